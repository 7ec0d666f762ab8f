"""The capacity a placement is written against, checked in the transaction that writes it.

Two callers place jobs: the reconcile pass, on a decision made over a snapshot read before its transaction (the
queue may be long), and a submit that fits at once (``kiln.scheduler.submit_placement``), on a snapshot read
inside its own. Several servers may share the database. So whoever moves a job to STARTING first takes the
backend's **placement lock** and then checks, against the allocations committed by then, that what it places is
still free: a decision that went stale between its snapshot and its write (another server's pass, or a submit
placed meanwhile, took the capacity) places nothing over it; the job stays queued and the next decision places it.

The lock: on PostgreSQL a transaction-scoped advisory lock per backend, taken before the organisations' rows
(``usecases.quotas.Admission``), always in that order, so two placers never wait for each other in a circle; on
SQLite the write transaction (``BEGIN IMMEDIATE``) already serialises every writer.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable, Sequence
from typing import TypeVar

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kiln.backends.base import Slot
from kiln.db.tables import Job
from kiln.domain.placement.types import Node
from kiln.domain.quantities import millicores
from kiln.domain.states import JobState
from kiln.usecases.jobs.scheduler_inputs import slots_of

log = logging.getLogger(__name__)
Row = TypeVar("Row")

# The first half of the advisory lock's key: Kiln's placements (the second is the backend's name, hashed), so the
# lock cannot collide with another application's advisory locks keyed by one integer.
LOCK_SPACE = 0x4B494C4E  # "KILN"
ACTIVE_STATES = [str(JobState.STARTING), str(JobState.RUNNING)]


def _backend_key(backend: str) -> int:
    """The backend's name as a signed 32-bit integer (the advisory lock's second half)."""
    value = zlib.crc32(backend.encode())
    return value - (1 << 32) if value >= 1 << 31 else value


def lock_placements(s: Session, dialect: str, backend: str, *, wait: bool = True) -> bool:
    """Inside ``s``: take the backend's placement lock until the transaction ends. ``wait=False``: give up at once
    if another transaction holds it (False). On SQLite the write transaction holds it already."""
    if dialect != "postgresql":
        return True
    key = (LOCK_SPACE, _backend_key(backend))
    if wait:
        s.execute(select(func.pg_advisory_xact_lock(*key)))
        return True
    return bool(s.scalar(select(func.pg_try_advisory_xact_lock(*key))))


def held_slots(s: Session, backend: str, default_node: str) -> list[Slot]:
    """The slots the backend's active jobs hold, as committed (and as this transaction wrote them so far)."""
    rows = s.scalars(select(Job.allocation).where(Job.backend == backend, Job.state.in_(ACTIVE_STATES)))
    return [slot for allocation in rows for slot in slots_of(allocation, default_node)]


class FreeCapacity:
    """What each node has free once the ``held`` slots are taken out. Pure: ``take`` checks a placement against it
    and counts it when it fits, so the next is judged as if the ones before it were placed."""

    def __init__(self, nodes: Sequence[Node], held: Iterable[Slot]) -> None:
        self.cpus = {n.name: n.millicores for n in nodes}
        self.memory = {n.name: n.memory for n in nodes}
        self.gpus = {n.name: set(n.gpus) for n in nodes}
        for slot in held:
            if slot.node in self.cpus:  # a node no longer in the inventory holds nothing of what is offered
                self._hold(slot)

    def _hold(self, slot: Slot) -> None:
        self.cpus[slot.node] -= millicores(slot.cpus)
        self.memory[slot.node] -= slot.memory or 0
        self.gpus[slot.node].difference_update(slot.gpus)

    def take(self, slots: Sequence[Slot]) -> bool:
        """Count ``slots`` (a whole gang) as held if every one of them is free now; else count nothing: False."""
        cpus: dict[str, int] = {}
        memory: dict[str, int] = {}
        gpus: dict[str, set[int]] = {}
        for slot in slots:
            if slot.node not in self.cpus:
                return False
            cpus[slot.node] = cpus.get(slot.node, 0) + millicores(slot.cpus)
            memory[slot.node] = memory.get(slot.node, 0) + (slot.memory or 0)
            wanted = gpus.setdefault(slot.node, set())
            if wanted & set(slot.gpus):
                return False  # one GPU given to two members
            wanted.update(slot.gpus)
        for node, n in cpus.items():
            if n > self.cpus[node] or memory[node] > self.memory[node] or not gpus[node] <= self.gpus[node]:
                return False
        for slot in slots:
            self._hold(slot)
        return True


def still_free(
    s: Session, dialect: str, backend: str, placed: list[tuple[Row, tuple[Slot, ...]]], nodes: Sequence[Node]
) -> list[tuple[Row, tuple[Slot, ...]]]:
    """Inside ``s``, under the placement lock it takes here: the placements (in order) that are still free by the
    allocations committed now. What no longer fits is left out, to stay queued for the next decision."""
    if not placed:
        return []
    lock_placements(s, dialect, backend)
    free = FreeCapacity(nodes, held_slots(s, backend, nodes[0].name if nodes else "local"))
    kept = [(row, slots) for row, slots in placed if free.take(slots)]
    if len(kept) < len(placed):
        log.info("%d placement(s) no longer free: left queued for the next decision", len(placed) - len(kept))
    return kept
