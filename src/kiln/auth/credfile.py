"""The credentials file format shared by the server's ``admin.env`` and the client's ``config``: shell-sourceable
``KEY=VALUE`` lines, readable by the owner only; and where those files live on this machine. Standard library
only, below both the server and the SDK (``kiln.sdk.config`` re-exports it for the client)."""

from __future__ import annotations

import os
from pathlib import Path


def client_dir() -> Path:
    """Where the CLI and SDK keep their state (``config`` from ``kiln login``, ``hashes.sqlite``, ``uploads/``):
    ``$KILN_CLIENT_DIR``, else ``$KILN_HOME`` (one directory for a server and its client on one machine), else
    ``~/.kiln``."""
    for var in ("KILN_CLIENT_DIR", "KILN_HOME"):
        value = os.environ.get(var, "").strip()
        if value:
            return Path(value).expanduser()
    return Path.home() / ".kiln"


def server_home() -> Path:
    """Where a server on this machine keeps its state, as ``kiln server`` resolves it (``$KILN_HOME``, else
    ``~/.kiln``): its first start writes the admin key to ``admin.env`` there."""
    value = os.environ.get("KILN_HOME", "").strip()
    return Path(value).expanduser() if value else Path.home() / ".kiln"


def read_config_file(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        out[key.strip().removeprefix("export ").strip()] = value.strip().strip("'\"")
    return out


def write_config_file(path: Path, endpoint: str, access_key: str, secret_key: str) -> None:
    """Write the three ``KILN_*`` lines with mode 0600, replacing any earlier file atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"KILN_ENDPOINT={endpoint}\nKILN_ACCESS_KEY={access_key}\nKILN_SECRET_KEY={secret_key}\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
