"""From a model logged the MLflow way to a served one: the official MLflow client's ``log_model`` (MLflow 3 records
a logged model through its logged-models endpoints, then uploads the ``MLmodel`` directory), from a laptop-like
client process and inside jobs; ``kiln models register NAME --from-run RUN`` takes it as a version with its flavor
and signature; a service serves it with the ``mlflow`` predictor in the catalog's runtime, and an instance that
does not fit the signature is refused naming the field. Another organisation sees none of it.

From the laptop: scikit-learn is the catalog runtime's (``.cache/test-runtimes``, built through a server when
missing, as the predictor tests do); MLflow's client is this venv's, with the runtime's packages after its own on
``sys.path``. In jobs: the catalog's sklearn and pytorch runtimes, which carry MLflow's client, with MLflow's
defaults (skops for sklearn, a ``torch.export`` graph for pytorch), as a user's training code calls it. PyTorch is
logged only in a job: the replica needs the pytorch runtime anyway, and the job needs nothing more, where the
laptop-like client would need torch beside this venv's MLflow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import mlflow
import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from kiln.domain.serving import ServiceState
from kiln.errors import InvalidInput, NotFound
from kiln.sdk.client import Client
from tests.kilnserver import TEST_RUNTIMES, KilnServer
from tests.tenancy_helpers import Api, Tenant, close_all, create_tenant

pytestmark = pytest.mark.slow

LOG_MODEL = """
import json, os, sys
sys.path.append(sys.argv[1])  # scikit-learn from the catalog runtime, after MLflow's client
import mlflow, numpy as np
from mlflow.models import infer_signature
from sklearn.linear_model import LogisticRegression
X = np.array([[0.0, 1.0, 2.0, 3.0], [1.0, 0.0, 1.0, 0.0], [3.0, 2.0, 1.0, 0.0], [0.5, 0.5, 0.5, 0.5]] * 3)
y = np.array([0, 1, 0, 1] * 3)
model = LogisticRegression().fit(X, y)
mlflow.set_experiment(sys.argv[2])
with mlflow.start_run() as run:
    info = mlflow.sklearn.log_model(
        model, name="model", signature=infer_signature(X, model.predict(X)), serialization_format="cloudpickle"
    )
print(json.dumps({"run": run.info.run_id, "model": info.model_id, "inputs": X[:4].tolist(),
                  "outputs": model.predict(X[:4]).tolist()}))
"""


def _sklearn_site(server: KilnServer) -> str:
    venv = TEST_RUNTIMES / "sklearn-1.9"
    if not (venv / ".kiln-ready").exists():
        client = server.client()
        client.install_runtime("sklearn")
        assert client.wait_runtime("sklearn", timeout=900, poll=2).status == "installed"
    return str(next((venv / "lib").glob("python3*/site-packages")))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    srv = KilnServer(tmp_path_factory.mktemp("logged") / "home", rate_limit_per_second="0", cpus="2").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tenants(server: KilnServer) -> Iterator[tuple[Tenant, Tenant]]:
    admin = Api.admin(server)
    labs, other = create_tenant(admin, "labs", ("member",)), create_tenant(admin, "other", ("member",))
    yield labs, other
    close_all(labs, other)
    admin.close()


def _mlflow_env(server: KilnServer, tenant: Tenant) -> dict[str, str]:
    account = tenant.accounts["member"]
    return {
        "MLFLOW_TRACKING_URI": f"{server.url}/mlflow",
        "MLFLOW_TRACKING_USERNAME": account.key_id,
        "MLFLOW_TRACKING_PASSWORD": account.secret,
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    }


@pytest.mark.timeout(900)  # the log (300 s at most on a loaded machine), then a replica's start and its predicts
def test_a_model_logged_from_a_laptop_is_registered_served_and_checked(
    server: KilnServer, tenants: tuple[Tenant, Tenant]
) -> None:
    labs, other = tenants
    site = _sklearn_site(server)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "MLFLOW_"))}
    done = subprocess.run(
        [sys.executable, "-c", LOG_MODEL, site, "laptop"],
        env={**env, **_mlflow_env(server, labs)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]  # today: RestException: ENDPOINT_NOT_FOUND
    logged: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])

    member = labs.accounts["member"]
    with Client(server.url, member.key_id, member.secret) as kiln:
        version = kiln.register_model_from_run("laptop-clf", logged["run"])
        assert (version.flavor, version.framework, version.lineage.run_id) == ("sklearn", "sklearn", logged["run"])
        assert version.lineage.logged_model_id == logged["model"] and version.lineage.job_id == ""
        [tensor] = (version.signature or {})["inputs"]
        assert tensor["tensor-spec"]["shape"] == [-1, 4]
        assert {f.path for f in version.files} >= {"MLmodel", "model.pkl"}
        assert [v.ref for v in kiln.run_model_versions(logged["run"])] == [version.ref]  # the run's side

        kiln.serve(
            {
                "name": "laptop-clf",
                "model": version.ref,
                "predictor": {"type": "mlflow"},
                "runtime": {"framework": "sklearn"},
                "resources": {"cpus": 0.5},
                "replicas": 1,
            }
        )
        ready = kiln.wait_service("laptop-clf", timeout=240)
        assert ready.state == ServiceState.READY, f"{ready.message}: {ready.replicas}"
        assert kiln.predict("laptop-clf", logged["inputs"]).outputs == logged["outputs"]
        with pytest.raises(InvalidInput) as refused:  # the signature's tensor spec: 4 numbers per instance
            kiln.predict("laptop-clf", [[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0]])
        assert refused.value.status == 422 and refused.value.message.startswith("inputs[1]: expected 4 numbers, got 3")
        assert (refused.value.details or {}).get("field") == "inputs[1]"
        kiln.delete_service("laptop-clf")

    # Another organisation: the logged model, its files and the run's model are not there.
    theirs = other.accounts["member"]
    with Client(server.url, theirs.key_id, theirs.secret) as stranger:
        with pytest.raises(NotFound):
            stranger.register_model_from_run("stolen", logged["run"])
        with pytest.raises(NotFound):  # as a run that does not exist, not as one with no versions
            stranger.run_model_versions(logged["run"])
    saved = {k: os.environ.get(k) for k in _mlflow_env(server, other)}
    os.environ.update(_mlflow_env(server, other))
    try:
        client = MlflowClient(f"{server.url}/mlflow")
        with pytest.raises(MlflowException, match="RESOURCE_DOES_NOT_EXIST"):
            client.get_logged_model(logged["model"])
        assert not client.search_logged_models(experiment_ids=[])
        with pytest.raises(MlflowException):
            mlflow.artifacts.download_artifacts(f"models:/{logged['model']}")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


SKLEARN_JOB = """
import json, mlflow, numpy as np
from mlflow.models import infer_signature
from sklearn.linear_model import LogisticRegression
X = np.array([[0.0, 1.0, 2.0, 3.0], [1.0, 0.0, 1.0, 0.0], [3.0, 2.0, 1.0, 0.0], [0.5, 0.5, 0.5, 0.5]] * 3)
y = np.array([0, 1, 0, 1] * 3)
model = LogisticRegression().fit(X, y)
with mlflow.start_run():  # the job's run, on the server as the job reaches it: Kiln set both
    mlflow.sklearn.log_model(model, name="model", signature=infer_signature(X, model.predict(X)))
print("LOGGED", json.dumps({"inputs": X[:4].tolist(), "outputs": model.predict(X[:4]).tolist()}))
"""

TORCH_JOB = """
import json, mlflow, numpy as np, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh())
X = np.array([[0.0, 1.0, 2.0], [1.0, 0.5, -1.0], [2.0, -1.0, 0.5]], dtype=np.float32)
with mlflow.start_run():
    mlflow.pytorch.log_model(model, name="model", input_example=X)
print("LOGGED", json.dumps({"inputs": X.tolist(), "outputs": model(torch.from_numpy(X)).detach().tolist()}))
"""


@pytest.mark.timeout(1200)  # a runtime built before MLflow's client was in it is updated first (pip, a minute)
def test_models_logged_inside_jobs_are_registered_from_the_cli_served_and_checked(
    server: KilnServer, tenants: tuple[Tenant, Tenant]
) -> None:
    labs, _ = tenants
    member = labs.accounts["member"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "MLFLOW_"))}
    env.update(KILN_ENDPOINT=server.url, KILN_ACCESS_KEY=member.key_id, KILN_SECRET_KEY=member.secret)
    with Client(server.url, member.key_id, member.secret) as kiln:
        jobs = {
            flavor: kiln.submit({"command": ["python", "-c", code], "runtime": {"framework": flavor}})
            for flavor, code in (("sklearn", SKLEARN_JOB), ("pytorch", TORCH_JOB))
        }
        logged: dict[str, dict[str, Any]] = {}
        for flavor, job in jobs.items():
            done = kiln.wait(job.id, timeout=900)
            lines = [line.text for line in kiln.stream_logs(job.id, follow=False)]
            assert done.state == "SUCCEEDED", (done.message, lines[-30:])  # before: No module named 'mlflow'
            logged[flavor] = json.loads(next(line for line in lines if line.startswith("LOGGED "))[7:])
            registered = subprocess.run(
                [sys.executable, "-m", "kiln", "models", "register", f"in-job-{flavor}", "--from-run", job.id],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert registered.returncode == 0, registered.stderr
            assert f"MLflow flavor {flavor}) from model of run {job.id}" in registered.stderr
            [version] = kiln.run_model_versions(job.id)
            assert (version.flavor, version.lineage.job_id) == (flavor, job.id) and version.signature
            kiln.serve(
                {
                    "name": f"in-job-{flavor}",
                    "model": version.ref,
                    "predictor": {"type": "mlflow"},
                    "runtime": {"framework": flavor},
                    "resources": {"cpus": 0.5},
                    "replicas": 1,
                }
            )
        for flavor in jobs:
            ready = kiln.wait_service(f"in-job-{flavor}", timeout=240)
            assert ready.state == ServiceState.READY, f"{ready.message}: {ready.replicas}"
        assert kiln.predict("in-job-sklearn", logged["sklearn"]["inputs"]).outputs == logged["sklearn"]["outputs"]
        outputs = kiln.predict("in-job-pytorch", logged["pytorch"]["inputs"]).outputs
        assert outputs == [pytest.approx(row, abs=1e-5) for row in logged["pytorch"]["outputs"]]
        with pytest.raises(InvalidInput) as refused:  # the signature MLflow inferred from the input example
            kiln.predict("in-job-pytorch", [[1.0, 2.0]])
        assert refused.value.message.startswith("inputs[0]: expected 3 numbers, got 2")
        for flavor in jobs:
            kiln.delete_service(f"in-job-{flavor}")
