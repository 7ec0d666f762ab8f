"""How the local executor turns the members of a distributed job (a gang) into one attempt status.

A gang is one shim per member, each in its own directory under the attempt (``members/worker-0``, …, ``ps-0``).
The attempt succeeds when every worker exits 0 (parameter servers serve forever, so they are stopped then); it
fails as soon as one member fails, and the others are stopped at once so that no worker hangs in a collective
waiting for a dead peer. This module only decides; the executor carries out the stops.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime

from kiln.backends.base import AttemptStatus, Phase
from kiln.domain.states import Reason

# What members stopped by the gang itself (not by their own failure) record as their reason.
GANG_STOPPED = "GangStopped"


@dataclass(frozen=True)
class MemberStatus:
    role: str  # "worker" | "ps"
    index: int
    status: AttemptStatus

    @property
    def label(self) -> str:
        return f"{self.role} {self.index}"

    @property
    def ended(self) -> bool:
        return self.status.phase in (Phase.EXITED, Phase.LOST)

    @property
    def succeeded(self) -> bool:
        s = self.status
        return s.phase is Phase.EXITED and s.reason == Reason.COMPLETED and s.exit_code == 0

    @property
    def failed(self) -> bool:
        return self.ended and not self.succeeded and self.status.reason != GANG_STOPPED


@dataclass(frozen=True)
class GangView:
    """The attempt's status, and which members the executor must stop now (with which reason)."""

    status: AttemptStatus
    stop: tuple[int, ...] = ()  # positions in the member list
    stop_reason: str = ""
    stop_message: str = ""


def _latest(times: list[datetime | None]) -> datetime | None:
    known = [t for t in times if t is not None]
    return max(known) if known else None


def aggregate(members: list[MemberStatus]) -> GangView:
    view = _aggregate(members)
    # The members build or wait for a runtime side by side: the gang's hold waited as long as the longest of them.
    unbilled = max((m.status.unbilled_seconds for m in members), default=0.0)
    return replace(view, status=replace(view.status, unbilled_seconds=unbilled)) if unbilled else view


def _aggregate(members: list[MemberStatus]) -> GangView:
    alive = [i for i, m in enumerate(members) if not m.ended]
    running_at = _latest([m.status.running_at for m in members]) if all(m.status.running_at for m in members) else None
    failures = sorted(
        (m for m in members if m.failed),
        key=lambda m: m.status.finished_at or datetime.max.replace(tzinfo=UTC),
    )
    unlaunched = [m for m in members if m.status.phase is Phase.UNLAUNCHED]
    if unlaunched and not failures:  # the start was cut short: the next start launches the missing members
        names = ", ".join(m.label for m in unlaunched)
        message = f"{names} of the gang never launched (the server stopped before it started them)"
        return GangView(AttemptStatus(Phase.UNLAUNCHED, reason="NotLaunched", message=message))
    if failures:
        first = failures[0]
        if alive:
            why = f"{first.label} ended ({first.status.reason or 'Error'}); stopping the rest of the gang"
            return GangView(AttemptStatus(Phase.RUNNING, running_at=running_at), tuple(alive), GANG_STOPPED, why)
        code = first.status.exit_code
        message = f"{first.label}: {first.status.message or f'exit code {code}'}"
        return GangView(
            AttemptStatus(
                Phase.EXITED if first.status.phase is Phase.EXITED else Phase.LOST,
                exit_code=code,
                reason=first.status.reason or Reason.ERROR,
                message=message,
                running_at=running_at,
                finished_at=_latest([m.status.finished_at for m in members]),
            )
        )
    workers = [m for m in members if m.role != "ps"]
    if workers and all(m.succeeded for m in workers):
        if alive:  # parameter servers never end by themselves
            return GangView(
                AttemptStatus(Phase.RUNNING, running_at=running_at),
                tuple(alive),
                GANG_STOPPED,
                "every worker finished; stopping the parameter servers",
            )
        return GangView(
            AttemptStatus(
                Phase.EXITED,
                exit_code=0,
                reason=Reason.COMPLETED,
                message=f"all {len(workers)} workers exited 0",
                running_at=running_at,
                finished_at=_latest([m.status.finished_at for m in members]),
            )
        )
    if all(m.status.phase is Phase.RUNNING or m.succeeded for m in members):
        return GangView(AttemptStatus(Phase.RUNNING, running_at=running_at))
    return GangView(AttemptStatus(Phase.STARTING, running_at=running_at))
