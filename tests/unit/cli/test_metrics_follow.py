"""`kiln metrics JOB --follow` into a pipe: a live table draws only on a terminal, so a pipe or a file gets a line
per new point (it printed nothing before, issue 26)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from kiln.cli import metrics as cli
from kiln.cli.main import build_app
from kiln.domain.schemas import MetricSeriesData, MetricSeriesSummary

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


class GrowingJob:
    """A job whose ``loss`` gains two steps and whose ``system/cpu`` (a time series) one sample per poll, and
    which ends after its third poll; answers what ``kiln.Client`` would, honouring ``step_min``."""

    def __init__(self) -> None:
        self.polls = 0
        self.loss: list[list[Any]] = [[0, T0, 2.0], [1, T0 + 1, 1.5]]
        self.cpu: list[list[Any]] = [[None, T0, 0.5]]
        self.asked: list[dict[str, Any]] = []

    def __enter__(self) -> GrowingJob:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def get_job(self, job_id: str) -> Any:
        self.polls += 1
        if 1 < self.polls <= 3:  # the job writes between polls
            n = len(self.loss)
            self.loss += [[n, T0 + n, 1.0 / n], [n + 1, T0 + n + 1, "nan"]]
            self.cpu.append([None, T0 + 10 * self.polls, 0.25 * self.polls])
        return SimpleNamespace(state="SUCCEEDED" if self.polls >= 3 else "RUNNING")

    def metrics_summary(self, job_id: str) -> list[MetricSeriesSummary]:
        def summary(name: str, points: list[list[Any]]) -> MetricSeriesSummary:
            step, at, value = points[-1]
            return MetricSeriesSummary(
                name=name,
                worker="0",
                kind="scalar",
                source="log",
                count=len(points),
                last_step=step,
                last_time=at,
                last_value=value,
            )

        return [summary("loss", self.loss), summary("system/cpu", self.cpu), summary("acc", [[0, T0, 0.1]])]

    def metrics(self, job_id: str, names: list[str], step_min: int | None = None, **_: Any) -> Any:
        self.asked.append({"names": names, "step_min": step_min})
        points = [p for p in self.loss if step_min is None or p[0] >= step_min]
        return [MetricSeriesData(name="loss", worker="0", kind="scalar", source="log", count=9, points=points)]


def test_follow_into_a_pipe_prints_a_line_per_new_point(monkeypatch: pytest.MonkeyPatch) -> None:
    job = GrowingJob()
    monkeypatch.setattr(cli, "connect", lambda: job)
    monkeypatch.setattr(cli.time, "sleep", lambda _s: None)
    result = CliRunner().invoke(build_app(), ["metrics", "job-1", "--follow", "--names", "loss,system/cpu"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        # the first poll: each series' latest point
        "loss=1.5 step=1 worker=0 time=2026-01-01T00:00:01.000+00:00",
        "system/cpu=0.5 step=- worker=0 time=2026-01-01T00:00:00.000+00:00",
        # then every new point of a step series, the latest of a time series
        "loss=0.5 step=2 worker=0 time=2026-01-01T00:00:02.000+00:00",
        'loss="nan" step=3 worker=0 time=2026-01-01T00:00:03.000+00:00',
        "system/cpu=0.5 step=- worker=0 time=2026-01-01T00:00:20.000+00:00",
        "loss=0.25 step=4 worker=0 time=2026-01-01T00:00:04.000+00:00",
        'loss="nan" step=5 worker=0 time=2026-01-01T00:00:05.000+00:00',
        "system/cpu=0.75 step=- worker=0 time=2026-01-01T00:00:30.000+00:00",
    ]
    # only the step series is read point by point, from the last step printed on, never the whole history
    assert job.asked == [{"names": ["loss"], "step_min": 1}, {"names": ["loss"], "step_min": 3}]


def test_point_lines_split_into_name_value_and_fields() -> None:
    line = cli.point_line("val/acc", "1", 7, T0, 0.93)
    head, *fields = line.split(" ")
    assert head.split("=", 1) == ["val/acc", "0.93"]
    assert dict(f.split("=", 1) for f in fields) == {
        "step": "7",
        "worker": "1",
        "time": "2026-01-01T00:00:00.000+00:00",
    }
