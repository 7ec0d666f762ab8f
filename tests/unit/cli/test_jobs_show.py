"""`kiln jobs show` of a distributed job says its resources per worker, times the workers, and the total (it
showed `1 CPU, 2 GiB` and nothing about workers, issue 26)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kiln.cli.output import job_detail
from kiln.domain.schemas import JobRead
from kiln.domain.spec import JobSpec

NOW = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def _shown(capsys: pytest.CaptureFixture[str], **spec: Any) -> dict[str, str]:
    job = JobRead(
        id="job-1",
        name="ddp",
        org_id="org-1",
        user_id="usr-1",
        state="QUEUED",
        spec=JobSpec.model_validate({"command": "python train.py", **spec}),
        created_at=NOW,
        updated_at=NOW,
    )
    job_detail(job)
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        key, _, value = line.strip().partition("  ")
        rows[key.strip()] = value.strip()
    return rows


def test_a_two_worker_job_shows_per_worker_the_workers_and_the_total(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _shown(
        capsys,
        resources={"cpus": 1, "memory": "2G", "gpus": 1},
        distributed={"framework": "pytorch", "workers": 2, "procs_per_worker": 2},
    )
    assert rows["distributed"] == "pytorch, 2 workers of 2 processes"
    assert rows["resources"] == "1 CPU, 2 GiB memory, 1 GPU per worker, 2 workers: 2 CPU, 4 GiB memory, 2 GPU in all"


def test_parameter_servers_count_as_members(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _shown(
        capsys,
        resources={"cpus": 0.5, "memory": "1G", "log": "100M"},
        distributed={"framework": "tensorflow", "workers": 2, "ps": 1},
    )
    assert rows["distributed"] == "tensorflow, 2 workers + 1 parameter server"
    assert rows["resources"] == (
        "0.5 CPU, 1 GiB memory per member, 3 members: 1.5 CPU, 3 GiB memory in all; 100 MiB log for the whole job"
    )


def test_a_single_job_reads_as_before(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _shown(capsys, resources={"cpus": 2, "memory": "4G"})
    assert rows["resources"] == "2 CPU, 4 GiB memory"
    assert rows["distributed"] == "-"
