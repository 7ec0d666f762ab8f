"""Experiment tracking: what a run is, its statuses, the limits on what is logged to it, and the environment that
points a job's MLflow client at Kiln. Pure data and functions.

Every job is a run (its id is the job's id, its status the job's state), in its organisation's experiment named by
``spec.experiment`` (``Default``); a run logged from outside Kiln (the MLflow client on a laptop, a CI job) is a run
without a job, whose status and times are what its client set. Params are text as logged; a numeric one is also
kept as a number, so that ``params.lr < 0.1`` compares numbers. Metrics are the metrics store's series of the run.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from kiln.domain.states import JobState

DEFAULT_EXPERIMENT = "Default"
# The runs of jobs Kiln starts to serve or to develop are kept out of the experiments people read: each kind in one
# experiment of its own, there to open on request.
SERVICES_EXPERIMENT = "Services"
NOTEBOOKS_EXPERIMENT = "Notebooks"
DEFAULT_EXPERIMENT_ALIAS = "0"  # the experiment id MLflow's client uses when none was set: the org's Default
RUN_STATUSES = ("RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED")
ENDED = frozenset({"FINISHED", "FAILED", "KILLED"})
ACTIVE, DELETED = "active", "deleted"
API_WORKER = "worker0"  # the member a run's logged metrics belong to (a single job's, so one series per name)

MAX_KEY = 250
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_BATCH_METRICS = 1000
MAX_BATCH_PARAMS = 100
MAX_BATCH_TAGS = 100
MAX_EXPERIMENT_NAME = 256
MAX_RUN_NAME = 256
MAX_SEARCH_RESULTS = 50000
DEFAULT_SEARCH_RESULTS = 1000
KEY = re.compile(r"^[\w./\- :]+$")  # MLflow's key alphabet: letters, digits, _ - . / space and :

_STATUS_OF_JOB = {
    JobState.QUEUED: "SCHEDULED",
    JobState.STARTING: "SCHEDULED",
    JobState.RESTARTING: "RUNNING",
    JobState.RUNNING: "RUNNING",
    JobState.SUCCEEDED: "FINISHED",
    JobState.FAILED: "FAILED",
    JobState.CANCELLED: "KILLED",
}


def run_status(job_state: str) -> str:
    """A job's run status from the job's state."""
    return _STATUS_OF_JOB[JobState(job_state)]


def job_states(status: str) -> list[str]:
    """The job states whose run has ``status``."""
    return [str(state) for state, mapped in _STATUS_OF_JOB.items() if mapped == status]


def param_text(value: object) -> str:
    """A param's text: as the command line and ``KILN_PARAM_*`` show it (``true``/``false`` for booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def param_number(text: str) -> float | None:
    """The param as a number where its text is a finite one (``0.01``, ``1e-3``, ``64``), else None."""
    try:
        number = float(text.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def check_key(key: str, what: str) -> str:
    """``key`` when it is a valid metric/param/tag key, else ValueError naming ``what``."""
    if not key or len(key) > MAX_KEY or not KEY.fullmatch(key) or ".." in key.split("/") or key.startswith("/"):
        raise ValueError(
            f"{what} {key[:80]!r}: 1 to {MAX_KEY} letters, digits, '_', '-', '.', '/', ':' or spaces (no '..')"
        )
    return key


@dataclass(frozen=True)
class MetricPoint:
    key: str
    value: float
    timestamp: int  # ms since the epoch
    step: int = 0


class PointIn(TypedDict):
    """A metric point as a client sends it (MLflow's JSON shape, validated): a plain dict, since a log-batch
    brings a thousand of them and an object per point would cost more than storing it."""

    key: str
    value: float
    timestamp: int  # ms since the epoch
    step: NotRequired[int]  # 0 when not given


@dataclass
class Batch:
    """What one ``log-batch`` (or one log-metric, log-param, set-tag) brings to a run."""

    metrics: list[PointIn] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


def tracking_env(endpoint: str, run_id: str) -> dict[str, str]:
    """What points a job's MLflow client at its own run on Kiln (its token goes in ``MLFLOW_TRACKING_TOKEN``,
    set by the backend beside ``KILN_JOB_TOKEN``): ``mlflow.start_run()`` resumes the job's run and
    ``mlflow.log_metric`` lands in its metrics."""
    return {"MLFLOW_TRACKING_URI": f"{endpoint.rstrip('/')}/mlflow", "MLFLOW_RUN_ID": run_id}


TOKEN_ENV = "MLFLOW_TRACKING_TOKEN"
