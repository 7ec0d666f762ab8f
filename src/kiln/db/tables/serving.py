"""Model services, their replicas and tokens."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from kiln.db.tables.base import Base, utcnow


class Service(Base):
    """A model service (kiln.domain.serving): its spec, the model version its current revision serves, and
    how many replicas it wants now (autoscaling moves it between the spec's min and max)."""

    __tablename__ = "services"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("organizations.id"))
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(63))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    code_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    state: Mapped[str] = mapped_column(String(16))
    message: Mapped[str | None] = mapped_column(Text, default=None)
    model_name: Mapped[str] = mapped_column(String(100))
    model_version: Mapped[int] = mapped_column(Integer)
    revision: Mapped[int] = mapped_column(Integer, default=1)
    desired_replicas: Mapped[int] = mapped_column(Integer)
    last_request_at: Mapped[datetime | None] = mapped_column(default=None)  # a cold start's request, at least
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    # A backend that runs the replicas itself (a Kubernetes Service): the address every server routes to while
    # the serving task routes there (None: not routed), its request secret sealed with the server key, and the
    # NAME@VERSION it serves.
    route_url: Mapped[str | None] = mapped_column(Text, default=None)
    route_secret: Mapped[str | None] = mapped_column(Text, default=None)
    route_model: Mapped[str | None] = mapped_column(String(200), default=None)
    # ... and its canary's and shadow's (each a deployment of its own, with the same secret): track → {"url",
    # "model": NAME@VERSION, "role": "canary", "shadow" or "stable" (a promoted canary's, until the stable track
    # rolled to its version)}; None or {}: none routed.
    route_tracks: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    # A canary (kiln.domain.traffic_split): the version run beside ``model_version``, the percentage of predicts it
    # gets and its replicas; None while there is none.
    canary_version: Mapped[int | None] = mapped_column(Integer, default=None)
    canary_weight: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    canary_replicas: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # Its rollout policy (kiln.domain.rollout.RolloutPolicy; None: moved by hand only), when its share last changed
    # (the policy's step window begins there), and the moves rollouts made (advanced, promoted, rolled back; the
    # newest last, at most kiln.usecases.models.rollout.EVENTS_KEPT).
    canary_policy: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    canary_step_at: Mapped[datetime | None] = mapped_column(default=None)
    rollout_events: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, default=None)
    # A shadow: the version a copy of the predicts goes to, its answers compared and never returned (None: none).
    shadow_version: Mapped[int | None] = mapped_column(Integer, default=None)

    __table_args__ = (Index("ux_services_org_name", "org_id", "name", unique=True),)


class ServiceReplica(Base):
    """One replica of a service: the job that runs it (category ``serve``), the revision and model version it
    serves, and where it stands for the router."""

    __tablename__ = "service_replicas"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    service_id: Mapped[str] = mapped_column(ForeignKey("services.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), default=None, index=True)
    revision: Mapped[int] = mapped_column(Integer)
    model_version: Mapped[int] = mapped_column(Integer)
    canary: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())  # a canary's replica
    shadow: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())  # a shadow's replica
    state: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    ready_at: Mapped[datetime | None] = mapped_column(default=None)
    ended_at: Mapped[datetime | None] = mapped_column(default=None)
    # Where every server reaches it once READY (kiln.tasks.serving_routes): the absolute path of its Unix
    # socket, on the machine ``node`` (servers on that machine share the file system), and its request secret
    # sealed with the server key.
    socket: Mapped[str | None] = mapped_column(Text, default=None)
    secret: Mapped[str | None] = mapped_column(Text, default=None)
    node: Mapped[str | None] = mapped_column(String(255), default=None)


class ServiceTraffic(Base):
    """What one server forwarded to one service, as it last wrote it (kiln.tasks.serving_routes): requests in
    flight (in all, and per replica), how many it forwarded since it started, and its last request. The serving
    task scales on the sum over the live servers."""

    __tablename__ = "service_traffic"

    server_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    service_id: Mapped[str] = mapped_column(ForeignKey("services.id", ondelete="CASCADE"), primary_key=True, index=True)
    in_flight: Mapped[int] = mapped_column(Integer, default=0)
    replica_in_flight: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    last_request_at: Mapped[datetime | None] = mapped_column(default=None)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Per model version: what it forwarded since it started (kiln.domain.rollout.VersionStats.to_json), for a
    # canary's rollout policy on the server that runs the serving task.
    versions: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)


class ServiceKey(Base):
    """A service-scoped token (``kst.<id>.<secret>``): it may predict on its service and do nothing else. Only
    the secret's SHA-256 is kept."""

    __tablename__ = "service_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    service_id: Mapped[str] = mapped_column(ForeignKey("services.id", ondelete="CASCADE"), index=True)
    secret_sha256: Mapped[str] = mapped_column(String(64))
    created_by: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
