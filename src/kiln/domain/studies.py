"""Hyperparameter tuning studies: the spec (``kiln tune -f study.yaml``), its states, and what the API returns.

A study runs its ``trial`` job spec again and again with parameters an Optuna sampler picks; every trial is a
job like any other (scheduled, quota-checked, metered). The objective is a metric Kiln already extracts from the
trial's output, so a training script needs no tuning code: it reads its parameters from its command line
(``{name}`` placeholders), from ``KILN_PARAM_<NAME>`` or from the JSON file ``$KILN_PARAMS_FILE``.
"""

from __future__ import annotations

import math
import re
import shlex
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kiln.domain import limits, pruning
from kiln.domain.durations import parse_duration
from kiln.domain.spec import Command, JobSpec, ParamName, ParamValue, format_param, param_env_name

MAX_PARAMETERS = 32
MAX_CHOICES = 1000
MAX_TRIALS = 10_000
MAX_PARALLELISM = 256
MAX_GRID = 100_000

Algorithm = Literal["random", "grid", "tpe", "cmaes", "qmc"]
Direction = Literal["minimize", "maximize"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ParameterSpec(_Strict):
    """One dimension of the search space: a float or int range (``low``..``high``, optionally ``log`` or with a
    ``step``), or a list of ``choices``."""

    type: Literal["float", "int", "categorical"]
    low: float | None = Field(None, description="Smallest value (float and int).")
    high: float | None = Field(None, description="Largest value (float and int), at least low.")
    log: bool = Field(False, strict=True, description="Sample on a log scale (low must be > 0).")
    step: float | None = Field(None, gt=0, description="Distance between values (a grid of low, low+step, …).")
    choices: list[ParamValue] | None = Field(
        None, min_length=1, max_length=MAX_CHOICES, description="The values of a categorical parameter."
    )

    @model_validator(mode="after")
    def _shape(self) -> ParameterSpec:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("choices: a categorical parameter needs at least one choice")
            extra = [k for k in ("low", "high", "step") if getattr(self, k) is not None] + (["log"] if self.log else [])
            if extra:
                raise ValueError(f"{', '.join(extra)}: not for a categorical parameter (give choices)")
            if len({repr(c) for c in self.choices}) != len(self.choices):
                raise ValueError("choices: each choice at most once")
            return self
        if self.choices is not None:
            raise ValueError(f"choices: only for a categorical parameter, not {self.type}")
        if self.low is None or self.high is None:
            missing = " and ".join(k for k in ("low", "high") if getattr(self, k) is None)
            raise ValueError(f"{missing}: a {self.type} parameter needs low and high")
        if self.low > self.high:
            raise ValueError(f"low: {self.low:g} is above high ({self.high:g})")
        if self.log and self.low <= 0:
            raise ValueError(f"low: a log-scale parameter needs low > 0 (got {self.low:g})")
        if self.type == "int":
            for key in ("low", "high", "step"):
                value = getattr(self, key)
                if value is not None and value != int(value):
                    raise ValueError(f"{key}: an int parameter needs a whole number (got {value:g})")
            if self.log and self.step not in (None, 1):
                raise ValueError("step: a log-scale int parameter takes no step other than 1")
        elif self.log and self.step is not None:
            raise ValueError("step: a log-scale float parameter takes no step")
        return self

    def grid(self, name: str) -> list[ParamValue]:
        """Every value of this dimension, for grid search; ValueError where it has no finite grid."""
        if self.type == "categorical":
            return list(self.choices or [])
        assert self.low is not None and self.high is not None
        step = self.step if self.step is not None else (1 if self.type == "int" else None)
        if step is None:
            raise ValueError(f"parameters.{name}: grid search needs a step for a float parameter (or use choices)")
        count = math.floor((self.high - self.low) / step + 1e-9) + 1
        if count > MAX_GRID:
            raise ValueError(f"parameters.{name}: {count} grid values; at most {MAX_GRID}")
        if self.type == "int":
            return [int(self.low) + i * int(step) for i in range(count)]
        return [round(self.low + i * step, 12) for i in range(count)]


class Objective(_Strict):
    """What a trial is judged by: a metric of the trial job (from its log lines, ``kiln.log`` or TensorBoard)."""

    metric: str = Field(min_length=1, max_length=200, description="The metric's name, e.g. val_acc.")
    direction: Direction = Field(description="minimize or maximize.")
    aggregate: Literal["last", "best"] = Field(
        "last", description="A trial's final value: its last reported value, or its best one."
    )

    @field_validator("metric")
    @classmethod
    def _metric(cls, value: str) -> str:
        if not value.strip() or any(ord(c) < 32 for c in value):
            raise ValueError("must be a metric name, not empty")
        return value


class EarlyStopping(_Strict):
    """Stopping trials that do worse than others at the same step: ``median``, ``asha`` (asynchronous successive
    halving), ``hyperband`` (several ASHA brackets), or ``none``. Kiln judges them (kiln.domain.pruning): a trial at
    a rung by its value there, and only once ``bootstrap_count`` other trials have a value there."""

    type: Literal["none", "median", "asha", "hyperband"] = "none"
    min_resource: int | None = Field(
        None,
        ge=1,
        le=limits.MAX_INT64,
        description="asha/hyperband: the first rung, the steps every trial gets (asha default: auto, 1/100 of the "
        "steps of the first finished trial; hyperband default: 1).",
    )
    max_resource: int | None = Field(
        None,
        ge=1,
        le=limits.MAX_INT64,
        description="asha/hyperband: the most steps a trial reports; no rung at or past it (hyperband default: "
        "auto, from the first finished trial).",
    )
    reduction_factor: int = Field(
        3, ge=2, le=100, description="asha/hyperband: rungs min_resource x n^k; about 1/n of the trials pass each."
    )
    bootstrap_count: int = Field(
        pruning.DEFAULT_BOOTSTRAP,
        ge=0,
        le=MAX_TRIALS,
        description="asha/hyperband: other trials that must have reached a rung before a trial is judged there "
        "(until then it goes on).",
    )
    warmup_steps: int = Field(0, ge=0, le=limits.MAX_INT64, description="median: steps before a trial is judged.")
    startup_trials: int = Field(5, ge=0, le=MAX_TRIALS, description="median: trials that finish before pruning.")

    @model_validator(mode="after")
    def _resources(self) -> EarlyStopping:
        if self.min_resource is not None and self.max_resource is not None and self.min_resource > self.max_resource:
            raise ValueError(f"min_resource: {self.min_resource} is above max_resource ({self.max_resource})")
        return self


class StudySpec(_Strict):
    """A tuning study, as submitted and as written in ``study.yaml``."""

    name: str | None = Field(None, min_length=1, max_length=limits.MAX_NAME_LENGTH, description="Display name.")
    trial: JobSpec = Field(description="The job every trial runs: a whole job spec, {name} placeholders allowed.")
    parameters: dict[ParamName, ParameterSpec] = Field(
        min_length=1, max_length=MAX_PARAMETERS, description="The search space."
    )
    objective: Objective
    algorithm: Algorithm = Field("tpe", description="The sampler: random, grid, tpe, cmaes or qmc.")
    early_stopping: EarlyStopping = Field(default_factory=EarlyStopping, description="none, median, asha, hyperband.")
    max_trials: int = Field(10, ge=1, le=MAX_TRIALS, strict=True, description="Trials in all (grid: at most the grid).")
    parallelism: int = Field(1, ge=1, le=MAX_PARALLELISM, strict=True, description="Trials running at once.")
    max_failed_trials: int | None = Field(
        None, ge=0, le=MAX_TRIALS, strict=True, description="The study fails once more trials than this failed."
    )
    time_budget: float | None = Field(
        None,
        gt=0,
        le=limits.MAX_DURATION_SECONDS,
        strict=True,
        description="Wall-clock limit of the study, seconds or e.g. '30m', '2h': then no new trial starts and the "
        "running ones are stopped.",
    )
    seed: int | None = Field(None, ge=0, le=2**32 - 1, strict=True, description="Seed of the sampler.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or any(ord(c) < 32 for c in value)):
            raise ValueError("must be printable text")
        return value

    @field_validator("early_stopping", mode="before")
    @classmethod
    def _early_stopping(cls, value: Any) -> Any:
        return {"type": value} if isinstance(value, str) else value

    @field_validator("time_budget", mode="before")
    @classmethod
    def _time_budget(cls, value: Any) -> Any:
        return None if value is None else parse_duration(value)

    @model_validator(mode="after")
    def _consistent(self) -> StudySpec:
        envs: dict[str, str] = {}
        for name in self.parameters:
            env = param_env_name(name)
            if env in envs:
                raise ValueError(f"parameters: {envs[env]!r} and {name!r} would share {env}")
            envs[env] = name
        fixed = set(self.parameters) & set(self.trial.params)
        if fixed:
            raise ValueError(f"trial.params: {', '.join(sorted(fixed))} is tuned; remove it from trial.params")
        if self.algorithm == "grid":
            self.grid()  # ValueError names the parameter without a finite grid
        return self

    def grid(self) -> dict[str, list[ParamValue]]:
        space = {name: p.grid(name) for name, p in self.parameters.items()}
        if math.prod(len(v) for v in space.values()) > MAX_GRID:
            raise ValueError(f"parameters: the grid has more than {MAX_GRID} points")
        return space

    @property
    def planned_trials(self) -> int:
        """How many trials the study runs: ``max_trials``, or the grid's size if that is smaller."""
        if self.algorithm == "grid":
            return min(self.max_trials, math.prod(len(v) for v in self.grid().values()))
        return self.max_trials

    @property
    def display_name(self) -> str:
        return self.name or self.trial.name or f"tune {self.objective.metric}"


# ---- a trial's job spec

EXPERIMENT_NAME_LENGTH = 256  # JobSpec.experiment's max_length

_PLACEHOLDER = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")


def substitute(command: Command, params: dict[str, ParamValue]) -> Command:
    """``{name}`` in the command replaced by the parameter's value; other braces (``${HOME}``, ``{other}``) are
    kept. A shell string gets each value shell-quoted; an argv list gets it as is."""

    def replace(match: re.Match[str], quote: bool) -> str:
        name = match.group(1)
        if name not in params:
            return match.group(0)
        text = format_param(params[name])
        return shlex.quote(text) if quote else text

    if isinstance(command, str):
        return _PLACEHOLDER.sub(lambda m: replace(m, True), command)
    return [_PLACEHOLDER.sub(lambda m: replace(m, False), part) for part in command]


def trial_spec(study: StudySpec, study_id: str, number: int, params: dict[str, ParamValue]) -> JobSpec:
    """The job spec of trial ``number``: the study's trial spec with its parameters in the command lines and in
    ``params`` (``KILN_PARAM_*`` and ``$KILN_PARAMS_FILE``), named and labelled after the study, and a run of the
    study's experiment (its display name) unless the trial spec names one."""
    base = study.trial
    update: dict[str, Any] = {
        "name": f"{study.display_name}-trial-{number}"[: limits.MAX_NAME_LENGTH],
        "command": substitute(base.command, params),
        "params": {**base.params, **params},
        "labels": {**base.labels, "kiln-study": study_id, "kiln-trial": str(number)},
    }
    # The objective's points go to the server one by one, as they are written: the pruner judges each at once.
    metrics = base.metrics.model_dump(mode="json")
    if study.objective.metric not in metrics["watch"]:
        metrics["watch"] = [*metrics["watch"], study.objective.metric][-limits.MAX_WATCHED_METRICS :]
    update["metrics"] = metrics
    if base.experiment is None:  # a study's trials are runs of its own experiment, not of Default
        update["experiment"] = study.display_name[:EXPERIMENT_NAME_LENGTH]
    for key in ("prepare_command", "finish_command"):
        value = getattr(base, key)
        if value is not None:
            update[key] = substitute(value, params)
    return JobSpec.model_validate({**base.model_dump(mode="json"), **update})


# ---- states and API shapes


class StudyState(StrEnum):
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"

    @property
    def terminal(self) -> bool:
        return self is not StudyState.RUNNING


class TrialState(StrEnum):
    RUNNING = "RUNNING"  # its job is queued, starting or running
    SUCCEEDED = "SUCCEEDED"  # its job succeeded and reported the objective
    PRUNED = "PRUNED"  # stopped early by the pruner (``pruned_step``)
    FAILED = "FAILED"  # its job failed, or never reported the objective
    CANCELLED = "CANCELLED"  # stopped with the study, or its job was cancelled

    @property
    def terminal(self) -> bool:
        return self is not TrialState.RUNNING


class StudyReason(StrEnum):
    SUBMITTED = "Submitted"
    COMPLETED = "Completed"
    STOPPED = "Stopped"
    TIME_BUDGET = "TimeBudgetReached"
    TOO_MANY_FAILURES = "TooManyFailedTrials"
    NO_RESULT = "NoTrialSucceeded"
    INVALID_TRIAL = "InvalidTrialSpec"
    TRIAL_STARTED = "TrialStarted"
    TRIAL_SUCCEEDED = "TrialSucceeded"
    TRIAL_PRUNED = "TrialPruned"
    TRIAL_FAILED = "TrialFailed"
    TRIAL_CANCELLED = "TrialCancelled"


class StudySubmit(BaseModel):
    """A study to start: its spec and the code bundle every trial runs (uploaded first, like a job's)."""

    model_config = ConfigDict(extra="forbid")

    spec: StudySpec
    code_sha256: str | None = Field(
        None, max_length=64, pattern=r"^[0-9a-f]{64}$", description="The uploaded code bundle."
    )


class PruneReport(BaseModel):
    """Why the pruner stopped a trial: its value where it was judged, what it had to reach, against how many."""

    rule: str = Field(description="asha, hyperband or median.")
    rung: int = Field(description="The step it was judged at (an asha/hyperband rung; median: the step).")
    step: int | None = Field(None, description="The step of the value judged: the rung, or the last reported below.")
    value: float | None = Field(None, description="Its objective there (median: its best so far).")
    cutoff: float | None = Field(
        None,
        description="What it had to reach: the 1-1/reduction_factor percentile of the other trials' values at the "
        "rung (asha, hyperband), their median (median).",
    )
    compared: int = Field(description="How many other trials' values at the rung it was compared with.")
    needed: int = Field(description="How many a verdict needs: bootstrap_count (median: startup_trials finished).")
    bracket: int | None = Field(None, description="hyperband: the trial's bracket (0: the first rung lowest).")

    @classmethod
    def of(cls, verdict: pruning.Verdict) -> PruneReport:
        return cls(
            rule=verdict.rule,
            rung=verdict.rung,
            step=verdict.step,
            value=verdict.value,
            cutoff=verdict.cutoff,
            compared=verdict.compared,
            needed=verdict.needed,
            bracket=verdict.bracket,
        )


class TrialRead(BaseModel):
    study_id: str
    number: int = Field(description="0, 1, … in the order trials started.")
    job_id: str | None = Field(None, description="The trial's job (None once that job was deleted).")
    state: TrialState
    job_state: str | None = Field(None, description="The job's state (QUEUED, RUNNING, …).")
    params: dict[str, ParamValue]
    value: float | None = Field(None, description="The objective's final value (SUCCEEDED trials).")
    last_step: int | None = Field(None, description="The last step of the objective the pruner saw.")
    last_value: float | None = Field(None, description="The objective's value at last_step.")
    pruned_step: int | None = Field(None, description="The step the pruner stopped it at.")
    pruning: PruneReport | None = Field(None, description="Why the pruner stopped it (PRUNED trials).")
    message: str = ""
    created_at: datetime
    finished_at: datetime | None = None
    duration_seconds: float | None = Field(None, description="From its job's start to its end (or to now).")


class TrialCounts(BaseModel):
    total: int = 0
    running: int = 0
    succeeded: int = 0
    pruned: int = 0
    failed: int = 0
    cancelled: int = 0


class StudyRead(BaseModel):
    id: str
    name: str
    org_id: str
    user_id: str
    state: StudyState
    reason: str | None = None
    message: str | None = None
    spec: StudySpec
    code_sha256: str | None = None
    planned_trials: int = Field(description="max_trials, or the grid's size if smaller.")
    trials: TrialCounts
    best: TrialRead | None = Field(None, description="The best succeeded trial so far.")
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None


class StudyList(BaseModel):
    items: list[StudyRead]


class TrialList(BaseModel):
    items: list[TrialRead]


class TrialVerdict(BaseModel):
    """What the pruner made of a trial's reports so far, as the trial's own job asks it (``kiln.should_prune()``)."""

    study_id: str
    number: int
    state: TrialState
    prune: bool = Field(description="True once the pruner stopped the trial (PRUNED): it should end now.")
    judged_step: int | None = Field(None, description="The last step of the objective the pruner has judged.")
    pruned_step: int | None = Field(None, description="The step the pruner stopped it at.")


class StudyEventRead(BaseModel):
    id: int
    study_id: str
    time: datetime
    from_state: StudyState | None = None
    to_state: StudyState | None = None
    reason: str
    trial: int | None = Field(None, description="The trial it is about, if any.")
    message: str = ""


class StudyEventList(BaseModel):
    items: list[StudyEventRead]


TrialNumber = Annotated[int, Field(ge=0, le=MAX_TRIALS)]
