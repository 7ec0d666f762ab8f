"""What the local executor takes from a shim's ``status.json`` about its start's unbilled seconds (a runtime's
build): a plain number of seconds, nothing else."""

from __future__ import annotations

import json
from pathlib import Path

from kiln.backends.base import Phase
from kiln.backends.local.shims import ShimLauncher, _seconds
from kiln.injob import claim


def test_only_a_plausible_number_of_seconds_counts() -> None:
    assert _seconds(6.5) == 6.5 and _seconds(3) == 3.0
    for bad in (None, "6.5", -1, 0, [1], 10**9, float("nan")):
        assert _seconds(bad) == 0.0, bad


def test_an_exited_attempt_reports_the_seconds_its_shim_wrote(tmp_path: Path) -> None:
    attempt = tmp_path / "attempt"
    attempt.mkdir()
    (attempt / "status.json").write_text(
        json.dumps({"phase": "running", "running_at": 1.8e9, "unbilled_seconds": 4.25})
    )
    (attempt / "exit.json").write_text(json.dumps({"exit_code": 0, "reason": "Completed", "finished_at": 1.8e9 + 9}))
    (attempt / claim.PID).write_text("")
    status = ShimLauncher(tmp_path / "run").poll(attempt)
    assert status.phase is Phase.EXITED and status.unbilled_seconds == 4.25
