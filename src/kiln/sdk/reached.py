"""Which endpoints have answered this machine before: a connection that cannot be made to one that never did is a
wrong address far more often than a restarting server, so the SDK gives it seconds, not the whole retry window.

An endpoint counts as reached once any HTTP answer came from it (even a refusal: something that speaks HTTP
listens there). It is remembered for this process, and in ``reached.json`` in the client's state directory
(``kiln.sdk.config.client_dir()``) for the next CLI call, refreshed at most once a day per endpoint. The file is a
hint only: unreadable or unwritable, it is ignored, and a call from inside a job never consults it (a job's
endpoint is the server that started it; it always gets the full window).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path

from kiln.sdk.config import client_dir

FILE = "reached.json"
REFRESH_SECONDS = 86400.0
KEEP = 50  # endpoints remembered (the most recently reached)

_lock = threading.Lock()
_this_process: set[str] = set()


def _path() -> Path:
    return client_dir() / FILE


def _read() -> dict[str, float]:
    try:
        data = json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}


def seen(endpoint: str) -> bool:
    """Whether ``endpoint`` answered, in this process or earlier from this machine."""
    with _lock:
        if endpoint in _this_process:
            return True
    return endpoint in _read()


def note(endpoint: str) -> None:
    """``endpoint`` answered: remember it (the file is written only when its record is missing or a day old)."""
    with _lock:
        if endpoint in _this_process:
            return
        _this_process.add(endpoint)
    known = _read()
    now = time.time()
    if now - known.get(endpoint, 0.0) < REFRESH_SECONDS:
        return
    known[endpoint] = now
    kept = dict(sorted(known.items(), key=lambda item: item[1])[-KEEP:])
    with contextlib.suppress(OSError):
        path = _path()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".reached-")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(kept, fh)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def forget_this_process() -> None:
    """For tests: as if this process had reached nothing."""
    with _lock:
        _this_process.clear()
