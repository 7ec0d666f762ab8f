"""One start of a notebook on Kubernetes as manifests: a pure function, no cluster, no client library.

A notebook's start is a job (``kiln.usecases.notebooks.job_spec``, passed in: the use cases sit above the
backends), so :func:`render_notebook` renders it with :func:`~kiln.backends.kubernetes.render.render`, unchanged,
and adjusts what a notebook needs on a cluster:

- JupyterLab listens on TCP port :data:`NOTEBOOK_PORT` in the pod (the launcher's ``port`` param, see
  kiln.injob.notebook), not on a Unix socket that Kiln's server, outside the pod, could not reach; its token is one
  Kiln injects: the attempt's Secret gets a ``notebook-token`` key (a placeholder when rendered client-side, as the
  job token), read into ``$KILN_NOTEBOOK_TOKEN``, never written inline;
- the launcher itself (kiln.injob's notebook, notebook_home and statefile modules, standard library only) is
  shipped in a ConfigMap mounted at :data:`LAUNCHER_DIR`: the pod's image has no Kiln, and ``python -m`` would
  find the metrics SDK's one-module ``kiln`` (entrypoint.sh) instead;
- ``$HOME`` is an emptyDir at :data:`HOME_DIR` (the home the launcher restores and saves, as the local
  executor's), and each dataset input at ``/data/NAME`` is mounted at ``<work dir>/data/NAME`` too, read-only,
  so the launcher links it into the home as ``data/`` as it does on the local executor;
- a ClusterIP Service named from the attempt (:func:`notebook_service_name`: each start's own, so a start never
  meets the objects of the one before it, still being removed) selects exactly this attempt's pod on
  :data:`NOTEBOOK_PORT`, where Kiln's proxy reaches it (the backend's ``notebook_address``: the Service's cluster
  IP and the token in the attempt's Secret);
- a NetworkPolicy admits only Kiln's server pods to that port (the attempt's own policy, render.py's, admits only
  the attempt's pods and the server pods anyway; NetworkPolicies add up, never subtract). ``network: host`` is
  refused: no NetworkPolicy applies to a ``hostNetwork`` pod, and the node's port would be open to anyone;
- the image: the catalog's entry for the runtime's ``+lab`` version where the operator's catalog has one (an
  image with JupyterLab in it), else the base version's image, into which an init container (``kiln-lab``, the
  same image) installs the variant's packages (``jupyterlab``) with the image's own pip into an emptyDir at
  :data:`LAB_DIR`, on the job container's ``PYTHONPATH``: the pod needs a package index then (PyPI, or
  ``PIP_INDEX_URL`` in the notebook's ``env``, which the init container gets with every other ``PIP_*``);
- every object carries ``kiln.io/notebook: <id>`` beside the labels every object of an attempt carries.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

from kiln.backends.capabilities import NotebookAddress
from kiln.backends.kubernetes.inputs import KubeConfig, RenderInput, resolve_image
from kiln.backends.kubernetes.kubeapi import KubeObjects
from kiln.backends.kubernetes.names import (
    LABEL_ATTEMPT,
    LABEL_JOB,
    MANAGED_BY,
    WORK_DIR,
    base_name,
    label_value,
)

# The server peer of every other NetworkPolicy of Kiln's (netpol.py): the server pods, in their namespace.
from kiln.backends.kubernetes.netpol import _server_peer
from kiln.backends.kubernetes.render import render
from kiln.domain.catalog import DEFAULT_CATALOG, Catalog
from kiln.domain.notebooks import LAB_PACKAGES, NOTEBOOK_LABEL
from kiln.domain.spec import JobSpec, command_argv
from kiln.errors import InvalidInput

Obj = dict[str, Any]
LABEL_NOTEBOOK = "kiln.io/notebook"
NOTEBOOK_PORT = 8888
PORT_NAME = "jupyterlab"
TOKEN_KEY = "notebook-token"  # in the attempt's Secret, beside the job token
TOKEN_ENV = "KILN_NOTEBOOK_TOKEN"  # what the launcher reads (kiln.injob.notebook.TOKEN_ENV)
NOTEBOOK_TOKEN_PLACEHOLDER = "REPLACE-WITH-THE-NOTEBOOK-TOKEN"
HOME_DIR = "/kiln/home"
LAB_DIR = "/kiln/lab"  # the init container's install of JupyterLab: LAB_DIR/site on PYTHONPATH
LAUNCHER_DIR = "/kiln/notebook-launcher"
LAUNCHER_MODULES = ("__init__.py", "notebook.py", "notebook_home.py", "statefile.py")  # of kiln.injob
PACKAGE_KEY = "kiln-package.py"
# `python -m kiln.injob.notebook` with the shipped package first on sys.path (only in the launcher's process:
# PYTHONPATH, which kernels inherit, keeps the metrics SDK's `kiln`).
LAUNCHER_ARGS = [
    "python",
    "-c",
    f"import runpy, sys; sys.path.insert(0, {LAUNCHER_DIR!r}); "
    "runpy.run_module('kiln.injob.notebook', run_name='__main__', alter_sys=True)",
]


def notebook_of(spec: JobSpec) -> str | None:
    """The notebook whose start ``spec`` is (kiln.usecases.notebooks.job_spec labels it), or None; InvalidInput
    for a TensorBoard."""
    notebook = spec.labels.get(NOTEBOOK_LABEL)
    if notebook is not None and command_argv(spec.command)[-1:] == ["kiln.injob.tensorboard"]:
        raise InvalidInput(
            "TensorBoard sessions run on the local executor only: TensorBoard has no token of its own, so on a "
            "cluster nothing but the network would guard it; open the jobs' event files with `kiln jobs files` "
            "(the `tensorboard/` prefix), or run TensorBoard on a server with the local executor",
            details={"field": "spec.kind"},
        )
    return notebook


def read_notebook_address(kube: KubeObjects, job_id: str, attempt: int) -> NotebookAddress | None:
    """The notebook Service's cluster IP on port 8888 and the token in the attempt's Secret; None while the
    Service has no IP (or either object is missing)."""
    service = kube.read("Service", notebook_service_name(job_id, attempt))
    secret = kube.read("Secret", base_name(job_id, attempt))
    ip = str(((service or {}).get("spec") or {}).get("clusterIP") or "")
    encoded = ((secret or {}).get("data") or {}).get(TOKEN_KEY)
    if not ip or ip == "None" or not encoded:
        return None
    token = base64.b64decode(encoded).decode()
    host = f"[{ip}]" if ":" in ip else ip
    return NotebookAddress(f"http://{host}:{NOTEBOOK_PORT}", token)


def notebook_service_name(job_id: str, attempt: int) -> str:
    """The Service, NetworkPolicy and launcher ConfigMap of one start of a notebook: ``<attempt's base>-notebook``
    (three kinds: one name)."""
    return f"{base_name(job_id, attempt)}-notebook"


def render_notebook(
    notebook_id: str,
    spec: JobSpec,
    job_id: str,
    org_id: str,
    attempt: int,
    cfg: KubeConfig,
    *,
    image: str | None = None,
    endpoint: str = "http://kiln:8080",
    token: str | None = None,
    notebook_token: str | None = None,
    owner_uid: str | None = None,
    catalog: Catalog | None = None,
) -> list[Obj]:
    """The manifests of one start of notebook ``notebook_id`` whose job (``spec``, from
    ``kiln.usecases.notebooks.job_spec``) is ``job_id`` attempt ``attempt``: render()'s objects adjusted (see the
    module docstring), then the launcher's ConfigMap, the Service and the NetworkPolicy, in creation order (the Job
    last). ``token``/``notebook_token`` None: placeholders (a client-side render); ``catalog``: the server's (the
    built-in one by default), where the runtime's image comes from."""
    if spec.network == "host":
        raise InvalidInput(
            "network: host cannot run a notebook on Kubernetes: no NetworkPolicy applies to a pod on the node's "
            "network, so JupyterLab's port would be open to anyone who reaches the node; use network: isolated",
            details={"field": "spec.network"},
        )
    if spec.distributed is not None:
        raise InvalidInput("a notebook runs one pod: it has no `distributed`", details={"field": "spec.distributed"})
    launched = spec.model_copy(update={"params": {**spec.params, "port": NOTEBOOK_PORT}})
    runtime = spec.runtime
    entry = (catalog or DEFAULT_CATALOG).resolve(runtime.framework or "python", runtime.version)
    image = image or resolve_image(spec, catalog or DEFAULT_CATALOG)
    job = RenderInput(
        job_id, org_id, attempt, launched, image=image, endpoint=endpoint, token=token, owner_uid=owner_uid
    )
    objects = render(job, cfg)
    notebook = label_value(notebook_id)
    for obj in objects:
        obj["metadata"]["labels"][LABEL_NOTEBOOK] = notebook
    secret = next(o for o in objects if o["kind"] == "Secret")
    secret["stringData"][TOKEN_KEY] = notebook_token or NOTEBOOK_TOKEN_PLACEHOLDER
    main = objects[-1]  # render(): the main Job last, and a single pod's job has no other
    pod = main["spec"]["template"]
    pod["metadata"]["labels"][LABEL_NOTEBOOK] = notebook
    selector = {
        MANAGED_BY: "kiln",
        LABEL_JOB: label_value(job_id),
        LABEL_ATTEMPT: str(attempt),
        LABEL_NOTEBOOK: notebook,
    }
    name = notebook_service_name(job_id, attempt)
    launcher = _launcher_config_map(secret["metadata"], name)
    _adjust_pod(pod["spec"], secret["metadata"]["name"], name, spec)
    if entry.derived:
        _install_lab(pod["spec"], image)
    service: Obj = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(secret["metadata"], name),
        "spec": {
            "type": "ClusterIP",
            "selector": dict(selector),
            "ports": [{"name": PORT_NAME, "port": NOTEBOOK_PORT, "targetPort": PORT_NAME, "protocol": "TCP"}],
        },
    }
    policy: Obj = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(secret["metadata"], name),
        "spec": {
            "podSelector": {"matchLabels": dict(selector)},
            "policyTypes": ["Ingress"],  # egress stays the attempt's policy's
            "ingress": [{"from": [_server_peer(cfg)], "ports": [{"protocol": "TCP", "port": NOTEBOOK_PORT}]}],
        },
    }
    # Before the Job: the launcher's files and the policy exist before the pod does.
    return [*objects[:-1], launcher, policy, service, main]


def _meta(shared: Obj, name: str) -> Obj:
    """``shared`` (the Secret's metadata: labels, annotations, owner) under another name."""
    out = copy.deepcopy(shared)
    out["name"] = name
    return out


def _launcher_config_map(shared: Obj, name: str) -> Obj:
    source = Path(__file__).parents[2] / "injob"
    data = {name: (source / name).read_text(encoding="utf-8") for name in LAUNCHER_MODULES}
    data[PACKAGE_KEY] = ""  # an empty `kiln` package: the launcher's alone
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(shared, name),
        "immutable": True,
        "data": data,
    }


def _adjust_pod(pod: Obj, secret: str, launcher: str, spec: JobSpec) -> None:
    """The job container runs the shipped launcher, on TCP, with the injected token and its own home."""
    container = next(c for c in pod["containers"] if c["name"] == "job")
    container["args"] = list(LAUNCHER_ARGS)
    env = [e for e in container["env"] if e["name"] not in ("HOME", TOKEN_ENV)]
    env += [
        {"name": "HOME", "value": HOME_DIR},
        {"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": secret, "key": TOKEN_KEY}}},
    ]
    container["env"] = env
    container["ports"] = [{"name": PORT_NAME, "containerPort": NOTEBOOK_PORT, "protocol": "TCP"}]
    # The Service sends to the pod once JupyterLab listens (its token keeps the answers to Kiln's proxy).
    container["readinessProbe"] = {"tcpSocket": {"port": PORT_NAME}, "periodSeconds": 5}
    items = [{"key": name, "path": f"kiln/injob/{name}"} for name in LAUNCHER_MODULES]
    items.append({"key": PACKAGE_KEY, "path": "kiln/__init__.py"})
    pod["volumes"] += [
        {"name": "kiln-notebook-home", "emptyDir": {}},
        {"name": "kiln-notebook-launcher", "configMap": {"name": launcher, "defaultMode": 0o444, "items": items}},
    ]
    mounts = container["volumeMounts"]
    mounts += [
        {"name": "kiln-notebook-home", "mountPath": HOME_DIR},
        {"name": "kiln-notebook-launcher", "mountPath": LAUNCHER_DIR, "readOnly": True},
    ]
    for i, item in enumerate(spec.inputs):  # render() mounts input i as volume kiln-input-i at item.where
        if item.dataset is not None and item.path is None:
            mounts.append({"name": f"kiln-input-{i}", "mountPath": f"{WORK_DIR}{item.where}", "readOnly": True})


def _install_lab(pod: Obj, image: str) -> None:
    """An init container that installs JupyterLab with the image's pip into an emptyDir on PYTHONPATH."""
    container = next(c for c in pod["containers"] if c["name"] == "job")
    script = (
        f"set -e; mkdir -p {LAB_DIR}/tmp; py=$(command -v python3 || command -v python); "
        f'exec "$py" -m pip install --no-cache-dir --disable-pip-version-check --no-warn-script-location '
        f'--target {LAB_DIR}/site "$@"'
    )
    env = [e for e in container["env"] if e["name"].startswith("PIP_") and "value" in e]
    env += [{"name": "HOME", "value": f"{LAB_DIR}/tmp"}, {"name": "TMPDIR", "value": f"{LAB_DIR}/tmp"}]
    install = {
        "name": "kiln-lab",
        "image": image,
        "command": ["/bin/sh", "-c", script, "kiln-lab", *LAB_PACKAGES],
        "env": env,
        "resources": {  # the job's cpu and memory (a pod's request is the larger of an init container's and the rest)
            part: {k: v for k, v in amounts.items() if k in ("cpu", "memory")}
            for part, amounts in container["resources"].items()
        },
        "volumeMounts": [{"name": "kiln-lab", "mountPath": LAB_DIR}],
        "securityContext": dict(container.get("securityContext") or {}),
    }
    pod["initContainers"] = [*pod.get("initContainers", []), install]
    pod["volumes"].append({"name": "kiln-lab", "emptyDir": {}})
    container["volumeMounts"].append({"name": "kiln-lab", "mountPath": LAB_DIR, "readOnly": True})
    path = next((e for e in container["env"] if e["name"] == "PYTHONPATH" and "value" in e), None)
    if path is None:
        container["env"].append({"name": "PYTHONPATH", "value": f"{LAB_DIR}/site"})
    else:
        path["value"] = f"{LAB_DIR}/site:{path['value']}"
