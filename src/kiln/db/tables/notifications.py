"""Notifications: subscriptions, the outbox of events (written in the transaction that records each event), and
the deliveries of each event to each subscription (their log)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from kiln.db.tables.base import Base, utcnow


class NotificationSubscription(Base):
    """Who wants which events, where (a webhook URL, signed with ``secret_sealed``; or an e-mail address)."""

    __tablename__ = "notification_subscriptions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"), index=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))  # its owner
    name: Mapped[str] = mapped_column(String(128))
    events: Mapped[list[str]] = mapped_column(JSON)
    channel: Mapped[str] = mapped_column(String(16))  # webhook | email
    target: Mapped[str] = mapped_column(Text)
    format: Mapped[str] = mapped_column(String(16), default="standard")
    secret_sealed: Mapped[str | None] = mapped_column(Text, default=None)  # SecretBox-sealed whsec_…
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    name_pattern: Mapped[str | None] = mapped_column(String(256), default=None)
    owner_id: Mapped[str | None] = mapped_column(String(32), default=None)
    all_orgs: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16), default="active")  # active | paused
    paused_reason: Mapped[str | None] = mapped_column(Text, default=None)
    failures: Mapped[int] = mapped_column(Integer, default=0)  # deliveries failed in a row
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class NotificationEvent(Base):
    """The outbox: one row per event, added to the session of the transaction that records the event (a job's
    end), so that it is committed with it or not at all. The delivery task fans it out to the subscriptions that
    want it (``fanned``) in its own fenced transaction."""

    __tablename__ = "notification_events"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # the webhook-id of every delivery of it
    org_id: Mapped[str] = mapped_column(String(32))
    type: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[str | None] = mapped_column(String(32), default=None)  # the subject's owner
    name: Mapped[str] = mapped_column(String(256), default="")
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)  # the webhook body (domain.notifications.WebhookEvent)
    notify: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)  # the job spec's notify:
    fanned: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_notification_events_fanned", "fanned", "created_at"),)


class NotificationDelivery(Base):
    """One event to one target: its attempts so far and the last one's outcome."""

    __tablename__ = "notification_deliveries"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    event_id: Mapped[str] = mapped_column(ForeignKey("notification_events.id", ondelete="CASCADE"))
    event_type: Mapped[str] = mapped_column(String(64))
    org_id: Mapped[str] = mapped_column(String(32))
    subscription_id: Mapped[str | None] = mapped_column(
        ForeignKey("notification_subscriptions.id", ondelete="CASCADE"), default=None
    )
    channel: Mapped[str] = mapped_column(String(16))
    target: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | delivered | failed | refused
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_at: Mapped[datetime | None] = mapped_column(default=None)
    response_code: Mapped[int | None] = mapped_column(Integer, default=None)
    latency_ms: Mapped[float | None] = mapped_column(Float, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(default=None)

    __table_args__ = (
        UniqueConstraint("event_id", "subscription_id", "target", name="uq_notification_deliveries_once"),
        Index("ix_notification_deliveries_due", "status", "next_at"),
        Index("ix_notification_deliveries_subscription", "subscription_id", "created_at"),
    )
