"""Task ``nonce-flush``, on every server (no lease): a single-process server's accepted nonces, kept in memory for
the replay check (kiln.usecases.access.identity.MemoryNonceStore), appended to the ``nonces`` table every
``flush_interval`` (0.1 s), so that a restart opens no replay window. A server on PostgreSQL writes each nonce
as it checks it and has no such task."""

from __future__ import annotations

from kiln.tasks.runner import Task, TaskContext
from kiln.usecases.access.identity import MemoryNonceStore


def nonce_flush(store: MemoryNonceStore) -> Task:
    def run_once(ctx: TaskContext) -> None:
        store.flush()

    return Task("nonce-flush", run_once, store.flush_interval)
