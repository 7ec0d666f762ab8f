"""The REASON column of `kiln jobs list`: why a waiting job waits, not just that it was submitted."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from rich.console import Console

from kiln.cli import output
from kiln.domain.schemas import JobRead
from kiln.domain.spec import JobSpec


def job(job_id: str, state: str, reason: str, message: str) -> JobRead:
    now = datetime.now(UTC)
    return JobRead(
        id=job_id,
        name="train",
        org_id="org-1",
        user_id="usr-1",
        state=state,  # type: ignore[arg-type]
        reason=reason,
        message=message,
        spec=JobSpec(command="true"),
        created_at=now,
        updated_at=now,
    )


def test_a_waiting_job_shows_why_it_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    # A wide console of its own: the shared one's width depends on COLUMNS when kiln.cli.common was first imported.
    monkeypatch.setattr(output, "out", Console(width=200, highlight=False))
    held = job("job-held", "QUEUED", "Submitted", "quota: cpus 1 of 1 in use (org acme, category train)")
    fresh = job("job-fresh", "QUEUED", "Submitted", "")
    failed = job("job-failed", "FAILED", "Error", "exit code 3")
    with output.out.capture() as captured:
        output.jobs_table([held, fresh, failed])
    rows = {line.split()[0]: line for line in captured.get().splitlines() if line.startswith("job-")}
    assert "quota: cpus 1 of 1 in use" in rows["job-held"] and "Submitted" not in rows["job-held"]
    assert "Submitted" in rows["job-fresh"] and "Error" in rows["job-failed"]
    assert output.job_reason(fresh) == "Submitted"
    assert output.job_reason(failed) == "Error"  # an ended job keeps its reason; `show` has the message
