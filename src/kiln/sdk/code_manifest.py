"""What the last run from a directory packed: the SHA-256 of each file, kept per directory under
``kiln.sdk.config.client_dir()/runs/``, so that ``kiln run`` can name the files that are new or changed since."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.sdk.config import client_dir


@dataclass(frozen=True)
class Changes:
    """How a bundle differs from the last one packed from the same directory (``first``: there was none)."""

    first: bool
    new: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def manifest_path(directory: Path, base: Path | None = None) -> Path:
    key = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:32]
    return (base or client_dir()) / "runs" / f"{key}.json"


def _load(path: Path) -> dict[str, str] | None:
    try:
        data: Any = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict):
        return None
    return {k: v for k, v in files.items() if isinstance(k, str) and isinstance(v, str)}


def compare(directory: Path, digests: dict[str, str], base: Path | None = None) -> Changes:
    """``digests`` (path → SHA-256) against what the last run from ``directory`` packed."""
    before = _load(manifest_path(directory, base))
    if before is None:
        return Changes(first=True)
    return Changes(
        first=False,
        new=sorted(p for p in digests if p not in before),
        changed=sorted(p for p, d in digests.items() if p in before and before[p] != d),
        removed=sorted(p for p in before if p not in digests),
    )


def remember(directory: Path, digests: dict[str, str], base: Path | None = None) -> None:
    """Keep ``digests`` as what the last run from ``directory`` packed. Best effort: a client directory that
    cannot be written loses the comparison, not the run."""
    path = manifest_path(directory, base)
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp.write_text(json.dumps({"directory": str(directory.resolve()), "files": digests}))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
