"""The one settings tree of Kiln.

Every knob is a field here, read from ``KILN_*`` environment variables (or passed explicitly in tests); the
cluster backends' own settings (``KILN_KUBERNETES_*``, ``KILN_SLURM_*``) are in :mod:`kiln.settings.clusters`, part
of the same tree. Nothing else in the code base reads ``os.environ`` for configuration.
"""

from __future__ import annotations

import hashlib
import os
import socket
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from kiln.domain import limits
from kiln.settings.client import ClientSettings
from kiln.settings.clusters import KubernetesSettings, SlurmSettings
from kiln.settings.notifications import NotificationSettings

__all__ = ["ClientSettings", "KubernetesSettings", "Settings", "SlurmSettings"]


def _split_rules(text: str) -> list[str]:
    return [r.strip() for r in text.replace("\n", ";").split(";") if r.strip()]


def _default_home() -> Path:
    return Path.home() / ".kiln"


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
    mlflow_basic_auth_over_http: bool = Field(
        False,
        description="Take MLflow clients' basic authentication (an access key's id and secret) over plain HTTP from "
        "other machines too; by default only over HTTPS (through a trusted proxy) or from this machine.",
    )
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
    submit_fast_path: bool = Field(
        True,
        description="Place a submitted job in its submit's own transaction when it fits free capacity with nothing "
        "waiting ahead of it (the scheduler's own decision, quotas and fair share included), rather than on the "
        "reconciler's next pass; false: every job waits for a pass.",
    )
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
    job_user_namespaces: bool = Field(
        False,
        description="Let sandboxed jobs make user namespaces (unshare -U, nested containers, rootless tools) and, "
        "inside them, mount, setns and pivot_root. Off, the job's seccomp filter refuses them with EPERM: the "
        "kernel surface most container escapes go through.",
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
    # A job's metrics budget (metrics.limits of its spec, kiln.domain.metric_limits): the default where the spec
    # sets none, and the ceiling up to which a spec may raise it.
    metrics_series_default: int = Field(
        10_000,
        ge=1,
        le=limits.MAX_JOB_METRIC_SERIES,
        description="Metric series a job may have when its spec sets no metrics.limits.series; past it new series "
        "are dropped (one MetricsLimitExceeded event), existing ones keep receiving points.",
    )
    metrics_max_series: int = Field(
        1_000_000,
        ge=1,
        le=limits.MAX_JOB_METRIC_SERIES,
        description="The most metrics.limits.series a spec may ask for (above it: 422).",
    )
    metrics_points_default: int = Field(
        10_000_000,
        ge=1,
        le=limits.MAX_JOB_METRIC_POINTS,
        description="Metric points stored for a job (all attempts) when its spec sets no metrics.limits.points; "
        "past it points are dropped or sampled (metrics.limits.on_limit).",
    )
    metrics_max_points: int = Field(
        1_000_000_000,
        ge=1,
        le=limits.MAX_JOB_METRIC_POINTS,
        description="The most metrics.limits.points a spec may ask for (above it: 422).",
    )
    metrics_line_default: int = Field(
        64 * 1024,
        ge=limits.MIN_METRIC_LINE_BYTES,
        le=limits.MAX_METRIC_LINE_BYTES,
        description="Longest metrics spool line in bytes when a spec sets no metrics.limits.line (or e.g. 64K); "
        "a longer line is skipped and counted as malformed, never held whole.",
    )
    metrics_max_line: int = Field(
        1024**2,
        ge=limits.MIN_METRIC_LINE_BYTES,
        le=limits.MAX_METRIC_LINE_BYTES,
        description="The most metrics.limits.line a spec may ask for (above it: 422).",
    )
    metrics_spool_default: int = Field(
        4 * 1024**3,
        ge=1,
        le=limits.MAX_METRIC_SPOOL_BYTES,
        description="Bytes of metrics spool files the server reads for a job when its spec sets no "
        "metrics.limits.spool (or e.g. 4G); past it the job's spool files are no longer read.",
    )
    metrics_max_spool: int = Field(
        64 * 1024**3,
        ge=1,
        le=limits.MAX_METRIC_SPOOL_BYTES,
        description="The most metrics.limits.spool a spec may ask for (above it: 422).",
    )
    job_tensorboard_bytes: int = Field(
        32 * 1024**2,
        ge=0,
        le=limits.MAX_RESOURCE_BYTES,
        description="Bytes of TensorBoard event records the job's supervisor decodes for metrics per job, all its "
        "attempts together (each file at most half of it; records over 1 MiB are skipped undecoded), bounding what "
        "a crafted event file costs it; past it the files are no longer read and the job's log says so (bytes, or "
        "e.g. 64M).",
    )
    job_tensorboard_cpu_seconds: float = Field(
        30.0,
        ge=0,
        le=24 * 3600,
        description="CPU seconds the job's supervisor may spend decoding the job's TensorBoard event files, all its "
        "attempts together (the supervisor runs outside the job's CPU quota); past it the files are no longer read "
        "and the job's log and events say so.",
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
    # Read from its own variables (KILN_WEBHOOK_*, KILN_SMTP_*, KILN_NOTIFICATIONS_*), as the Kubernetes branch.
    notifications: NotificationSettings = Field(
        default_factory=NotificationSettings,
        description="Webhook targets, the SMTP server and deliveries (docs/notifications.md).",
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
    tensorboard_sync_seconds: float = Field(
        30.0,
        ge=0,
        description="How often running jobs' TensorBoard event files are copied to the store, where `kiln "
        "tensorboard` reads them (0: only at the end of each attempt).",
    )
    tensorboard_keep_bytes: int = Field(
        256 * 1024**2,
        ge=0,
        le=limits.MAX_RESOURCE_BYTES,
        description="Bytes of TensorBoard event files kept in the store per job (counted in the organisation's "
        "storage); files past it are left out and the server's log says so (bytes, or e.g. 1G).",
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
    metering: bool = Field(
        True,
        description="Meter every attempt's hold (kiln usage, budgets); off only to measure what metering costs "
        "(benchmarks/submit_latency.py --no-metering): what runs while it is off is never counted.",
    )
    currency: str = Field(
        "",
        pattern=r"^([A-Z]{3})?$",
        description="The currency prices are set in and costs reported in, an ISO 4217 code (USD, EUR, CNY): shown "
        "beside every cost (kiln usage, budgets, prices, the console); empty: costs are plain numbers.",
    )
    metrics_token: str | None = Field(
        None,
        description="When set, GET /metrics (Prometheus) needs 'Authorization: Bearer <this token>' and shows "
        "usage by organisation too (kiln_usage_*); unset, /metrics is open and shows only aggregate numbers, no "
        "tenant labels.",
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
    network_pool_min: int = Field(
        2,
        ge=0,
        description="Network namespaces the local executor keeps made ahead for each network mode (isolated, "
        "none) on an idle server; during a burst the pool keeps the starts expected while spares are made, up to "
        "network_pool_max. A burst of N jobs at once that none of them waits for needs N here.",
    )
    network_pool_max: int = Field(
        32, ge=0, description="The most network namespaces kept made ahead for each network mode (0: none)."
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

    @field_validator(
        "job_disk_default",
        "job_log_default",
        "job_tensorboard_bytes",
        "tensorboard_keep_bytes",
        "metrics_line_default",
        "metrics_max_line",
        "metrics_spool_default",
        "metrics_max_spool",
        mode="before",
    )
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
