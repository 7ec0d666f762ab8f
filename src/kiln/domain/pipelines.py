"""A pipeline: named steps with ``depends_on``, as submitted (``POST /api/v1/pipelines/runs``, ``pipeline.yaml``),
checked whole before anything runs.

    name: digits-flow
    steps:
      prep:
        command: python prep.py            # any job spec field
      train:
        depends_on: [prep]
        command: python train.py
        inputs: [{step: prep}]             # prep's outputs, staged like a dataset: $KILN_INPUT_PREP
        retries: 2
      register:
        depends_on: [train]
        register_model: {name: digits, from: train, path: model.joblib}
      deploy:
        depends_on: [register]
        when: "steps.train.metrics.val_acc >= 0.95"
        serve: {name: digits, predictor: {type: sklearn}, replicas: 1}

A step is a job (every job spec field, plus the step's own: ``depends_on``, ``retries``, ``retry_backoff``,
``cache``, ``when``; ``inputs`` may name upstream steps), or a built-in step: ``register_model`` (a model version
from an upstream job step's outputs) or ``serve`` (a service of the model an upstream ``register_model`` step
registered). Errors name the step and the field (``steps.train.inputs[0].step``), and the whole pipeline is
refused: a cycle, a ``depends_on`` or input naming an unknown step, an input or a ``when`` reference to a step that
is not upstream, an invalid ``when``, an invalid job spec.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kiln.domain.pipeline_when import When, WhenError, parse_when
from kiln.domain.serving import ServiceSpec
from kiln.domain.spec import JobSpec

STEP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
PIPELINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
MAX_STEPS = 200
MAX_RETRIES = 10
MAX_BACKOFF = 3600.0
STEP_FIELDS = {"depends_on", "retries", "retry_backoff", "cache", "when", "register_model", "serve", "code_sha256"}
SHA256 = re.compile(r"^[0-9a-f]{64}$")
PIPELINE_FIELDS = {"name", "steps", "description"}
REGISTER_FIELDS = {"name", "from", "path", "framework", "description"}


class PipelineError(ValueError):
    """The pipeline is refused: ``field`` names where (``steps.train.inputs[0].step``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class StepInput:
    """An upstream step's outputs, staged read-only at ``path`` (default /data/STEP) as ``$KILN_INPUT_<STEP>``."""

    step: str
    path: str | None = None


@dataclass(frozen=True)
class RegisterModel:
    name: str
    source: str  # the job step whose outputs hold the model (``from``)
    path: str
    framework: str | None = None
    description: str = ""


@dataclass
class Step:
    name: str
    depends_on: tuple[str, ...] = ()
    retries: int = 0
    retry_backoff: float = 10.0  # seconds before the first retry, doubling
    cache: bool = True
    when: When | None = None
    job: JobSpec | None = None  # a job step (its ``inputs`` without the step inputs)
    code_sha256: str | None = None  # its own code bundle (else the run's)
    job_raw: dict[str, Any] = field(default_factory=dict)  # the job fields as written (what the cache key hashes)
    step_inputs: tuple[StepInput, ...] = ()
    register_model: RegisterModel | None = None
    serve: ServiceSpec | None = None  # its ``model`` filled in from the upstream register step at run time
    serve_model_step: str | None = None  # the register_model step whose version it serves

    @property
    def kind(self) -> str:
        return "register_model" if self.register_model else "serve" if self.serve else "job"


@dataclass
class Pipeline:
    name: str
    steps: dict[str, Step]  # in a topological order (every step after the steps it depends on)
    description: str = ""

    def upstream(self, name: str) -> set[str]:
        """Every step ``name`` depends on, directly or not."""
        seen: set[str] = set()
        todo = list(self.steps[name].depends_on)
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo.extend(self.steps[current].depends_on)
        return seen

    def downstream(self, name: str) -> set[str]:
        """Every step that depends on ``name``, directly or not."""
        return {other for other in self.steps if name in self.upstream(other)}


def parse_pipeline(data: Any) -> Pipeline:
    """The pipeline ``data`` (a mapping, as JSON or YAML gives it), checked whole; PipelineError otherwise."""
    if not isinstance(data, dict):
        raise PipelineError("pipeline", "a mapping with name and steps")
    unknown = sorted(set(data) - PIPELINE_FIELDS)
    if unknown:
        raise PipelineError(unknown[0], f"unknown field (a pipeline has {', '.join(sorted(PIPELINE_FIELDS))})")
    name = data.get("name")
    if not isinstance(name, str) or not PIPELINE_NAME.fullmatch(name):
        raise PipelineError("name", "1 to 128 letters, digits, '_', '-' or '.', starting with a letter or digit")
    description = data.get("description") or ""
    if not isinstance(description, str) or len(description) > 2000:
        raise PipelineError("description", "text of at most 2000 characters")
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, dict) or not raw_steps:
        raise PipelineError("steps", "a mapping of step name to step, at least one")
    if len(raw_steps) > MAX_STEPS:
        raise PipelineError("steps", f"at most {MAX_STEPS} steps")
    steps = {}
    for step_name, raw in raw_steps.items():
        if not isinstance(step_name, str) or not STEP_NAME.fullmatch(step_name):
            raise PipelineError(
                f"steps.{step_name}",
                "a step name is 1 to 63 letters, digits, '_' or '-', starting with a letter or digit",
            )
        steps[step_name] = _step(step_name, raw)
    pipeline = Pipeline(name, _ordered(steps), description)
    _check_references(pipeline)
    return pipeline


def _step(name: str, raw: Any) -> Step:
    where = f"steps.{name}"
    if not isinstance(raw, dict):
        raise PipelineError(where, "a mapping (a job spec's fields, or register_model/serve)")
    raw = dict(raw)
    depends = raw.pop("depends_on", [])
    if isinstance(depends, str):
        depends = [depends]
    if not isinstance(depends, list) or not all(isinstance(d, str) for d in depends):
        raise PipelineError(f"{where}.depends_on", "a list of step names")
    if len(set(depends)) != len(depends):
        raise PipelineError(f"{where}.depends_on", "a step is named twice")
    retries = raw.pop("retries", 0)
    if type(retries) is not int or not 0 <= retries <= MAX_RETRIES:
        raise PipelineError(f"{where}.retries", f"a whole number from 0 to {MAX_RETRIES}")
    backoff = raw.pop("retry_backoff", 10.0)
    if isinstance(backoff, bool) or not isinstance(backoff, int | float) or not 0 <= backoff <= MAX_BACKOFF:
        raise PipelineError(f"{where}.retry_backoff", f"seconds from 0 to {MAX_BACKOFF:.0f}")
    cache = raw.pop("cache", True)
    if not isinstance(cache, bool):
        raise PipelineError(f"{where}.cache", "true or false")
    when = None
    text = raw.pop("when", None)
    if text is not None:
        if not isinstance(text, str):
            raise PipelineError(f"{where}.when", "an expression as text")
        try:
            when = parse_when(text)
        except WhenError as exc:
            raise PipelineError(f"{where}.when", str(exc)) from None
    step = Step(name, tuple(depends), retries, float(backoff), cache, when)
    code = raw.pop("code_sha256", None)
    if code is not None and (not isinstance(code, str) or not SHA256.fullmatch(code)):
        raise PipelineError(f"{where}.code_sha256", "the SHA-256 of an uploaded code bundle (64 hex digits)")
    if "code" in raw:
        raise PipelineError(
            f"{where}.code", "a directory is packed by the CLI (kiln pipelines run); send its bundle as code_sha256"
        )
    step.code_sha256 = code
    register, serve = raw.pop("register_model", None), raw.pop("serve", None)
    if register is not None or serve is not None:
        if register is not None and serve is not None:
            raise PipelineError(where, "a step either registers a model or serves one, not both")
        if raw or code is not None:
            field_name = sorted(raw)[0] if raw else "code_sha256"
            raise PipelineError(f"{where}.{field_name}", "a built-in step (register_model, serve) takes no job fields")
        if register is not None:
            step.register_model = _register(where, register)
        else:
            step.serve = _serve(where, serve)
        return step
    inputs = raw.get("inputs", [])
    if not isinstance(inputs, list):
        raise PipelineError(f"{where}.inputs", "a list of inputs")
    job_inputs, step_inputs = [], []
    for i, item in enumerate(inputs):
        if isinstance(item, dict) and "step" in item:
            extra = sorted(set(item) - {"step", "path"})
            if extra:
                raise PipelineError(f"{where}.inputs[{i}].{extra[0]}", "a step input has step and path only")
            if not isinstance(item["step"], str):
                raise PipelineError(f"{where}.inputs[{i}].step", "a step name")
            path = item.get("path")
            if path is not None and (not isinstance(path, str) or not path.startswith("/") or ".." in path.split("/")):
                raise PipelineError(f"{where}.inputs[{i}].path", "an absolute path without '..'")
            step_inputs.append(StepInput(item["step"], path))
        else:
            job_inputs.append(item)
    job_raw = {**raw, "inputs": job_inputs} if "inputs" in raw else raw
    try:
        step.job = JobSpec.model_validate(job_raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise PipelineError(f"{where}.{loc}" if loc else where, first["msg"]) from None
    step.job_raw = job_raw
    step.step_inputs = tuple(step_inputs)
    return step


def _register(where: str, raw: Any) -> RegisterModel:
    where = f"{where}.register_model"
    if not isinstance(raw, dict):
        raise PipelineError(where, "a mapping: name, from (a job step), path")
    extra = sorted(set(raw) - REGISTER_FIELDS)
    if extra:
        raise PipelineError(f"{where}.{extra[0]}", f"unknown field ({', '.join(sorted(REGISTER_FIELDS))})")
    for key in ("name", "from", "path"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise PipelineError(f"{where}.{key}", "required text")
    framework = raw.get("framework")
    if framework is not None and not isinstance(framework, str):
        raise PipelineError(f"{where}.framework", "text")
    return RegisterModel(raw["name"], raw["from"], raw["path"], framework, str(raw.get("description") or ""))


def _serve(where: str, raw: Any) -> ServiceSpec:
    where = f"{where}.serve"
    if not isinstance(raw, dict):
        raise PipelineError(where, "a service spec (name, predictor, replicas…)")
    if "model" in raw:
        raise PipelineError(f"{where}.model", "the model is the one an upstream register_model step registers")
    try:
        return ServiceSpec.model_validate({**raw, "model": "pipeline-model@1"})  # the model filled in at run time
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise PipelineError(f"{where}.{loc}" if loc else where, first["msg"]) from None


def _ordered(steps: dict[str, Step]) -> dict[str, Step]:
    """The steps in a topological order (ties in the order written); PipelineError for an unknown step or a
    cycle (named, step by step)."""
    for name, step in steps.items():
        for i, dep in enumerate(step.depends_on):
            if dep not in steps:
                raise PipelineError(f"steps.{name}.depends_on[{i}]", f"no step named {dep!r}")
            if dep == name:
                raise PipelineError(f"steps.{name}.depends_on[{i}]", "a step cannot depend on itself")
    order: list[str] = []
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = [*path[path.index(name) :], name]
            raise PipelineError(f"steps.{cycle[0]}.depends_on", f"a cycle: {' -> '.join(cycle)}")
        state[name] = 1
        for dep in steps[name].depends_on:
            visit(dep, [*path, name])
        state[name] = 2
        order.append(name)

    for name in steps:
        visit(name, [])
    return {name: steps[name] for name in order}


def _check_references(pipeline: Pipeline) -> None:
    for name, step in pipeline.steps.items():
        upstream = pipeline.upstream(name)
        where = f"steps.{name}"
        for i, item in enumerate(step.step_inputs):
            if item.step not in pipeline.steps:
                raise PipelineError(f"{where}.inputs[{i}].step", f"no step named {item.step!r}")
            if item.step not in upstream:
                raise PipelineError(
                    f"{where}.inputs[{i}].step", f"{item.step!r} is not upstream of {name} (add it to depends_on)"
                )
            if pipeline.steps[item.step].kind != "job":
                raise PipelineError(f"{where}.inputs[{i}].step", f"{item.step!r} is not a job step: it has no outputs")
        if step.when is not None:
            for ref in step.when.refs:
                if ref.step not in pipeline.steps:
                    raise PipelineError(f"{where}.when", f"{ref}: no step named {ref.step!r}")
                if ref.step not in upstream:
                    raise PipelineError(f"{where}.when", f"{ref}: {ref.step!r} is not upstream of {name}")
        if step.register_model is not None:
            source = step.register_model.source
            if source not in pipeline.steps:
                raise PipelineError(f"{where}.register_model.from", f"no step named {source!r}")
            if source not in upstream or pipeline.steps[source].kind != "job":
                raise PipelineError(f"{where}.register_model.from", f"{source!r} is not a job step upstream of {name}")
        if step.serve is not None:
            registers = [s for s in upstream if pipeline.steps[s].kind == "register_model"]
            if len(registers) != 1:
                raise PipelineError(
                    f"{where}.serve",
                    "a serve step serves the model of exactly one upstream register_model step "
                    f"({len(registers)} upstream)",
                )
            step.serve_model_step = registers[0]


def cache_key(step: Step, code_sha256: str | None, inputs: list[str]) -> str:
    """What makes a job step's result reusable: its job fields as written (whitespace and key order aside), its
    code bundle's digest and its inputs' digests (pinned dataset and model versions, upstream steps' output
    digests), in order."""
    payload = json.dumps(
        {"job": step.job_raw, "code": code_sha256, "inputs": inputs}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(payload.encode()).hexdigest()


# -- the API's shapes -------------------------------------------------------------------------------------------


class RunState(StrEnum):
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class StepState(StrEnum):
    WAITING = "WAITING"  # for its upstream steps, or for its retry's back-off
    RUNNING = "RUNNING"  # its job is queued or running
    SUCCEEDED = "SUCCEEDED"
    CACHED = "CACHED"  # an earlier job's result reused (``job_id`` is that job)
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"  # an upstream step failed or was skipped, or its ``when`` was false
    CANCELLED = "CANCELLED"


STEP_DONE = frozenset({StepState.SUCCEEDED, StepState.CACHED})
STEP_ENDED = STEP_DONE | {StepState.FAILED, StepState.SKIPPED, StepState.CANCELLED}


class PipelineSubmit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: dict[str, Any] = Field(description="The pipeline: name and steps (docs/pipelines.md).")
    code_sha256: str | None = Field(
        None,
        max_length=64,
        pattern=r"^[0-9a-f]{64}$",
        description="The uploaded code bundle its job steps run (unless their own).",
    )
    use_cache: bool = Field(
        True, strict=True, description="Reuse an earlier identical job step's result (false: run them all)."
    )


class PipelineDryRun(BaseModel):
    """What ``POST /pipelines/runs:dry-run`` found: the pipeline as a run would check it, nothing created."""

    name: str
    steps: dict[str, dict[str, Any]] = Field(description="Each job step's spec as its job would get it.")


class PipelineStepRead(BaseModel):
    name: str
    kind: str
    state: StepState
    depends_on: list[str]
    job_id: str | None = None
    cached: bool = False
    tries: int = 0
    message: str = ""
    result: dict[str, Any] = Field(default_factory=dict)
    started_at: datetime | None = None
    finished_at: datetime | None = None


class PipelineRunRead(BaseModel):
    id: str
    name: str
    state: RunState
    message: str = ""
    user: str
    use_cache: bool
    created_at: datetime
    finished_at: datetime | None = None
    steps: list[PipelineStepRead]


class PipelineRunList(BaseModel):
    items: list[PipelineRunRead]


def check_cron(expression: str) -> str:
    """A cron expression (five fields, in UTC; a sixth is seconds), else PipelineError naming ``cron``."""
    from croniter import croniter

    text = " ".join(expression.split())
    if not text or len(text) > 128 or not croniter.is_valid(text) or len(text.split()) not in (5, 6):
        raise PipelineError("cron", f"{expression!r} is not a cron expression (minute hour day month weekday, UTC)")
    return text


def next_time(expression: str, after: datetime) -> datetime:
    """The first time of ``expression`` after ``after`` (an aware datetime, UTC)."""
    from croniter import croniter

    found = croniter(expression, after).get_next(datetime)
    assert isinstance(found, datetime)
    return found


class PipelineScheduleSubmit(PipelineSubmit):
    cron: str = Field(
        max_length=128,
        description="When, in UTC: minute hour day-of-month month day-of-week (`0 3 * * *`: 03:00 every day); a "
        "sixth field is seconds.",
    )


class PipelineScheduleRead(BaseModel):
    id: str
    name: str
    cron: str
    next_at: datetime
    last_run_id: str | None = None
    last_at: datetime | None = None
    message: str = Field("", description="Why the last time started no run, if it did not.")
    use_cache: bool
    user: str
    created_at: datetime


class PipelineScheduleList(BaseModel):
    items: list[PipelineScheduleRead]
