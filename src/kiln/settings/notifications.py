"""The settings of notifications (``settings.notifications``): where webhooks may go (``KILN_WEBHOOK_ALLOW``), the
SMTP server e-mails go through (``KILN_SMTP_*``), and how deliveries are retried (``KILN_WEBHOOK_*``). Read from
their own environment variables and part of the one settings tree (:class:`kiln.settings.Settings`)."""

from __future__ import annotations

import ipaddress
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class NotificationSettings(BaseSettings):
    """Webhook targets, SMTP and the delivery task (``settings.notifications``)."""

    model_config = SettingsConfigDict(env_prefix="KILN_", extra="ignore")

    webhook_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated networks (CIDRs or addresses) webhooks may reach although they are refused by "
        "default: loopback, link-local, unspecified, multicast and this machine's own addresses (Kiln's API, its "
        "PostgreSQL). E.g. 127.0.0.1/32 for a receiver on this machine.",
    )
    webhook_timeout_seconds: float = Field(10.0, gt=0, description="How long one webhook POST may take.")
    webhook_retry_base_seconds: float = Field(
        10.0,
        gt=0,
        description="The wait after a delivery's first failed attempt (a 5xx, a timeout, no connection); doubled "
        "after each next one (at most an hour between two).",
    )
    webhook_max_attempts: int = Field(
        12, ge=1, description="Attempts of one delivery before it is given up (12 from 10 s: about 11 hours)."
    )
    webhook_pause_after: int = Field(
        5, ge=1, description="A subscription whose deliveries failed this many times in a row is paused."
    )
    notifications_interval_seconds: float = Field(
        1.0,
        gt=0,
        description="How often the delivery task looks for events and due deliveries (it is also woken "
        "when this server records an event).",
    )
    notifications_send: bool = Field(
        True,
        description="Whether this server runs the delivery task; false: it records events for the other servers "
        "to deliver.",
    )
    smtp_host: str | None = Field(None, description="The SMTP server e-mails go through; unset: no e-mail.")
    smtp_port: int = Field(25, description="Its port (587 with STARTTLS, 465 with SSL).")
    smtp_user: str | None = Field(None, description="Login at the SMTP server, if it wants one.")
    smtp_password: SecretStr | None = Field(None, description="Its password (never logged).")
    smtp_from: str = Field("kiln@localhost", description="The From: address of Kiln's e-mails.")
    smtp_starttls: bool = Field(False, description="Upgrade the connection with STARTTLS before logging in.")
    smtp_ssl: bool = Field(False, description="Connect with TLS from the start (port 465).")

    @field_validator("webhook_allow", mode="before")
    @classmethod
    def _networks(cls, value: object) -> object:
        if isinstance(value, str):
            value = [x.strip() for x in value.split(",") if x.strip()]
        if isinstance(value, list):
            for item in value:
                try:
                    ipaddress.ip_network(str(item), strict=False)
                except ValueError:
                    raise ValueError(f"KILN_WEBHOOK_ALLOW: {item!r} is not a network (e.g. 127.0.0.1/32)") from None
        return value
