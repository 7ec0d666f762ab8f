"""The state file an in-job server leaves for Kiln (a model replica's ``.kiln-replica.json``, a notebook's
``.kiln-notebook.json``): readable by the job's user only, appearing whole or not at all. Standard library only."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_state(path: Path, state: dict[str, Any]) -> Path:
    """``state`` as JSON at ``path``, mode 0600, written to a temporary name beside it and renamed over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path
