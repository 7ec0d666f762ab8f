"""Where ``kiln.Client`` takes its credentials from, and what it tells a user whose credentials failed.

Credentials come from the arguments, else ``KILN_ENDPOINT`` / ``KILN_ACCESS_KEY`` / ``KILN_SECRET_KEY``, else
``KILN_JOB_TOKEN`` (set by Kiln inside a running job), else the file ``kiln login`` writes (``config`` in
``kiln.sdk.config.client_dir()``, or ``KILN_CONFIG``). Each value remembers where it came from, so that a refused
request can say what to check: the endpoint, the access key id and the variable or file each came from (as gh,
kubectl and the AWS CLI do), never anything of the secret itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.auth import failures, signing
from kiln.errors import Unauthenticated
from kiln.sdk.config import read_config_file, server_home

if TYPE_CHECKING:
    from kiln.settings import ClientSettings

ARGUMENT = "argument"
ENVIRONMENT = "environment"
CONFIG = "config"
VARIABLES = {
    "endpoint": "KILN_ENDPOINT",
    "access_key": "KILN_ACCESS_KEY",
    "secret_key": "KILN_SECRET_KEY",
    "job_token": "KILN_JOB_TOKEN",
}
LABELS = {"endpoint": "endpoint", "access_key": "access key id", "secret_key": "secret key", "job_token": "job token"}


@dataclass(frozen=True)
class Credentials:
    """What a client signs with, and where each value came from (``sources``: field name to ARGUMENT,
    ENVIRONMENT or CONFIG)."""

    endpoint: str
    access_key: str
    secret_key: str = field(repr=False)
    job_token: str = field(repr=False)
    config: Path
    sources: dict[str, str]

    def origin(self, name: str) -> str:
        """Where one value came from, as a user would look for it: ``KILN_SECRET_KEY (environment variable)``,
        ``KILN_SECRET_KEY in /home/ann/.kiln/config``, ``the secret key you gave`` (to ``Client()``, ``kiln login``)."""
        source = self.sources.get(name, ENVIRONMENT)
        if source == ARGUMENT:
            return f"the {LABELS[name]} you gave"
        if source == CONFIG:
            return f"{VARIABLES[name]} in {self.config}"
        return f"{VARIABLES[name]} (environment variable)"

    def key_origins(self) -> str:
        """Where the access key id and the secret came from, in one phrase."""
        key, secret = self.sources.get("access_key"), self.sources.get("secret_key")
        if key == secret == CONFIG:
            return f"KILN_ACCESS_KEY and KILN_SECRET_KEY in {self.config}"
        if key == secret == ENVIRONMENT:
            return "KILN_ACCESS_KEY and KILN_SECRET_KEY (environment variables)"
        if key == secret == ARGUMENT:
            return "the access key id and secret key you gave"
        return f"{self.origin('access_key')} and {self.origin('secret_key')}"

    def _from_file(self) -> bool:
        return CONFIG in (self.sources.get("access_key"), self.sources.get("secret_key"))

    def explain(self, error: Unauthenticated) -> Unauthenticated:
        """The server's refusal as advice about these credentials (same class, code and details)."""
        details = error.details if isinstance(error.details, dict) else {}
        return type(error)(self._advice(error.message, details), details=error.details)

    def _advice(self, message: str, details: dict[str, Any]) -> str:
        reason = details.get("reason")
        at = self.endpoint
        if self.job_token:
            return f"{message} (server {at})"
        # A value that is no access key id may be a secret pasted in its place: it is never repeated.
        key = self.access_key if signing.ACCESS_KEY_PATTERN.fullmatch(self.access_key) else ""
        relogin = ", or run `kiln login` again" if self._from_file() else ""
        if reason == failures.UNKNOWN_KEY and key:
            return (
                f"the access key id you provided does not exist: {at} has no access key {key} — check "
                f"{self.origin('access_key')} and {self.origin('endpoint')}{relogin}"
            )
        if reason == failures.SIGNATURE and key:
            check = self.origin("secret_key")
            return f"the secret key does not match access key {key} at {at} — check {check}{relogin}"
        if reason in (failures.KEY_DISABLED, failures.KEY_EXPIRED):
            then = "run `kiln login` with it" if self._from_file() else f"set {self.key_origins()}"
            return (
                f"{message} (server {at}) — ask an admin of your organisation for a new key "
                f"(`kiln keys create --user NAME`), then {then}"
            )
        if reason == failures.STALE and isinstance(details.get("server_time"), int):
            return self._skew(details)
        if not key:
            return f"{message} — check {self.origin('access_key')}: an access key id is AK and 18 capitals or digits"
        return f"{message} (server {at}, access key {key} from {self.origin('access_key')})"

    def _skew(self, details: dict[str, Any]) -> str:
        server, sent = int(details["server_time"]), int(details.get("request_time") or 0)
        delta = sent - server
        direction = "ahead of" if delta > 0 else "behind"
        allowed = details.get("max_skew_seconds", "?")
        return (
            f"this machine's clock is {abs(delta)} s {direction} the server's at {self.endpoint} (server time "
            f"{failures.iso(server)}, this machine's {failures.iso(sent)}; at most {allowed} s either way is "
            "accepted) — set this machine's clock right, e.g. turn on NTP: `timedatectl set-ntp true`"
        )


def resolve(
    endpoint: str | None,
    access_key: str | None,
    secret_key: str | None,
    job_token: str | None,
    settings: ClientSettings,
) -> Credentials:
    """The credentials a client uses (see the module's docstring for the order); Unauthenticated, naming what
    is missing and where to get it, when there are none."""
    saved = read_config_file(settings.config)
    sources: dict[str, str] = {}

    def pick(name: str, *candidates: tuple[str | None, str]) -> str:
        for value, source in candidates:
            if value:
                sources[name] = source
                return value
        return ""

    url = pick(
        "endpoint", (endpoint, ARGUMENT), (settings.endpoint, ENVIRONMENT), (saved.get(VARIABLES["endpoint"]), CONFIG)
    )
    key = pick("access_key", (access_key, ARGUMENT), (settings.access_key, ENVIRONMENT))
    secret = pick("secret_key", (secret_key, ARGUMENT), (settings.secret_key, ENVIRONMENT))
    token = pick("job_token", (job_token, ARGUMENT))
    if not token and not (key and secret) and not (access_key or secret_key):
        # Inside a job: the job's own token comes before a `kiln login` file that may lie in the same $HOME.
        token = pick("job_token", (settings.job_token, ENVIRONMENT))
    if token:
        key = secret = ""
    else:
        key = key or pick("access_key", (saved.get(VARIABLES["access_key"]), CONFIG))
        secret = secret or pick("secret_key", (saved.get(VARIABLES["secret_key"]), CONFIG))
    credentials = Credentials(url.rstrip("/"), key, secret, token, settings.config, sources)
    if not (credentials.endpoint and (token or (key and secret))):
        raise missing(credentials)
    return credentials


def missing(credentials: Credentials) -> Unauthenticated:
    """No usable credentials: say which are missing, and where the real files are (the admin key the server
    wrote to ``$KILN_HOME/admin.env``, the config file ``kiln login`` writes)."""
    config = credentials.config
    names = [VARIABLES["endpoint"]] if not credentials.endpoint else []
    if not credentials.job_token:
        names += [VARIABLES[n] for n in ("access_key", "secret_key") if not getattr(credentials, n)]
    if len(names) == 3:
        state = "does not exist" if not config.exists() else "holds none of them"
        what = (
            f"no Kiln credentials: KILN_ENDPOINT, KILN_ACCESS_KEY and KILN_SECRET_KEY are not set, and {config} {state}"
        )
    else:
        listed = " and ".join(names)
        verb = "is" if len(names) == 1 else "are"
        what = f"incomplete Kiln credentials: {listed} {verb} not set, in the environment or in {config}"
    admin_env = server_home() / "admin.env"
    return Unauthenticated(
        f"{what}. On the server's machine, load the admin key it wrote: `set -a; . {admin_env}; set +a`; "
        f"or run `kiln login` to save credentials to {config}",
        details={"missing": names},
    )
