"""Model serving: the service spec (``kiln serve -f service.yaml``), its states, and what the API returns.

A service runs replicas of a predictor over one registered model version. Each replica is a long-running
attempt of the same machinery jobs use (a job of quota category ``serve``, placed by the scheduler, run by the
backend's shim, with logs and metrics); on the local executor it serves HTTP on a loopback port and Kiln's
router in the API server forwards ``POST /api/v1/services/{name}/predict`` to a healthy one.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from kiln.domain import limits
from kiln.domain.rollout import RolloutPolicy
from kiln.domain.spec import EnvName, EnvValue, LabelKey, LabelValue, Resources, RuntimeSpec
from kiln.errors import InvalidInput

SERVICE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MODEL_REF = re.compile(r"^(?P<name>[a-z0-9][a-z0-9._-]{0,99})@(?P<ref>[A-Za-z0-9][A-Za-z0-9._-]{0,62})$")
MAX_REPLICAS = 64
MAX_DIMENSION = 2**31 - 1
PredictorType = Literal["torchscript", "torch-export", "onnx", "sklearn", "mlflow", "custom"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def parse_model_ref(value: str) -> tuple[str, str]:
    """``NAME@VERSION`` or ``NAME@ALIAS`` → (name, version-or-alias); ValueError saying the form."""
    match = MODEL_REF.fullmatch(value)
    if match is None:
        raise ValueError(f"{value!r}: expected NAME@VERSION or NAME@ALIAS, e.g. digits@3 or digits@production")
    return match.group("name"), match.group("ref")


class InputSchema(_Strict):
    """What one instance of a request's ``inputs`` must be: a nested list of numbers of this ``shape`` (per
    instance, without the batch dimension; ``null`` for any length), or, with ``dtype: string``, a string."""

    shape: list[Annotated[int, Field(ge=1, le=MAX_DIMENSION)] | None] = Field(
        default_factory=list, max_length=8, description="Per-instance shape, e.g. [64]."
    )
    dtype: Literal["float32", "float64", "int64", "string"] = "float32"

    @field_validator("shape")
    @classmethod
    def _shape(cls, value: list[int | None]) -> list[int | None]:
        if any(d is not None and d < 1 for d in value):
            raise ValueError("dimensions are ≥ 1 (or null for any length)")
        return value


class PredictorSpec(_Strict):
    """How a replica loads the model and answers: a built-in (``torchscript``, ``torch-export``, ``onnx``,
    ``sklearn``; ``mlflow`` for a version registered ``--from-run``: the flavor its MLmodel names, requests checked
    against its signature) or ``custom`` (``class: module:Class`` from the service's code bundle, with
    ``load(path)`` and ``predict(batch)``)."""

    type: PredictorType
    class_: str | None = Field(
        None, alias="class", max_length=200, description="custom: module:Class in the code bundle."
    )
    file: str | None = Field(
        None,
        max_length=limits.MAX_PATH_LENGTH,
        description="The model file in the version (default: its only one).",
    )
    input_schema: InputSchema | None = Field(None, description="Checked before predict: a wrong instance is a 422.")
    method: Literal["predict", "predict_proba"] = Field("predict", description="sklearn: which method answers.")

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)

    @model_validator(mode="after")
    def _custom(self) -> PredictorSpec:
        if self.type == "custom":
            if not self.class_ or not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", self.class_):
                raise ValueError("class: a custom predictor needs class: module:Class (e.g. predictor:Model)")
        elif self.class_ is not None:
            raise ValueError(f"class: only for a custom predictor, not {self.type}")
        return self


class Autoscale(_Strict):
    """Replicas follow the load: ``target_concurrency`` requests in flight per replica. ``min: 0`` scales to
    zero after ``idle_seconds`` without requests; a request then waits for a cold start."""

    min: int = Field(1, ge=0, le=MAX_REPLICAS)
    max: int = Field(ge=1, le=MAX_REPLICAS)
    target_concurrency: float = Field(4.0, gt=0, le=10_000)
    idle_seconds: float = Field(60.0, gt=0, le=limits.MAX_DURATION_SECONDS, description="Before scaling to zero.")

    @model_validator(mode="after")
    def _range(self) -> Autoscale:
        if self.min > self.max:
            raise ValueError(f"min: {self.min} is above max ({self.max})")
        return self


class Batching(_Strict):
    """Requests that arrive together are answered by one ``predict`` call on up to ``max_batch_size`` instances,
    waiting at most ``max_latency_ms`` for a batch to fill."""

    max_batch_size: int = Field(32, ge=1, le=4096)
    max_latency_ms: float = Field(5.0, ge=0, le=10_000)


class ServiceSpec(_Strict):
    """A model service, as submitted and as written in ``service.yaml``."""

    name: str = Field(min_length=1, max_length=63, description="DNS-style: lowercase letters, digits and '-'.")
    model: str = Field(max_length=200, description="NAME@VERSION or NAME@ALIAS of a registered model.")
    predictor: PredictorSpec
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    resources: Resources = Field(default_factory=Resources)
    replicas: int = Field(1, ge=0, le=MAX_REPLICAS, strict=True, description="Fixed replica count (no autoscale).")
    autoscale: Autoscale | None = None
    batching: Batching | None = None
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=limits.MAX_ENV_VARS)
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=limits.MAX_LABELS)
    request_timeout: float = Field(60.0, gt=0, le=3600, description="Seconds a predict may take.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not SERVICE_NAME.fullmatch(value):
            raise ValueError(f"{value!r}: lowercase letters, digits and '-', not starting or ending with '-'")
        return value

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        parse_model_ref(value)
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if key.startswith("KILN_"):
                raise ValueError(f"{key!r}: names starting with KILN_ are set by Kiln")
        return value

    @property
    def min_replicas(self) -> int:
        return self.autoscale.min if self.autoscale is not None else self.replicas

    @property
    def max_replicas(self) -> int:
        return self.autoscale.max if self.autoscale is not None else self.replicas


MODEL_DIR = "/model"  # where a replica finds its model version's files


def replica_params(spec: ServiceSpec, model: tuple[str, int]) -> dict[str, Any]:
    """A replica's configuration (its job's ``params``, read from ``$KILN_PARAMS_FILE`` by kiln.injob.serve),
    the same flat scalar keys on every backend; keys without a value are left out."""
    predictor, batching = spec.predictor, spec.batching
    schema = predictor.input_schema
    params: dict[str, Any] = {
        "model_dir": MODEL_DIR,
        "model": f"{model[0]}@{model[1]}",
        "predictor": predictor.type,
        "class": predictor.class_,
        "file": predictor.file,
        "method": predictor.method,
        "input_schema": schema.model_dump_json() if schema is not None else None,
        "max_batch_size": batching.max_batch_size if batching is not None else 1,
        "max_latency_ms": batching.max_latency_ms if batching is not None else 0.0,
    }
    return {k: v for k, v in params.items() if v is not None}


class ServiceState(StrEnum):
    DEPLOYING = "DEPLOYING"  # no replica ready yet
    READY = "READY"  # every wanted replica is ready
    UPDATING = "UPDATING"  # a rolling update is under way
    DEGRADED = "DEGRADED"  # fewer ready replicas than wanted (a replica failed, e.g. its model did not load)
    IDLE = "IDLE"  # scaled to zero
    DELETING = "DELETING"


class ReplicaState(StrEnum):
    STARTING = "STARTING"  # its job is queued or starting, or the model is loading
    READY = "READY"  # answers /healthz: requests are routed to it
    DRAINING = "DRAINING"  # an update or scale-down: no new requests, stopped once its in-flight ones end
    FAILED = "FAILED"  # its job ended (the model did not load, it crashed): replaced
    STOPPED = "STOPPED"


class ServiceSubmit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: ServiceSpec
    code_sha256: str | None = Field(
        None, max_length=64, pattern=r"^[0-9a-f]{64}$", description="The code bundle (custom predictors)."
    )


class ServiceUpdate(_Strict):
    """A change rolled out replica by replica (``model``, ``spec``) or applied at once (``replicas``)."""

    model: str | None = Field(None, max_length=200, description="NAME@VERSION or NAME@ALIAS to roll out.")
    canary: int | None = Field(
        None,
        ge=0,
        le=100,
        strict=True,
        description="With model: run it beside the stable version as a canary with this percentage of predicts "
        "(0: only predicts that target it with X-Kiln-Model-Version); without: change the canary's percentage.",
    )
    canary_replicas: int | None = Field(None, ge=1, le=MAX_REPLICAS, strict=True, description="The canary's replicas.")
    rollout: RolloutPolicy | None = Field(
        None,
        description="With canary: advance its share through steps and promote it while it stays within bounds, "
        "roll it back on its own when it breaks one (kiln.domain.rollout).",
    )
    shadow: str | None = Field(
        None,
        max_length=200,
        description="NAME@VERSION of the same model to send a copy of the predicts to (its answers compared, never "
        'returned; one replica); "" ends the shadow.',
    )
    replicas: int | None = Field(None, ge=0, le=MAX_REPLICAS, strict=True, description="Scale (no autoscale).")
    spec: ServiceSpec | None = Field(None, description="A whole new spec (same name), rolled out.")
    code_sha256: str | None = Field(None, max_length=64, pattern=r"^[0-9a-f]{64}$")

    @field_validator("model", "shadow")
    @classmethod
    def _model(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not (value == "" and info.field_name == "shadow"):  # "": the shadow ends
            parse_model_ref(value)
        return value


class CanaryRead(BaseModel):
    """A model version run beside the stable one, with a percentage of the predicts."""

    model_version: int
    weight: int = Field(description="Percent of the predicts that name no version it receives.")
    replicas: int
    policy: RolloutPolicy | None = Field(None, description="Its rollout policy (None: moved by hand only).")
    step_at: datetime | None = Field(None, description="When its share last changed.")


class RolloutEvent(BaseModel):
    """A canary's move: its share advanced, the canary promoted or rolled back, by its policy or by hand."""

    at: datetime
    move: Literal["advanced", "promoted", "rolled_back"]
    version: int
    weight: int
    by: Literal["policy", "hand"]
    message: str = ""


class ShadowRead(BaseModel):
    """A version sent a copy of the predicts, and how its answers compare with those the clients got (through this
    server since it started)."""

    model_version: int
    copied: int = Field(0, description="Copies sent to it.")
    dropped: int = Field(0, description="Copies not sent: its queue was full (a slow shadow) or it had no replica.")
    errors: int = 0
    compared: int = Field(0, description="Outputs (instances) compared.")
    agreement_rate: float | None = Field(None, description="Outputs equal (as JSON) to the answered ones.")
    mean_abs_diff: float | None = Field(None, description="Mean |shadow - answered| over the numbers compared.")
    latency_ms_p50: float | None = None
    latency_ms_p99: float | None = None


class VersionTraffic(BaseModel):
    """What this server's router forwarded to one model version of the service since it started."""

    model_version: int
    role: Literal["stable", "canary", "shadow", "retired"]
    requests: int = 0
    errors: int = 0
    error_rate: float | None = None
    requests_per_second: float = Field(0.0, description="Over the last minute.")
    latency_ms_mean: float | None = None
    latency_ms_p50: float | None = Field(None, description="From a fixed-bucket histogram: within 25 %.")
    latency_ms_p99: float | None = None


class ReplicaRead(BaseModel):
    id: str
    job_id: str | None = None
    job_state: str | None = None
    revision: int
    state: ReplicaState
    model_version: int
    canary: bool = False
    shadow: bool = False
    in_flight: int = 0
    message: str = ""
    created_at: datetime
    ready_at: datetime | None = None


class ServiceRead(BaseModel):
    id: str
    name: str
    org_id: str
    user_id: str
    state: ServiceState
    message: str | None = None
    spec: ServiceSpec
    model_name: str
    model_version: int = Field(description="The version replicas of the current revision serve.")
    revision: int
    canary: CanaryRead | None = None
    shadow: ShadowRead | None = None
    versions: list[VersionTraffic] = Field(default_factory=list)
    rollout_events: list[RolloutEvent] = Field(default_factory=list, description="The canary's moves, newest last.")
    desired_replicas: int
    ready_replicas: int = 0
    replicas: list[ReplicaRead] = Field(default_factory=list)
    endpoint: str = Field(description="POST here (signed, or with a service token) to predict.")
    created_at: datetime
    updated_at: datetime


class ServiceList(BaseModel):
    items: list[ServiceRead]


class ServiceToken(BaseModel):
    id: str
    service: str
    token: str | None = Field(None, description="Shown once, at creation: send it as 'Authorization: Bearer …'.")
    created_at: datetime


class ServiceManifests(BaseModel):
    """What a service spec renders to on Kubernetes: Secret, ConfigMap, Deployment, Service (+ HPA)."""

    manifests: list[dict[str, Any]]


class PredictRequest(BaseModel):
    """``inputs``: a list of instances (one row each); ``parameters``: passed to a custom predictor."""

    model_config = ConfigDict(extra="forbid")

    inputs: list[Any] = Field(max_length=limits.MAX_PREDICT_INPUTS)
    parameters: dict[str, Any] = Field(default_factory=dict)


def check_predict_inputs(body: bytes) -> None:
    """InvalidInput (422 naming ``inputs`` and the limit) for a predict body of more than MAX_PREDICT_INPUTS
    instances; anything else wrong with it is the replica's to say. The router forwards a body as it came: one too
    short to hold that many instances (each takes two bytes at least, a value and a comma) is not parsed here."""
    most = limits.MAX_PREDICT_INPUTS
    if len(body) <= 2 * most:
        return
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return
    inputs = data.get("inputs") if isinstance(data, dict) else None
    if isinstance(inputs, list) and len(inputs) > most:
        raise InvalidInput(
            f"inputs: at most {most} instances in one predict request, got {len(inputs)}: send them in batches",
            details={"field": "inputs", "max": most, "count": len(inputs)},
        )


class PredictResponse(BaseModel):
    outputs: list[Any]
    model: str = Field(description="NAME@VERSION that answered.")
