"""The job spec: one pydantic schema for the API, the SDK and ``kiln.yaml`` files.

Unknown fields are rejected (``extra="forbid"``) so that a typo such as ``resorces`` is an error naming the
field, not a silently ignored setting.
"""

from __future__ import annotations

import re
import shlex
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from kiln.domain import limits
from kiln.domain import models as model_refs
from kiln.domain.dataset_refs import parse_ref
from kiln.domain.distributed import DistributedSpec
from kiln.domain.durations import parse_duration
from kiln.domain.metric_limits import MetricLimitsSpec
from kiln.domain.notifications import JobNotify
from kiln.domain.quantities import parse_memory

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.\-/]{0,61}[A-Za-z0-9])?$")
RESERVED_ENV_PREFIX = "KILN_"


# A command: one shell string, or an argv list. Every part is bounded (the OpenAPI schema shows the maxima).
CommandText = Annotated[str, Field(max_length=limits.MAX_COMMAND_LENGTH)]
CommandArg = Annotated[str, Field(max_length=limits.MAX_ARG_LENGTH)]
Command = CommandText | Annotated[list[CommandArg], Field(max_length=limits.MAX_COMMAND_ARGS)]
Text = Annotated[str, Field(max_length=limits.MAX_TEXT_LENGTH)]
EnvName = Annotated[str, Field(max_length=limits.MAX_ENV_NAME_LENGTH)]
EnvValue = Annotated[str, Field(max_length=limits.MAX_ARG_LENGTH)]
LabelKey = Annotated[str, Field(max_length=limits.MAX_LABEL_KEY_LENGTH)]
LabelValue = Annotated[str, Field(max_length=limits.MAX_LABEL_VALUE_LENGTH)]
Priority = Literal["low", "normal", "high"]
PRIORITIES: dict[str, int] = {"low": 0, "normal": 1, "high": 2}

# A job's parameters (a tuning study's trials get theirs from the sampler): names as in Python, values plain.
ParamName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
ParamValue = Annotated[bool, Field(strict=True)] | int | float | Annotated[str, Field(max_length=limits.MAX_ARG_LENGTH)]
MAX_PARAMS = 64


def param_env_name(name: str) -> str:
    """The environment variable that holds parameter ``name`` in the job: ``KILN_PARAM_<NAME>``."""
    return f"KILN_PARAM_{name.upper()}"


def format_param(value: bool | int | float | str) -> str:
    """A parameter as text: the command line's and ``KILN_PARAM_*``'s form (``true``/``false`` for booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def command_argv(command: Command) -> list[str]:
    """A string runs through ``/bin/sh -c`` (pipes, globs, ``&&`` work); a list is executed as given."""
    if isinstance(command, str):
        return ["/bin/sh", "-c", command]
    return list(command)


def command_text(command: Command) -> str:
    return command if isinstance(command, str) else shlex.join(command)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class RuntimeSpec(_Strict):
    """Where the command runs: a catalog framework (``{framework, version}``), or bring your own
    environment: a Python interpreter on the machine (``{python: /path/to/python}``) or, on container
    backends, an image (``{image: repo/name:tag}``)."""

    framework: Text | None = Field(None, description="A catalog framework (`kiln runtimes list`).")
    version: Text | None = Field(None, description="Catalog version; default: the catalog's default.")
    python: Text | None = Field(None, description="A Python executable to run with (custom runtime).")
    image: Text | None = Field(None, description="A container image (container backends only).")

    @model_validator(mode="after")
    def _one_kind(self) -> RuntimeSpec:
        kinds = [k for k in ("framework", "python", "image") if getattr(self, k)]
        if len(kinds) > 1:
            raise ValueError(f"give only one of framework, python, image (got {', '.join(kinds)})")
        if not kinds:
            self.framework = "python"
        if self.version is not None and not self.framework:
            raise ValueError("version applies only to a catalog framework")
        return self

    @property
    def label(self) -> str:
        if self.framework:
            return f"{self.framework}{'==' + self.version if self.version else ''}"
        return f"python:{self.python}" if self.python else f"image:{self.image}"


class Resources(_Strict):
    """What one worker of the job is allocated. ``memory``, ``disk``, ``pids`` and ``log`` are also limits: the job
    fails above them; ``cpus`` is a quota it cannot exceed (local executor: docs/sandbox.md)."""

    cpus: float = Field(
        1.0,
        gt=0,
        le=limits.MAX_CPUS,
        description="CPU cores reserved; on the local executor also a CPU quota (a cgroup's), where the machine "
        "allows one, that the job's processes together cannot exceed.",
        strict=True,
    )
    memory: int | None = Field(
        None,
        gt=0,
        le=limits.MAX_RESOURCE_BYTES,
        description="Memory reserved and enforced, e.g. 2G, 512Mi (at most 1 PiB); bytes in responses. None: no limit.",
        strict=True,
    )
    disk: int | None = Field(
        None,
        gt=0,
        le=limits.MAX_RESOURCE_BYTES,
        description="Most bytes the job's work dir, outputs, checkpoints, site packages and home may hold, e.g. "
        "20G (at most 1 PiB; its /tmp counts as memory); bytes in responses. None: the platform's default "
        "(KILN_JOB_DISK_DEFAULT).",
        strict=True,
    )
    pids: int | None = Field(
        None,
        ge=limits.MIN_PIDS,
        le=limits.MAX_PIDS,
        description="Most processes and threads the job may have at once (per worker, 16 to 4194304); a fork past "
        "it fails and the job ends PidsLimitExceeded. None: the platform's default (KILN_JOB_PIDS_DEFAULT, 4096).",
        strict=True,
    )
    log: int | None = Field(
        None,
        gt=0,
        le=limits.MAX_RESOURCE_BYTES,
        description="Most bytes the job's log may hold, all attempts and workers together, e.g. 100M (at most "
        "1 PiB); past it the output is dropped and the job ends LogLimitExceeded; bytes in responses. None: the "
        "platform's default (KILN_JOB_LOG_DEFAULT, 1 GiB). The log counts in the organisation's storage.",
        strict=True,
    )
    gpus: int = Field(
        0, ge=0, le=limits.MAX_GPUS, description="Whole GPUs reserved (pinned with CUDA_VISIBLE_DEVICES).", strict=True
    )
    gpu_type: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="Only GPUs of this model, e.g. H200 (matched case-insensitively against the GPU's name).",
    )

    @model_validator(mode="after")
    def _gpu_type_needs_gpus(self) -> Resources:
        if self.gpu_type is not None and self.gpus == 0:
            raise ValueError("gpu_type needs gpus ≥ 1")
        return self

    @field_validator("memory", "disk", "log", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str) and len(value) > limits.MAX_QUANTITY_LENGTH:
            raise ValueError(f"not a memory quantity: longer than {limits.MAX_QUANTITY_LENGTH} characters")
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            try:
                parsed = parse_memory(value)
            except OverflowError:  # e.g. 1e999G, or Infinity
                raise ValueError(f"not a memory quantity: {value!r} is out of range") from None
            if parsed <= 0:
                raise ValueError("must be positive")
            return parsed
        raise ValueError(f"not a memory quantity: {value!r}")


STEP_GROUPS = ("step", "epoch", "iteration", "iter")


class MetricPattern(_Strict):
    """A regular expression whose named groups are metrics (FfDL's regex extractor): matched against each
    log line joined with the ``lines - 1`` lines after it; a number in a group is a value, other text a text
    metric; the ``step`` group (default: a group named step, epoch, iteration or iter) is the step."""

    regex: str = Field(
        min_length=1, max_length=limits.MAX_REGEX_LENGTH, description="Python regular expression with named groups."
    )
    lines: int = Field(1, ge=1, le=20, description="Lookahead window: lines one match may span.", strict=True)
    step: str | None = Field(
        None, max_length=limits.MAX_NAME_LENGTH, description="The named group holding the step, if not step/epoch/…."
    )

    @model_validator(mode="after")
    def _compiles(self) -> MetricPattern:
        try:
            compiled = re.compile(self.regex)
        except (re.error, OverflowError, RecursionError) as exc:  # a{99999999999}: OverflowError
            raise ValueError(f"regex {self.regex!r} does not compile: {exc}") from None
        groups = set(compiled.groupindex)
        if self.step is not None and self.step not in groups:
            raise ValueError(f"step {self.step!r} is not a named group of {self.regex!r}")
        step = self.step or next((g for g in STEP_GROUPS if g in groups), None)
        if not groups - {step}:
            raise ValueError(f"regex {self.regex!r} has no named group for a value: write e.g. (?P<loss>[0-9.]+)")
        return self


def _name_pattern(value: str) -> str:
    if not value.strip() or any(ord(c) < 32 or c == "\x7f" for c in value):
        raise ValueError(f"{value!r} is not a metric name or pattern (e.g. loss, val_*, train/*)")
    return value


MetricNamePattern = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_name_pattern)]
"""A metric name, or a shell-style pattern of names (``val_*``), as ``metrics.include``/``exclude`` list them."""


class MetricsSpec(_Strict):
    """How Kiln collects the job's metrics without code changes (``kiln.log`` in the job always works)."""

    builtin: bool = Field(
        True, description="Recognise key=value, key: value and Keras-style progress lines.", strict=True
    )
    patterns: list[MetricPattern] = Field(
        default_factory=list, max_length=limits.MAX_METRIC_PATTERNS, description="Custom extractors."
    )
    include: list[MetricNamePattern] = Field(
        default_factory=list,
        max_length=limits.MAX_METRIC_PATTERNS,
        description="Names to take from the log, shell-style patterns (loss, val_*): only these when given, the "
        "well-known non-metrics (rank, world_size, pid, seed, ...) too where they match. Default: every name but "
        "those.",
    )
    exclude: list[MetricNamePattern] = Field(
        default_factory=list,
        max_length=limits.MAX_METRIC_PATTERNS,
        description="Names never taken from the log, shell-style patterns (lr, debug/*).",
    )
    tensorboard: bool = Field(
        True, description="Ingest TensorBoard scalars written under the TensorBoard dir.", strict=True
    )
    tensorboard_dir: str | None = Field(
        None,
        max_length=limits.MAX_PATH_LENGTH,
        description="Where the job writes TensorBoard events, relative to its work dir; "
        "default: $KILN_TENSORBOARD_DIR.",
    )
    system: bool = Field(True, description="Sample CPU %, RSS and GPU utilisation/memory of the job.", strict=True)
    system_interval: float = Field(5.0, ge=0.5, le=3600, description="Seconds between system samples.", strict=True)
    watch: list[MetricNamePattern] = Field(
        default_factory=list,
        max_length=limits.MAX_WATCHED_METRICS,
        description="Metrics whose every point goes to the server as soon as it is written, not with the next "
        "batch (names or shell-style patterns): a study's trials watch its objective, so that its pruner judges "
        "each report as it is made. Each such point costs a write and a wake-up of the server: watch a "
        "per-epoch metric, not a per-batch one.",
    )
    limits: MetricLimitsSpec | None = Field(
        None,
        description="The job's metrics budget: most series, points, bytes per spool line and spool bytes read "
        "(docs/metrics.md). Unset: the operator's defaults.",
    )

    @field_validator("tensorboard_dir")
    @classmethod
    def _relative(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = value.replace("\\", "/").split("/")
        if value.startswith("/") or ".." in parts or "\x00" in value or not value.strip():
            raise ValueError("must be a relative path inside the job's work dir (no '..', not absolute)")
        return value


def input_env_name(dataset: str) -> str:
    """``KILN_INPUT_<NAME>``: the dataset name upper-cased, every other character an underscore."""
    name = dataset.split("@", 1)[0]
    return "KILN_INPUT_" + re.sub(r"[^A-Z0-9]", "_", name.upper())


class InputSpec(_Strict):
    """What the job reads, staged (or mounted) read-only at ``path`` before the command runs: a dataset version, a
    registered model's version, or the outputs of an ended job of the organisation. Exactly one of ``dataset``,
    ``model`` and ``job``."""

    dataset: str | None = Field(
        None,
        max_length=limits.MAX_DATASET_REF_LENGTH,
        description="NAME, NAME@VERSION or NAME@latest; without a version, the latest at submit (then pinned).",
    )
    model: str | None = Field(
        None,
        max_length=model_refs.MAX_MODEL_REF_LENGTH,
        description="A registered model: NAME@VERSION, NAME@ALIAS or NAME (the latest); pinned to its version "
        "number at submit.",
    )
    job: str | None = Field(
        None,
        max_length=64,
        pattern=r"^[a-z]+-[0-9a-z]{1,40}$",
        description="A job that succeeded: its outputs (what it wrote to $KILN_OUTPUT_DIR), as they were when it "
        "ended.",
    )
    name: str | None = Field(
        None,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="What the job calls it: $KILN_INPUT_<NAME> and the default path /data/NAME; default the "
        "dataset's, the model's or the job's name.",
    )
    path: str | None = Field(
        None,
        max_length=limits.MAX_PATH_LENGTH,
        description="Where the job sees it; default /data/NAME (a dataset, a job's outputs), /models/NAME (a model).",
    )
    mode: Literal["stage", "mount"] = Field("stage", description="Copy into a local cache, or mount (FUSE).")

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str | None) -> str | None:
        if value is not None:
            parse_ref(value)  # the server's rules, the SDK's and the CLI's: one parser
        return value

    @field_validator("model")
    @classmethod
    def _model(cls, value: str | None) -> str | None:
        if value is not None:
            model_refs.parse_ref(value)
        return value

    @model_validator(mode="after")
    def _one_source(self) -> InputSpec:
        if [self.dataset, self.model, self.job].count(None) != 2:
            raise ValueError("give exactly one of dataset (NAME@VERSION), model (NAME@VERSION|ALIAS) and job (JOB_ID)")
        if self.job is not None and self.mode == "mount":
            raise ValueError("a job's outputs are staged (mode: stage), not mounted")
        return self

    @property
    def ref(self) -> str:
        """The dataset's, the model's or the job's reference, as given (or pinned)."""
        return self.dataset if self.dataset is not None else self.model if self.model is not None else self.job or ""

    @property
    def env(self) -> str:
        """``KILN_INPUT_<NAME>``: where the job finds it."""
        return input_env_name(self.name or self.ref)

    @field_validator("path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = [p for p in value.split("/") if p]
        if not parts or ".." in parts or "\\" in value or "\x00" in value or "%" in value:
            raise ValueError(f"{value!r}: a path without '..', backslashes, '%' or NUL")
        return value

    @property
    def label(self) -> str:
        """Its name: as given, else the dataset's or the model's (without the version), or the job's id."""
        return self.name or self.ref.split("@", 1)[0]

    @property
    def where(self) -> str:
        return self.path or (f"/models/{self.label}" if self.model is not None else f"/data/{self.label}")


NetworkMode = Literal["isolated", "none", "host"]


class JobSpec(_Strict):
    """A training job, as submitted and as written in ``kiln.yaml``."""

    name: str | None = Field(None, min_length=1, max_length=limits.MAX_NAME_LENGTH, description="Display name.")
    command: Command = Field(description="A shell string, or an argv list executed without a shell.")
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    resources: Resources = Field(default_factory=Resources)
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, max_length=limits.MAX_ENV_VARS, description="Extra environment variables."
    )
    prepare_command: Command | None = Field(None, description="Runs before the command, in the work dir.")
    finish_command: Command | None = Field(
        None, description="Runs after the command whatever its outcome; $KILN_EXIT_CODE holds it."
    )
    max_restarts: int = Field(
        0, ge=0, le=limits.MAX_RESTARTS, description="How often a failed run is retried.", strict=True
    )
    restart_on_exit_codes: list[Annotated[int, Field(ge=1, le=255, strict=True)]] = Field(
        default_factory=list,
        max_length=limits.MAX_EXIT_CODES,
        description="Exit codes that are retried; empty: any failure.",
    )
    timeout: float | None = Field(
        None,
        gt=0,
        le=limits.MAX_DURATION_SECONDS,
        description="Wall-clock limit per run, seconds or e.g. '90s', '15m', '2h', '1d', '1h30m' (at most a year); the "
        "run fails above it.",
        strict=True,
    )
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=limits.MAX_LABELS)
    priority: Priority = Field(
        "normal", description="Scheduling class: low, normal or high (high may need a grant from a platform admin)."
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=limits.MAX_LABELS,
        description="Run only on nodes carrying all these labels (key: value).",
    )
    distributed: DistributedSpec | None = Field(
        None, description="Several workers started together (a gang); resources are per worker."
    )
    metrics: MetricsSpec = Field(default_factory=MetricsSpec, description="Metric collection from logs etc.")
    notify: JobNotify | None = Field(
        None, description="E-mail these addresses when the job ends, fails… (Slurm's --mail-type; kiln run --notify)."
    )
    network: NetworkMode = Field(
        "isolated",
        description="The job's network: isolated (its own network namespace; the outside world through a "
        "user-mode stack under the operator's egress rules, the Kiln API forwarded, nothing of the machine's "
        "loopback or addresses), none (its own loopback and the Kiln API only) or host (the machine's network; "
        "refused unless the operator allows it for the organisation). A distributed job's workers on one "
        "machine share one namespace.",
    )
    inputs: list[InputSpec] = Field(
        default_factory=list, max_length=limits.MAX_INPUTS, description="Datasets and models the job reads."
    )
    params: dict[ParamName, ParamValue] = Field(
        default_factory=dict,
        max_length=MAX_PARAMS,
        description="Parameters (a tuning study's trials get them from its sampler): in the job as "
        "KILN_PARAM_<NAME> and in the JSON file $KILN_PARAMS_FILE; its run records them.",
    )
    experiment: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        pattern=r"^[^\x00-\x1f]+$",
        description="The experiment its run belongs to (made on first use); default: Default.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or any(ord(c) < 32 for c in value)):
            raise ValueError("must be printable text")
        return value

    @field_validator("command", "prepare_command", "finish_command")
    @classmethod
    def _command(cls, value: Command | None) -> Command | None:
        if value is None:
            return None
        if isinstance(value, str):
            if not value.strip():
                raise ValueError("must not be empty")
            if "\x00" in value:
                raise ValueError("must not contain NUL")
        else:
            if not value or not value[0]:
                raise ValueError("must not be empty")
            if any("\x00" in part for part in value):
                raise ValueError("must not contain NUL")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            if not _ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if key.startswith(RESERVED_ENV_PREFIX):
                raise ValueError(f"{key!r}: names starting with {RESERVED_ENV_PREFIX} are set by Kiln")
            if "\x00" in val:
                raise ValueError(f"{key!r}: value must not contain NUL")
        return value

    @field_validator("labels", "node_selector")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            if not _LABEL_KEY.match(key):
                raise ValueError(f"{key!r} is not a valid label key (letters, digits, -_./, ≤63)")
            if len(val) > 256:
                raise ValueError(f"label {key!r}: value longer than 256 characters")
        return value

    @field_validator("timeout", mode="before")
    @classmethod
    def _timeout(cls, value: Any) -> Any:
        return None if value is None else parse_duration(value)

    @field_validator("params")
    @classmethod
    def _params(cls, value: dict[str, Any]) -> dict[str, Any]:
        seen: dict[str, str] = {}
        for key, val in value.items():
            env = param_env_name(key)
            if env in seen:
                raise ValueError(f"{seen[env]!r} and {key!r} would share {env}")
            seen[env] = key
            if isinstance(val, float) and val != val:
                raise ValueError(f"{key!r}: not a number")
            if isinstance(val, str) and "\x00" in val:
                raise ValueError(f"{key!r}: value must not contain NUL")
        return value

    @model_validator(mode="after")
    def _distinct_inputs(self) -> JobSpec:
        seen_env: dict[str, str] = {}
        seen_path: set[str] = set()
        for item in self.inputs:
            env = item.env
            if env in seen_env:
                raise ValueError(f"inputs: {item.ref!r} and {seen_env[env]!r} would share {env}")
            seen_env[env] = item.ref
            where = "/".join(p for p in item.where.split("/") if p)
            if where in seen_path:
                raise ValueError(f"inputs: two inputs at the same path {item.where!r}")
            seen_path.add(where)
        return self

    @property
    def gang_size(self) -> int:
        """Members started together: the workers and, for TensorFlow, the parameter servers."""
        if self.distributed is None:
            return 1
        return self.distributed.workers + self.distributed.ps

    @property
    def priority_value(self) -> int:
        return PRIORITIES[self.priority]

    @property
    def display_name(self) -> str:
        if self.name:
            return self.name
        text = command_text(self.command)
        return text if len(text) <= 40 else text[:39] + "…"
