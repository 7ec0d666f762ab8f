"""`kiln pipelines run --follow` prints each step's change once, with its job id once: the step's message already
names the job ("job job-…"), and the id was printed before it as well."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest
from rich.console import Console

from kiln.cli import common
from kiln.cli import pipelines as cli
from kiln.domain.pipelines import PipelineRunRead, PipelineStepRead, RunState, StepState

NOW = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


def run(state: RunState, step_state: StepState, message: str, job_id: str | None) -> PipelineRunRead:
    step = PipelineStepRead(name="train", kind="job", state=step_state, depends_on=[], job_id=job_id, message=message)
    return PipelineRunRead(
        id="prun-1", name="flow", state=state, user="ada", use_cache=True, created_at=NOW, steps=[step]
    )


class StandIn:
    def __init__(self) -> None:
        self.answers = [
            run(RunState.RUNNING, StepState.RUNNING, "job job-01abc", "job-01abc"),
            run(RunState.SUCCEEDED, StepState.SUCCEEDED, "", "job-01abc"),
        ]

    def get_pipeline_run(self, run_id: str) -> PipelineRunRead:
        return self.answers.pop(0)


def test_follow_names_each_steps_job_once(monkeypatch: pytest.MonkeyPatch) -> None:
    err = Console(file=io.StringIO(), width=200, color_system=None, highlight=False)
    monkeypatch.setattr(common, "err", err)
    cli._follow(StandIn(), run(RunState.RUNNING, StepState.WAITING, "", None))
    lines = err.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert lines == ["train: RUNNING job job-01abc", "train: SUCCEEDED job-01abc"], lines
