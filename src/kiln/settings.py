"""The one settings tree of Kiln.

Every knob is a field here, read from ``KILN_*`` environment variables (or passed explicitly in tests).
Nothing else in the code base reads ``os.environ`` for configuration.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from kiln.auth.credfile import client_dir
from kiln.domain import limits
from kiln.domain.spec import PRIORITIES


def _split_rules(text: str) -> list[str]:
    return [r.strip() for r in text.replace("\n", ";").split(";") if r.strip()]


def _default_home() -> Path:
    return Path.home() / ".kiln"


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


class Settings(BaseSettings):
    """Server-side settings (``kiln server``)."""

    model_config = SettingsConfigDict(env_prefix="KILN_", extra="ignore")

    home: Path = Field(default_factory=_default_home, description="Root of all local state ($KILN_HOME).")
    host: str = Field("127.0.0.1", description="Address the API server binds.")
    port: int = Field(8080, description="Port the API server binds.")
    public_endpoint: str | None = Field(
        None, description="Endpoint written to admin.env; defaults to http://HOST:PORT."
    )
    database_url: str | None = Field(
        None,
        description="SQLAlchemy URL. Default: SQLite at $KILN_HOME/kiln.db. "
        "PostgreSQL: postgresql+psycopg://user@host:5432/db.",
    )
    storage_url: str | None = Field(
        None,
        description="fsspec URL of the object store (code bundles, artifacts, logs archives, datasets), e.g. "
        "s3://bucket/prefix for any S3-compatible store. Default: $KILN_HOME/store (local directory).",
    )
    storage_endpoint_url: str | None = Field(
        None, description="Endpoint of a non-AWS S3-compatible store (MinIO, Ceph, moto), e.g. http://minio:9000."
    )
    storage_region: str | None = Field(None, description="Region of the S3 store (default: the AWS defaults).")
    storage_access_key_id: str | None = Field(
        None, description="S3 access key id (default: the usual AWS variables, profile or instance role)."
    )
    storage_secret_access_key: SecretStr | None = Field(None, description="S3 secret access key (never logged).")
    storage_presign: bool = Field(
        True,
        description="On S3, clients send dataset parts and read dataset files straight from the store through "
        "short-lived presigned URLs; false: every byte goes through the API.",
    )
    storage_presign_seconds: int = Field(900, ge=30, description="Life of a presigned store URL.")
    dataset_part_bytes: int = Field(
        32 * 1024**2,
        ge=5 * 1024**2,
        le=limits.MAX_PART_BYTES,
        description="Part size of dataset uploads straight to S3 (parts through the API are at most 16 MiB).",
    )
    dataset_small_blob_bytes: int = Field(
        4 * 1024**2,
        ge=0,
        le=15 * 1024**2,
        description="Dataset files smaller than this are sent many to a request through the API (which checks "
        "their SHA-256 and writes them to the store) instead of one upload session each; 0: never.",
    )
    dataset_max_files: int = Field(
        200_000, ge=1, le=limits.MAX_MANIFEST_FILES, description="Most files one dataset version may hold."
    )
    server_key: str | None = Field(
        None, description="Fernet key encrypting secrets at rest. Default: generated in $KILN_HOME/server.key."
    )
    instance_id: str | None = Field(
        None, description="Identity of this server for work leases; defaults to a hash of host and home."
    )

    # Signed API
    clock_skew_seconds: int = Field(300, description="Largest accepted difference of X-Kiln-Date from now.")
    nonce_ttl_seconds: int = Field(900, description="How long a used nonce is remembered per key.")
    idempotency_retention_seconds: int = Field(
        24 * 3600,
        ge=60,
        description="How long a create's Idempotency-Key is remembered: a repeat of the same request with the "
        "same key within it answers the resource the first one created (docs/idempotency.md).",
    )

    # Tenancy
    rate_limit_per_second: float = Field(
        100.0, description="Requests per second each access key (or job token) may make on average; 0: no limit."
    )
    rate_limit_burst: int = Field(400, description="Requests an access key may make at once above the rate.")
    audit_retention_days: float = Field(90.0, description="How long audit records are kept.")
    job_token_ttl_seconds: float = Field(
        48 * 3600.0,
        description="Longest life of a job token; it also dies as soon as the attempt it was given to ends.",
    )

    worker_threads: int = Field(8, ge=1, description="Threads that run blocking request work (database calls).")

    # Web console (docs/console.md)
    session_hours: float = Field(
        12.0,
        gt=0,
        le=24 * 30,
        description="How long a console sign-in lasts; it ends sooner when its access key or user is disabled, "
        "deleted or expires.",
    )
    console_dir: Path | None = Field(
        None,
        description="The built console the server serves at / (index.html and assets/). Default: the package's "
        "kiln/api/console_dist, written by `make console`; without an index.html there the server is API only.",
    )

    # Uploads
    max_blob_bytes: int = Field(
        512 * 1024**2, gt=0, le=limits.MAX_FILE_BYTES, description="Largest code bundle accepted by PUT /blobs (413)."
    )
    max_archive_members: int = Field(100_000, description="Most files a code bundle may hold.")
    max_archive_unpacked_bytes: int = Field(4 * 1024**3, description="Largest total unpacked size of a code bundle.")

    # Reconciler and executor
    reconcile_interval: float = Field(0.5, description="Seconds between reconcile passes when idle.")
    lease_seconds: float = Field(15.0, description="How long a reconciler's claim on a job lasts unrenewed.")
    database_idle_transaction_seconds: float = Field(
        15.0,
        ge=0,
        description="PostgreSQL ends a server's session idle this long inside a transaction (a paused server's row "
        "locks are let go, so other servers can take its jobs over); 0: never.",
    )
    server_heartbeat_seconds: float = Field(
        5.0,
        gt=0,
        le=300,
        description="How often a server records itself as live in the database and counts the live servers (it "
        "enforces 1/servers of each rate limit); one unseen for 3 heartbeats no longer counts.",
    )
    kill_grace_seconds: float = Field(10.0, description="SIGTERM → SIGKILL grace on cancel and timeout.")
    restart_backoff_seconds: float = Field(1.0, description="Delay before a failed job is restarted.")
    cpus: float | None = Field(None, description="CPUs the local executor offers (default: all).")
    memory: str | None = Field(None, description="Memory the local executor offers, e.g. 16G (default: all).")
    gpus: str | None = Field(
        None,
        description="GPU indices the local executor offers, e.g. '0,1', optionally with their model, "
        "'0:H200,1:A100' (default: what NVML finds).",
    )
    runtimes_dir: Path | None = Field(
        None, description="Where managed runtime virtualenvs live (default: $KILN_HOME/runtimes)."
    )
    runtime_catalog: Path | None = Field(
        None,
        description="A YAML file of extra runtime catalog entries (list of {framework, version, packages, image, "
        "default, description}); an entry with the same framework and version replaces the built-in one.",
    )
    bootstrap: bool = Field(True, description="Create the admin organisation, user and key on first start.")

    # Interpreters a job may name (runtime.python, `kiln run --python`) on the local executor: the catalog's runtimes,
    # the system's under /usr, and these directories (an installation or virtualenvs the operator put there). Never
    # anything in $KILN_HOME, whatever is listed (backends/local/python_policy.py).
    allowed_python_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="Directories whose interpreters runtime.python may name besides /usr and the catalog's "
        "runtimes, as a JSON list or separated by ':' (e.g. /opt/python:/srv/venvs); default: none.",
    )

    @field_validator("allowed_python_roots", mode="before")
    @classmethod
    def _python_roots(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                import json

                return json.loads(text)
            return [part.strip() for part in text.split(os.pathsep) if part.strip()]
        return value

    @field_validator("allowed_python_roots")
    @classmethod
    def _absolute_roots(cls, value: list[Path]) -> list[Path]:
        relative = [str(p) for p in value if not p.is_absolute()]
        if relative:
            raise ValueError(f"allowed python roots must be absolute paths, not {', '.join(relative)}")
        return [Path(os.path.normpath(p)) for p in value]

    # Job sandbox (local executor)
    sandbox: Literal["bwrap", "none"] = Field(
        "bwrap",
        description="How the local executor isolates jobs: bwrap runs each job in a bubblewrap sandbox (its own "
        "files only, an unprivileged uid); none runs jobs as the server's user with the whole filesystem visible "
        "(an operator's explicit opt-in; jobs are refused while bwrap is asked for and unusable).",
    )
    sandbox_uid_base: int = Field(
        1_500_000_000,
        ge=1000,
        le=4_000_000_000,
        description="When the server runs as root, each organisation's jobs run as uid/gid BASE + a number "
        "derived from the organisation (within 2^24); pick a range no account of the machine uses.",
    )
    job_disk_default: int = Field(
        20 * 1024**3,
        gt=0,
        description="Disk a job may use in its work dir, outputs, checkpoints, site packages and home when its "
        "spec sets no resources.disk (bytes, or a quantity such as 20G).",
    )
    work_retention_seconds: float = Field(
        24 * 3600.0,
        ge=0,
        description="How long a failed job's work dir is kept for debugging (a succeeded or cancelled job's is "
        "removed once its outputs are in the store).",
    )

    # Job limits (local executor)
    job_pids_default: int = Field(
        4096,
        ge=limits.MIN_PIDS,
        le=limits.MAX_PIDS,
        description="Processes and threads a job (each worker) may have at once when its spec sets no "
        "resources.pids: a pids control group per attempt where the machine has one (else RLIMIT_NPROC of the "
        "job's uid); past it forks fail and the job ends PidsLimitExceeded.",
    )
    job_log_default: int = Field(
        1024**3,
        gt=0,
        le=limits.MAX_RESOURCE_BYTES,
        description="Bytes a job's log may hold (all its attempts and workers) when its spec sets no "
        "resources.log (bytes, or a quantity such as 1G); past it the output is dropped and the job ends "
        "LogLimitExceeded. Logs count in the organisation's storage.",
    )
    job_tensorboard_bytes: int = Field(
        32 * 1024**2,
        ge=0,
        le=limits.MAX_RESOURCE_BYTES,
        description="Bytes of TensorBoard event records the job's supervisor decodes for metrics per attempt (each "
        "file at most half of it; records over 1 MiB are skipped undecoded), bounding what a crafted event file "
        "costs it; past it the files are no longer read and the job's log says so (bytes, or e.g. 64M).",
    )

    backend: Literal["local", "kubernetes", "slurm"] = Field(
        "local",
        description="Where jobs run: processes on this machine, a Kubernetes cluster (settings KILN_KUBERNETES_*, "
        "docs/kubernetes.md) or a Slurm cluster (settings KILN_SLURM_*, docs/slurm.md).",
    )
    # Read from its own KILN_KUBERNETES_* variables (an invalid one is named by its variable at start).
    kubernetes: KubernetesSettings = Field(
        default_factory=KubernetesSettings, description="Settings of the Kubernetes backend (KILN_KUBERNETES_*)."
    )
    # Read from its own KILN_SLURM_* variables, as the Kubernetes branch.
    slurm: SlurmSettings = Field(
        default_factory=SlurmSettings, description="Settings of the Slurm backend (KILN_SLURM_*, docs/slurm.md)."
    )

    # Scheduling
    preemption: bool = Field(
        True, description="A higher-priority job may preempt lower-priority ones that hold what it needs."
    )
    preemption_grace_seconds: float = Field(
        30.0, ge=0, description="Between a preemption notice (and SIGTERM) and SIGKILL: time to checkpoint."
    )
    node_labels: dict[str, str] = Field(
        default_factory=dict,
        description='Labels of this machine for node_selector, as JSON, e.g. {"zone": "a"}; Kiln adds '
        "kiln.io/hostname and kiln.io/backend.",
    )
    checkpoint_sync_seconds: float = Field(
        300.0,
        ge=0,
        description="How often running jobs' $KILN_CHECKPOINT_DIR is copied to the store (0: only at "
        "the end of each attempt).",
    )
    log_ship_seconds: float = Field(
        2.0,
        ge=0,
        description="How often the logs of the running jobs this server holds are shipped to the store, where "
        "every server reads them (0: only when each attempt ends).",
    )
    data_cache_bytes: int = Field(
        50 * 1024**3, ge=0, description="Size limit of the local executor's dataset cache (LRU beyond it)."
    )
    mount_tools: str = Field(
        "rclone,s3fs",
        description="FUSE tools the local executor may mount `mode: mount` inputs with, in order of preference "
        "(rclone mounts any store, s3fs only S3), comma-separated; empty: such inputs are refused at submit.",
    )
    mount_cache_bytes: int = Field(
        0,
        ge=0,
        description="With rclone, keep what a job reads through a mount on disk (in the attempt's directory, "
        "removed when it ends), up to this size; 0: every read is streamed from the store.",
    )
    metrics_token: str | None = Field(
        None,
        description="When set, GET /metrics (Prometheus) needs 'Authorization: Bearer <this token>'; "
        "unset, /metrics is open (it only shows aggregate numbers, no tenant labels).",
    )

    # Job network
    job_egress: str = Field(
        "",
        description="Where jobs with network: isolated may connect, as rules separated by ';' or newlines: "
        "'allow CIDR[:PORT[-PORT]]' or 'deny CIDR[:PORT[-PORT]]', the first that matches decides, what none "
        "matches is allowed; the machine itself and link-local addresses (metadata services) are always denied "
        "unless an allow rule names them; 'allow 127.0.0.1:PORT' forwards a port of the job's loopback to the "
        "machine's (a local mirror or proxy). E.g. 'deny 10.0.0.0/8; allow 127.0.0.1:3128'.",
    )
    network_host_orgs: str = Field(
        "",
        description="Organisations (names or ids, comma-separated) whose jobs may ask for network: host, the "
        "machine's own network; everyone else's are refused.",
    )

    @field_validator("job_egress")
    @classmethod
    def _egress_rules(cls, value: str) -> str:
        from kiln.domain.egress import parse_rules

        parse_rules(_split_rules(value))  # a bad rule stops the server at start, named
        return value

    @property
    def egress_rules(self) -> list[Any]:
        """KILN_JOB_EGRESS parsed (kiln.domain.egress.EgressRule)."""
        from kiln.domain.egress import parse_rules

        return list(parse_rules(_split_rules(self.job_egress)))

    @property
    def network_host_org_list(self) -> list[str]:
        return [o.strip() for o in self.network_host_orgs.split(",") if o.strip()]

    # Proxies
    trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Addresses or networks (CIDR) of the reverse proxies in front of the server, comma-separated "
        "or a JSON list, e.g. 127.0.0.1,10.0.0.0/8: only a request whose direct peer is one of them has its "
        "X-Forwarded-For (the client's address, as the audit log records it) and X-Forwarded-Proto honoured; "
        "default: none, from anyone.",
    )

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _proxy_list(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                import json

                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _proxy_networks(cls, value: list[str]) -> list[str]:
        import ipaddress

        networks = []
        for item in value:
            try:
                networks.append(str(ipaddress.ip_network(item.strip(), strict=False)))
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or a network such as 10.0.0.0/8") from None
        return networks

    @field_validator("job_disk_default", "job_log_default", "job_tensorboard_bytes", mode="before")
    @classmethod
    def _disk_quantity(cls, value: object) -> object:
        if isinstance(value, str) and value.strip() and not value.strip().isdigit():
            from kiln.domain.quantities import parse_memory

            return parse_memory(value)
        return value

    @field_validator("home", mode="before")
    @classmethod
    def _expand_home(cls, value: object) -> object:
        if isinstance(value, str):
            return Path(os.path.expanduser(value))
        return value

    @cached_property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'kiln.db'}"

    @cached_property
    def resolved_storage_url(self) -> str:
        return self.storage_url or str(self.home / "store")

    @property
    def storage_options(self) -> dict[str, object]:
        """fsspec options of the store (credentials included: never log them)."""
        if not self.resolved_storage_url.startswith(("s3://", "s3a://")):
            return {}
        client: dict[str, object] = {}
        if self.storage_endpoint_url:
            client["endpoint_url"] = self.storage_endpoint_url
        if self.storage_region:
            client["region_name"] = self.storage_region
        options: dict[str, object] = {"client_kwargs": client}
        if self.storage_access_key_id:
            options["key"] = self.storage_access_key_id
        if self.storage_secret_access_key is not None:
            options["secret"] = self.storage_secret_access_key.get_secret_value()
        return options

    @field_validator("mount_tools")
    @classmethod
    def _mount_tools(cls, value: str) -> str:
        unknown = sorted({t.strip() for t in value.split(",") if t.strip()} - {"rclone", "s3fs"})
        if unknown:
            raise ValueError(f"unknown mount tools {', '.join(unknown)}: the tools are rclone and s3fs")
        return value

    @property
    def mount_tool_list(self) -> list[str]:
        return [t.strip() for t in self.mount_tools.split(",") if t.strip()]

    @cached_property
    def resolved_runtimes_dir(self) -> Path:
        return self.runtimes_dir or self.home / "runtimes"

    @cached_property
    def resolved_instance_id(self) -> str:
        if self.instance_id:
            return self.instance_id
        digest = hashlib.sha256(f"{socket.gethostname()}:{self.home.resolve()}".encode()).hexdigest()
        return f"{socket.gethostname()}-{digest[:10]}"

    @property
    def endpoint(self) -> str:
        return self.public_endpoint or f"http://{self.host}:{self.port}"

    @property
    def jobs_dir(self) -> Path:
        return self.home / "jobs"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def run_dir(self) -> Path:
        """Sockets and locks of the running server."""
        return self.home / "run"


class ClientSettings(BaseSettings):
    """What the SDK and CLI need to reach a server: environment first, then ``kiln login``'s file."""

    model_config = SettingsConfigDict(env_prefix="KILN_", extra="ignore")

    endpoint: str | None = Field(None, description="Server URL, e.g. http://127.0.0.1:8080.")
    access_key: str | None = Field(None, description="Access key id.")
    secret_key: str | None = Field(None, description="Secret key (never logged).")
    job_token: str | None = Field(
        None, description="Bearer token of a running job (set by Kiln in the job's environment; never logged)."
    )
    config: Path = Field(
        default_factory=lambda: client_dir() / "config",
        description="File written by `kiln login` (default: config in the client's state directory, "
        "$KILN_CLIENT_DIR, else $KILN_HOME, else ~/.kiln).",
    )
    timeout: float = Field(60.0, description="HTTP timeout in seconds.")
    retry_seconds: float = Field(
        60.0,
        ge=0,
        description="How long the SDK keeps retrying a request that is safe to repeat (a read, or a create it "
        "sends with an Idempotency-Key) after a lost connection or a 502, 503 or 504; 0: never retry.",
    )
