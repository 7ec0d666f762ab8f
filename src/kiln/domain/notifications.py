"""Notifications: what a subscription asks for, the webhook body Kiln sends, and the pure decisions of delivery —
which subscriptions an event reaches, whether a failed attempt is tried again and when, whether a target address
may be reached. No I/O here: kiln.usecases.notifications.notification_outbox records and fans out events,
kiln.usecases.notifications.notification_sending sends them, kiln.tasks.notifications drives both.

Events are named ``<kind>.<what>``: ``job.succeeded``, ``job.failed``, ``job.cancelled`` (a job's end), a study's
end and each new best trial (``study.*``), a pipeline run's end (``pipeline_run.*``), a budget's soft and hard mark
(``budget.*``), a model version registered or aliased (``model.*``), a notebook culled for idleness
(``notebook.culled``), a service DEGRADED and READY again (``service.unhealthy``, ``service.recovered``), a
canary's share advanced, the canary promoted or rolled back (``service.canary_advanced``, ``service.canary_promoted``,
``service.canary_rolled_back``), a
subscription paused after failing deliveries (``subscription.paused``, told to its owner's other subscriptions)
and ``test`` (a subscription's test event). A subscription lists patterns (``job.*``, ``model.*``) and may narrow
them by the subject's labels, name (a glob) and owner.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kiln.domain import limits

EVENT_TYPES = (
    "job.succeeded",
    "job.failed",
    "job.cancelled",
    "study.succeeded",
    "study.failed",
    "study.stopped",
    "study.best_trial",
    "pipeline_run.succeeded",
    "pipeline_run.failed",
    "budget.soft_limit",
    "budget.hard_limit",
    "model.version_registered",
    "model.alias_set",
    "notebook.culled",
    "service.unhealthy",
    "service.recovered",
    "service.canary_advanced",
    "service.canary_promoted",
    "service.canary_rolled_back",
    "subscription.paused",
    "test",
)
# A job's end, by its terminal state (the event type it is sent as).
JOB_END_EVENTS = {"SUCCEEDED": "job.succeeded", "FAILED": "job.failed", "CANCELLED": "job.cancelled"}
# ``notify:`` in a job spec (Slurm's --mail-type): which of the job's ends are mailed.
NOTIFY_ON = {"end": frozenset(JOB_END_EVENTS.values()), "fail": frozenset({"job.failed"})}
NOTIFY_ON |= {"success": frozenset({"job.succeeded"}), "cancel": frozenset({"job.cancelled"})}

Channel = Literal["webhook", "email"]
Format = Literal["standard", "slack"]
DeliveryStatus = Literal["pending", "delivered", "failed", "refused"]
MAX_WAIT_SECONDS = 3600.0  # between two attempts of one delivery, however many failed
Email = Annotated[str, Field(max_length=254, pattern=r"^[^@\s<>,;]+@[^@\s<>,;]+$")]
# As a job spec's labels are bounded (kiln.domain.spec imports this module, so not from there).
LabelKey = Annotated[str, Field(max_length=limits.MAX_LABEL_KEY_LENGTH)]
LabelValue = Annotated[str, Field(max_length=limits.MAX_LABEL_VALUE_LENGTH)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobNotify(_Strict):
    """``notify:`` of a job spec: e-mail these addresses when the job ends (``end``), fails (``fail``), succeeds
    (``success``) or is cancelled (``cancel``) — Slurm's ``--mail-type=END,FAIL``."""

    on: list[Literal["end", "fail", "success", "cancel"]] = Field(
        min_length=1, max_length=4, description="Which ends: end (any), fail, success, cancel."
    )
    email: list[Email] = Field(min_length=1, max_length=10, description="Who is mailed.")

    def events(self) -> frozenset[str]:
        return frozenset().union(*(NOTIFY_ON[x] for x in self.on))


class SubscriptionCreate(_Strict):
    """A new subscription: which events, narrowed how, sent where."""

    name: str = Field(min_length=1, max_length=128, description="What it is for, e.g. nightly-failures.")
    events: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        min_length=1, max_length=20, description="Event types or globs: job.failed, job.*, *."
    )
    url: str | None = Field(None, max_length=2048, description="A webhook target (http or https).")
    email: Email | None = Field(None, description="An address mailed through the operator's SMTP server.")
    format: Format = Field("standard", description='standard (Kiln\'s JSON body) or slack ({"text": …}).')
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=limits.MAX_LABELS, description="Only subjects carrying all these labels."
    )
    name_pattern: str | None = Field(None, max_length=256, description="Only subjects whose name matches (a glob).")
    owner: str | None = Field(None, max_length=128, description="Only subjects of this user (a name or id).")
    all_orgs: bool = Field(False, strict=True, description="Every organisation's events (the platform admin only).")

    @field_validator("events")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not any(fnmatch.fnmatchcase(t, pattern) for t in EVENT_TYPES):
                raise ValueError(f"{pattern!r} matches no event type (known: {', '.join(EVENT_TYPES)})")
        return value


class SubscriptionUpdate(_Strict):
    paused: bool = Field(
        strict=True, description="true: pause it (no deliveries); false: resume it (and forget its failures)."
    )


class SubscriptionRead(BaseModel):
    id: str
    org_id: str
    user_id: str = Field(description="Its owner: events reach it only where they may read them.")
    name: str
    events: list[str]
    channel: Channel
    target: str = Field(description="The webhook URL or the e-mail address.")
    format: Format
    labels: dict[str, str]
    name_pattern: str | None
    owner_id: str | None
    all_orgs: bool
    state: Literal["active", "paused"]
    paused_reason: str | None = Field(description="Why it was paused (by its owner, or after failing deliveries).")
    failures: int = Field(description="Deliveries failed in a row.")
    created_at: datetime
    secret: str | None = Field(
        None, description="The signing secret (whsec_…): in the answer to its creation only, never again."
    )


class SubscriptionList(BaseModel):
    items: list[SubscriptionRead]


class DeliveryRead(BaseModel):
    id: str
    event_id: str = Field(description="The event's id, sent as webhook-id: the same in every attempt.")
    event_type: str
    subscription_id: str | None
    channel: Channel
    status: DeliveryStatus
    attempts: int
    next_attempt_at: datetime | None = Field(description="When it is tried next (pending only).")
    response_code: int | None = Field(description="The receiver's HTTP status in the last attempt.")
    latency_ms: float | None = Field(description="How long the last attempt took.")
    error: str | None = Field(description="Why the last attempt failed (plain text, at most 500 characters).")
    created_at: datetime
    delivered_at: datetime | None


class DeliveryList(BaseModel):
    items: list[DeliveryRead]


class WebhookSubject(BaseModel):
    kind: Literal["job", "study", "pipeline_run", "budget", "model", "notebook", "service", "subscription"]
    id: str
    name: str
    state: str | None = None
    reason: str | None = None
    message: str | None = None
    exit_code: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    user_id: str | None = None
    details: dict[str, Any] = Field(
        default_factory=dict, description="What else the event says: a best trial's number and value, a version…"
    )


class WebhookEvent(BaseModel):
    """The JSON body of a webhook in the standard format (signed per Standard Webhooks: webhook-id is ``id``)."""

    id: str = Field(description="The event's id (evt-…): the same in every attempt and resend; deduplicate by it.")
    type: str = Field(description="One of the event types: job.failed, study.best_trial, model.alias_set, test…")
    time: datetime = Field(description="When it happened (UTC).")
    org_id: str
    subject: WebhookSubject
    url: str = Field(description="The subject's page in the console.")


class SlackMessage(BaseModel):
    """The body of a webhook in the slack format (an incoming webhook's)."""

    text: str


# -- which subscriptions an event reaches --------------------------------------------------------------------------


def wants(
    events: Sequence[str],
    labels: Mapping[str, str],
    name_pattern: str | None,
    owner_id: str | None,
    event: Mapping[str, Any],
) -> bool:
    """Does a subscription with these filters want ``event`` (its outbox row: type, name, labels, user_id)? Its
    tenancy (same organisation, an owner who may read the subject) is checked by the caller."""
    if not any(fnmatch.fnmatchcase(event["type"], p) for p in events):
        return False
    subject_labels = event.get("labels") or {}
    if any(subject_labels.get(k) != v for k, v in labels.items()):
        return False
    if name_pattern and not fnmatch.fnmatchcase(event.get("name") or "", name_pattern):
        return False
    return not (owner_id and event.get("user_id") != owner_id)


# -- retries -------------------------------------------------------------------------------------------------------


def retryable(status_code: int | None) -> bool:
    """Is an attempt that ended so tried again? No answer (a timeout, no connection: None), a 5xx or 429: yes;
    any other 4xx (the receiver refuses it) and 3xx: never."""
    return status_code is None or status_code >= 500 or status_code == 429


def next_wait(attempts: int, base: float) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones: base, 2·base, 4·base … at most an hour."""
    return min(MAX_WAIT_SECONDS, base * 2 ** min(max(attempts - 1, 0), 30))


# -- where a webhook may go ----------------------------------------------------------------------------------------

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(items: Iterable[str]) -> list[Network]:
    return [ipaddress.ip_network(x, strict=False) for x in items]


def refusal(address: str, allowed: Sequence[Network], own: Iterable[str]) -> str | None:
    """Why a webhook may not connect to ``address`` (None: it may). Refused unless an allowed network holds it:
    loopback, link-local (cloud metadata), unspecified, multicast, reserved, and this machine's own addresses."""
    ip: Address = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if any(ip in net for net in allowed if net.version == ip.version):
        return None
    for what, hit in (
        ("a loopback address", ip.is_loopback),
        ("a link-local address", ip.is_link_local),
        ("the unspecified address", ip.is_unspecified),
        ("a multicast address", ip.is_multicast),
        ("a reserved address", ip.is_reserved),
    ):
        if hit:
            return f"{ip} is {what}"
    mine = {ipaddress.ip_address(x.split("%", 1)[0]) for x in own}
    if ip in mine:
        return f"{ip} is this machine's own address"
    return None


def slack_text(event: Mapping[str, Any], url: str) -> str:
    subject = event.get("subject") or {}
    what = {"job.succeeded": "succeeded", "job.failed": "failed", "job.cancelled": "was cancelled"}
    if event["type"] == "test":
        return f"Kiln test event for subscription {subject.get('name', '')} <{url}|open in Kiln>"
    if not event["type"].startswith("job."):
        kind = str(subject.get("kind", "")).replace("_", " ").capitalize()
        line = f"{kind} {subject.get('name')} ({subject.get('id')}): {event['type']}"
        if subject.get("message"):
            line += f": {subject['message']}"
        return f"{line} <{url}|open in Kiln>"
    line = f"Job {subject.get('name')} ({subject.get('id')}) {what.get(event['type'], event['type'])}"
    if subject.get("message"):
        line += f": {subject['message']}"
    return f"{line} <{url}|open in Kiln>"
