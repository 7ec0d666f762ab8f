"""The model registry against a real server, real jobs and the real store: a finished job's output file and
directory become versions (identical bytes stored once), their lineage holds the job, its spec, its final metrics
and its tuning study and trial, aliases resolve, a job reads a version as an input (pinned at submit, read-only at
its path), removal is refused while a service serves the model, and everything is per organisation (404 across
organisations, viewers read only). The registry's rules in detail: tests/integration/models/test_model_registry.py."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from kiln.errors import Conflict, Forbidden, InvalidInput, NotFound
from kiln.sdk.client import Client
from tests.helpers import log_text, spec, wait_for
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, close_all, create_tenant

# A training job: a model file, a directory holding the same bytes beside a config, and metrics in its log.
TRAIN = r"""
import os, pathlib, sys
out = pathlib.Path(os.environ["KILN_OUTPUT_DIR"])
weights = bytes.fromhex(sys.argv[1])
(out / "model.pkl").write_bytes(weights)
(out / "model" / "sub").mkdir(parents=True)
(out / "model" / "weights.bin").write_bytes(weights)
(out / "model" / "sub" / "config.json").write_text('{"layers": 2}')
print("epoch=1 val_acc=0.5 loss=0.9")
print("epoch=2 val_acc=0.97 loss=0.1")
"""

# A tuning trial that writes a model and reports its parameter as the objective.
TRIAL = r"""
import os, pathlib
pathlib.Path(os.environ["KILN_OUTPUT_DIR"], "model.pkl").write_bytes(os.urandom(64))
print("score=" + os.environ["KILN_PARAM_X"])
"""

# A job reading two model inputs: what it sees, where, and whether it may write there.
READER = r"""
import hashlib, os, pathlib
for root, env in ((pathlib.Path("model"), "KILN_INPUT_DIGITS"), (pathlib.Path("models/tree"), "KILN_INPUT_TREE")):
    assert root.resolve() == pathlib.Path(os.environ[env]).resolve(), (root.resolve(), os.environ[env])
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        print(f.relative_to(root).as_posix(), hashlib.sha256(f.read_bytes()).hexdigest())
    try:
        (root / "x").write_text("no")
        print("writable")
    except OSError:
        print("read-only")
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    started = KilnServer(tmp_path_factory.mktemp("models") / "home", cpus="4").start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def client(server: KilnServer) -> Iterator[Client]:
    with server.client() as c:
        yield c


def data_blobs(server: KilnServer) -> int:
    """Objects in the store's content-addressed data blobs (every organisation's)."""
    return sum(1 for _ in (server.home / "store" / "orgs").glob("*/data/sha256/*/*"))


def trained(client: Client, weights: bytes) -> str:
    job = client.submit(spec([sys.executable, "-c", TRAIN, weights.hex()], name="train-digits"))
    done = wait_for(client, job.id, timeout=60)
    assert done.state == "SUCCEEDED", (done.message, log_text(client, job.id))
    return job.id


def test_a_jobs_outputs_become_versions_that_a_job_reads_as_inputs(server: KilnServer, client: Client) -> None:
    weights = os.urandom(50_000)
    job_id = trained(client, weights)
    sha = hashlib.sha256(weights).hexdigest()
    before = data_blobs(server)

    first = client.register_model("digits", job_id, "model.pkl", description="sklearn digits")
    assert (first.version, first.framework, [(f.path, f.sha256) for f in first.files]) == (
        1,
        "sklearn",  # from the suffix
        [("model.pkl", sha)],
    )
    assert (first.lineage.job_id, first.lineage.job_state, first.lineage.job_name) == (
        job_id,
        "SUCCEEDED",
        "train-digits",
    )
    assert first.lineage.spec["command"][2] == TRAIN
    assert first.lineage.metrics["val_acc"] == 0.97 and first.lineage.metrics["loss"] == 0.1  # the last values
    assert data_blobs(server) == before + 1

    # The same bytes again (and again inside a directory): stored once; the directory's config is new.
    second = client.register_model("digits", job_id, "model.pkl", framework="custom")
    tree = client.register_model("tree", job_id, "model")
    assert (second.version, second.framework) == (2, "custom")
    assert [f.path for f in tree.files] == ["sub/config.json", "weights.bin"]
    assert tree.files[1].sha256 == sha
    assert data_blobs(server) == before + 2
    # The same file of the same job once more: the version that holds it (200), not an identical digits@3.
    again = client.request("POST", "/models/digits/versions", json_body={"job_id": job_id, "path": "model.pkl"})
    assert again.status_code == 200, again.text
    assert (again.json()["version"], again.json()["already_registered"]) == (1, True)

    assert client.set_alias("digits", "production", 2).version == 2
    got = client.request("GET", "/models/tree/versions/latest/files/weights.bin")
    assert got.content == weights and got.headers["X-Kiln-SHA256"] == sha
    with pytest.raises(NotFound, match=r"model tree@1 has no file 'nope\.bin'"):
        client.request("GET", "/models/tree/versions/1/files/nope.bin")
    assert client.model_version("digits@production").version == 2
    shown = client.get_model("digits")
    assert (shown.latest_version, shown.aliases, [v.version for v in shown.items]) == (2, {"production": 2}, [2, 1])
    assert [m.name for m in client.list_models()] == ["digits", "tree"]

    # A job reads versions as inputs: pinned to numbers at submit, read-only at their paths.
    inputs = [{"model": "digits@production", "path": "/model"}, {"model": "tree", "path": "/models/tree"}]
    reader = client.submit(spec([sys.executable, "-c", READER], inputs=inputs))
    assert [(i.model, i.path) for i in reader.spec.inputs] == [("digits@2", "/model"), ("tree@1", "/models/tree")]
    done = wait_for(client, reader.id, timeout=60)
    config_sha = tree.files[0].sha256
    assert done.state == "SUCCEEDED", (done.message, log_text(client, reader.id))
    assert log_text(client, reader.id) == [
        f"model.pkl {sha}",
        "read-only",
        f"sub/config.json {config_sha}",
        f"weights.bin {sha}",
        "read-only",
    ]
    with pytest.raises(InvalidInput, match=r"inputs\[0\]\.model: model digits has no alias 'canary'") as caught:
        client.submit(spec("true", inputs=[{"model": "digits@canary"}]))
    assert caught.value.details == {"field": "spec.inputs[0].model"}

    # A service serving the model holds it: the model cannot be removed until the service is deleted.
    service = {
        "name": "digits-web",
        "model": "digits@production",
        "predictor": {"type": "sklearn"},
        "runtime": {"python": sys.executable},
        "replicas": 0,
    }
    client.request("POST", "/services", json_body={"spec": service})
    with pytest.raises(Conflict, match="model digits@2 is served by service digits-web"):
        client.delete_model("digits")
    assert client.delete_model_version("digits", 1).versions == [1]  # not the served one
    client.request("DELETE", "/services/digits-web")
    removed = client.delete_model("digits")
    assert (removed.versions, removed.aliases) == ([2], ["production"])
    assert removed.blobs_deleted == 0  # the tree's version still holds the weights
    with pytest.raises(NotFound):
        client.get_model("digits")


def test_a_trials_version_names_its_study_and_trial(client: Client) -> None:
    study = client.submit_study(
        {
            "trial": spec([sys.executable, "-c", TRIAL]),
            "parameters": {"x": {"type": "int", "low": 3, "high": 3}},
            "objective": {"metric": "score", "direction": "maximize"},
            "max_trials": 1,
        }
    )
    ended = client.wait_study(study.id, timeout=90, poll=0.2)
    assert ended.state == "SUCCEEDED", ended
    (trial,) = client.study_trials(study.id)
    assert trial.job_id is not None
    version = client.register_model("tuned", trial.job_id, "model.pkl")
    assert (version.lineage.study_id, version.lineage.trial) == (study.id, trial.number)
    assert version.lineage.metrics["score"] == 3


def test_models_belong_to_their_organisation_and_viewers_only_read(server: KilnServer) -> None:
    admin = Api.admin(server)
    alpha = create_tenant(admin, "models-alpha", ("member", "viewer"))
    bravo = create_tenant(admin, "models-bravo", ("member",))
    clients: dict[str, Client] = {}
    try:
        for tenant, role in ((alpha, "member"), (alpha, "viewer"), (bravo, "member")):
            account = tenant[role]
            clients[f"{tenant.name}/{role}"] = Client(server.url, account.key_id, account.secret)
        member, viewer, other = (
            clients["models-alpha/member"],
            clients["models-alpha/viewer"],
            clients["models-bravo/member"],
        )
        job_id = trained(member, os.urandom(1000))
        member.register_model("secret-model", job_id, "model.pkl")

        assert [m.name for m in viewer.list_models()] == ["secret-model"]
        assert viewer.model_version("secret-model@1").lineage.job_id == job_id
        for attempt in (
            lambda: viewer.register_model("secret-model", job_id, "model.pkl"),
            lambda: viewer.set_alias("secret-model", "production", 1),
            lambda: viewer.delete_model_version("secret-model", 1),
            lambda: viewer.delete_model("secret-model"),
        ):
            with pytest.raises(Forbidden, match="needs models:write"):
                attempt()

        # Another organisation: everything of A answers as if it did not exist.
        assert other.list_models() == []
        answers: list[Any] = []
        for name in ("secret-model", "no-such-model"):
            for attempt in (
                partial(other.get_model, name),
                partial(other.model_version, f"{name}@1"),
                partial(other.set_alias, name, "production", 1),
                partial(other.delete_model, name),
            ):
                with pytest.raises(NotFound) as caught:
                    attempt()
                answers.append(caught.value.message.replace(name, "<name>"))
        assert answers[:4] == answers[4:]
        with pytest.raises(NotFound, match=f"job {job_id} not found"):
            other.register_model("stolen", job_id, "model.pkl")
        assert member.get_model("secret-model").latest_version == 1  # nothing changed
    finally:
        for c in clients.values():
            c.close()
        close_all(alpha, bravo)
        admin.close()


def test_registering_from_a_job_that_has_not_ended_is_refused(client: Client) -> None:
    job = client.submit(spec([sys.executable, "-c", "import time; time.sleep(60)"]))
    wait_for(client, job.id, "RUNNING", timeout=30)
    try:
        with pytest.raises(Conflict, match=f"job {job.id} is RUNNING: its outputs are final once it has ended"):
            client.register_model("early", job.id, "model.pkl")
    finally:
        client.cancel(job.id)
    assert wait_for(client, job.id, timeout=30).state == "CANCELLED"
