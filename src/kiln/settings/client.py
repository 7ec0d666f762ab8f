"""What the SDK and CLI read from the environment (``KILN_*``) to reach a server."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from kiln.auth.credfile import client_dir


class ClientSettings(BaseSettings):
    """What the SDK and CLI need to reach a server: environment first, then ``kiln login``'s file."""

    model_config = SettingsConfigDict(env_prefix="KILN_", extra="ignore")

    endpoint: str | None = Field(None, description="Server URL, e.g. http://127.0.0.1:8080.")
    access_key: str | None = Field(None, description="Access key id.")
    secret_key: str | None = Field(None, description="Secret key (never logged).")
    job_token: str | None = Field(
        None, description="Bearer token of a running job (set by Kiln in the job's environment; never logged)."
    )
    config: Path = Field(
        default_factory=lambda: client_dir() / "config",
        description="File written by `kiln login` (default: config in the client's state directory, "
        "$KILN_CLIENT_DIR, else $KILN_HOME, else ~/.kiln).",
    )
    timeout: float = Field(60.0, description="HTTP timeout in seconds.")
    retry_seconds: float = Field(
        60.0,
        ge=0,
        description="How long the SDK keeps retrying a request that is safe to repeat (a read, or a create it "
        "sends with an Idempotency-Key) after a lost connection or a 502, 503 or 504; 0: never retry.",
    )
    first_contact_seconds: float = Field(
        4.0,
        ge=0,
        description="How long a connection that cannot be made is retried when nothing has ever answered at this "
        "endpoint from this machine (a mistyped address or port fails within this, not retry_seconds); an "
        "endpoint that answered before, and any call from inside a job, gets the full retry_seconds (a server "
        "restarting).",
    )
