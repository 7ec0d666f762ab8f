"""Render one attempt of a Kiln job as Kubernetes manifests: a pure function, no cluster, no client library.

:func:`render` turns the job spec that runs on the local executor, unchanged, into plain dicts
(``apiVersion``/``kind``/``metadata``/``spec``) that a controller creates in order, or that
``kiln jobs render --backend kubernetes`` prints. docs/kubernetes.md has the mapping table; in short:

- a single-worker job is one ``batch/v1`` Job; a distributed job is an Indexed Job of its workers
  (``completionMode: Indexed``, ``parallelism = completions = workers``) plus a headless Service whose name is
  every pod's ``subdomain``, so worker ``i`` is reachable at ``<base>-worker-i.<base>.<namespace>.svc``;
  TensorFlow parameter servers are a second Indexed Job ``<base>-ps`` in the same gang;
- the rendezvous environment is :func:`kiln.domain.distributed.member_env`'s, computed for every member and
  every local process with those DNS names as hosts, and delivered as env files in the attempt's ConfigMap: the
  entrypoint sources ``gang.env`` (values every process shares) and then ``ROLE-INDEX-LOCAL.env`` (values that
  differ), picking INDEX from ``$JOB_COMPLETION_INDEX``;
- a Secret holds the job token; an init container (the ``init_image``) fetches the code bundle, the staged
  datasets and the job's stored checkpoints from the Kiln API with it (``podfetch.py``, shipped in the
  ConfigMap); a native sidecar (an init container with ``restartPolicy: Always``) uploads the checkpoints every
  ``checkpoint_sync_seconds`` and, when the command has ended, the outputs (``podsync.py``), while the
  entrypoint waits for it (at most ``upload_timeout`` seconds);
- ``backoffLimit: 0`` (Kiln restarts whole gangs itself: ``max_restarts``), ``activeDeadlineSeconds`` = the
  spec's timeout, ``ttlSecondsAfterFinished`` from the settings, ``restartPolicy: Never``;
- every object carries ``app.kubernetes.io/managed-by: kiln``, ``kiln.io/job``, ``kiln.io/org``,
  ``kiln.io/attempt`` and ``kiln.io/role``; with ``owner_uid`` (the main Job's uid, known once it is created)
  every other object gets an ownerReference to the main Job, so deleting that Job (or its TTL) removes all;
  without it, :func:`cleanup_selector` selects everything of the attempt.

Names are deterministic: ``kiln-<job id>-a<attempt>``, cleaned into a DNS-1123 label and, when anything had
to change or it is too long, suffixed with a hash of the original (:func:`dns_label`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kiln.backends.kubernetes.entrypoint import entrypoint
from kiln.domain.distributed import Member, gang_members, hostfile_text, member_env
from kiln.domain.spec import JobSpec, command_argv, input_env_name
from kiln.errors import InvalidInput

MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_JOB = "kiln.io/job"
LABEL_ORG = "kiln.io/org"
LABEL_ATTEMPT = "kiln.io/attempt"
LABEL_ROLE = "kiln.io/role"
USER_LABEL_PREFIX = "label.kiln.io/"
ANNOTATION_LABELS = "kiln.io/labels"  # the user's labels as given (JSON), when any had to be renamed
ANNOTATION_SUCCESS_INDEX = "kiln.io/success-index"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
GPU_RESOURCE = "nvidia.com/gpu"
TOKEN_PLACEHOLDER = "REPLACE-WITH-THE-JOB-TOKEN"
SSH_KEY_PLACEHOLDER = "REPLACE-WITH-AN-SSH-KEY"

CONF_DIR = "/etc/kiln"
WORK_DIR = "/kiln/work"
OUTPUT_DIR = "/kiln/outputs"
CHECKPOINT_DIR = "/kiln/checkpoints"
METRICS_DIR = "/kiln/metrics"
RUN_DIR = "/kiln/run"
INPUTS_STAGING = "/kiln/inputs"
HOSTFILE = f"{CONF_DIR}/hostfile"
SSH_DIR = f"{CONF_DIR}/ssh"

MAX_BASE = 44  # "<base>-worker-255" (a pod's hostname) and "<base>-env-99" stay within 63
CONFIGMAP_BYTES = 900_000  # one ConfigMap holds at most 1 MiB; the env files spill into more
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_MIN_SUCCESS_POLICY = (1, 31)  # Job successPolicy: beta and on by default from Kubernetes 1.31

GangScheduler = Literal["kueue", "volcano"]


# -- names -----------------------------------------------------------------------------------------------


def _digest(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def dns_label(text: str, max_len: int = 63) -> str:
    """``text`` as an RFC 1035 label (lowercase letters, digits, ``-``; starts with a letter; ``max_len``):
    unchanged when it already is one, else cleaned and suffixed with ``-`` + 8 hex digits of its SHA-256,
    so two different inputs never collide by cleaning and the same input always gives the same name."""
    if len(text) <= max_len and _DNS_LABEL.match(text):
        return text
    clean = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")
    if not clean or not clean[0].isalpha():
        clean = "k-" + clean
    clean = clean[: max_len - 9].rstrip("-")
    return f"{clean}-{_digest(text)}"


def label_value(text: str) -> str:
    """``text`` as a label value (≤ 63, alphanumerics and ``-_.``, alphanumeric at both ends): unchanged when
    valid, else cleaned, cut and suffixed with a hash of the original."""
    if len(text) <= 63 and _LABEL_VALUE.match(text):
        return text
    clean = re.sub(r"[^A-Za-z0-9_.-]", "-", text)
    clean = re.sub(r"^[^A-Za-z0-9]+", "", clean)[:54]
    clean = re.sub(r"[^A-Za-z0-9]+$", "", clean)
    return f"{clean}-{_digest(text)}" if clean else f"h-{_digest(text)}"


def user_labels(labels: dict[str, str]) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """The job's own labels as Kubernetes labels, all under ``label.kiln.io/`` (never clashing with Kiln's
    or anyone's), and the mapping ``{original key: (label key, label value)}``. A key or value that is not a
    valid label name/value is renamed deterministically (:func:`label_value`)."""
    out: dict[str, str] = {}
    mapping: dict[str, tuple[str, str]] = {}
    for key in sorted(labels):
        name = key if len(key) <= 63 and _LABEL_NAME.match(key) else label_value(key.replace("/", "_"))
        if not _LABEL_NAME.match(name):
            name = f"h-{_digest(key)}"
        pair = (USER_LABEL_PREFIX + name, label_value(labels[key]))
        out[pair[0]] = pair[1]
        mapping[key] = pair
    return out, mapping


def base_name(job_id: str, attempt: int) -> str:
    """The name every object of the attempt starts with: ``kiln-<job id>-a<attempt>``."""
    return dns_label(f"kiln-{job_id}-a{attempt}", MAX_BASE)


def main_job_name(job_id: str, attempt: int, distributed: bool) -> str:
    """The Job that owns everything else of the attempt (the workers' Job of a gang)."""
    base = base_name(job_id, attempt)
    return f"{base}-worker" if distributed else base


def cleanup_selector(job_id: str, attempt: int | None = None) -> str:
    """A label selector of every object Kiln created for the job (or one attempt of it)."""
    parts = [f"{MANAGED_BY}=kiln", f"{LABEL_JOB}={label_value(job_id)}"]
    if attempt is not None:
        parts.append(f"{LABEL_ATTEMPT}={attempt}")
    return ",".join(parts)


# -- inputs ------------------------------------------------------------------------------------------------


@dataclass
class KubeConfig:
    """How Kiln renders jobs for one cluster (settings; see :class:`kiln.backends.kubernetes.settings`)."""

    namespace: str = "kiln"
    init_image: str = "python:3.11-slim"  # runs podfetch.py and podsync.py: any image with python3
    gpu_type_label: str = "nvidia.com/gpu.product"
    gpu_types: dict[str, str] = field(default_factory=dict)  # spec gpu_type → node label value; else as given
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    image_pull_secrets: list[str] = field(default_factory=list)
    ttl_seconds_after_finished: int | None = 3600
    gang_scheduler: GangScheduler | None = None
    queue: str | None = None  # Kueue LocalQueue or Volcano Queue; required with gang_scheduler
    priority_classes: dict[str, str] = field(default_factory=dict)  # low/normal/high → PriorityClass
    rendezvous_port: int = 29500  # every member's port (MASTER_PORT, TF server, JAX coordinator)
    cluster_domain: str | None = None  # None: "<ns>.svc" (resolved through the pod's search path)
    kubernetes_version: str = "1.29"  # the cluster's; from 1.31 on, gangs use Job successPolicy
    termination_grace_seconds: int = 30
    checkpoint_sync_seconds: float = 300.0  # the server's setting: how often pods upload changed checkpoints
    upload_timeout: int = 600  # how long a pod's entrypoint waits for the outputs' upload when the command ends
    service_account: str | None = None  # for the job's pods; None: no API token is mounted
    # What MPI members other than 0 run: an sshd that the launcher's mpirun reaches (the image must have one).
    mpi_daemon: str = "ssh-keygen -A >/dev/null; mkdir -p /run/sshd && exec /usr/sbin/sshd -D -e"

    def __post_init__(self) -> None:
        if not _DNS_LABEL.match(self.namespace) or len(self.namespace) > 63:
            raise ValueError(f"namespace {self.namespace!r} is not a valid Kubernetes namespace name")
        if self.gang_scheduler is not None and not self.queue:
            raise ValueError(f"gang_scheduler {self.gang_scheduler!r} needs a queue")
        if not 1 <= self.rendezvous_port <= 65535:
            raise ValueError("rendezvous_port must be 1..65535")
        if self.upload_timeout < 1 or self.checkpoint_sync_seconds < 0:
            raise ValueError("upload_timeout must be >= 1 and checkpoint_sync_seconds >= 0")
        if not re.match(r"^\d+\.\d+", self.kubernetes_version):
            raise ValueError(f"kubernetes_version {self.kubernetes_version!r} is not MAJOR.MINOR")

    @property
    def version(self) -> tuple[int, int]:
        major, minor = self.kubernetes_version.split(".")[:2]
        return int(major), int(re.sub(r"\D.*", "", minor) or 0)


@dataclass
class RenderInput:
    """One attempt of one job, as the controller (or the CLI) knows it."""

    job_id: str
    org_id: str
    attempt: int
    spec: JobSpec
    image: str | None = None  # resolved from the runtime catalog; None: spec.runtime.image
    code_sha256: str | None = None  # None: the job has no code bundle
    endpoint: str = "http://kiln:8080"  # the Kiln API as pods reach it
    token: str | None = None  # the job token; None: a placeholder
    ssh_private_key: str | None = None  # MPI only: the gang's key pair (OpenSSH format)
    ssh_public_key: str | None = None
    owner_uid: str | None = None  # the main Job's uid, once created: ownerReferences on everything else


def resolve_image(spec: JobSpec, catalog: Any) -> str:
    """The container image of a spec: its own ``runtime.image``, or the catalog entry's image.
    ``runtime.python`` (an interpreter on the host) can never run on Kubernetes."""
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


# -- rendering ---------------------------------------------------------------------------------------------


def _quantity_cpu(cpus: float) -> str:
    millis = max(1, round(cpus * 1000))
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def _k8s_escape(text: str) -> str:
    """Kubernetes expands ``$(VAR)`` in env values, command and args; ``$$`` is a literal ``$``."""
    return text.replace("$", "$$")


def _env_file(values: dict[str, str]) -> str:
    return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in sorted(values.items()))


def _check_selector(key: str, value: str, what: str) -> None:
    prefix, _, name = key.rpartition("/")
    ok = bool(_LABEL_NAME.match(name)) and len(name) <= 63
    ok = ok and (not prefix or (len(prefix) <= 253 and bool(_DNS_SUBDOMAIN.match(prefix))))
    if not ok or not (len(value) <= 63 and _LABEL_VALUE.match(value)):
        raise InvalidInput(f"{what}: {key}={value!r} is not a valid Kubernetes label selector")


def _node_selector(spec: JobSpec, cfg: KubeConfig) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in spec.node_selector.items():
        if key == "kiln.io/backend":  # the local executor's own node label
            if value != "kubernetes":
                raise InvalidInput(f"node_selector: kiln.io/backend={value} can never match on Kubernetes")
            continue
        key = "kubernetes.io/hostname" if key == "kiln.io/hostname" else key
        _check_selector(key, value, "node_selector")
        out[key] = value
    gpu_type = spec.resources.gpu_type
    if gpu_type:
        value = cfg.gpu_types.get(gpu_type, gpu_type)
        _check_selector(cfg.gpu_type_label, value, "resources.gpu_type")
        out[cfg.gpu_type_label] = value
    return out


def _member_host(base: str, role: str, index: int, cfg: KubeConfig) -> str:
    suffix = f"svc.{cfg.cluster_domain}" if cfg.cluster_domain else "svc"
    return f"{base}-{role}-{index}.{base}.{cfg.namespace}.{suffix}"


def gang_env(job: RenderInput, cfg: KubeConfig) -> tuple[dict[str, str], dict[str, dict[str, str]], str | None]:
    """The distributed env of every process of the gang, split as the pods receive it: ``(shared, files,
    hostfile)`` with ``shared`` the values every process has, ``files`` ``{"ROLE-INDEX-LOCAL.env" values:
    only what differs}``, and the MPI hostfile text (or None)."""
    dist = job.spec.distributed
    assert dist is not None
    base = base_name(job.job_id, job.attempt)
    members = [
        Member(role, index, _member_host(base, role, index, cfg), cfg.rendezvous_port)
        for role, index in gang_members(dist)
    ]
    hostfile = hostfile_text(dist, members) if dist.framework == "mpi" else None
    per_proc: dict[str, dict[str, str]] = {}
    for me, member in enumerate(members):
        envs = member_env(job.job_id, dist, members, me, hostfile=HOSTFILE if dist.framework == "mpi" else None)
        for local, env in enumerate(envs):
            per_proc[f"{member.role}-{member.index}-{local}.env"] = env
    all_envs = list(per_proc.values())
    shared = {k: v for k, v in all_envs[0].items() if all(e.get(k) == v for e in all_envs[1:])}
    files = {name: {k: v for k, v in env.items() if k not in shared} for name, env in per_proc.items()}
    return shared, files, hostfile


def render(job: RenderInput, cfg: KubeConfig) -> list[dict[str, Any]]:
    """The manifests of one attempt, in creation order: Secret, ConfigMap(s), Service and PodGroup (gangs
    only), the main Job, then the parameter servers' Job (TensorFlow with ps)."""
    spec = job.spec
    from kiln.domain.catalog import DEFAULT_CATALOG

    if spec.runtime.python:
        resolve_image(spec, DEFAULT_CATALOG)  # raises: a host interpreter cannot run here
    image = job.image or resolve_image(spec, DEFAULT_CATALOG)
    if job.attempt < 0:
        raise InvalidInput("attempt must be >= 0")
    dist = spec.distributed
    base = base_name(job.job_id, job.attempt)
    main = main_job_name(job.job_id, job.attempt, dist is not None)
    ns = cfg.namespace
    extra_labels, mapping = user_labels(spec.labels)
    renamed = any(key != USER_LABEL_PREFIX + k or value != spec.labels[k] for k, (key, value) in mapping.items())

    def labels(role: str) -> dict[str, str]:
        return {
            **extra_labels,
            MANAGED_BY: "kiln",
            LABEL_JOB: label_value(job.job_id),
            LABEL_ORG: label_value(job.org_id),
            LABEL_ATTEMPT: str(job.attempt),
            LABEL_ROLE: role,
        }

    def meta(name: str, role: str, owned: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels(role)}
        if renamed:
            out["annotations"] = {ANNOTATION_LABELS: json.dumps(spec.labels, sort_keys=True, separators=(",", ":"))}
        if owned and job.owner_uid:
            out["ownerReferences"] = [
                {"apiVersion": "batch/v1", "kind": "Job", "name": main, "uid": job.owner_uid, "controller": True}
            ]
        return out

    # The Secret: the job token (and an MPI gang's SSH keys).
    secret_data = {"token": job.token or TOKEN_PLACEHOLDER}
    mpi = dist is not None and dist.framework == "mpi"
    if mpi:
        public = job.ssh_public_key or SSH_KEY_PLACEHOLDER
        secret_data |= {
            "id_ed25519": job.ssh_private_key or SSH_KEY_PLACEHOLDER,
            "id_ed25519.pub": public,
            "authorized_keys": public,
        }
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta(base, "shared"),
            "type": "Opaque",
            "immutable": True,
            "stringData": secret_data,
        }
    ]

    # The ConfigMap(s): entrypoint, fetcher, env files, hostfile.
    prepare = shlex.join(command_argv(spec.prepare_command)) if spec.prepare_command else None
    finish = shlex.join(command_argv(spec.finish_command)) if spec.finish_command else None
    files: dict[str, str] = {
        "entrypoint.sh": entrypoint(prepare, finish),
        **{name: Path(__file__).with_name(name).read_text(encoding="utf-8") for name in ("podfetch.py", "podsync.py")},
        # The metrics SDK (standard library only), which the entrypoint makes importable as `kiln`.
        "kiln_sdk.py": (Path(__file__).parents[2] / "runtime" / "metrics_sdk.py").read_text(encoding="utf-8"),
    }
    if dist is not None:
        shared, member_files, hostfile = gang_env(job, cfg)
        files["gang.env"] = _env_file(shared)
        if hostfile is not None:
            files["hostfile"] = hostfile
        files |= {name: _env_file(values) for name, values in member_files.items()}
    chunks: list[dict[str, str]] = [{}]
    size = 0
    for name, text in files.items():
        length = len(name) + len(text.encode())
        if size + length > CONFIGMAP_BYTES and chunks[-1]:
            chunks.append({})
            size = 0
        chunks[-1][name] = text
        size += length
    config_names = [base if i == 0 else f"{base}-env-{i}" for i in range(len(chunks))]
    for name, data in zip(config_names, chunks, strict=True):
        objects.append(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(name, "shared"), "immutable": True, "data": data}
        )

    if dist is not None:
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": meta(base, "shared"),
                "spec": {
                    "clusterIP": "None",
                    "publishNotReadyAddresses": True,  # names resolve as soon as pods exist, before readiness
                    "selector": {LABEL_JOB: label_value(job.job_id), LABEL_ATTEMPT: str(job.attempt)},
                    "ports": [{"name": "rendezvous", "port": cfg.rendezvous_port, "protocol": "TCP"}],
                },
            }
        )
    if cfg.gang_scheduler == "volcano":
        objects.append(
            {
                "apiVersion": "scheduling.volcano.sh/v1beta1",
                "kind": "PodGroup",
                "metadata": meta(base, "shared"),
                "spec": {
                    "minMember": spec.gang_size,
                    "queue": cfg.queue,
                    **(
                        {"priorityClassName": cfg.priority_classes[spec.priority]}
                        if spec.priority in cfg.priority_classes
                        else {}
                    ),
                },
            }
        )

    # The pod template, shared by the workers' and the parameter servers' Jobs.
    res = spec.resources
    cpu = _quantity_cpu(res.cpus)
    compute: dict[str, str] = {"cpu": cpu}
    if res.memory is not None:
        compute["memory"] = str(res.memory)
    limits = dict(compute)
    if res.gpus:
        limits[GPU_RESOURCE] = str(res.gpus)
    tolerations = [dict(t) for t in cfg.tolerations]
    if res.gpus and not any(t.get("key") == GPU_RESOURCE for t in tolerations):
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    node_selector = _node_selector(spec, cfg)

    secret_ref = {"secretKeyRef": {"name": base, "key": "token"}}
    endpoint = job.endpoint.rstrip("/")
    static_env: dict[str, str] = {
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": str(max(1, int(res.cpus))),
        **spec.env,
        "KILN_JOB_ID": job.job_id,
        "KILN_ATTEMPT": str(job.attempt),
        "KILN_WORK_DIR": WORK_DIR,
        "KILN_OUTPUT_DIR": OUTPUT_DIR,
        "KILN_CHECKPOINT_DIR": CHECKPOINT_DIR,
        "KILN_NUM_CPUS": f"{res.cpus:g}",
        "KILN_NUM_GPUS": str(res.gpus),
        "KILN_NOTICE_FILE": f"{RUN_DIR}/notice.json",
        "KILN_TENSORBOARD_DIR": f"{METRICS_DIR}/tensorboard",
        "KILN_RUN_DIR": RUN_DIR,
        "KILN_CONF_DIR": CONF_DIR,
        "KILN_ENDPOINT": endpoint,
        "KILN_WORKER_INDEX": "0",
        "KILN_SYNC_TIMEOUT": str(cfg.upload_timeout),
        "KILN_NUM_WORKERS": str(dist.workers if dist else 1),
    }
    for item in spec.inputs:
        static_env[input_env_name(item.dataset)] = item.where

    volumes: list[dict[str, Any]] = [
        {
            "name": "kiln-conf",
            "projected": {
                "defaultMode": 0o555,
                "sources": [
                    *({"configMap": {"name": n}} for n in config_names),
                    # An MPI gang's SSH keys, at /etc/kiln/ssh (a second mount inside /etc/kiln cannot be made).
                    *([{"secret": {"name": base, "items": _ssh_items()}}] if mpi else []),
                ],
            },
        },
        *({"name": v, "emptyDir": {}} for v in ("kiln-work", "kiln-outputs", "kiln-checkpoints", "kiln-metrics")),
        {"name": "kiln-run", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "kiln-conf", "mountPath": CONF_DIR, "readOnly": True},
        {"name": "kiln-work", "mountPath": WORK_DIR},
        {"name": "kiln-outputs", "mountPath": OUTPUT_DIR},
        {"name": "kiln-checkpoints", "mountPath": CHECKPOINT_DIR},
        {"name": "kiln-metrics", "mountPath": METRICS_DIR},
        {"name": "kiln-run", "mountPath": RUN_DIR},
    ]
    init_mounts = [m for m in mounts if m["name"] in ("kiln-conf", "kiln-work", "kiln-checkpoints", "kiln-run")]
    sync_mounts = [
        {**m, "readOnly": True} if m["name"] in ("kiln-outputs", "kiln-checkpoints") else m
        for m in mounts
        if m["name"] in ("kiln-conf", "kiln-outputs", "kiln-checkpoints", "kiln-run")
    ]
    fetch_inputs = []
    for i, item in enumerate(spec.inputs):
        volumes.append({"name": f"kiln-input-{i}", "emptyDir": {}})
        mounts.append({"name": f"kiln-input-{i}", "mountPath": item.where, "readOnly": True})
        init_mounts.append({"name": f"kiln-input-{i}", "mountPath": f"{INPUTS_STAGING}/{i}"})
        fetch_inputs.append({"dataset": item.dataset, "dir": f"{INPUTS_STAGING}/{i}"})
    if res.gpus or dist is not None:  # NCCL and data loaders need more than the runtime's 64 MiB /dev/shm
        volumes.append({"name": "kiln-shm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "kiln-shm", "mountPath": "/dev/shm"})

    # Every pod restores the job's stored checkpoints (a restarted attempt resumes), so the fetcher always runs.
    fetch_container = {
        "name": "kiln-fetch",
        "image": cfg.init_image,
        "command": ["python3", f"{CONF_DIR}/podfetch.py"],
        "env": [
            {"name": "KILN_ENDPOINT", "value": _k8s_escape(endpoint)},
            {"name": "KILN_JOB_TOKEN", "valueFrom": secret_ref},
            {"name": "KILN_JOB_ID", "value": _k8s_escape(job.job_id)},
            {"name": "KILN_CODE_SHA256", "value": job.code_sha256 or ""},
            {"name": "KILN_WORK_DIR", "value": WORK_DIR},
            {"name": "KILN_INPUTS", "value": _k8s_escape(json.dumps(fetch_inputs, separators=(",", ":")))},
            {"name": "KILN_CHECKPOINT_DIR", "value": CHECKPOINT_DIR},
            {"name": "KILN_RUN_DIR", "value": RUN_DIR},
            {"name": "TMPDIR", "value": RUN_DIR},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        ],
        "resources": {"requests": dict(compute), "limits": dict(compute)},
        "volumeMounts": init_mounts,
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True},
    }

    def sync_container(role: str) -> dict[str, Any]:
        """The native sidecar (Kubernetes >= 1.29) that uploads checkpoints and outputs: see podsync.py."""
        env = {
            "KILN_ENDPOINT": _k8s_escape(endpoint),
            "KILN_JOB_ID": _k8s_escape(job.job_id),
            "KILN_ROLE": role,
            "KILN_OUTPUT_DIR": OUTPUT_DIR,
            "KILN_CHECKPOINT_DIR": CHECKPOINT_DIR,
            "KILN_RUN_DIR": RUN_DIR,
            "KILN_CHECKPOINT_SYNC_SECONDS": f"{cfg.checkpoint_sync_seconds:g}",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        return {
            "name": "kiln-sync",
            "image": cfg.init_image,
            "restartPolicy": "Always",
            "command": ["python3", f"{CONF_DIR}/podsync.py"],
            "env": [
                *({"name": k, "value": v} for k, v in env.items()),
                {"name": "KILN_JOB_TOKEN", "valueFrom": secret_ref},
            ],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
            "volumeMounts": sync_mounts,
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True},
        }

    def pod_template(role: str, procs: int) -> dict[str, Any]:
        env = {**static_env, "KILN_ROLE": role, "KILN_PROCS": str(procs)}
        if mpi:
            env["KILN_MPI_DAEMON"] = cfg.mpi_daemon
        container: dict[str, Any] = {
            "name": "job",
            "image": image,
            "command": ["/bin/sh", f"{CONF_DIR}/entrypoint.sh"],
            "args": [_k8s_escape(a) for a in command_argv(spec.command)],
            "workingDir": WORK_DIR,
            "env": [
                *({"name": k, "value": _k8s_escape(v)} for k, v in env.items()),
                {"name": "KILN_JOB_TOKEN", "valueFrom": secret_ref},
            ],
            "resources": {"requests": dict(compute), "limits": limits},
            "volumeMounts": mounts,
        }
        if res.gpus:
            container["resources"]["requests"] = {**compute, GPU_RESOURCE: str(res.gpus)}
        pod: dict[str, Any] = {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": cfg.termination_grace_seconds,
            "enableServiceLinks": False,
            "containers": [container],
            "volumes": volumes,
        }
        pod["initContainers"] = [fetch_container, sync_container(role)]
        if cfg.service_account:
            pod["serviceAccountName"] = cfg.service_account
        else:
            pod["automountServiceAccountToken"] = False
        if dist is not None:
            pod["subdomain"] = base
        if node_selector:
            pod["nodeSelector"] = node_selector
        if tolerations:
            pod["tolerations"] = tolerations
        if cfg.image_pull_secrets:
            pod["imagePullSecrets"] = [{"name": n} for n in cfg.image_pull_secrets]
        if spec.priority in cfg.priority_classes:
            pod["priorityClassName"] = cfg.priority_classes[spec.priority]
        template_meta: dict[str, Any] = {"labels": labels(role)}
        if cfg.gang_scheduler == "volcano":
            pod["schedulerName"] = "volcano"
            template_meta["annotations"] = {VOLCANO_GROUP_ANNOTATION: base, VOLCANO_QUEUE_ANNOTATION: cfg.queue}
        return {"metadata": template_meta, "spec": pod}

    def job_object(name: str, role: str, count: int, procs: int, owned: bool) -> dict[str, Any]:
        job_spec: dict[str, Any] = {
            "backoffLimit": 0,  # a failed pod fails the attempt; Kiln restarts the whole gang (max_restarts)
            "parallelism": count,
            "completions": count,
            "template": pod_template(role, procs),
        }
        if dist is not None:
            job_spec["completionMode"] = "Indexed"
        if spec.timeout is not None:
            job_spec["activeDeadlineSeconds"] = max(1, math.ceil(spec.timeout))
        if cfg.ttl_seconds_after_finished is not None:
            job_spec["ttlSecondsAfterFinished"] = cfg.ttl_seconds_after_finished
        metadata = meta(name, role, owned)
        if cfg.gang_scheduler == "kueue":
            metadata["labels"][KUEUE_QUEUE_LABEL] = cfg.queue
            job_spec["suspend"] = True  # Kueue unsuspends it on admission
        if role == "worker" and dist is not None and _launcher_gang(spec):
            # Only worker 0 (the MPI launcher, the TF chief) ends on its own: its success is the gang's.
            metadata.setdefault("annotations", {})[ANNOTATION_SUCCESS_INDEX] = "0"
            if cfg.version >= _MIN_SUCCESS_POLICY:
                job_spec["successPolicy"] = {"rules": [{"succeededIndexes": "0"}]}
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": job_spec}

    workers = dist.workers if dist else 1
    procs = dist.procs_per_worker if dist and dist.framework == "pytorch" else 1
    objects.append(job_object(main, "worker", workers, procs, owned=False))
    if dist is not None and dist.ps:
        objects.append(job_object(f"{base}-ps", "ps", dist.ps, 1, owned=True))
    return objects


def _launcher_gang(spec: JobSpec) -> bool:
    dist = spec.distributed
    return dist is not None and (dist.framework == "mpi" or (dist.framework == "tensorflow" and dist.ps > 0))


def _ssh_items() -> list[dict[str, Any]]:
    # Readable by the container's user whoever it is: every process in the container is the job's own.
    return [{"key": k, "path": f"ssh/{k}", "mode": 0o444} for k in ("id_ed25519", "id_ed25519.pub", "authorized_keys")]


def new_ssh_keypair() -> tuple[str, str]:
    """A fresh Ed25519 key pair for an MPI gang, ``(private OpenSSH PEM, public OpenSSH line)``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public.decode() + " kiln-mpi\n"


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """The manifests as one YAML multi-document stream (keys in the order rendered)."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)
