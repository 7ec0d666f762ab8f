"""Subscriptions to notifications and their delivery log: the use cases behind /api/v1/notifications.

A subscription belongs to its owner and their organisation: events reach it only where its owner may read their
subject (kiln.usecases.notifications.notification_outbox). Its owner sees and changes it; so do their organisation's
admins and
the platform admin (who alone may subscribe to every organisation's events). Members and admins subscribe; a
viewer, a job's or a service's token may not. A webhook's signing secret is made here, shown in the answer to the
creation only, and stored sealed like access keys' secrets.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from kiln.auth.secrets import SecretBox
from kiln.db.session import Database
from kiln.db.tables import NotificationDelivery, NotificationSubscription, utcnow
from kiln.domain.ids import new_id
from kiln.domain.notifications import (
    DeliveryRead,
    SubscriptionCreate,
    SubscriptionRead,
    SubscriptionUpdate,
    parse_networks,
)
from kiln.errors import Forbidden, InvalidInput, NotFound
from kiln.settings.notifications import NotificationSettings
from kiln.usecases.access.accounts import find_user
from kiln.usecases.access.identity import Principal
from kiln.usecases.notifications import notification_outbox
from kiln.usecases.notifications.notification_sending import resolve_target

MAX_DELIVERIES = 500  # listed at once, newest first


def new_webhook_secret() -> str:
    """A signing secret as Standard Webhooks writes them: ``whsec_`` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


class NotificationService:
    def __init__(
        self, db: Database, box: SecretBox, settings: NotificationSettings, wake: Callable[[], None] = lambda: None
    ) -> None:
        self.db = db
        self.box = box
        self.settings = settings
        self.wake = wake  # the delivery task: a test event or a resend goes out now

    def create(self, principal: Principal, body: SubscriptionCreate) -> SubscriptionRead:
        self._may_subscribe(principal)
        if (body.url is None) == (body.email is None):
            raise InvalidInput("give a webhook url or an email address (one of them)", details={"field": "url"})
        if body.all_orgs and not principal.platform_admin:
            raise Forbidden("only the platform admin subscribes to every organisation's events")
        if body.email is not None and not self.settings.smtp_host:
            raise InvalidInput(
                "e-mail notifications need an SMTP server, and the operator configured none (KILN_SMTP_HOST)",
                details={"field": "email"},
            )
        if body.url is not None:  # refused now, not at the first event (and checked again at every attempt)
            resolve_target(body.url, parse_networks(self.settings.webhook_allow))
        secret = new_webhook_secret() if body.url is not None else None
        with self.db.transaction() as s:
            owner_id = find_user(s, principal, body.owner)[0].id if body.owner else None
            row = NotificationSubscription(
                id=new_id("sub"),
                org_id=principal.org_id,
                user_id=principal.user_id,
                name=body.name,
                events=list(body.events),
                channel="webhook" if body.url is not None else "email",
                target=body.url if body.url is not None else str(body.email),
                format=body.format,
                secret_sealed=self.box.seal(secret) if secret else None,
                labels=dict(body.labels),
                name_pattern=body.name_pattern,
                owner_id=owner_id,
                all_orgs=body.all_orgs,
                state="active",
                failures=0,
                created_at=utcnow(),
            )
            s.add(row)
        return read_subscription(row, secret)

    def list_subscriptions(self, principal: Principal) -> list[SubscriptionRead]:
        principal.require("jobs:read")
        with self.db.read() as s:
            query = select(NotificationSubscription).order_by(NotificationSubscription.created_at)
            if not principal.platform_admin:
                query = query.where(NotificationSubscription.org_id == principal.org_id)
                if not principal.can("users:manage"):
                    query = query.where(NotificationSubscription.user_id == principal.user_id)
            return [read_subscription(x) for x in s.scalars(query)]

    def get(self, principal: Principal, sub_id: str) -> SubscriptionRead:
        with self.db.read() as s:
            return read_subscription(self._find(s, principal, sub_id))

    def update(self, principal: Principal, sub_id: str, body: SubscriptionUpdate) -> SubscriptionRead:
        self._may_subscribe(principal)
        with self.db.transaction() as s:
            sub = self._find(s, principal, sub_id)
            if body.paused:
                sub.state, sub.paused_reason = "paused", f"paused by {principal.user_name}"
            else:
                sub.state, sub.paused_reason, sub.failures = "active", None, 0
            return read_subscription(sub)

    def remove(self, principal: Principal, sub_id: str) -> None:
        self._may_subscribe(principal)
        with self.db.transaction() as s:
            sub = self._find(s, principal, sub_id)
            s.execute(delete(NotificationDelivery).where(NotificationDelivery.subscription_id == sub.id))
            s.delete(sub)

    def send_test(self, principal: Principal, sub_id: str) -> DeliveryRead:
        """A test event to this subscription (paused or not: it says whether the receiver answers now)."""
        self._may_subscribe(principal)
        with self.db.transaction() as s:
            sub = self._find(s, principal, sub_id)
            if sub.state != "active":
                raise InvalidInput(f"subscription {sub.id} is paused: resume it first", details={"field": "state"})
            delivery = notification_outbox.test_event(s, sub)
        self.wake()
        return read_delivery(delivery)

    def deliveries(self, principal: Principal, sub_id: str, limit: int = 100) -> list[DeliveryRead]:
        with self.db.read() as s:
            sub = self._find(s, principal, sub_id)
            rows = s.scalars(
                select(NotificationDelivery)
                .where(NotificationDelivery.subscription_id == sub.id)
                .order_by(NotificationDelivery.created_at.desc(), NotificationDelivery.id.desc())
                .limit(min(limit, MAX_DELIVERIES))
            )
            return [read_delivery(x) for x in rows]

    def resend(self, principal: Principal, sub_id: str, delivery_id: str) -> DeliveryRead:
        """Send a delivery again now (same event id: receivers that saw it deduplicate)."""
        self._may_subscribe(principal)
        with self.db.transaction() as s:
            sub = self._find(s, principal, sub_id)
            delivery = s.get(NotificationDelivery, delivery_id)
            if delivery is None or delivery.subscription_id != sub.id:
                raise NotFound(f"delivery {delivery_id} not found")
            delivery.status, delivery.next_at = "pending", utcnow()
            if sub.state != "active":
                sub.state, sub.paused_reason, sub.failures = "active", None, 0
            out = read_delivery(delivery)
        self.wake()
        return out

    @staticmethod
    def _may_subscribe(principal: Principal) -> None:
        if principal.job_id or principal.service_id:
            raise Forbidden(f"{principal.describe()} may not manage notifications")
        principal.require("jobs:write")

    @staticmethod
    def _find(s: Session, principal: Principal, sub_id: str) -> NotificationSubscription:
        principal.require("jobs:read")
        sub = s.get(NotificationSubscription, sub_id)
        visible = sub is not None and (
            principal.platform_admin
            or (sub.org_id == principal.org_id and (sub.user_id == principal.user_id or principal.can("users:manage")))
        )
        if sub is None or not visible:
            raise NotFound(f"subscription {sub_id} not found")
        return sub


def read_subscription(row: NotificationSubscription, secret: str | None = None) -> SubscriptionRead:
    return SubscriptionRead(
        id=row.id,
        org_id=row.org_id,
        user_id=row.user_id,
        name=row.name,
        events=list(row.events),
        channel=row.channel,  # type: ignore[arg-type]
        target=row.target,
        format=row.format,  # type: ignore[arg-type]
        labels=dict(row.labels or {}),
        name_pattern=row.name_pattern,
        owner_id=row.owner_id,
        all_orgs=row.all_orgs,
        state=row.state,  # type: ignore[arg-type]
        paused_reason=row.paused_reason,
        failures=row.failures,
        created_at=row.created_at,
        secret=secret,
    )


def read_delivery(row: NotificationDelivery) -> DeliveryRead:
    return DeliveryRead(
        id=row.id,
        event_id=row.event_id,
        event_type=row.event_type,
        subscription_id=row.subscription_id,
        channel=row.channel,  # type: ignore[arg-type]
        status=row.status,  # type: ignore[arg-type]
        attempts=row.attempts,
        next_attempt_at=row.next_at if row.status == "pending" else None,
        response_code=row.response_code,
        latency_ms=row.latency_ms,
        error=row.error,
        created_at=row.created_at,
        delivered_at=row.delivered_at,
    )
