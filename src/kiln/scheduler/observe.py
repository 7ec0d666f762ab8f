"""Step 1 of a reconcile pass: where each attempt is, asked of the backend with no transaction open (a cancel or a
preemption notice it is due sent first), and what an attempt that ended left behind (its whole log, its outputs
and checkpoints, in the store before the end is recorded). The pass's transaction writes what it found
(``Seen``); the one other write is the outputs' reservation against the storage quota, before they are copied
(kiln.scheduler.outputs_gate)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from kiln.backends.base import Backend, Phase
from kiln.backends.capabilities import CheckpointSyncer, EventSyncer, OutputCollector, OutputsNotKept, Preemptible
from kiln.domain.states import JobState
from kiln.scheduler.outputs_gate import OutputsGate
from kiln.scheduler.passes import Seen
from kiln.settings import Settings
from kiln.storage.keys import outputs_prefix
from kiln.storage.logs import LogStore
from kiln.usecases.data.storage_gate import StorageGate, sync_checkpoints, sync_events

log = logging.getLogger(__name__)


class Observer:
    """Asks the backend about one attempt at a time; holds nothing between passes."""

    def __init__(self, backend: Backend, logs: LogStore, settings: Settings, gate: OutputsGate | None = None) -> None:
        self.backend = backend
        self.logs = logs
        self.settings = settings
        self.gate = gate  # the storage quota, checked before outputs are copied (None: none checked)
        self.kept = StorageGate(gate.db, gate.logs) if gate is not None else None  # and before checkpoints are

    def look(self, job: Any) -> Seen:
        """Ask the backend where the job's attempt is (sending a requested cancel or preemption first), and
        collect what an attempt that ended left behind. ``job``: the job's row, or a row of its columns that this
        reads (id, org_id, state, attempt, handle, cancel_requested, preempt_reason, output_bytes). The pass's
        transaction writes it; only the outputs' reservation against the storage quota (``gate``) is written here,
        before they are copied."""
        seen = Seen(job, dict(job.handle or self.backend.handle_for(job.id, job.attempt)))
        handle = seen.handle
        if job.cancel_requested and not handle.get("cancel_sent"):
            self.backend.cancel(handle, self.settings.kill_grace_seconds)
            handle["cancel_sent"] = True
            seen.handle_changed = True
        elif job.preempt_reason and not handle.get("preempt_sent"):
            sent_at = time.time()  # before the notice: an exit 0 after it is the job obeying the notice
            if isinstance(self.backend, Preemptible):
                self.backend.preempt(handle, job.preempt_reason, self.settings.preemption_grace_seconds)
            else:  # no notice channel, no reason of its own: a cancel with the preemption's grace
                self.backend.cancel(handle, self.settings.preemption_grace_seconds)
            handle["preempt_sent"] = True
            handle["preempt_sent_at"] = sent_at
            seen.handle_changed = True
            seen.notes.append(f"preempted: {job.preempt_reason}; the job is warned and stopped")
        status = self.backend.poll(handle)
        if status.phase is Phase.STARTING:
            return seen
        if status.phase is Phase.UNLAUNCHED:
            seen.status = status  # the pass launches it again (``_apply``): nothing ended, nothing to collect
            return seen
        if status.phase is Phase.RUNNING:
            if job.state == JobState.STARTING:
                seen.status = status
            return seen
        seen.status = status
        # The whole log into the store before the end is recorded: a server that sees the job ended serves it all.
        seen.log_bytes = self.ship_log(job, handle)  # counted in the organisation's storage (usecases/access/quotas.py)
        backend = self.backend
        if isinstance(backend, OutputCollector):
            self.collect_outputs(backend, job, handle, seen)
        # Checkpoints and event files count in the organisation's storage quota each on their own, admitted by
        # ``kept`` before they are written (kiln.usecases.data.storage_gate): past it, the job's event says so once.
        try:
            if isinstance(backend, CheckpointSyncer):
                sync_checkpoints(backend, self.kept, handle, job.org_id, job.id)
        except Exception as exc:
            seen.copy_error += f"; keeping checkpoints in the store failed: {type(exc).__name__}: {exc}"
            log.warning("job %s: keeping checkpoints failed: %s", job.id, exc)
        try:
            if isinstance(backend, EventSyncer):
                sync_events(backend, self.kept, handle, job.org_id, job.id)
        except Exception as exc:
            seen.copy_error += f"; keeping TensorBoard event files failed: {type(exc).__name__}: {exc}"
            log.warning("job %s: keeping TensorBoard event files failed: %s", job.id, exc)
        if status.phase is Phase.LOST:
            self.backend.cleanup(handle)
        return seen

    def collect_outputs(self, backend: OutputCollector, job: Any, handle: dict[str, Any], seen: Seen) -> None:
        """The attempt's outputs into the store, whole or not at all, admitted by the storage quota first."""
        reserved: list[int] = []

        def admit(size: int) -> None:
            assert self.gate is not None
            self.gate.admit(job.id, size)
            reserved.append(size)

        kept = False
        try:
            prefix = outputs_prefix(job.org_id, job.id)
            seen.copied, seen.copied_bytes = backend.collect_outputs(handle, prefix, admit if self.gate else None)
            kept = True
        except OutputsNotKept as exc:  # refused whole, none of them in the store: the job's end event says why
            seen.copy_error = f"; outputs not kept: {exc}"
            seen.notes.append(f"outputs not kept: {exc}")
        except Exception as exc:  # keep the job's outcome even when its outputs cannot be kept
            seen.copy_error = f"; collecting outputs failed: {type(exc).__name__}: {exc}"
            log.warning("job %s: collecting outputs failed: %s", job.id, exc)
        if reserved and not kept and self.gate is not None:
            # Admitted, then not copied (the store failed, the files grew): the reservation would count bytes
            # the store does not hold, so the count goes back to what it was.
            try:
                self.gate.release(job.id, job.output_bytes or 0)
            except Exception as exc:
                log.warning("job %s: releasing its outputs' reservation failed: %s", job.id, exc)

    def ship_log(self, job: Any, handle: dict[str, Any]) -> int:
        """Ship the job's log to the store (all of it: the attempt is over); its size. A store that is down
        leaves it to the log-shipping task, and the end is recorded all the same. ``handle``'s ``log``: the file
        the attempt writes, when the backend names it (another server's on this machine, for an adopted one)."""
        source = log_source(handle)
        try:
            size = self.logs.ship(job.org_id, job.id, final=True, source=source)
            self.logs.unshipped.discard((job.org_id, job.id))
            return max(size, self.logs.size(job.id))
        except Exception as exc:
            log.warning("job %s: shipping its log to the store failed: %s", job.id, exc)
            self.logs.unshipped.add((job.org_id, job.id))
            return self.logs.size(job.id)


def log_source(handle: dict[str, Any]) -> Path | None:
    """The file the attempt writes its log to, where its backend names it in the handle."""
    return Path(handle["log"]) if isinstance(handle.get("log"), str) else None
