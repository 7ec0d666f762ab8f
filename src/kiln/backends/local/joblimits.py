"""The CPU and process limits the local executor hands each shim (``"cgroup"`` in ``shim.json``), and the removal
of what a dead shim left of them.

Each attempt member gets control groups of its own, named after the job, the attempt and the member
(``injob/cgroups.py``: ``kiln/<job>-<attempt>[-<member>]`` in each hierarchy); its shim makes them before its
first step and removes them when it ends. A shim that died cannot: ``cleanup`` kills what is left in them and
removes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.backends.local.attemptdir import member_dirs
from kiln.domain.spec import JobSpec
from kiln.injob import cgroups
from kiln.settings import Settings


def cgroup_name(job_id: str, attempt: int, attempt_dir: Path, member_dir: Path) -> str:
    """The groups' name of one attempt member (a gang member's dir name is in it)."""
    member = member_dir.name if Path(member_dir) != Path(attempt_dir) else None
    return cgroups.group_name(job_id, attempt, member)


def cgroup_config(
    settings: Settings, spec: JobSpec, job_id: str, attempt: int, attempt_dir: Path, member_dir: Path, cpus: float
) -> dict[str, Any]:
    """``shim.json``'s ``"cgroup"`` of one member: its CPU quota (the CPUs it was given) and process limit."""
    return {
        "name": cgroup_name(job_id, attempt, attempt_dir, member_dir),
        "cpus": cpus,
        "pids": spec.resources.pids or settings.job_pids_default,
    }


def cleanup(handle: dict[str, Any]) -> None:
    """Kill what is left in each member's groups and remove them (best effort)."""
    attempt_dir = Path(handle["dir"])
    for _, _, member_dir in member_dirs(handle):
        try:
            cgroups.remove(cgroup_name(handle["job_id"], int(handle["attempt"]), attempt_dir, member_dir))
        except OSError:
            continue
