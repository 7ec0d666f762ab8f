"""The model registry's use cases in process, on a real database (SQLite and PostgreSQL) and a real local store:
a version's files are copied from a job's outputs into the data blobs datasets use (identical bytes stored once),
its lineage, numbers never given twice, aliases and references, removal that keeps what a dataset or another
version still holds, and the refusals (a job that has not ended, another organisation, a viewer, the storage
quota, a version a service serves or a running job reads). The HTTP side, real jobs and real inputs are
tests/integration/models/test_models.py's."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import func, select

from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import DataBlob, Job, MetricSeries, Quota, Service, TuningStudy, TuningTrial
from kiln.domain.datasets import DatasetFileEntry, DraftCreate
from kiln.domain.models import ModelRegister
from kiln.errors import BadRequest, Conflict, Forbidden, NotFound
from kiln.settings import Settings
from kiln.storage.keys import outputs_prefix
from kiln.storage.store import ObjectStore
from kiln.usecases.access.identity import Principal
from kiln.usecases.access.quotas import QuotaService
from kiln.usecases.data.dataset_names import data_key
from kiln.usecases.data.datasets import DatasetService
from kiln.usecases.models.model_registry import ModelRegistry
from tests.helpers import seed_jobs
from tests.s3server import S3Server

WEIGHTS = b"torchscript weights " * 100
CONFIG = b'{"layers": 2}\n'
SPEC = {"command": "python train.py", "runtime": {"framework": "pytorch"}}


@dataclass
class World:
    db: Database
    store: ObjectStore
    registry: ModelRegistry
    datasets: DatasetService
    quotas: QuotaService
    member: Principal
    viewer: Principal
    other: Principal  # a member of another organisation

    def outputs(self, job_id: str, files: dict[str, bytes], org: str = "org-a") -> None:
        self.store.put_objects([(f"{outputs_prefix(org, job_id)}/{p}", d) for p, d in files.items()])

    def register(self, name: str, path: str, job_id: str = "job-done", **extra: str) -> int:
        body = ModelRegister.model_validate({"job_id": job_id, "path": path, **extra})
        return self.registry.register(self.member, name, body).version

    def blobs(self) -> int:
        with self.db.read() as s:
            return int(s.scalar(select(func.count()).select_from(DataBlob)) or 0)


def make_world(tmp_path: Path, database_url: str, store: ObjectStore) -> World:
    db = Database(database_url)
    migrate.upgrade(db.engine)
    seed_jobs(
        db,
        "org-a",
        "usr-a",
        {"job-done": {"state": "SUCCEEDED", "spec": SPEC}, "job-running": {"state": "RUNNING"}},
    )
    seed_jobs(db, "org-b", "usr-b", {"job-b": {"state": "SUCCEEDED"}})
    settings = Settings(home=tmp_path / "home")
    quotas = QuotaService(db)
    w = World(
        db,
        store,
        ModelRegistry(db, store, settings, quotas),
        DatasetService(db, store, settings, quotas),
        quotas,
        Principal("usr-a", "ann", "org-a", "org-a", "AK1", "member", False),
        Principal("usr-a", "ann", "org-a", "org-a", "AK2", "viewer", False),
        Principal("usr-b", "bob", "org-b", "org-b", "AK3", "member", False),
    )
    w.outputs("job-done", {"model.pt": WEIGHTS, "ckpt/model.pt": WEIGHTS, "ckpt/sub/config.json": CONFIG})
    w.outputs("job-b", {"model.pt": WEIGHTS}, org="org-b")
    return w


@pytest.fixture
def world(tmp_path: Path, database_url: str) -> Iterator[World]:
    w = make_world(tmp_path, database_url, ObjectStore(str(tmp_path / "store")))
    yield w
    w.db.dispose()


def test_a_version_copies_the_jobs_files_once_and_keeps_its_lineage(world: World) -> None:
    with world.db.transaction() as s:
        s.add_all(
            [
                MetricSeries(job_id="job-done", worker="worker0", name="val_acc", kind="scalar", last_value=0.91),
                MetricSeries(job_id="job-done", worker="worker1", name="val_acc", kind="scalar", last_value=0.5),
                MetricSeries(job_id="job-done", worker="worker0", name="loss", kind="scalar", last_value=0.25),
                MetricSeries(job_id="job-done", worker="worker0", name="note", kind="text", last_text="done"),
                MetricSeries(
                    job_id="job-done", worker="worker0", name="cpu", kind="scalar", source="sys", last_value=3
                ),
                TuningStudy(
                    id="study-1", org_id="org-a", user_id="usr-a", name="s", spec={}, state="RUNNING", planned_trials=1
                ),
            ]
        )
        s.flush()
        s.add(
            TuningTrial(
                study_id="study-1", number=4, optuna_trial_id=9, job_id="job-done", state="SUCCEEDED", params={}
            )
        )
    body = ModelRegister(job_id="job-done", path="model.pt", description="first")
    first = world.registry.register(world.member, "digits", body)
    sha = hashlib.sha256(WEIGHTS).hexdigest()
    assert (first.name, first.version, first.framework, first.source_path) == ("digits", 1, "torch", "model.pt")
    assert [(f.path, f.size, f.sha256) for f in first.files] == [("model.pt", len(WEIGHTS), sha)]
    assert world.store.local_path(data_key("org-a", sha)).read_bytes() == WEIGHTS  # type: ignore[union-attr]
    lineage = first.lineage
    assert (lineage.job_id, lineage.job_state, lineage.spec) == ("job-done", "SUCCEEDED", SPEC)
    assert lineage.metrics == {"loss": 0.25, "val_acc": 0.91}  # worker 0's; no text, no system samples
    assert (lineage.study_id, lineage.trial) == ("study-1", 4)
    assert world.blobs() == 1

    # The same bytes in a directory beside another file: one new blob, for the new file.
    tree = world.registry.register(world.member, "tree", ModelRegister(job_id="job-done", path="ckpt/"))
    assert [(f.path, f.size) for f in tree.files] == [("model.pt", len(WEIGHTS)), ("sub/config.json", len(CONFIG))]
    assert (tree.framework, tree.file_count, tree.size) == ("torch", 2, len(WEIGHTS) + len(CONFIG))
    assert world.blobs() == 2
    assert world.registry.resolve("org-a", "digits") == ("digits", 1)


def test_the_same_files_of_the_same_job_again_answer_the_version_that_holds_them(world: World) -> None:
    """Registering a job's output twice made an identical digits@2 without a word (issue 26): the same job, the
    same framework and the same files (paths and bytes) answer the version registered before, flagged."""
    first = world.registry.register(world.member, "digits", ModelRegister(job_id="job-done", path="model.pt"))
    again = world.registry.register(world.member, "digits", ModelRegister(job_id="job-done", path="model.pt"))
    assert (first.version, first.already_registered) == (1, False)
    assert (again.version, again.already_registered, again.files) == (1, True, first.files)
    # ckpt/model.pt holds the same bytes under the same name in the version: the same artifact again.
    assert (
        world.registry.register(world.member, "digits", ModelRegister(job_id="job-done", path="ckpt/model.pt")).version
        == 1
    )
    assert world.registry.get_model(world.member, "digits").latest_version == 1
    # Anything else is a new version: another framework, other files, another model's name.
    assert world.register("digits", "model.pt", framework="custom") == 2
    assert world.register("digits", "ckpt") == 3
    assert world.register("other", "model.pt") == 1
    assert world.register("digits", "ckpt") == 3  # and each of those is answered again, not copied


def test_references_aliases_and_what_a_missing_one_says(world: World) -> None:
    for path in ("model.pt", "ckpt", "ckpt/sub/config.json"):  # three different artifacts
        world.register("digits", path, framework="custom")
    registry, me = world.registry, world.member
    assert registry.set_alias(me, "digits", "production", 2).version == 2
    assert registry.resolve("org-a", "digits@production") == ("digits", 2)
    assert registry.resolve("org-a", "digits@latest") == ("digits", 3)
    assert registry.resolve("org-a", "digits@1") == ("digits", 1)
    registry.set_alias(me, "digits", "production", 3)  # moved
    assert registry.version(me, "digits", "production").version == 3
    assert registry.version(me, "digits", "3").aliases == ["production"]
    registry.set_alias(me, "digits", "staging", 1)
    assert registry.get_model(me, "digits").aliases == {"production": 3, "staging": 1}
    assert [v.version for v in registry.get_model(me, "digits").items] == [3, 2, 1]
    assert [v.version for v in registry.versions(me, "digits")] == [1, 2, 3]

    with pytest.raises(NotFound, match=r"model digits has no version 9; it has 1, 2, 3 \(latest 3\)"):
        registry.resolve("org-a", "digits@9")
    with pytest.raises(NotFound, match=r"no alias 'canary' \(its aliases: production → 3, staging → 1\)"):
        registry.resolve("org-a", "digits@canary")
    with pytest.raises(NotFound, match="model 'nope' not found"):
        registry.resolve("org-a", "nope@1")
    with pytest.raises(NotFound, match="model 'digits' not found"):
        registry.resolve("org-b", "digits@1")  # another organisation's
    with pytest.raises(BadRequest, match="model name 'Digits'"):
        registry.resolve("org-a", "Digits@1")
    for alias, why in (("latest", "always means the newest"), ("3x", "starting with a letter"), ("Prod", "lowercase")):
        with pytest.raises(BadRequest, match=why):
            registry.set_alias(me, "digits", alias, 1)
    with pytest.raises(NotFound, match="has no version 7"):
        registry.set_alias(me, "digits", "production", 7)
    assert registry.delete_alias(me, "digits", "staging").version == 1
    with pytest.raises(NotFound, match="no alias 'staging'"):
        registry.delete_alias(me, "digits", "staging")


def test_registering_is_refused_for_a_running_job_a_missing_path_another_org_and_a_viewer(world: World) -> None:
    with pytest.raises(Conflict, match="job job-running is RUNNING: its outputs are final once it has ended"):
        world.register("m", "model.pt", job_id="job-running")
    with pytest.raises(NotFound, match=r"no output file or directory 'nope.pt' \(its outputs are: ckpt/model.pt"):
        world.register("m", "nope.pt")
    # Another organisation's job reads exactly like a missing one.
    for job_id in ("job-b", "job-missing"):
        with pytest.raises(NotFound) as caught:
            world.register("m", "model.pt", job_id=job_id)
        assert caught.value.message == f"job {job_id} not found"
    world.register("m", "model.pt")
    with pytest.raises(Forbidden, match="needs models:write"):
        world.registry.register(world.viewer, "m", ModelRegister(job_id="job-done", path="model.pt"))
    with pytest.raises(Forbidden):
        world.registry.set_alias(world.viewer, "m", "production", 1)
    with pytest.raises(Forbidden):
        world.registry.remove(world.viewer, "m", None)
    assert [m.name for m in world.registry.list_models(world.viewer)] == ["m"]  # viewers read
    assert world.registry.list_models(world.other) == []
    with pytest.raises(NotFound):
        world.registry.get_model(world.other, "m")
    assert world.blobs() == 1


def test_a_storage_quota_refuses_a_version_and_leaves_no_bytes_behind(world: World) -> None:
    with world.db.transaction() as s:
        s.add(Quota(org_id="org-a", category="total", storage=len(WEIGHTS) - 1))
    with pytest.raises(Forbidden, match="quota: storage"):
        world.register("m", "model.pt")
    assert world.blobs() == 0
    assert not world.store.exists(data_key("org-a", hashlib.sha256(WEIGHTS).hexdigest()))
    with pytest.raises(NotFound):
        world.registry.resolve("org-a", "m")


def test_removal_keeps_what_a_dataset_or_another_version_holds_and_never_reuses_a_number(world: World) -> None:
    sha = hashlib.sha256(WEIGHTS).hexdigest()
    key = data_key("org-a", sha)
    world.register("m", "model.pt")  # 1
    world.register("m", "ckpt")  # 2: the same weights and the config
    # A dataset of the same bytes: already held, nothing to upload; its removal leaves the model's blob.
    draft = world.datasets.create_draft(
        world.member, DraftCreate(name="d", files=[DatasetFileEntry(path="w.pt", size=len(WEIGHTS), sha256=sha)])
    )
    assert draft.missing == []
    world.datasets.commit(world.member, draft.id)
    assert world.datasets.remove(world.member, "d", None).blobs_deleted == 0
    assert world.store.exists(key)

    world.registry.set_alias(world.member, "m", "production", 2)
    removed = world.registry.remove(world.member, "m", 2)
    assert (removed.versions, removed.aliases, removed.blobs_deleted) == ([2], ["production"], 1)  # the config
    assert removed.bytes_freed == len(CONFIG)
    assert world.store.exists(key)  # version 1 holds it
    assert world.register("m", "ckpt") == 3  # 2 is not given again
    removed = world.registry.remove(world.member, "m", None)
    assert (removed.versions, removed.blobs_deleted, removed.bytes_freed) == ([1, 3], 2, len(WEIGHTS) + len(CONFIG))
    assert not world.store.exists(key)
    assert world.blobs() == 0
    with pytest.raises(NotFound):
        world.registry.get_model(world.member, "m")
    assert world.register("m", "model.pt") == 1  # a new model starts again


def test_removal_is_refused_while_a_service_serves_the_version_or_a_running_job_reads_it(world: World) -> None:
    world.register("m", "model.pt")
    world.register("m", "ckpt")
    with world.db.transaction() as s:
        s.add(
            Service(
                id="svc-1",
                org_id="org-a",
                user_id="usr-a",
                name="web",
                spec={},
                state="READY",
                model_name="m",
                model_version=1,
                desired_replicas=1,
            )
        )
    with pytest.raises(Conflict, match="model m@1 is served by service web"):
        world.registry.remove(world.member, "m", 1)
    with pytest.raises(Conflict, match="served by service web"):
        world.registry.remove(world.member, "m", None)
    assert world.registry.remove(world.member, "m", 2).versions == [2]  # not the served one
    with world.db.transaction() as s:
        service = s.get(Service, "svc-1")
        assert service is not None
        service.state = "DELETING"
    seed_jobs_reading(world, "m@1")
    with pytest.raises(Conflict, match="model m@1 is an input of job job-reader \\(RUNNING\\)"):
        world.registry.remove(world.member, "m", None)
    assert world.registry.resolve("org-a", "m@1") == ("m", 1)


def seed_jobs_reading(world: World, ref: str) -> None:
    with world.db.transaction() as s:
        s.add(
            Job(
                id="job-reader",
                org_id="org-a",
                user_id="usr-a",
                name="reader",
                state="RUNNING",
                spec={"command": "true", "inputs": [{"model": ref, "path": "/model", "mode": "stage"}]},
            )
        )


def test_files_give_the_executor_each_blobs_store_key(world: World) -> None:
    world.register("tree", "ckpt")
    resolved = world.registry.files("org-a", "tree@latest")
    assert (resolved.name, resolved.version) == ("tree", 1)
    for f in resolved.files:
        data = world.store.local_path(f.key).read_bytes()  # type: ignore[union-attr]
        assert hashlib.sha256(data).hexdigest() == f.sha256 and len(data) == f.size
    assert [f.path for f in resolved.files] == ["model.pt", "sub/config.json"]


def test_on_an_s3_store_the_files_are_copied_through_a_temporary_download_and_removed_with_the_version(
    tmp_path: Path,
) -> None:
    s3 = S3Server().start()
    try:
        s3.create_bucket("kiln-models")
        store = ObjectStore(f"s3://kiln-models/{tmp_path.name}", **s3.storage_options())
        world = make_world(tmp_path, f"sqlite:///{tmp_path / 'k.db'}", store)
        assert world.register("tree", "ckpt") == 1
        resolved = world.registry.files("org-a", "tree@1")
        for f in resolved.files:
            assert hashlib.sha256(b"".join(store.iter_bytes(f.key))).hexdigest() == f.sha256
        assert list((tmp_path / "home" / "tmp").iterdir()) == []  # the downloads are gone
        removed = world.registry.remove(world.member, "tree", None)
        assert removed.blobs_deleted == 2
        assert not any(store.exists(f.key) for f in resolved.files)
        world.db.dispose()
    finally:
        s3.stop()
