"""A notebook's start on Kubernetes (kiln.backends.kubernetes.notebooks): its job's objects with JupyterLab on the
pod's TCP port 8888, a Service selecting exactly that attempt's pod, a NetworkPolicy admitting only Kiln's server
pods to the port, the token from a Secret; strictly valid for the oldest and newest Kubernetes; ``kiln notebooks
render`` prints them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kiln.backends.kubernetes.netpol import service_network_policy
from kiln.backends.kubernetes.notebooks import (
    LABEL_NOTEBOOK,
    LAUNCHER_ARGS,
    LAUNCHER_DIR,
    NOTEBOOK_PORT,
    NOTEBOOK_TOKEN_PLACEHOLDER,
    notebook_service_name,
    render_notebook,
)
from kiln.backends.kubernetes.render import TOKEN_PLACEHOLDER, KubeConfig, base_name, to_yaml
from kiln.domain.catalog import DEFAULT_CATALOG
from kiln.domain.notebooks import NotebookSpec
from kiln.domain.spec import JobSpec
from kiln.errors import InvalidInput
from kiln.usecases.notebooks import job_spec
from tests.unit.kubernetes.conftest import OLDEST, VERSIONS, validate_strict

NOTEBOOK = "nb-01jd5y3c2k7q4m"
JOB = "job-01jd5y3c2k7q4m9x2a"
ORG = "org-01jd5y3c2k7q4m9x2b"
UID = "9f0b6c1e-3d1a-4a53-9d0e-1b2c3d4e5f60"
SECRET_TOKEN = "nb-secret-3f9a1c7e5b2d4a6c8e0f"


def notebook_job(**fields: Any) -> JobSpec:
    spec = NotebookSpec.model_validate({"name": "explore", "runtime": {"framework": "pytorch"}, **fields})
    entry = DEFAULT_CATALOG.resolve("pytorch", None)
    return job_spec(NOTEBOOK, spec, entry.version, 60.0)


def rendered(job: JobSpec | None = None, cfg: KubeConfig | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    return render_notebook(
        NOTEBOOK, job or notebook_job(), JOB, ORG, kwargs.pop("attempt", 2), cfg or KubeConfig(), **kwargs
    )


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, [(o["kind"], o["metadata"]["name"]) for o in objects]
    return found[0]


def pod_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "Job")["spec"]["template"]


def container_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return next(c for c in pod_of(objects)["spec"]["containers"] if c["name"] == "job")


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "full": {
        "resources": {"cpus": 4, "memory": "16G", "gpus": 1},
        "inputs": [{"dataset": "mnist@2"}, {"dataset": "imagenet@1", "path": "/mnt/in"}],
        "env": {"LR": "3e-4"},
        "network": "none",
    },
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.needs("kubernetes-validate")
def test_every_manifest_validates_strictly(case: str, version: str) -> None:
    cfg = KubeConfig(kubernetes_version=version)
    for owner in (None, UID):
        objects = rendered(notebook_job(**CASES[case]), cfg, owner_uid=owner)
        assert {"Secret", "ConfigMap", "NetworkPolicy", "Service", "Job"} <= {o["kind"] for o in objects}
        validate_strict(objects, version)
        assert objects[-1]["kind"] == "Job", "the pod comes last: everything it needs exists first"


@pytest.mark.timeout(60)
def test_the_service_selects_exactly_this_attempts_pod_on_8888() -> None:
    objects = rendered(attempt=2)
    name = notebook_service_name(JOB, 2)
    assert name == f"kiln-{JOB}-a2-notebook" and len(name) <= 63  # each start's own: never the last start's
    assert notebook_service_name(JOB, 3) != name
    service = one(objects, "Service", name)
    assert service["spec"]["type"] == "ClusterIP"
    selector = service["spec"]["selector"]
    pod_labels = pod_of(objects)["metadata"]["labels"]
    assert selects(selector, pod_labels)
    assert (
        selector["kiln.io/attempt"] == "2" and selector["kiln.io/job"] == JOB and selector[LABEL_NOTEBOOK] == NOTEBOOK
    )
    assert not selects(selector, {**pod_labels, "kiln.io/attempt": "1"})  # an earlier attempt's pod
    assert not selects(selector, {**pod_labels, "kiln.io/job": "job-other"})
    [port] = service["spec"]["ports"]
    assert (port["port"], port["protocol"]) == (NOTEBOOK_PORT, "TCP")
    container = container_of(objects)
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[port["targetPort"]] == NOTEBOOK_PORT
    assert container["readinessProbe"]["tcpSocket"]["port"] == port["targetPort"]
    for obj in objects:  # every object: the attempt's labels and the notebook's
        labels = obj["metadata"]["labels"]
        assert labels[LABEL_NOTEBOOK] == NOTEBOOK and labels["kiln.io/job"] == JOB, obj["kind"]
        assert labels["kiln.io/org"] == ORG and labels["app.kubernetes.io/managed-by"] == "kiln"
    assert pod_labels[LABEL_NOTEBOOK] == NOTEBOOK
    owned = rendered(owner_uid=UID)
    assert one(owned, "Service")["metadata"]["ownerReferences"][0]["uid"] == UID  # gone with the Job
    assert "ownerReferences" not in one(owned, "Job")["metadata"]


@pytest.mark.timeout(60)
def test_the_network_policy_admits_only_the_server_pods_on_8888() -> None:
    cfg = KubeConfig(server_pod_labels={"app": "kiln-server"}, server_namespace="kiln-system")
    objects = rendered(cfg=cfg)
    policy = one(objects, "NetworkPolicy", notebook_service_name(JOB, 2))["spec"]
    assert selects(policy["podSelector"]["matchLabels"], pod_of(objects)["metadata"]["labels"])
    assert policy["policyTypes"] == ["Ingress"]  # egress stays the attempt's policy's
    server = {
        "podSelector": {"matchLabels": {"app": "kiln-server"}},
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kiln-system"}},
    }
    assert policy["ingress"] == [{"from": [server], "ports": [{"protocol": "TCP", "port": NOTEBOOK_PORT}]}]
    # The same server peer as a model service's replicas are reached by (netpol.py's own).
    serving = service_network_policy({}, {}, NOTEBOOK_PORT, cfg, [])
    assert policy["ingress"] == serving["spec"]["ingress"]
    # The attempt's own policy (render.py's) admits nothing but the attempt's pods and the server either.
    attempt = one(objects, "NetworkPolicy", base_name(JOB, 2))["spec"]
    peers = attempt["ingress"][0]["from"]
    assert server in peers and all(p == server or set(p) == {"podSelector"} for p in peers)
    with pytest.raises(InvalidInput, match="network: host"):
        rendered(notebook_job(network="host"))


@pytest.mark.timeout(60)
def test_the_token_comes_from_the_secret_never_inline() -> None:
    objects = rendered(token="job-token-1", notebook_token=SECRET_TOKEN)
    secret = one(objects, "Secret")
    assert secret["stringData"]["notebook-token"] == SECRET_TOKEN
    env = {e["name"]: e for e in container_of(objects)["env"]}
    ref = env["KILN_NOTEBOOK_TOKEN"]
    assert "value" not in ref
    assert ref["valueFrom"] == {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "notebook-token"}}
    assert to_yaml(objects).count(SECRET_TOKEN) == 1  # in the Secret only
    placeholder = one(rendered(), "Secret")["stringData"]
    assert placeholder == {"token": TOKEN_PLACEHOLDER, "notebook-token": NOTEBOOK_TOKEN_PLACEHOLDER}
    assert env["HOME"]["value"] == "/kiln/home"
    assert list(env).count("HOME") == 1


@pytest.mark.timeout(60)
def test_the_pod_runs_the_shipped_launcher_on_tcp(tmp_path: Path) -> None:
    objects = rendered(notebook_job(inputs=[{"dataset": "mnist@2"}]))
    params = json.loads(one(objects, "ConfigMap", base_name(JOB, 2))["data"]["params.json"])
    assert params["port"] == NOTEBOOK_PORT and params["notebook_id"] == NOTEBOOK
    container = container_of(objects)
    assert container["args"] == LAUNCHER_ARGS
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/kiln/work/data/mnist"]["readOnly"] and mounts["/data/mnist"]["name"] == "kiln-input-0"
    # The launcher's ConfigMap laid out as its volume's items, run by an interpreter without Kiln (-I: no
    # PYTHONPATH, no cwd): the shipped files import on their own and run in port mode.
    launcher = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-notebook"))
    volume = next(
        v
        for v in pod_of(objects)["spec"]["volumes"]
        if v.get("configMap", {}).get("name") == launcher["metadata"]["name"]
    )
    assert mounts[LAUNCHER_DIR]["name"] == volume["name"]
    for item in volume["configMap"]["items"]:
        path = tmp_path / "launcher" / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(launcher["data"][item["key"]])
    (tmp_path / "params.json").write_text(json.dumps(params))
    env = {
        "KILN_PARAMS_FILE": str(tmp_path / "params.json"),
        "KILN_ENDPOINT": "http://127.0.0.1:1",
        "KILN_JOB_TOKEN": "t",
        "HOME": str(tmp_path),
        "KILN_WORK_DIR": str(tmp_path),
        "PATH": "/usr/bin:/bin",
    }
    code = LAUNCHER_ARGS[2].replace(LAUNCHER_DIR, str(tmp_path / "launcher"))
    done = subprocess.run([sys.executable, "-I", "-c", code], env=env, capture_output=True, text=True, timeout=20)
    assert done.returncode == 2, done.stderr
    assert "kiln: notebook: KILN_NOTEBOOK_TOKEN not set" in done.stderr
    # The shipped package is the one imported (not this checkout's kiln): without one of its files it fails.
    (tmp_path / "launcher" / "kiln" / "injob" / "notebook_home.py").unlink()
    done = subprocess.run([sys.executable, "-I", "-c", code], env=env, capture_output=True, text=True, timeout=20)
    assert done.returncode == 1 and "No module named 'kiln.injob.notebook_home'" in done.stderr, done.stderr


@pytest.mark.timeout(120)
@pytest.mark.needs("kubernetes-validate")
def test_the_cli_prints_the_manifests_and_refuses_a_bad_spec() -> None:
    from kiln.cli.main import app

    runner = CliRunner()
    args = ["notebooks", "render", "explore", "--runtime", "pytorch", "--gpus", "1", "--input", "mnist@2"]
    result = runner.invoke(app, [*args, "--namespace", "ml"])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    kinds = [d["kind"] for d in docs]
    assert kinds.count("Service") == 1 and kinds[-1] == "Job" and "NetworkPolicy" in kinds
    assert {d["metadata"]["namespace"] for d in docs} == {"ml"}
    secret = one(docs, "Secret")["stringData"]
    assert secret["notebook-token"] == NOTEBOOK_TOKEN_PLACEHOLDER and secret["token"] == TOKEN_PLACEHOLDER
    assert one(docs, "Service")["spec"]["ports"][0]["port"] == NOTEBOOK_PORT
    job = one(docs, "Job")["spec"]["template"]["spec"]
    assert job["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    validate_strict(docs, OLDEST)
    bad = runner.invoke(app, ["notebooks", "render", "Bad_Name"])
    assert bad.exit_code == 2 and "lower-case letters, digits and '-'" in bad.output, bad.output
    created = runner.invoke(app, ["notebooks", "create", "Bad_Name"])  # refused before any server is asked
    assert created.exit_code == 2 and created.output == bad.output
    unknown = runner.invoke(app, ["notebooks", "render", "ok", "--runtime", "nosuch"])
    assert unknown.exit_code == 2 and "unknown framework 'nosuch'" in unknown.output, unknown.output


@pytest.mark.timeout(60)
@pytest.mark.needs("kubernetes-validate")
def test_jupyterlab_comes_from_the_operators_lab_image_or_is_installed_into_the_base_image_at_start() -> None:
    from kiln.backends.kubernetes.notebooks import LAB_DIR
    from kiln.domain.catalog import load_catalog_file
    from kiln.domain.notebooks import LAB_PACKAGES

    base = DEFAULT_CATALOG.resolve("pytorch", None)
    objects = rendered(notebook_job(env={"PIP_INDEX_URL": "https://pypi.example/simple", "OTHER": "x"}))
    pod = pod_of(objects)["spec"]
    container = container_of(objects)
    assert container["image"] == base.image  # the runtime's own image, JupyterLab added at start
    [install] = [c for c in pod["initContainers"] if c["name"] == "kiln-lab"]
    assert install["image"] == base.image and install["command"][-len(LAB_PACKAGES) :] == list(LAB_PACKAGES)
    assert f"--target {LAB_DIR}/site" in install["command"][2]
    assert {e["name"]: e.get("value") for e in install["env"]}["PIP_INDEX_URL"] == "https://pypi.example/simple"
    assert not {"OTHER", "KILN_JOB_TOKEN", "KILN_NOTEBOOK_TOKEN"} & {e["name"] for e in install["env"]}  # no secrets
    assert "nvidia.com/gpu" not in json.dumps(install["resources"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PYTHONPATH"].split(":")[0] == f"{LAB_DIR}/site"
    assert {"name": "kiln-lab", "mountPath": LAB_DIR, "readOnly": True} in container["volumeMounts"]

    own = DEFAULT_CATALOG.extended(
        load_catalog_file(
            f"- {{framework: pytorch, version: '{base.version}+lab', image: 'registry.example/pytorch-lab:1'}}\n",
            "extra.yaml",
        )
    )
    objects = rendered(catalog=own)
    assert container_of(objects)["image"] == "registry.example/pytorch-lab:1"  # the operator's, as it is
    assert not [c for c in pod_of(objects)["spec"].get("initContainers", []) if c["name"] == "kiln-lab"]
    for version in (OLDEST, VERSIONS[-1]):
        validate_strict(rendered(), version)
