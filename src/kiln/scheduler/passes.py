"""What one reconcile pass carries from its halves to its transaction: what observing an attempt found
(``Seen``) and what the scheduling half decided (``Plan``). Built with no transaction open, written in one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kiln.backends.base import AttemptStatus, Phase, Slot
from kiln.domain.placement.types import Node


@dataclass
class Seen:
    """What observing one attempt found, through the backend alone; the pass's transaction writes it."""

    # The job as read before the backend was asked: a row of the reconciler's observed columns (id, org_id, state,
    # attempt, handle, cancel_requested, preempt_reason, message, output_bytes), or a whole Job row.
    job: Any
    handle: dict[str, Any]
    handle_changed: bool = False  # a cancel or a preemption notice was sent: the handle records it
    status: AttemptStatus | None = None  # None: nothing to write (still starting, or running as recorded)
    copied: int = 0
    copied_bytes: int = 0
    log_bytes: int = 0  # the job's log's size once the attempt ended
    copy_error: str = ""
    notes: list[str] = field(default_factory=list)  # lines for the job's log, once committed
    keep_files: bool | None = None  # the job ended: free its local files (False), or keep them a while (True)

    @property
    def ended(self) -> bool:
        return self.status is not None and self.status.phase in (Phase.EXITED, Phase.LOST)

    @property
    def writes(self) -> bool:
        return self.handle_changed or self.status is not None


@dataclass
class Plan:
    """What the scheduling half of a pass writes, decided on a snapshot read before the pass's transaction."""

    unschedulable: dict[str, str] = field(default_factory=dict)  # job id → why it can never run
    preemptions: dict[str, str] = field(default_factory=dict)  # victim → why
    waiting: dict[str, str] = field(default_factory=dict)  # job id → its changed wait message
    rows: dict[str, Any] = field(default_factory=dict)  # the snapshot's queue rows, by id
    starts: list[tuple[Any, tuple[Slot, ...]]] = field(default_factory=list)  # placements this pass starts
    names: dict[str, str] = field(default_factory=dict)  # org id → name
    nodes: list[Node] = field(default_factory=list)  # the nodes the decision placed on (the starts' re-check)

    @property
    def writes(self) -> bool:
        return bool(self.unschedulable or self.preemptions or self.waiting or self.starts)
