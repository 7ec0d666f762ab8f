"""The model registry's grammar and API shapes: model names, aliases, ``NAME@VERSION|ALIAS`` references, and what
``/api/v1/models`` takes and returns. One definition for the server, the SDK and the CLI.

A model is a name of an organisation with immutable, numbered versions; each version is a set of files copied
from a finished job's outputs into the organisation's content-addressed data blobs (the ones datasets use), with
its lineage: the job, its spec, its final metrics, and the tuning study and trial when the job was one. An alias
(``production``) names one version of its model and can be moved.

A reference is ``NAME`` (the latest version), ``NAME@latest`` (the same), ``NAME@3`` (a version) or
``NAME@production`` (an alias). Errors are ``ModelRefError`` (a ValueError, so a pydantic validator reports it on
its field); the server turns them into a 400 with the same message, and the SDK refuses what the server refuses.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal, NamedTuple, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kiln.domain import limits

NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")
ALIAS = re.compile(r"[a-z][a-z0-9._-]{0,62}")
LATEST = "latest"
MAX_MODEL_REF_LENGTH = 100 + 1 + 63
Framework = Literal["torch", "onnx", "sklearn", "custom"]
FRAMEWORKS: tuple[str, ...] = get_args(Framework)
# What a model file's name says of its framework, when registering does not say.
SUFFIXES: dict[str, Framework] = {
    ".pt": "torch",
    ".pth": "torch",
    ".pt2": "torch",
    ".onnx": "onnx",
    ".pkl": "sklearn",
    ".pickle": "sklearn",
    ".joblib": "sklearn",
}


class ModelRefError(ValueError):
    """Not a model name, alias, version or reference; the message quotes it and says what is allowed."""


class ModelRef(NamedTuple):
    name: str
    ref: int | str | None  # a version number, an alias, or None: the latest version


def check_name(name: str) -> str:
    """``name`` when it is a valid model name, else ModelRefError naming the rule it breaks."""
    if ".." in name:
        raise ModelRefError(f"model name {name!r}: '..' is not allowed")
    if not NAME.fullmatch(name):
        raise ModelRefError(
            f"model name {name!r}: use lowercase letters, digits and . _ - (at most 100, starting with a letter "
            "or digit)"
        )
    return name


def check_alias(alias: str) -> str:
    """``alias`` when it may name a version: lowercase, starting with a letter (so never a number), not
    ``latest`` (which always means the newest version)."""
    if alias == LATEST:
        raise ModelRefError(f"alias {alias!r}: '{LATEST}' always means the newest version; choose another name")
    if not ALIAS.fullmatch(alias):
        raise ModelRefError(
            f"alias {alias!r}: use lowercase letters, digits and . _ - (at most 63, starting with a letter)"
        )
    return alias


def parse_version(text: str) -> int | str | None:
    """What follows ``@``: a number from 1 (→ int), ``latest`` (→ None) or an alias (→ str)."""
    if text == LATEST:
        return None
    if text.isascii() and text.isdigit():
        number = int(text)
        if not 1 <= number <= limits.MAX_DATASET_VERSION:
            raise ModelRefError(f"version {text!r}: a number from 1 to {limits.MAX_DATASET_VERSION}")
        return number
    try:
        return check_alias(text)
    except ModelRefError:
        raise ModelRefError(f"version {text!r}: a number from 1, an alias, or '{LATEST}'") from None


def parse_ref(ref: str) -> ModelRef:
    """``NAME``, ``NAME@latest`` → (name, None); ``NAME@3`` → (name, 3); ``NAME@production`` → (name, 'production')."""
    name, at, version = ref.partition("@")
    check_name(name)
    if not at:
        return ModelRef(name, None)
    try:
        return ModelRef(name, parse_version(version))
    except ModelRefError as exc:
        raise ModelRefError(f"model reference {ref!r}: {exc}") from None


def format_ref(name: str, ref: int | str | None) -> str:
    return f"{name}@{LATEST if ref is None else ref}"


def guess_framework(paths: list[str]) -> Framework:
    """The framework the files' suffixes agree on (``model.pt`` → torch), else ``custom``."""
    found = {SUFFIXES.get(_suffix(p)) for p in paths} - {None}
    return found.pop() if len(found) == 1 else "custom"  # type: ignore[return-value]


def _suffix(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    return base[base.rfind(".") :].lower() if "." in base else ""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ModelRegister(_Strict):
    """``POST /models/{name}/versions``: a new version from a job's outputs (``job_id``), or from an MLflow model
    directory a run logged (``run_id``: a logged model of that name, else the run's artifact directory ``path``)."""

    job_id: str | None = Field(
        None, min_length=1, max_length=limits.MAX_ID_LENGTH, description="The job whose outputs hold it."
    )
    run_id: str | None = Field(
        None,
        min_length=1,
        max_length=limits.MAX_ID_LENGTH,
        description="The run that logged it the MLflow way (mlflow.<flavor>.log_model): its MLmodel file names the "
        "flavor the service's predictor loads and the signature requests are checked against.",
    )
    path: str = Field(
        "model",
        min_length=1,
        max_length=limits.MAX_PATH_LENGTH,
        description="A file, or a directory (every file under it), of the job's outputs ($KILN_OUTPUT_DIR); with "
        "run_id, the logged model's name (log_model's name/artifact_path) or the run's artifact directory.",
    )
    framework: Framework | None = Field(
        None, description="torch, onnx, sklearn or custom; default: what the files' suffixes say, else custom."
    )
    description: str | None = Field(None, max_length=limits.MAX_DESCRIPTION_LENGTH)

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        parts = [p for p in value.split("/") if p not in ("", ".")]
        if not parts or ".." in parts or "\\" in value or "\x00" in value:
            raise ValueError(f"{value!r}: a path inside the job's outputs, without '..', backslashes or NUL")
        return "/".join(parts)

    @model_validator(mode="after")
    def _one_source(self) -> ModelRegister:
        if (self.job_id is None) == (self.run_id is None):
            raise ValueError("job_id or run_id: name exactly one (the job's outputs, or the run's MLflow model)")
        return self


class AliasSet(_Strict):
    """``PUT /models/{name}/aliases/{alias}``: the version the alias names from now on."""

    version: int = Field(ge=1, le=limits.MAX_DATASET_VERSION, strict=True)


class ModelFileRead(BaseModel):
    path: str
    size: int
    sha256: str


class ModelLineage(BaseModel):
    """Where a version came from. The job's spec is copied: the lineage outlives the job."""

    job_id: str
    job_name: str | None = None
    job_state: str | None = Field(None, description="The job's state when the version was registered.")
    spec: dict[str, Any] = Field(default_factory=dict, description="The job's spec, inputs pinned.")
    metrics: dict[str, float] = Field(
        default_factory=dict, description="The last value of each of the job's scalar metrics (system ones aside)."
    )
    study_id: str | None = Field(None, description="The tuning study, when the job was one of its trials.")
    trial: int | None = Field(None, description="The trial's number in that study.")
    run_id: str | None = Field(None, description="The run it was registered from (--from-run); a job's run is the job.")
    logged_model_id: str | None = Field(None, description="The MLflow logged model it was registered from.")


class ModelVersionRead(BaseModel):
    name: str
    version: int
    framework: Framework
    description: str | None = None
    source_path: str = Field(description="The file or directory of the job's outputs it was copied from.")
    file_count: int
    size: int
    files: list[ModelFileRead] = Field(default_factory=list)
    aliases: list[str] = Field(default_factory=list)
    lineage: ModelLineage
    flavor: str | None = Field(
        None,
        description="The MLflow flavor its MLmodel file names (sklearn, pytorch, python_function): the mlflow "
        "predictor loads it so.",
    )
    signature: dict[str, Any] | None = Field(
        None,
        description="Its MLflow signature (inputs, outputs, params; each a list of specs): requests are checked "
        "against the inputs.",
    )
    created_by: str
    created_at: datetime
    already_registered: bool = Field(
        False,
        description="Set only in a register's answer (200, not 201) when no version was made: this version was "
        "registered earlier from the same job with the same framework and the same files, and is the one to use.",
    )

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"


class ModelVersionList(BaseModel):
    name: str
    items: list[ModelVersionRead]


class RunModelVersions(BaseModel):
    """The versions registered from a run, oldest first (files left out)."""

    run_id: str
    items: list[ModelVersionRead]


class ModelSummary(BaseModel):
    name: str
    latest_version: int | None = Field(None, description="None once every version was deleted.")
    versions: int
    aliases: dict[str, int] = Field(default_factory=dict)
    size: int = Field(0, description="Bytes of its versions' files (shared files counted once per version).")
    created_at: datetime
    updated_at: datetime


class ModelList(BaseModel):
    items: list[ModelSummary]


class ModelRead(ModelSummary):
    """A model with its versions (newest first) and aliases."""

    items: list[ModelVersionRead] = Field(default_factory=list, description="Its versions, newest first.")


class AliasRead(BaseModel):
    name: str
    alias: str
    version: int


class ModelRemoved(BaseModel):
    name: str
    versions: list[int] = Field(description="The version numbers removed.")
    aliases: list[str] = Field(default_factory=list, description="Aliases removed with them.")
    blobs_deleted: int = 0
    bytes_freed: int = 0
