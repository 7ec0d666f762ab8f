"""What can stop a server from starting, each said in one line: the listening socket, and the errors building the
platform may meet (settings, ``$KILN_HOME``, the database, another server, Kubernetes).

``kiln server`` prints these as ``error: ...`` and exits non-zero; tracebacks only with ``--debug``.
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kiln.errors import DatabaseUnavailable, KilnError
from kiln.settings import Settings

EXIT_ERROR = 1
EXIT_USAGE = 2  # invalid settings, as for any invalid usage of the CLI
EXIT_INTERRUPTED = 130

CHANGE_PORT = "set KILN_PORT (or pass --port) to use another port"
CHANGE_HOST = "set KILN_HOST (or pass --host) to an address of this machine, e.g. 127.0.0.1 or 0.0.0.0"
# The options of `kiln server` that override a setting, named beside its variable.
OPTIONS = {"host": "--host", "port": "--port", "home": "--home"}
DEBUG_HINT = " (kiln server --debug prints the traceback)"


class StartupError(Exception):
    """Why the server did not start, in one line, and the exit code that says so."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, before anything else is created: a port in use is found before the
    server writes a database or an admin key into a new ``$KILN_HOME``, and holding it leaves no window in which
    another program takes it. uvicorn listens on it once the platform has started."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if not 1 <= port <= 65535:
        raise StartupError(f"KILN_PORT={port} is not a port number (1-65535); {CHANGE_PORT}", EXIT_USAGE)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn does
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on the connections it accepts only when the listening socket
    # says it is TCP; without it every response waited ~40 ms on the client's delayed ACK (181 req/s at c=8).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
        sock.bind((host, port))
    except socket.gaierror as exc:
        sock.close()
        raise StartupError(
            f"cannot listen on {where}: KILN_HOST={host!r} is not an address ({exc.strerror}); {CHANGE_HOST}"
        ) from None
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {where}: {_bind_problem(exc)}") from None
    sock.set_inheritable(True)
    return sock


def _bind_problem(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"the address is already in use (is another Kiln server running?); {CHANGE_PORT}"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"that address is not one of this machine's; {CHANGE_HOST}"
    if exc.errno == errno.EACCES:
        return f"permission denied (ports below 1024 need root); {CHANGE_PORT}"
    return f"{exc.strerror or exc}; {CHANGE_PORT}, or KILN_HOST (--host)"


def settings_problems(exc: ValidationError) -> str:
    """``KILN_PORT (--port): Input should be a valid integer; ...``: each invalid setting by the variable that
    sets it (values are not repeated: some are secrets)."""
    prefix = _env_prefix(exc.title)
    problems = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"])
        name = f"{prefix}{field.upper()}" if field else exc.title
        if prefix == "KILN_" and field in OPTIONS:
            name += f" ({OPTIONS[field]})"
        problems.append(f"{name}: {error['msg']}")
    return "; ".join(problems)


def _env_prefix(model: str) -> str:
    if model == "KubernetesSettings":
        return "KILN_KUBERNETES_"
    if model == "SlurmSettings":
        return "KILN_SLURM_"
    return "KILN_"


def explain(exc: BaseException, settings: Settings) -> StartupError:
    """One line for an error met while the platform was built and started (``$KILN_HOME``, the database, the
    lock, the backend), naming the setting that leads elsewhere."""
    if isinstance(exc, StartupError):
        return exc
    if isinstance(exc, ValidationError):
        return StartupError(f"invalid settings: {settings_problems(exc)}", EXIT_USAGE)
    if isinstance(exc, DatabaseUnavailable) and exc.__cause__ is not None:  # the driver's error says why
        return StartupError(_cannot_use_database(settings, _first_line(exc.__cause__)))
    if isinstance(exc, KilnError):
        return StartupError(exc.message or exc.code)
    database = _database_problem(exc, settings)
    if database is not None:
        return StartupError(database)
    if isinstance(exc, ImportError) and settings.database_url and not _supported_database(settings.database_url):
        return StartupError(
            f"KILN_DATABASE_URL names a database Kiln does not support ({_first_line(exc)}); use sqlite:///PATH or "
            "postgresql+psycopg://USER@HOST:5432/DATABASE"
        )
    if isinstance(exc, OSError):
        return StartupError(_os_problem(exc, settings))
    if type(exc).__module__.split(".")[0] == "kubernetes":
        return StartupError(f"cannot use Kubernetes (KILN_BACKEND=kubernetes): {_first_line(exc)}")
    return StartupError(f"the server could not start: {type(exc).__name__}: {_first_line(exc)}{DEBUG_HINT}")


def _database_problem(exc: BaseException, settings: Settings) -> str | None:
    from sqlalchemy import exc as sa

    if not isinstance(exc, sa.SQLAlchemyError):
        return None
    named = "KILN_DATABASE_URL" if settings.database_url else f"the default database in KILN_HOME={settings.home}"
    if isinstance(exc, sa.ArgumentError):  # not a URL at all, or an unknown dialect or driver
        return (
            f"{named} is not a database URL ({_first_line(exc)}); use sqlite:///PATH or "
            "postgresql+psycopg://USER@HOST:5432/DATABASE"
        )
    reason = _first_line(exc.orig) if isinstance(exc, sa.DBAPIError) and exc.orig is not None else _first_line(exc)
    return _cannot_use_database(settings, reason)


def _cannot_use_database(settings: Settings, reason: str) -> str:
    named = "KILN_DATABASE_URL" if settings.database_url else f"the default database in KILN_HOME={settings.home}"
    return f"cannot use the database {_safe_url(settings.resolved_database_url)} ({named}): {reason}"


def _supported_database(url: str) -> bool:
    return url.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql")


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "(unparsable URL)"


def _os_problem(exc: OSError, settings: Settings) -> str:
    reason = exc.strerror or str(exc)
    if not exc.filename:
        return f"the server could not start: {reason}{DEBUG_HINT}"
    path = Path(str(exc.filename))
    for name, value in settings:  # a file a setting names (KILN_RUNTIME_CATALOG, KILN_RUNTIMES_DIR, ...)
        if name != "home" and isinstance(value, Path) and value == path:
            return f"cannot use KILN_{name.upper()}={value}: {reason}"
    home = settings.home
    if path.is_relative_to(home) or home.is_relative_to(path):  # the home, something in it, or a parent
        return (
            f"cannot use KILN_HOME={home}: {reason}: {path}; set KILN_HOME (or pass --home) to a directory this user "
            "can create and write"
        )
    return f"the server could not start: {reason}: {path}{DEBUG_HINT}"


def _first_line(exc: Any) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
