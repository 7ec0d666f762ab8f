"""What Slurm says of Kiln's jobs, read and mapped: ``squeue`` lines parsed into :class:`QueueEntry`, and an entry
mapped to an :class:`~kiln.backends.base.AttemptStatus` (:func:`status_of`). Pure functions: the backend
(:mod:`kiln.backends.slurm.backend`) runs the commands.

One ``squeue`` call lists every Kiln job of the server's user in every state Slurm still remembers (``--states=all``:
pending, running, and ended ones for ``MinJobAge`` seconds, 300 by default), one line per job in the format
:data:`SQUEUE_FORMAT`, fields separated by ``|`` (a job name cannot hold one: Kiln's are ``kiln-<id>-a<n>``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from kiln.backends.base import AttemptStatus, Phase

# squeue --Format fields, in order; exit_code is the batch script's raw wait status (768: exit 3; 9: SIGKILL).
FIELDS = ("JobID", "Name", "State", "Reason", "NodeList", "StartTime", "EndTime", "exit_code")
SQUEUE_FORMAT = ",".join(f"{field}:|" for field in FIELDS)
NAME = re.compile(r"kiln-(?P<job>[A-Za-z0-9][A-Za-z0-9_.-]*)-a(?P<attempt>\d+)")

PENDING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
RUNNING = frozenset({"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING", "SUSPENDED", "STOPPED"})


@dataclass(frozen=True)
class QueueEntry:
    """One Slurm job as ``squeue`` lists it."""

    slurm_id: str
    name: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, ...
    reason: str  # why it waits or how it ended (Resources, Priority, NonZeroExitCode, BadConstraints, ...)
    nodes: str
    start: datetime | None
    end: datetime | None
    exit_status: int | None  # the raw wait status

    @property
    def job_attempt(self) -> tuple[str, int] | None:
        """(Kiln job id, attempt) from the name; None for a job that is not Kiln's."""
        match = NAME.fullmatch(self.name)
        return (match["job"], int(match["attempt"])) if match else None

    @property
    def exit_code(self) -> int | None:
        """The script's exit code as a shell gives it: N, or 128+S for signal S."""
        if self.exit_status is None:
            return None
        signal = self.exit_status & 0x7F
        return 128 + signal if signal else self.exit_status >> 8


def _time(text: str) -> datetime | None:
    text = text.strip()
    if not text or text in ("N/A", "NONE", "Unknown"):
        return None
    try:  # squeue prints the controller's local time without a zone; the servers here run in UTC
        return datetime.fromisoformat(text).replace(tzinfo=UTC)
    except ValueError:
        return None


def parse_squeue(text: str) -> list[QueueEntry]:
    """The entries of ``squeue --noheader --Format=SQUEUE_FORMAT`` output; lines of another shape are skipped."""
    entries = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) < len(FIELDS):
            continue
        slurm_id, name, state, reason, nodes, start, end, status = parts[: len(FIELDS)]
        if not slurm_id.isdigit():
            continue
        entries.append(
            QueueEntry(
                slurm_id=slurm_id,
                name=name,
                state=state.split()[0].rstrip("+") if state else "",
                reason=reason if reason != "None" else "",
                nodes=nodes if nodes not in ("", "(null)") else "",
                start=_time(start),
                end=_time(end),
                exit_status=int(status) if status.isdigit() else None,
            )
        )
    return entries


# Ended states → (phase, Kiln's reason, what to say). The restart policy applies to each but Completed.
ENDED: dict[str, tuple[Phase, str, str]] = {
    "COMPLETED": (Phase.EXITED, "Completed", "completed"),
    "FAILED": (Phase.EXITED, "Error", "failed"),
    "CANCELLED": (Phase.EXITED, "Cancelled", "was cancelled in Slurm (scancel, not by Kiln)"),
    "TIMEOUT": (Phase.EXITED, "Timeout", "reached its time limit (--time, the spec's timeout or the partition's)"),
    "DEADLINE": (Phase.EXITED, "Timeout", "reached its deadline"),
    "OUT_OF_MEMORY": (Phase.EXITED, "OOMKilled", "ran out of memory (--mem)"),
    "PREEMPTED": (Phase.EXITED, "Preempted", "was preempted by Slurm"),
    "BOOT_FAIL": (Phase.LOST, "NodeLost", "could not start: its node failed to boot"),
    "NODE_FAIL": (Phase.LOST, "NodeLost", "ended: a node of its allocation failed"),
    "REVOKED": (Phase.LOST, "NodeLost", "was revoked by a sibling cluster"),
    "SPECIAL_EXIT": (Phase.EXITED, "Error", "ended in Slurm's SPECIAL_EXIT state"),
}


def status_of(entry: QueueEntry, stopping: tuple[str, str] | None = None) -> AttemptStatus:
    """Where the attempt ``entry`` is. ``stopping``: (reason, message) of Kiln's own cancel or preemption, which
    names how the attempt ended, whatever its exit code (a job that checkpoints on SIGTERM exits 0)."""
    where = f"Slurm job {entry.slurm_id}"
    if entry.state in PENDING:
        why = f" ({entry.reason})" if entry.reason else ""
        return AttemptStatus(Phase.STARTING, message=f"{where} is {entry.state.lower()} in Slurm's queue{why}")
    if entry.state in RUNNING:
        on = f" on {entry.nodes}" if entry.nodes else ""
        return AttemptStatus(Phase.RUNNING, message=f"{where} runs{on}", running_at=entry.start)
    phase, reason, said = ENDED.get(entry.state, (Phase.EXITED, "Error", f"ended in state {entry.state}"))
    code = entry.exit_code if phase is Phase.EXITED else None
    if entry.state == "FAILED" and entry.reason and entry.reason != "NonZeroExitCode":
        said = f"failed: {entry.reason}"  # e.g. BadConstraints: Slurm could never run it as asked
        if not entry.reason.startswith("RaisedSignal"):
            # Slurm failed it, not its script (BadConstraints, JobLaunchFailure, ...): the controller's exit_code
            # 1 then is a mark, not the script's wait status (not SIGHUP, 129).
            code = None
    message = f"{where} {said}" + (f" (exit code {code})" if code else "")
    if stopping is not None:  # a job that obeyed Kiln's SIGTERM and exited 0 was still cancelled or preempted
        reason, message = stopping
    running_at = entry.start if entry.start and entry.nodes else None
    return AttemptStatus(phase, code, reason, message, running_at=running_at, finished_at=entry.end)


@dataclass(frozen=True)
class NodeEntry:
    """One node as ``scontrol show node -o`` describes it."""

    name: str
    cpus: int
    memory_mb: int
    gpus: int
    gpu_type: str | None
    features: tuple[str, ...]
    state: str
    partitions: tuple[str, ...]

    @property
    def usable(self) -> bool:
        # scontrol marks a node that does not answer with * (DOWN*, IDLE*+DRAIN)
        flags = set(self.state.replace("*", "+NOT_RESPONDING+").replace("+", " ").split())
        return not flags & {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING", "FUTURE"}


_GRES_GPU = re.compile(r"(?:^|,)gpu(?::(?P<type>[A-Za-z0-9_.+-]+))?:(?P<count>\d+)")


def _fields(line: str) -> dict[str, str]:
    """``Key=value`` pairs of one ``-o`` line (values with spaces, such as Reason=, keep only their first word)."""
    return dict(item.split("=", 1) for item in line.split() if "=" in item)


def parse_nodes(text: str) -> list[NodeEntry]:
    """The nodes of ``scontrol show node -o`` (one node per line)."""
    nodes = []
    for line in text.splitlines():
        f = _fields(line)
        if "NodeName" not in f:
            continue
        gres = _GRES_GPU.search(f.get("Gres", "") if f.get("Gres") != "(null)" else "")
        features = f.get("AvailableFeatures", "")
        nodes.append(
            NodeEntry(
                name=f["NodeName"],
                cpus=int(f.get("CPUTot", "0") or 0),
                memory_mb=int(f.get("RealMemory", "0") or 0),
                gpus=int(gres["count"]) if gres else 0,
                gpu_type=gres["type"] if gres else None,
                features=tuple(x for x in features.split(",") if x and x != "(null)"),
                state=f.get("State", ""),
                partitions=tuple(x for x in f.get("Partitions", "").split(",") if x and x != "(null)"),
            )
        )
    return nodes
