"""Render a model service as Kubernetes manifests: a pure function, no cluster, no client library.

:func:`render_service` turns the service spec that runs on the local executor, unchanged, into plain dicts in
creation order: a Secret, the ConfigMap, a NetworkPolicy (``netpol.py``: only Kiln's router reaches the replicas;
their egress is an ``isolated`` job's), a Deployment of the replicas, a ClusterIP Service in front of them and,
with ``autoscale``, a HorizontalPodAutoscaler (``autoscaling/v2``). ``POST /api/v1/services:render`` and
``kiln services render`` print them; docs/kubernetes.md has the job side of the same mapping.

- **Replicas.** Each pod runs ``python -m kiln.injob.serve`` (the same replica server as on the local
  executor) with its configuration in ``$KILN_PARAMS_FILE`` (:func:`replica_params`: the keys the local replicas
  get). The module is shipped in the ConfigMap, like the job render ships ``kiln_sdk.py``, and a projected volume
  lays the ConfigMap's keys out as a package at ``/etc/kiln/pylib/kiln/injob/`` (``PYTHONPATH``), so no image
  needs Kiln installed. That copy comes first on ``PYTHONPATH``, before an image's own ``kiln``: the replica must
  speak the protocol of the server that rendered it.
- **Port and address.** A replica listens on ``KILN_REPLICA_HOST`` (``0.0.0.0``: the Service reaches the pod's
  IP, not its loopback) and ``KILN_REPLICA_PORT`` (:data:`REPLICA_PORT`, fixed: the Service's ``targetPort``),
  where the local executor's replicas take a free loopback port.
- **The replica's secret.** Every request to a replica carries ``Authorization: Bearer S`` (any pod of the
  cluster can reach a ClusterIP Service, as any job could reach the loopback). Here ``S`` cannot be made up by the
  replica and reported in a file as on the local executor: the Secret holds it (``replica-secret``) and the pod
  gets it as ``KILN_REPLICA_SECRET``; Kiln's router, which rendered it, sends it.
- **Probes.** Kubernetes probes cannot read a Secret (an ``httpGet`` probe's headers are literal text in the pod
  spec, readable by anyone who may read Deployments), and ``/healthz`` stays authenticated. So readiness (and
  startup, which gives a model up to :data:`STARTUP_SECONDS` to load) is an ``exec`` probe: ``replica.sh
  healthz`` asks ``GET /healthz`` on the loopback with ``$KILN_REPLICA_SECRET`` and passes only on ``{"ready":
  true}``, i.e. once the model has loaded — a bare TCP check could pass on a listening socket whose model is still
  loading or failed. Liveness is a ``tcpSocket`` check: it only has to notice a replica that stopped listening,
  and a replica busy with long predicts must not be restarted for answering its health check late.
- **Rolling updates** (a new model version, a new spec): the ConfigMap's name carries a hash of its contents, so
  any change gives the Deployment a new pod template; ``maxUnavailable: 0, maxSurge: 1`` brings each new replica up
  (ready) before an old one goes. A replica being stopped first waits :data:`DRAIN_SECONDS` (``preStop``) so the
  Service's endpoints drop it, then gets SIGTERM and finishes its in-flight requests (the grace period covers
  ``request_timeout``). Old ConfigMaps stay (the old pods still mount theirs) until the Deployment is deleted:
  with ``owner_uid`` everything is owned by it; :func:`service_selector` selects all of a service's objects.
- **Autoscale** renders a HorizontalPodAutoscaler on the external metric :data:`HPA_METRIC` (requests in flight,
  label ``service_id``), ``averageValue`` = ``target_concurrency``: the cluster needs a metrics adapter that
  serves it from Kiln's ``/metrics``. Its ``minReplicas`` is at least 1: an HPA does not scale to zero (that
  needs an alpha feature gate), so scale-to-zero (``min: 0``) is the local router's; here ``min: 0`` keeps one.
  The Deployment then has no ``replicas``: re-applying one would undo what the HPA chose.
- **The model** is staged by an init container (``podmodel.py``, beside ``podfetch.py`` whose download and code
  helpers it uses) into an emptyDir mounted read-only at ``/model``; a custom predictor's code bundle is unpacked
  into the working directory, which ``python -m`` puts on ``sys.path``.

- **Canary and shadow tracks** (``track``): a service's canary (or shadow) version is a Deployment, a ConfigMap,
  a NetworkPolicy and a ClusterIP Service of its own, named ``kiln-<service id>-canary`` (``-shadow``: see
  :func:`track_base`) and labelled ``kiln.io/track``, whose pods have the role ``canary-replica`` (``shadow-replica``)
  so that neither the stable Deployment's selector nor its Service's ever matches them. They share the stable
  track's Secret (one replica secret for the router), have fixed replicas and no HPA. Kiln's router weighs the
  tracks' Services (kiln.domain.traffic_split), not the cluster: a plain cluster has no weighting between two
  Services, and the rollout policy needs the per-version figures the router counts.

Resources, GPUs (``nvidia.com/gpu``, its toleration, ``/dev/shm``), ``gpu_type``, labels, pull secrets,
tolerations, the service account and the init container's security context are the job render's.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from kiln.backends.kubernetes.inputs import KubeConfig
from kiln.backends.kubernetes.names import (
    CONF_DIR,
    LABEL_ORG,
    LABEL_ROLE,
    MANAGED_BY,
    MAX_BASE,
    RUN_DIR,
    USER_LABEL_PREFIX,
    WORK_DIR,
    check_selector,
    dns_label,
    label_value,
    user_labels,
)
from kiln.backends.kubernetes.netpol import service_network_policy
from kiln.backends.kubernetes.render import (
    ANNOTATION_LABELS,
    GPU_RESOURCE,
    PARAMS_FILE,
    TOKEN_PLACEHOLDER,
    _k8s_escape,
    _quantity_cpu,
)
from kiln.domain.catalog import Catalog
from kiln.domain.serving import MODEL_DIR, ServiceSpec, replica_params
from kiln.errors import InvalidInput

LABEL_SERVICE = "kiln.io/service"
LABEL_SERVICE_NAME = "kiln.io/service-name"
LABEL_REVISION = "kiln.io/revision"
LABEL_TRACK = "kiln.io/track"  # on a canary's or shadow's objects only (the stable track's have none)
TRACKS = ("stable", "canary", "shadow")
ANNOTATION_MODEL = "kiln.io/model"
REPLICA_PORT = 8080
MODEL_STAGING = "/kiln/model"  # the same emptyDir, where the init container writes it
PYLIB = f"{CONF_DIR}/pylib"
DRAIN_SECONDS = 5  # preStop: time for the Service's endpoints to drop a stopping replica
STARTUP_SECONDS = 900  # how long a replica may take to load its model before it is restarted
HPA_METRIC = "kiln_service_requests_in_flight"  # external metric the HPA scales on, label HPA_METRIC_LABEL
HPA_METRIC_LABEL = "service_id"
SECRET_PLACEHOLDER = "REPLACE-WITH-THE-REPLICA-SECRET"
JOB_PLACEHOLDER = "REPLACE-WITH-THE-JOB-ID"
_HPA_MAX_WINDOW = 3600  # behavior.scaleDown.stabilizationWindowSeconds' maximum

# The replica's program, its probe and its drain: POSIX sh, in whatever image the service runs.
REPLICA_SCRIPT = r"""#!/bin/sh
# Rendered by Kiln (kiln.backends.kubernetes.serving): a model service replica. See docs/kubernetes.md.
#   replica.sh serve    run the replica server (PID 1 after exec: SIGTERM drains it)
#   replica.sh healthz  the startup/readiness probe: GET /healthz with the replica's secret, ready or not
#   replica.sh drain    the preStop hook: let the Service's endpoints drop this pod before SIGTERM
py=python3
command -v python3 >/dev/null 2>&1 || py=python
case "${1:-serve}" in
serve)
    exec "$py" -m kiln.injob.serve
    ;;
healthz)
    # -I: neither the work dir nor PYTHON* variables can change what the probe imports.
    exec "$py" -I - <<'EOF'
import json, os, sys, urllib.request
url = "http://127.0.0.1:%s/healthz" % os.environ.get("KILN_REPLICA_PORT", "8080")
request = urllib.request.Request(url, headers={"Authorization": "Bearer " + os.environ.get("KILN_REPLICA_SECRET", "")})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through the user's proxy
try:
    with opener.open(request, timeout=4) as response:
        ready = json.load(response).get("ready") is True
except Exception as exc:
    sys.exit("kiln replica not ready: %s" % exc)
if not ready:
    sys.exit("kiln replica not ready: /healthz says so")
EOF
    ;;
drain)
    sleep "${KILN_DRAIN_SECONDS:-5}"
    ;;
*)
    echo "replica.sh: unknown step ${1}" >&2
    exit 2
    ;;
esac
"""


def service_base(service_id: str) -> str:
    """The name of the service's Deployment, Service, Secret and HPA: ``kiln-<service id>``."""
    return dns_label(f"kiln-{service_id}", MAX_BASE)


def track_base(service_id: str, track: str = "stable") -> str:
    """The name of a track's Deployment, Service and NetworkPolicy: the service's base for the stable track,
    ``<base>-canary`` / ``<base>-shadow`` for the others (within the same length as any base)."""
    _check_track(track)
    if track == "stable":
        return service_base(service_id)
    return dns_label(f"kiln-{service_id}-{track}", MAX_BASE)


def service_selector(service_id: str, track: str | None = None) -> str:
    """A label selector of every object Kiln created for the service (``track`` None), or of its canary's or
    shadow's only."""
    selector = f"{MANAGED_BY}=kiln,{LABEL_SERVICE}={label_value(service_id)}"
    if track is not None:
        _check_track(track)
        if track == "stable":
            raise InvalidInput("the stable track's objects are selected with the service's")
        selector += f",{LABEL_TRACK}={track}"
    return selector


def service_url(service_id: str, cfg: KubeConfig, track: str = "stable") -> str:
    """Where Kiln's router reaches a track's replicas: its ClusterIP Service's name in the namespace."""
    suffix = f"svc.{cfg.cluster_domain}" if cfg.cluster_domain else "svc"
    return f"http://{track_base(service_id, track)}.{cfg.namespace}.{suffix}:{REPLICA_PORT}"


def _check_track(track: str) -> None:
    if track not in TRACKS:
        raise InvalidInput(f"track: expected one of {', '.join(TRACKS)}, got {track!r}")


def _image(spec: ServiceSpec, catalog: Catalog) -> str:
    runtime = spec.runtime
    if runtime.python:
        raise InvalidInput(
            f"runtime.python ({runtime.python}) names an interpreter on the host, which does not exist on "
            "Kubernetes: give runtime.image (your own image) or runtime.framework (a catalog image)"
        )
    if runtime.image:
        return runtime.image
    entry = catalog.resolve(runtime.framework or "python", runtime.version)
    if not entry.image:
        raise InvalidInput(f"runtime {runtime.label}: the catalog entry has no image for container backends")
    return str(entry.image)


def _shipped_files() -> tuple[dict[str, str], list[dict[str, str]]]:
    """The ConfigMap's program files and the projected volume's items laying them out: the scripts at
    ``/etc/kiln``, and ``kiln`` (the metrics SDK as its ``__init__``) + ``kiln.injob.serve*`` under ``pylib``."""
    here = Path(__file__).parent
    runtime = here.parents[1] / "injob"
    files = {
        "replica.sh": REPLICA_SCRIPT,
        **{name: (here / name).read_text(encoding="utf-8") for name in ("podfetch.py", "podmodel.py")},
        "kiln_sdk.py": (runtime / "metrics_sdk.py").read_text(encoding="utf-8"),
        "kiln_injob.py": '"""kiln.injob, as shipped to a service replica: the replica server only."""\n',
    }
    items = [{"key": k, "path": k} for k in ("replica.sh", "podfetch.py", "podmodel.py", PARAMS_FILE)]
    items += [
        {"key": "kiln_sdk.py", "path": "pylib/kiln/__init__.py"},
        {"key": "kiln_injob.py", "path": "pylib/kiln/injob/__init__.py"},
    ]
    # serve.py and the helper modules it may import (serve_*.py, statefile.py): all standard library, none imports
    # more of Kiln.
    for module in [runtime / "serve.py", *sorted(runtime.glob("serve_*.py")), runtime / "statefile.py"]:
        files[module.name] = module.read_text(encoding="utf-8")
        items.append({"key": module.name, "path": f"pylib/kiln/injob/{module.name}"})
    return files, items


def render_service(
    service_id: str,
    org_id: str,
    spec: ServiceSpec,
    model: tuple[str, int],
    cfg: KubeConfig,
    catalog: Catalog | None = None,
    endpoint: str = "http://kiln:8080",
    *,
    revision: int = 1,
    image: str | None = None,
    code_sha256: str | None = None,
    job_id: str | None = None,
    token: str | None = None,
    replica_secret: str | None = None,
    owner_uid: str | None = None,
    track: str = "stable",
) -> list[dict[str, Any]]:
    """The manifests of a service, in creation order: Secret, ConfigMap, NetworkPolicy, Deployment, Service and,
    with ``autoscale``, the HorizontalPodAutoscaler. ``track`` "canary" or "shadow": that track's ConfigMap,
    NetworkPolicy, Deployment (``spec.replicas``; the caller fixes them) and Service only, under
    :func:`track_base`'s name; its pods use the stable track's Secret.

    ``model``: the version the spec's ``model`` resolved to (name, number). ``token``: the Bearer credential the
    init container reads the model version (and, with ``code_sha256``, job ``job_id``'s code bundle) with;
    ``replica_secret``: what every request to a replica must carry (keep it across revisions: the router sends
    one secret). Both are placeholders when None, as is the job id. ``owner_uid``: the Deployment's uid, once
    created; every other object is then owned by it."""
    from kiln.domain.catalog import DEFAULT_CATALOG

    name, version = model
    if not name or isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidInput(f"model: expected the resolved (name, version number), got {model!r}")
    if revision < 1:
        raise InvalidInput("revision must be >= 1")
    image = image or _image(spec, catalog or DEFAULT_CATALOG)
    secret_name = service_base(service_id)  # the stable track's Secret: one replica secret for every track
    base = track_base(service_id, track)
    stable = track == "stable"
    if not stable:
        spec = spec.model_copy(update={"autoscale": None})  # fixed replicas: no HPA
    ns = cfg.namespace
    extra_labels, mapping = user_labels(spec.labels)
    renamed = any(key != USER_LABEL_PREFIX + k or value != spec.labels[k] for k, (key, value) in mapping.items())
    replica_role = "replica" if stable else f"{track}-replica"  # outside the stable selectors
    selector = {LABEL_SERVICE: label_value(service_id), LABEL_ROLE: replica_role}

    def labels(role: str) -> dict[str, str]:
        return {
            **extra_labels,
            MANAGED_BY: "kiln",
            LABEL_SERVICE: label_value(service_id),
            LABEL_SERVICE_NAME: label_value(spec.name),
            LABEL_ORG: label_value(org_id),
            LABEL_ROLE: role,
            **({} if stable else {LABEL_TRACK: track}),
        }

    def meta(object_name: str, role: str, owned: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"name": object_name, "namespace": ns, "labels": labels(role)}
        if renamed:
            out["annotations"] = {ANNOTATION_LABELS: json.dumps(spec.labels, sort_keys=True, separators=(",", ":"))}
        if owned and owner_uid:
            out["ownerReferences"] = [
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": base, "uid": owner_uid, "controller": True}
            ]
        return out

    # Not immutable (unlike a job attempt's): the service outlives a token, and the replica secret must stay.
    objects: list[dict[str, Any]] = []
    if stable:
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": meta(base, "shared"),
                "type": "Opaque",
                "stringData": {
                    "token": token or TOKEN_PLACEHOLDER,
                    "replica-secret": replica_secret or SECRET_PLACEHOLDER,
                },
            }
        )

    files, items = _shipped_files()
    files[PARAMS_FILE] = json.dumps(replica_params(spec, model), sort_keys=True)
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:10]
    config_name = f"{base}-{digest}"  # a new name per content: a change rolls the Deployment
    config_meta = meta(config_name, "shared")
    config_meta["labels"][LABEL_REVISION] = str(revision)
    objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": config_meta, "immutable": True, "data": files})

    # Resources, GPUs, node selection: the job render's.
    res = spec.resources
    compute: dict[str, str] = {"cpu": _quantity_cpu(res.cpus)}
    if res.memory is not None:
        compute["memory"] = str(res.memory)
    requests, limits = dict(compute), dict(compute)
    if res.gpus:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(res.gpus)
    tolerations = [dict(t) for t in cfg.tolerations]
    if res.gpus and not any(t.get("key") == GPU_RESOURCE for t in tolerations):
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    node_selector: dict[str, str] = {}
    if res.gpu_type:
        value = cfg.gpu_types.get(res.gpu_type, res.gpu_type)
        check_selector(cfg.gpu_type_label, value, "resources.gpu_type")
        node_selector[cfg.gpu_type_label] = value

    endpoint = endpoint.rstrip("/")
    model_ref = f"{name}@{version}"
    token_ref = {"secretKeyRef": {"name": secret_name, "key": "token"}}
    user_path = spec.env.get("PYTHONPATH")
    env: dict[str, str] = {
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": str(max(1, int(res.cpus))),
        **spec.env,
        "PYTHONDONTWRITEBYTECODE": "1",  # the package is on a read-only volume
        "PYTHONPATH": PYLIB + (f":{user_path}" if user_path else ""),
        "KILN_SERVICE_ID": service_id,
        "KILN_SERVICE": spec.name,
        "KILN_MODEL": model_ref,
        "KILN_WORK_DIR": WORK_DIR,
        "KILN_PARAMS_FILE": f"{CONF_DIR}/{PARAMS_FILE}",
        "KILN_REPLICA_HOST": "0.0.0.0",
        "KILN_REPLICA_PORT": str(REPLICA_PORT),
        "KILN_DRAIN_SECONDS": str(DRAIN_SECONDS),
        "KILN_NUM_CPUS": f"{res.cpus:g}",
        "KILN_NUM_GPUS": str(res.gpus),
        "KILN_ENDPOINT": endpoint,
    }
    volumes: list[dict[str, Any]] = [
        {
            "name": "kiln-conf",
            "projected": {"defaultMode": 0o444, "sources": [{"configMap": {"name": config_name, "items": items}}]},
        },
        *({"name": v, "emptyDir": {}} for v in ("kiln-work", "kiln-model", "kiln-run")),
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "kiln-conf", "mountPath": CONF_DIR, "readOnly": True},
        {"name": "kiln-work", "mountPath": WORK_DIR},
        {"name": "kiln-model", "mountPath": MODEL_DIR, "readOnly": True},
    ]
    if res.gpus:  # data loaders and NCCL need more than the runtime's 64 MiB /dev/shm
        volumes.append({"name": "kiln-shm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "kiln-shm", "mountPath": "/dev/shm"})

    fetch_env = {
        "KILN_ENDPOINT": _k8s_escape(endpoint),
        "KILN_MODEL": _k8s_escape(model_ref),
        "KILN_MODEL_DIR": MODEL_STAGING,
        "KILN_CODE_SHA256": code_sha256 or "",
        "KILN_JOB_ID": _k8s_escape(job_id or (JOB_PLACEHOLDER if code_sha256 else "")),
        "KILN_WORK_DIR": WORK_DIR,
        "TMPDIR": RUN_DIR,
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    fetch_container = {
        "name": "kiln-fetch",
        "image": cfg.init_image,
        "command": ["python3", f"{CONF_DIR}/podmodel.py"],
        "env": [
            *({"name": k, "value": v} for k, v in fetch_env.items()),
            {"name": "KILN_JOB_TOKEN", "valueFrom": token_ref},
        ],
        "resources": {"requests": dict(compute), "limits": dict(compute)},
        "volumeMounts": [
            {"name": "kiln-conf", "mountPath": CONF_DIR, "readOnly": True},
            {"name": "kiln-work", "mountPath": WORK_DIR},
            {"name": "kiln-model", "mountPath": MODEL_STAGING},
            {"name": "kiln-run", "mountPath": RUN_DIR},
        ],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True},
    }

    script = ["/bin/sh", f"{CONF_DIR}/replica.sh"]
    healthz = {"exec": {"command": [*script, "healthz"]}, "timeoutSeconds": 5}
    container: dict[str, Any] = {
        "name": "replica",
        "image": image,
        "command": script,
        "args": ["serve"],
        "workingDir": WORK_DIR,
        "ports": [{"name": "http", "containerPort": REPLICA_PORT, "protocol": "TCP"}],
        "env": [
            *({"name": k, "value": _k8s_escape(v)} for k, v in env.items()),
            {"name": "KILN_REPLICA_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "KILN_REPLICA_SECRET",
                "valueFrom": {"secretKeyRef": {"name": secret_name, "key": "replica-secret"}},
            },
        ],
        "resources": {"requests": requests, "limits": limits},
        "volumeMounts": mounts,
        "startupProbe": {**healthz, "periodSeconds": 5, "failureThreshold": STARTUP_SECONDS // 5},
        "readinessProbe": {**healthz, "periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {
            "tcpSocket": {"port": "http"},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "lifecycle": {"preStop": {"exec": {"command": [*script, "drain"]}}},
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    pod: dict[str, Any] = {
        # preStop, then the in-flight requests (each at most request_timeout) finish before SIGKILL.
        "terminationGracePeriodSeconds": max(
            cfg.termination_grace_seconds, DRAIN_SECONDS + math.ceil(spec.request_timeout) + 5
        ),
        "enableServiceLinks": False,
        "initContainers": [fetch_container],
        "containers": [container],
        "volumes": volumes,
    }
    if cfg.service_account:
        pod["serviceAccountName"] = cfg.service_account
    else:
        pod["automountServiceAccountToken"] = False
    if node_selector:
        pod["nodeSelector"] = node_selector
    if tolerations:
        pod["tolerations"] = tolerations
    if cfg.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in cfg.image_pull_secrets]

    # Before the Deployment: no replica runs without it. Requests from Kiln's router only (netpol.py).
    policy_selector = {MANAGED_BY: "kiln", **selector}
    objects.append(service_network_policy(meta(base, "shared"), policy_selector, REPLICA_PORT, cfg, cfg.egress_rules))

    template_labels = {**labels(replica_role), LABEL_REVISION: str(revision)}
    deployment_spec: dict[str, Any] = {
        "selector": {"matchLabels": selector},
        # A new replica is ready before an old one goes: never fewer ready replicas than wanted during an update.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "template": {
            "metadata": {"labels": template_labels, "annotations": {ANNOTATION_MODEL: model_ref}},
            "spec": pod,
        },
    }
    if spec.autoscale is None:
        deployment_spec = {"replicas": spec.replicas, **deployment_spec}
    deployment_meta = meta(base, replica_role, owned=False)
    deployment_meta.setdefault("annotations", {})[ANNOTATION_MODEL] = model_ref
    objects.append(
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": deployment_meta, "spec": deployment_spec}
    )

    objects.append(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(base, "shared"),
            "spec": {
                "type": "ClusterIP",
                "selector": selector,
                "ports": [{"name": "http", "port": REPLICA_PORT, "targetPort": "http", "protocol": "TCP"}],
            },
        }
    )

    auto = spec.autoscale
    if auto is not None:
        objects.append(
            {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": meta(base, "shared"),
                "spec": {
                    "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": base},
                    # An HPA never scales to zero (without an alpha feature gate): scale-to-zero is the local
                    # router's, so min: 0 keeps one replica here.
                    "minReplicas": max(1, auto.min),
                    "maxReplicas": auto.max,
                    "metrics": [
                        {
                            "type": "External",
                            "external": {
                                "metric": {
                                    "name": HPA_METRIC,
                                    "selector": {"matchLabels": {HPA_METRIC_LABEL: label_value(service_id)}},
                                },
                                "target": {
                                    "type": "AverageValue",
                                    "averageValue": _quantity_cpu(auto.target_concurrency),
                                },
                            },
                        }
                    ],
                    # Load must stay low this long before replicas go (the local router's idle_seconds).
                    "behavior": {
                        "scaleDown": {"stabilizationWindowSeconds": min(_HPA_MAX_WINDOW, math.ceil(auto.idle_seconds))}
                    },
                },
            }
        )
    return objects
