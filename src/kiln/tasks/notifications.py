"""The leased task ``notifications``: delivers what the outbox recorded
(kiln.usecases.notifications.notification_outbox).

Each run, in its fenced transaction, fans the new events out into deliveries and reads the deliveries due; then,
outside any transaction and after ``ctx.fence()``, sends them (kiln.usecases.notifications.notification_sending); then
writes
what each attempt got in a second fenced transaction. One server at a time holds the lease, so two servers do not
both send an event; a server killed after sending and before writing leaves the delivery due, and the next holder
sends it again with the same ``webhook-id`` (at least once, deduplicable by that id). It is woken by every commit
that records an event on this server, and looks again every interval for what other servers recorded.
"""

from __future__ import annotations

from kiln.db.session import Database
from kiln.settings.notifications import NotificationSettings
from kiln.tasks.runner import Task, TaskContext
from kiln.usecases.notifications import notification_outbox
from kiln.usecases.notifications.notification_sending import Sender

BATCH = 200  # attempts per run (more due: the next run goes at once)


class NotificationTask:
    def __init__(self, db: Database, settings: NotificationSettings, sender: Sender) -> None:
        self.db = db
        self.settings = settings
        self.sender = sender
        self._task = Task(
            "notifications",
            self.run_once,
            settings.notifications_interval_seconds,
            lease_scope="notifications",
            stop=sender.close,
        )
        self._remove = notification_outbox.on_recorded(self._task.wake.set)

    def task(self) -> Task:
        return self._task

    def wake(self) -> None:
        self._task.wake.set()

    def close(self) -> None:
        self._remove()

    def run_once(self, ctx: TaskContext) -> float | None:
        with ctx.transaction() as s:
            fanned = notification_outbox.fan_out(s)
        with self.db.read() as s:
            sends = notification_outbox.due(s, BATCH)
        if not sends:
            return 0.0 if fanned else None
        ctx.fence()
        outcomes = self.sender.send_all(sends)
        s_ = self.settings
        with ctx.transaction() as s:
            notification_outbox.record(
                s, outcomes, s_.webhook_retry_base_seconds, s_.webhook_max_attempts, s_.webhook_pause_after
            )
        return 0.0 if len(sends) >= BATCH or fanned else None
