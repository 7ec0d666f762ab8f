"""The settings of the backends that run jobs on a cluster: ``settings.kubernetes`` (``KILN_KUBERNETES_*``) and
``settings.slurm`` (``KILN_SLURM_*``), each read from its own environment variables and part of the one settings
tree (:class:`kiln.settings.Settings`)."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from kiln.domain.spec import PRIORITIES


class KubernetesSettings(BaseSettings):
    """Settings of the Kubernetes backend (``settings.kubernetes``): ``KILN_KUBERNETES_*`` environment variables,
    maps and lists as JSON. A sub-tree with a prefix of its own, so that the variables keep their names."""

    model_config = SettingsConfigDict(env_prefix="KILN_KUBERNETES_", extra="ignore")

    namespace: str = Field("kiln", description="Namespace of the jobs' objects.")
    init_image: str = Field("python:3.11-slim", description="Image of the init container that fetches code/data.")
    gpu_type_label: str = Field("nvidia.com/gpu.product", description="Node label that resources.gpu_type selects.")
    gpu_types: dict[str, str] = Field(
        default_factory=dict, description='gpu_type → label value, e.g. {"H200": "NVIDIA-H200"}; else as given.'
    )
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="Tolerations of every job pod.")
    image_pull_secrets: list[str] = Field(default_factory=list, description="Secrets for pulling job images.")
    ttl_seconds_after_finished: int | None = Field(3600, description="Finished Jobs are deleted after this.")
    gang_scheduler: Literal["kueue", "volcano"] | None = Field(None, description="Queue jobs with Kueue/Volcano.")
    queue: str | None = Field(None, description="Kueue LocalQueue or Volcano Queue (with gang_scheduler).")
    priority_classes: dict[str, str] = Field(
        default_factory=dict, description='Spec priority → PriorityClass, e.g. {"high": "kiln-high"}.'
    )
    rendezvous_port: int = Field(29500, description="Port of every gang member (MASTER_PORT, TF, JAX).")
    cluster_domain: str | None = Field(None, description="e.g. cluster.local; None: names end in .svc.")
    kubernetes_version: str = Field("1.29", description="The cluster's version (successPolicy from 1.31).")
    termination_grace_seconds: int = Field(30, description="SIGTERM → SIGKILL grace of job pods.")
    service_account: str | None = Field(None, description="Service account of job pods; None: no API token.")
    upload_timeout: int = Field(
        600, ge=1, description="Seconds a pod waits, once its command ended, for its outputs to reach the store."
    )
    # The jobs' NetworkPolicies (network: isolated/none): who Kiln's server pods are, and the cluster's DNS pods.
    server_pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "kiln", "app.kubernetes.io/component": "server"},
        description="Labels of Kiln's server pods (deploy/kubernetes): the only pods besides a job's own that may "
        "connect to it, and the Kiln API it may always reach.",
    )
    server_namespace: str | None = Field(
        None, description="Namespace of Kiln's server pods; None: the jobs' namespace (as deploy/kubernetes has it)."
    )
    dns_pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"k8s-app": "kube-dns"},
        description="Labels of the cluster's DNS pods (any namespace), which jobs may query on port 53.",
    )

    # How the server reaches the API server: in-cluster (its service account) by default, else a kubeconfig, or
    # an explicit URL (and bearer token).
    api_url: str | None = Field(None, description="API server URL, e.g. https://10.0.0.1:6443 (default: in-cluster).")
    token: SecretStr | None = Field(None, description="Bearer token for api_url (never logged).")
    verify_ssl: bool = Field(True, description="Verify the API server's certificate (with api_url).")
    kubeconfig: str | None = Field(None, description="A kubeconfig file, when not running in the cluster.")
    image_pull_grace: float = Field(60.0, ge=0, description="Seconds an image pull may fail before the job does.")


_SLURM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+:-]*")  # partitions, accounts, QOS, gres types: no spaces, no ','
_SLURM_COMMANDS = ("sbatch", "squeue", "scontrol", "scancel", "sacct")


class SlurmSettings(BaseSettings):
    """Settings of the Slurm backend (``settings.slurm``): ``KILN_SLURM_*`` environment variables, maps and lists
    as JSON. The Slurm commands themselves read the cluster's configuration the way they always do (``SLURM_CONF``
    in the server's environment, else the compiled-in path): Kiln passes its environment through to them."""

    model_config = SettingsConfigDict(env_prefix="KILN_SLURM_", extra="ignore")

    partition: str | None = Field(
        None, description="Partition of every job (--partition); None: the cluster's default."
    )
    account: str | None = Field(None, description="Account jobs are charged to (--account); None: the user's default.")
    qos: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description='Spec priority → Slurm QOS (--qos), e.g. {"high": "kiln-high", "low": "scavenger"}; a priority '
        "not named: no --qos (the account's default).",
    )
    extra_directives: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description='Extra "#SBATCH" options every job script carries, as a JSON list, e.g. ["--exclusive", '
        '"--mail-type=NONE"]: each one option starting with "--", on one line.',
    )
    gpu_types: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description='resources.gpu_type → the cluster\'s GRES type, e.g. {"H200": "h200"}; else the type as given '
        "(--gres=gpu:TYPE:N).",
    )
    python: str = Field(
        "python3",
        description="The Python 3 on the nodes that runs Kiln's programs in a job (fetch, sync) and the jobs of the "
        "default runtime: a command name looked up on the node's PATH, or an absolute path. It needs tarfile's "
        "data filter: 3.12, or 3.8.17, 3.9.17, 3.10.12, 3.11.4 and later.",
    )
    runtimes: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="Catalog runtime → its Python interpreter on the nodes (a venv the operator made), e.g. "
        '{"pytorch": "/opt/venvs/torch/bin/python", "pytorch-2.4.1": "/opt/venvs/torch241/bin/python"}: the '
        "catalog entry's name (FRAMEWORK-VERSION, as `kiln runtimes list` shows it) first, then FRAMEWORK. Only "
        "the default runtime (python) needs no entry: it is KILN_SLURM_PYTHON.",
    )
    scratch_dir: str | None = Field(
        None,
        description="A directory on every node (local disk) under which each job gets a directory of its own for "
        "its code, inputs, outputs and checkpoints, removed when it ends; None: the node's $TMPDIR, else /tmp.",
    )
    log_dir: str = Field(
        "/tmp",
        description="Where on the node a job's --output and --error files go (kiln-JOB-aN.SLURMID.out/.err): an "
        "existing directory on the nodes.",
    )
    upload_timeout: int = Field(
        600, ge=1, description="Seconds a job waits, once its command ended, for its outputs to reach the store."
    )
    poll_seconds: float = Field(
        1.0,
        gt=0,
        le=60,
        description="Seconds between the controller's squeue calls (one per pass for all of Kiln's jobs); 0.2 while "
        "a job submitted in the last minute has not ended.",
    )
    sbatch: str | None = Field(None, description="Path of sbatch; None: found on the server's PATH.")
    squeue: str | None = Field(None, description="Path of squeue; None: found on the server's PATH.")
    scontrol: str | None = Field(None, description="Path of scontrol; None: found on the server's PATH.")
    scancel: str | None = Field(None, description="Path of scancel; None: found on the server's PATH.")
    sacct: str | None = Field(None, description="Path of sacct; None: found on the server's PATH.")

    @field_validator("qos", "gpu_types", "runtimes", "extra_directives", mode="before")
    @classmethod
    def _json(cls, value: object, info: ValidationInfo) -> object:
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except ValueError:
            example = '["--exclusive"]' if info.field_name == "extra_directives" else '{"high": "kiln-high"}'
            raise ValueError(f"not JSON: write it as JSON, e.g. {example}") from None

    @field_validator("partition", "account")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not _SLURM_NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not a Slurm name (letters, digits and _.+:-, no spaces or commas)")
        return value

    @field_validator("qos")
    @classmethod
    def _qos(cls, value: dict[str, str]) -> dict[str, str]:
        for priority, qos in value.items():
            if priority not in PRIORITIES:
                raise ValueError(f"{priority!r} is not a job priority ({', '.join(PRIORITIES)})")
            if not _SLURM_NAME.fullmatch(qos):
                raise ValueError(f"{priority}: {qos!r} is not a Slurm QOS name (letters, digits and _.+:-)")
        return value

    @field_validator("gpu_types")
    @classmethod
    def _gres_types(cls, value: dict[str, str]) -> dict[str, str]:
        for gpu_type, gres in value.items():
            if not _SLURM_NAME.fullmatch(gres) or ":" in gres:
                raise ValueError(f"{gpu_type}: {gres!r} is not a GRES type (letters, digits and _.+-)")
        return value

    @field_validator("extra_directives")
    @classmethod
    def _directives(cls, value: list[str]) -> list[str]:
        for line in value:
            if any(c in line for c in "\n\r\x00"):
                raise ValueError(f"{line!r}: one option per entry, on one line")
            if not line.startswith("--") or len(line) < 3 or line[2].isspace():
                raise ValueError(f"{line!r}: each entry is one long option starting with '--', e.g. --exclusive")
        return value

    @field_validator("python", "scratch_dir", "log_dir", *_SLURM_COMMANDS)
    @classmethod
    def _paths(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or any(c in value for c in "\n\r\x00")):
            raise ValueError(f"{value!r}: a path or command name on one line")
        return value

    @field_validator("scratch_dir", "log_dir")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"{value!r}: an absolute path on the nodes")
        return value

    @field_validator("runtimes")
    @classmethod
    def _runtimes(cls, value: dict[str, str]) -> dict[str, str]:
        for runtime, python in value.items():
            if not python.startswith("/") or any(c in python for c in "\n\r\x00"):
                raise ValueError(f"{runtime}: {python!r} is not an absolute path of an interpreter on the nodes")
        return value
