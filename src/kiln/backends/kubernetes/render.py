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
- the spec's ``network``: ``isolated`` and ``none`` get a NetworkPolicy over the attempt's pods (``netpol.py``:
  reached only by each other and Kiln's server; egress to DNS, the Kiln API, each other and, isolated, the
  outside world under the operator's egress rules); ``host`` runs the pods with ``hostNetwork: true``;
- ``backoffLimit: 0`` (Kiln restarts whole gangs itself: ``max_restarts``), ``activeDeadlineSeconds`` = the
  spec's timeout, ``ttlSecondsAfterFinished`` from the settings, ``restartPolicy: Never``;
- every object carries ``app.kubernetes.io/managed-by: kiln``, ``kiln.io/job``, ``kiln.io/org``,
  ``kiln.io/attempt`` and ``kiln.io/role``; with ``owner_uid`` (the main Job's uid, known once it is created)
  every other object gets an ownerReference to the main Job, so deleting that Job (or its TTL) removes all;
  without it, :func:`~kiln.backends.kubernetes.names.cleanup_selector` selects everything of the attempt.

Names are deterministic: ``kiln-<job id>-a<attempt>``, cleaned into a DNS-1123 label and, when anything had
to change or it is too long, suffixed with a hash of the original (:func:`~kiln.backends.kubernetes.names.dns_label`).

Besides this module: ``names.py`` (names, labels, pod paths), ``inputs.py`` (:class:`KubeConfig`,
:class:`RenderInput`) and ``gang.py`` (a gang's env files, hostfile and SSH keys).
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Any

from kiln.backends.kubernetes.entrypoint import entrypoint
from kiln.backends.kubernetes.gang import (
    SSH_KEY_PLACEHOLDER,
    env_file,
    gang_env,
    launcher_gang,
    new_ssh_keypair,  # noqa: F401  (moved for size; still importable from here)
    ssh_items,
)
from kiln.backends.kubernetes.inputs import KubeConfig, RenderInput, resolve_image
from kiln.backends.kubernetes.names import (
    CHECKPOINT_DIR,
    CONF_DIR,
    INPUTS_STAGING,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_ORG,
    LABEL_ROLE,
    MANAGED_BY,
    METRICS_DIR,
    OUTPUT_DIR,
    RUN_DIR,
    USER_LABEL_PREFIX,
    WORK_DIR,
    base_name,
    check_selector,
    cleanup_selector,  # noqa: F401  (moved for size; still importable from here)
    dns_label,  # noqa: F401
    label_value,
    main_job_name,
    user_labels,
)
from kiln.backends.kubernetes.netpol import job_network_policy
from kiln.domain.spec import JobSpec, command_argv, format_param, param_env_name
from kiln.domain.tracking import TOKEN_ENV as TRACKING_TOKEN_ENV
from kiln.domain.tracking import tracking_env
from kiln.errors import InvalidInput

ANNOTATION_LABELS = "kiln.io/labels"  # the user's labels as given (JSON), when any had to be renamed
ANNOTATION_SUCCESS_INDEX = "kiln.io/success-index"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
GPU_RESOURCE = "nvidia.com/gpu"
TOKEN_PLACEHOLDER = "REPLACE-WITH-THE-JOB-TOKEN"

PARAMS_FILE = "params.json"
CONFIGMAP_BYTES = 900_000  # one ConfigMap holds at most 1 MiB; the env files spill into more
_MIN_SUCCESS_POLICY = (1, 31)  # Job successPolicy: beta and on by default from Kubernetes 1.31


# -- rendering ---------------------------------------------------------------------------------------------


def _quantity_cpu(cpus: float) -> str:
    millis = max(1, round(cpus * 1000))
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def _k8s_escape(text: str) -> str:
    """Kubernetes expands ``$(VAR)`` in env values, command and args; ``$$`` is a literal ``$``."""
    return text.replace("$", "$$")


def _node_selector(spec: JobSpec, cfg: KubeConfig) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in spec.node_selector.items():
        if key == "kiln.io/backend":  # the local executor's own node label
            if value != "kubernetes":
                raise InvalidInput(f"node_selector: kiln.io/backend={value} can never match on Kubernetes")
            continue
        key = "kubernetes.io/hostname" if key == "kiln.io/hostname" else key
        check_selector(key, value, "node_selector")
        out[key] = value
    gpu_type = spec.resources.gpu_type
    if gpu_type:
        value = cfg.gpu_types.get(gpu_type, gpu_type)
        check_selector(cfg.gpu_type_label, value, "resources.gpu_type")
        out[cfg.gpu_type_label] = value
    return out


def render(job: RenderInput, cfg: KubeConfig) -> list[dict[str, Any]]:
    """The manifests of one attempt, in creation order: Secret, ConfigMap(s), Service and PodGroup (gangs
    only), the NetworkPolicy (not with ``network: host``), the main Job, then the parameter servers' Job
    (TensorFlow with ps)."""
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
        "kiln_sdk.py": (Path(__file__).parents[2] / "injob" / "metrics_sdk.py").read_text(encoding="utf-8"),
        # The job's parameters ($KILN_PARAMS_FILE; a tuning study's trials get them from its sampler).
        PARAMS_FILE: json.dumps(spec.params, sort_keys=True),
    }
    if dist is not None:
        shared, member_files, hostfile = gang_env(job, cfg)
        files["gang.env"] = env_file(shared)
        if hostfile is not None:
            files["hostfile"] = hostfile
        files |= {name: env_file(values) for name, values in member_files.items()}
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

    # The attempt's network (netpol.py): a NetworkPolicy before any pod exists; host: the node's network.
    own_pods = {MANAGED_BY: "kiln", LABEL_JOB: label_value(job.job_id), LABEL_ATTEMPT: str(job.attempt)}
    policy = job_network_policy(meta(base, "shared"), own_pods, spec.network, cfg, cfg.egress_rules)
    if policy is not None:
        objects.append(policy)
    if spec.network == "host" and mpi:
        raise InvalidInput(
            "network: host cannot run an MPI gang on Kubernetes: its members' sshd would take the node's own SSH "
            "port; use network: isolated",
            details={"field": "spec.network"},
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
        "KILN_PARAMS_FILE": f"{CONF_DIR}/{PARAMS_FILE}",
        **{param_env_name(k): format_param(v) for k, v in spec.params.items()},
    }
    if spec.metrics.watch:  # kiln.log sends these metrics' points at once (a study's objective)
        static_env["KILN_WATCH_METRICS"] = ",".join(spec.metrics.watch)
    mlflow = "MLFLOW_TRACKING_URI" not in spec.env  # the team's own tracker, if it names one
    if mlflow:  # MLflow's client logs into the job's run (its token: MLFLOW_TRACKING_TOKEN, from the Secret)
        static_env.update(tracking_env(endpoint, job.job_id))
    for item in spec.inputs:
        static_env[item.env] = item.where

    volumes: list[dict[str, Any]] = [
        {
            "name": "kiln-conf",
            "projected": {
                "defaultMode": 0o555,
                "sources": [
                    *({"configMap": {"name": n}} for n in config_names),
                    # An MPI gang's SSH keys, at /etc/kiln/ssh (a second mount inside /etc/kiln cannot be made).
                    *([{"secret": {"name": base, "items": ssh_items()}}] if mpi else []),
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
        {**m, "readOnly": True} if m["name"] in ("kiln-outputs", "kiln-checkpoints", "kiln-metrics") else m
        for m in mounts
        if m["name"] in ("kiln-conf", "kiln-outputs", "kiln-checkpoints", "kiln-metrics", "kiln-run")
    ]
    fetch_inputs = []
    for i, item in enumerate(spec.inputs):
        volumes.append({"name": f"kiln-input-{i}", "emptyDir": {}})
        mounts.append({"name": f"kiln-input-{i}", "mountPath": item.where, "readOnly": True})
        init_mounts.append({"name": f"kiln-input-{i}", "mountPath": f"{INPUTS_STAGING}/{i}"})
        source = {"dataset": item.dataset} if item.dataset is not None else {"model": item.model}
        fetch_inputs.append({**source, "dir": f"{INPUTS_STAGING}/{i}"})
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
        """The native sidecar (Kubernetes >= 1.29) that uploads checkpoints, TensorBoard event files and outputs:
        see podsync.py."""
        env = {
            "KILN_ENDPOINT": _k8s_escape(endpoint),
            "KILN_JOB_ID": _k8s_escape(job.job_id),
            "KILN_ROLE": role,
            "KILN_OUTPUT_DIR": OUTPUT_DIR,
            "KILN_CHECKPOINT_DIR": CHECKPOINT_DIR,
            "KILN_TENSORBOARD_DIR": f"{METRICS_DIR}/tensorboard",
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
                *([{"name": TRACKING_TOKEN_ENV, "valueFrom": secret_ref}] if mlflow else []),
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
        if spec.network == "host":
            pod["hostNetwork"] = True
            pod["dnsPolicy"] = "ClusterFirstWithHostNet"  # still resolves the cluster's names (Kiln, the gang)
            if dist is not None:  # one member per node and port: the scheduler keeps two gangs' members apart
                container["ports"] = [
                    {
                        "name": "rendezvous",
                        "containerPort": cfg.rendezvous_port,
                        "hostPort": cfg.rendezvous_port,
                        "protocol": "TCP",
                    }
                ]
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
        if role == "worker" and dist is not None and launcher_gang(spec):
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
