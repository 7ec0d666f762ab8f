"""The outbox of notifications and what the delivery task writes.

``job_ended`` adds an event row (``notification_events``) to the session of the transaction that ends a job
(kiln.usecases.jobs.lifecycle), so the event is committed with the job's end or not at all: a server killed after that
commit loses no notification. The leased task ``notifications`` (kiln.tasks.notifications) then, in its fenced
transactions: ``fan_out`` turns each new event into one delivery per subscription that wants it (and one per
address of the job spec's ``notify:``), ``due`` reads the deliveries whose attempt is due, and ``record`` writes
each attempt's outcome (retried with back-off, given up, the subscription paused). A delivery is unique per (event,
subscription, target): an event fanned out twice (a holder that lost its lease mid-way) delivers once; an attempt
whose outcome was not written (the server killed while sending) is sent again with the same ``webhook-id``, so
receivers deduplicate by it (at least once).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import event as sa_event
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from kiln.db.tables import (
    Job,
    JobEvent,
    NotificationDelivery,
    NotificationEvent,
    NotificationSubscription,
    User,
    utcnow,
)
from kiln.domain import policy
from kiln.domain.ids import new_id
from kiln.domain.notifications import EVENT_TYPES, JOB_END_EVENTS, JobNotify, next_wait, wants

# What a subscription's owner must hold to be told of an event of this kind (they would read the subject).
READ_PERMISSION = {
    "job": "jobs:read",
    "study": "studies:read",
    "pipeline_run": "pipelines:read",
    "budget": "jobs:read",
    "model": "models:read",
    "notebook": "notebooks:read",
    "service": "services:read",
}
_WAKE = "kiln.notifications.recorded"  # session.info: this transaction recorded an event
_wakers: list[Callable[[], None]] = []
_wakers_lock = threading.Lock()


def on_recorded(wake: Callable[[], None]) -> Callable[[], None]:
    """Call ``wake`` after every commit that recorded an event (the delivery task sends it at once, not at its
    next interval). Returns the function that stops it."""
    with _wakers_lock:
        _wakers.append(wake)

    def remove() -> None:
        with _wakers_lock:
            if wake in _wakers:
                _wakers.remove(wake)

    return remove


@sa_event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    if session.info.pop(_WAKE, False):
        with _wakers_lock:
            wakers = list(_wakers)
        for wake in wakers:
            wake()


@dataclass(frozen=True)
class Subject:
    """What an event is about: its kind (study, model …), its organisation and owner (whose subscriptions may be
    told), its name and labels (what subscriptions filter by) and its page in the console."""

    kind: str
    org_id: str
    id: str
    name: str
    user_id: str | None
    path: str
    labels: dict[str, str] = field(default_factory=dict)


def job_ended(session: Session, job: Job, event: JobEvent) -> NotificationEvent:
    """Record a job's end (``event``, its terminal transition) in the outbox, in the caller's transaction."""
    spec = job.spec or {}
    labels = dict(spec.get("labels") or {})
    kind = JOB_END_EVENTS[str(event.to_state)]
    event_id = new_id("evt")
    body = {
        "id": event_id,
        "type": kind,
        "time": event.time.isoformat(),
        "org_id": job.org_id,
        "subject": {
            "kind": "job",
            "id": job.id,
            "name": job.name,
            "state": str(event.to_state),
            "reason": event.reason,
            "message": event.message or "",
            "exit_code": job.exit_code,
            "labels": labels,
            "user_id": job.user_id,
        },
        "path": f"/jobs/{job.id}",
    }
    row = NotificationEvent(
        id=event_id,
        org_id=job.org_id,
        type=kind,
        user_id=job.user_id,
        name=job.name,
        labels=labels,
        body=body,
        notify=spec.get("notify"),
        fanned=False,
        created_at=event.time,
    )
    session.add(row)
    session.info[_WAKE] = True
    return row


def recorded(
    session: Session,
    kind: str,
    subject: Subject,
    *,
    state: str | None = None,
    message: str = "",
    details: dict[str, Any] | None = None,
) -> NotificationEvent:
    """Record an event other than a job's end (``kind``, one of domain.notifications.EVENT_TYPES) about
    ``subject`` in the outbox, in the caller's transaction: the one that records what happened."""
    assert kind in EVENT_TYPES, kind
    now = utcnow()
    event_id = new_id("evt")
    body = {
        "id": event_id,
        "type": kind,
        "time": now.isoformat(),
        "org_id": subject.org_id,
        "subject": {
            "kind": subject.kind,
            "id": subject.id,
            "name": subject.name,
            "state": state,
            "message": message,
            "labels": dict(subject.labels),
            "user_id": subject.user_id,
            "details": details or {},
        },
        "path": subject.path,
    }
    row = NotificationEvent(
        id=event_id,
        org_id=subject.org_id,
        type=kind,
        user_id=subject.user_id,
        name=subject.name,
        labels=dict(subject.labels),
        body=body,
        fanned=False,
        created_at=now,
    )
    session.add(row)
    session.info[_WAKE] = True
    return row


def test_event(session: Session, sub: NotificationSubscription) -> NotificationDelivery:
    """A test event for one subscription, fanned out to it alone: its delivery, due now."""
    now = utcnow()
    event_id = new_id("evt")
    body = {
        "id": event_id,
        "type": "test",
        "time": now.isoformat(),
        "org_id": sub.org_id,
        "subject": {"kind": "subscription", "id": sub.id, "name": sub.name, "labels": {}},
        "path": "/notifications",
    }
    session.add(
        NotificationEvent(id=event_id, org_id=sub.org_id, type="test", name=sub.name, labels={}, body=body, fanned=True)
    )
    session.flush()
    delivery = _delivery(event_id, "test", sub.org_id, sub.id, sub.channel, sub.target, now)
    session.add(delivery)
    session.info[_WAKE] = True
    return delivery


def _delivery(
    event_id: str, kind: str, org_id: str, sub_id: str | None, channel: str, target: str, now: datetime
) -> NotificationDelivery:
    return NotificationDelivery(
        id=new_id("dlv"),
        event_id=event_id,
        event_type=kind,
        org_id=org_id,
        subscription_id=sub_id,
        channel=channel,
        target=target,
        status="pending",
        attempts=0,
        next_at=now,
        created_at=now,
    )


def fan_out(s: Session, limit: int = 1000) -> int:
    """Turn up to ``limit`` new events into deliveries; how many events it took."""
    events = s.scalars(
        select(NotificationEvent)
        .where(NotificationEvent.fanned.is_(False))
        .order_by(NotificationEvent.created_at)
        .limit(limit)
    ).all()
    if not events:
        return 0
    orgs = {e.org_id for e in events}
    subs = s.scalars(
        select(NotificationSubscription).where(
            NotificationSubscription.state == "active",
            NotificationSubscription.org_id.in_(orgs) | NotificationSubscription.all_orgs.is_(True),
        )
    ).all()
    owners = {u.id: u for u in s.scalars(select(User).where(User.id.in_({x.user_id for x in subs})))}
    now = utcnow()
    made: list[NotificationDelivery] = []
    for ev in events:
        seen = {"type": ev.type, "labels": ev.labels, "name": ev.name, "user_id": ev.user_id}
        for sub in subs:
            owner = owners.get(sub.user_id)
            if owner is None or not _may_read(owner, sub, ev):
                continue
            if wants(sub.events, sub.labels or {}, sub.name_pattern, sub.owner_id, seen):
                made.append(_delivery(ev.id, ev.type, ev.org_id, sub.id, sub.channel, sub.target, now))
        if ev.notify:
            notify = JobNotify.model_validate(ev.notify)
            if ev.type in notify.events():
                made += [
                    _delivery(ev.id, ev.type, ev.org_id, None, "email", a, now) for a in dict.fromkeys(notify.email)
                ]
        ev.fanned = True
    s.add_all(made)
    return len(events)


def _may_read(owner: User, sub: NotificationSubscription, ev: NotificationEvent) -> bool:
    """The tenancy of a delivery: the owner is enabled, may read this kind of subject, and the event is of the
    subscription's organisation (any, for a platform admin's subscription of every organisation)."""
    if owner.disabled:
        return False
    if ev.org_id != sub.org_id and not (sub.all_orgs and owner.platform_admin):
        return False
    if ev.org_id != owner.org_id and not owner.platform_admin:
        return False
    kind = ev.type.split(".", 1)[0]
    if kind == "subscription":  # a paused subscription: told to its owner (and their organisation's admins)
        return sub.user_id == ev.user_id or "users:manage" in policy.permissions(owner.role, owner.platform_admin)
    needed = READ_PERMISSION.get(kind)
    return needed is None or needed in policy.permissions(owner.role, owner.platform_admin)


@dataclass(frozen=True)
class Send:
    """One attempt to make: what the sender needs, read in the task's transaction."""

    delivery_id: str
    event_id: str
    body: dict[str, Any]
    channel: str
    target: str
    format: str
    secret_sealed: str | None
    attempts: int


@dataclass(frozen=True)
class Outcome:
    """What one attempt got: delivered, or why not; ``retry`` whether it is tried again (5xx, timeouts)."""

    delivery_id: str
    ok: bool
    retry: bool
    status_code: int | None = None
    latency_ms: float | None = None
    error: str | None = None
    refused: bool = False  # the target may not be reached (KILN_WEBHOOK_ALLOW): nothing was sent


def due(s: Session, limit: int = 200) -> list[Send]:
    """Deliveries whose next attempt is due, oldest first (a paused subscription's wait)."""
    rows = s.execute(
        select(NotificationDelivery, NotificationEvent.body, NotificationSubscription)
        .join(NotificationEvent, NotificationEvent.id == NotificationDelivery.event_id)
        .outerjoin(NotificationSubscription, NotificationSubscription.id == NotificationDelivery.subscription_id)
        .where(NotificationDelivery.status == "pending", NotificationDelivery.next_at <= utcnow())
        .order_by(NotificationDelivery.next_at)
        .limit(limit)
    ).all()
    out = []
    for delivery, body, sub in rows:
        if sub is not None and sub.state != "active":
            continue
        out.append(
            Send(
                delivery.id,
                delivery.event_id,
                body,
                delivery.channel,
                delivery.target,
                sub.format if sub is not None else "standard",
                sub.secret_sealed if sub is not None else None,
                delivery.attempts,
            )
        )
    return out


def record(s: Session, outcomes: list[Outcome], retry_base: float, max_attempts: int, pause_after: int) -> None:
    """Write each attempt's outcome: delivered; tried again after the back-off (5xx, timeouts) until
    ``max_attempts``; or failed (4xx, given up, refused). A subscription whose deliveries failed ``pause_after``
    times in a row is paused, saying why."""
    if not outcomes:
        return
    rows = {
        d.id: d
        for d in s.scalars(
            select(NotificationDelivery).where(NotificationDelivery.id.in_([o.delivery_id for o in outcomes]))
        )
    }
    now = utcnow()
    good: set[str] = set()
    bad: dict[str, tuple[int, str]] = {}  # a subscription's failed deliveries in this batch, and the last's error
    for o in outcomes:
        d = rows.get(o.delivery_id)
        if d is None or d.status != "pending":
            continue  # removed with its subscription, or written by another holder
        d.attempts += 1
        d.response_code, d.latency_ms, d.error = o.status_code, o.latency_ms, (o.error or None) and o.error[:500]
        if o.ok:
            d.status, d.next_at, d.delivered_at = "delivered", None, now
            if d.subscription_id:
                good.add(d.subscription_id)
        elif o.retry and not o.refused and d.attempts < max_attempts:
            d.next_at = now + timedelta(seconds=next_wait(d.attempts, retry_base))
        else:
            d.status, d.next_at = ("refused" if o.refused else "failed"), None
            if d.subscription_id:
                count = bad.get(d.subscription_id, (0, ""))[0] + 1  # each counts: 5 in one batch are 5 in a row
                bad[d.subscription_id] = (count, o.error or f"HTTP {o.status_code}")
    if good:
        s.execute(
            update(NotificationSubscription).where(NotificationSubscription.id.in_(good - set(bad))).values(failures=0)
        )
    for sub_id, (count, why) in bad.items():
        sub = s.get(NotificationSubscription, sub_id)
        if sub is None:
            continue
        sub.failures += count
        if sub.failures >= pause_after and sub.state == "active":
            sub.state = "paused"
            sub.paused_reason = (
                f"paused after {sub.failures} failed deliveries in a row (last: {why[:200]}); "
                "fix the receiver, then resume it (kiln notify resume)"
            )
            # Its owner is told through their other subscriptions (subscription.paused) and the console's badge.
            about = Subject("subscription", sub.org_id, sub.id, sub.name, sub.user_id, "/notifications")
            recorded(s, "subscription.paused", about, state="paused", message=sub.paused_reason)
