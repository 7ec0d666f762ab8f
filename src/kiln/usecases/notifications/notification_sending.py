"""Sending notifications: webhooks signed per Standard Webhooks (``webhook-id``, ``webhook-timestamp``,
``webhook-signature``: the ``standardwebhooks`` package's signature over ``id.timestamp.body``) to targets the
operator allows, and e-mails through the operator's SMTP server.

A webhook's host is resolved here, every address it resolves to is checked (kiln.domain.notifications.refusal:
no loopback, link-local or this machine's own address unless ``KILN_WEBHOOK_ALLOW`` holds it), and the connection
goes to the checked address (the URL's host kept in ``Host`` and TLS's SNI), so that a name that resolves
elsewhere a moment later (DNS rebinding) reaches nothing unchecked. A refused target is sent nothing.
"""

from __future__ import annotations

import json
import smtplib
import socket
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from email.message import EmailMessage
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psutil
from standardwebhooks.webhooks import Webhook

from kiln import __version__
from kiln.auth.secrets import SecretBox
from kiln.domain.notifications import Network, parse_networks, refusal, retryable, slack_text
from kiln.errors import InvalidInput
from kiln.settings.notifications import NotificationSettings
from kiln.usecases.notifications.notification_outbox import Outcome, Send

WORKERS = 16  # attempts sent at once (one slow receiver does not hold the others back)


class TargetRefused(InvalidInput, refines_code=True):
    """A webhook URL that may not be reached (KILN_WEBHOOK_ALLOW) or is not a URL Kiln sends to."""


@lru_cache(maxsize=1)
def own_addresses() -> frozenset[str]:
    """This machine's addresses: every interface's, and what its host name resolves to."""
    found: set[str] = set()
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                found.add(a.address.split("%", 1)[0])
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None):
            found.add(str(info[4][0]).split("%", 1)[0])
    except OSError:
        pass
    return frozenset(found)


def resolve_target(url: str, allowed: Sequence[Network], own: Iterable[str] | None = None) -> tuple[str, str]:
    """The address a webhook to ``url`` connects to, and the URL's host; ``TargetRefused`` naming why not (not
    http(s), no host, unresolvable, or an address refused). Every address the host resolves to must be allowed."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused(f"{url!r}: a webhook URL is http:// or https:// with a host", details={"field": "url"})
    if parts.username or parts.password:
        raise TargetRefused("a webhook URL carries no user or password", details={"field": "url"})
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise TargetRefused(f"{host}: cannot be resolved ({exc})", details={"field": "url"}) from None
    addresses = list(dict.fromkeys(str(i[4][0]) for i in infos))
    mine = own_addresses() if own is None else own
    for address in addresses:
        why = refusal(address, allowed, mine)
        if why is not None:
            raise TargetRefused(
                f"{host} resolves to {why}: webhooks may not reach it (the operator allows such networks with "
                "KILN_WEBHOOK_ALLOW)",
                details={"field": "url"},
            )
    if not addresses:
        raise TargetRefused(f"{host}: resolves to no address", details={"field": "url"})
    return addresses[0], host


def body_of(send: Send, endpoint: str) -> dict[str, Any]:
    """The JSON sent: Kiln's event (domain.notifications.WebhookEvent) or, for the slack format, ``{"text"}``."""
    stored = dict(send.body)
    url = endpoint.rstrip("/") + str(stored.pop("path", "/"))
    event = {**stored, "url": url}
    if send.format == "slack":
        return {"text": slack_text(event, url)}
    return event


class Sender:
    """Makes attempts: ``send_all`` sends a batch at once (up to WORKERS in parallel) and says what each got."""

    def __init__(self, settings: NotificationSettings, box: SecretBox, endpoint: str) -> None:
        self.settings = settings
        self.box = box
        self.endpoint = endpoint
        self.allowed = parse_networks(settings.webhook_allow)
        self.http = httpx.Client(timeout=settings.webhook_timeout_seconds, follow_redirects=False)
        self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="kiln-notify")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.http.close()

    def send_all(self, sends: list[Send]) -> list[Outcome]:
        if len(sends) == 1:
            return [self.send(sends[0])]
        return list(self.pool.map(self.send, sends))

    def send(self, send: Send) -> Outcome:
        try:
            if send.channel == "email":
                return self._email(send)
            return self._webhook(send)
        except Exception as exc:  # an attempt's failure is its outcome, never the task's
            return Outcome(send.delivery_id, ok=False, retry=True, error=f"{type(exc).__name__}: {exc}")

    def _webhook(self, send: Send) -> Outcome:
        try:
            address, host = resolve_target(send.target, self.allowed)
        except TargetRefused as exc:
            return Outcome(send.delivery_id, ok=False, retry=False, error=exc.message, refused=True)
        payload = json.dumps(body_of(send, self.endpoint), separators=(",", ":"), sort_keys=True).encode()
        now = datetime.now(UTC)
        headers = {
            "content-type": "application/json",
            "user-agent": f"Kiln-Webhooks/{__version__}",
            "webhook-id": send.event_id,
            "webhook-timestamp": str(int(now.timestamp())),
        }
        if send.secret_sealed:
            secret = self.box.open(send.secret_sealed)
            headers["webhook-signature"] = Webhook(secret).sign(send.event_id, now, payload)
        parts = urlsplit(send.target)
        netloc = f"[{address}]" if ":" in address else address
        if parts.port:
            netloc += f":{parts.port}"
        pinned = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
        headers["host"] = parts.netloc.rsplit("@", 1)[-1]
        extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
        start = time.perf_counter()
        try:
            answer = self.http.post(pinned, content=payload, headers=headers, extensions=extensions)
        except httpx.TimeoutException:
            took = (time.perf_counter() - start) * 1000
            return Outcome(send.delivery_id, ok=False, retry=True, latency_ms=took, error="timed out")
        except httpx.HTTPError as exc:
            took = (time.perf_counter() - start) * 1000
            return Outcome(send.delivery_id, ok=False, retry=True, latency_ms=took, error=f"{type(exc).__name__}")
        took = (time.perf_counter() - start) * 1000
        code = answer.status_code
        if 200 <= code < 300:
            return Outcome(send.delivery_id, ok=True, retry=False, status_code=code, latency_ms=took)
        # The receiver's answer is kept as plain text, short (the console shows it as text, never as markup).
        text = answer.text[:200].replace("\n", " ")
        return Outcome(
            send.delivery_id,
            ok=False,
            retry=retryable(code),
            status_code=code,
            latency_ms=took,
            error=f"HTTP {code}: {text}",
        )

    def _email(self, send: Send) -> Outcome:
        s = self.settings
        if not s.smtp_host:
            return Outcome(
                send.delivery_id, ok=False, retry=False, error="no SMTP server is configured (KILN_SMTP_HOST)"
            )
        event = body_of(send, self.endpoint)
        subject = event.get("subject") or {}
        message = EmailMessage()
        message["From"] = s.smtp_from
        message["To"] = send.target
        message["Subject"] = f"[Kiln] {event['type']}: {subject.get('name', '')}"
        message["Message-ID"] = f"<{send.event_id}.{send.delivery_id}@kiln>"
        lines = [
            slack_text(event, event["url"]).split(" <", 1)[0],
            "",
            f"Open it: {event['url']}",
            f"Event: {send.event_id}",
        ]
        message.set_content("\n".join(lines) + "\n")
        start = time.perf_counter()
        factory = smtplib.SMTP_SSL if s.smtp_ssl else smtplib.SMTP
        try:
            with factory(s.smtp_host, s.smtp_port, timeout=s.webhook_timeout_seconds) as smtp:
                if s.smtp_starttls:
                    smtp.starttls()
                if s.smtp_user:
                    smtp.login(s.smtp_user, s.smtp_password.get_secret_value() if s.smtp_password else "")
                smtp.send_message(message)
        except smtplib.SMTPResponseException as exc:
            took = (time.perf_counter() - start) * 1000
            return Outcome(
                send.delivery_id,
                ok=False,
                retry=exc.smtp_code >= 400 and exc.smtp_code < 500,
                status_code=exc.smtp_code,
                latency_ms=took,
                error=f"SMTP {exc.smtp_code}",
            )
        except (OSError, smtplib.SMTPException) as exc:
            took = (time.perf_counter() - start) * 1000
            return Outcome(
                send.delivery_id, ok=False, retry=True, latency_ms=took, error=f"{type(exc).__name__}: {exc}"
            )
        return Outcome(send.delivery_id, ok=True, retry=False, latency_ms=(time.perf_counter() - start) * 1000)
