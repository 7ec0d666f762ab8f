"""What has outlived its use, deleted in the background.

Rows of the (maybe shared) database: one server at a time purges each kind (a leased task), in its fenced
transaction: ``purge-nonces`` (the replay window's used nonces), ``purge-audit`` (entries past
``KILN_AUDIT_RETENTION_DAYS``), ``purge-idempotency-keys`` (keys past ``KILN_IDEMPOTENCY_RETENTION_SECONDS``)."""

from __future__ import annotations

from kiln.tasks.runner import Task
from kiln.usecases.access.audit import AuditService
from kiln.usecases.access.idempotency import Idempotency
from kiln.usecases.access.identity import IdentityService


def purges(identity: IdentityService, audit: AuditService, idempotency: Idempotency) -> list[Task]:
    return [
        Task.writing("purge-nonces", identity.purge_nonces, 60, lease_scope="purge-nonces"),
        Task.writing("purge-audit", audit.purge, 600, lease_scope="purge-audit"),
        Task.writing("purge-idempotency-keys", idempotency.purge, 600, lease_scope="purge-idempotency-keys"),
    ]
