"""The files of an attempt's directory that the local executor reads and writes itself: JSON records
(:func:`read_json`, :func:`write_json_atomic`) and, for a distributed job, the gang's layout in ``gang.json``
(:func:`gang_layout`: each member's port and directory, fixed once) and the members' directories
(:func:`member_dirs`)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from kiln.domain.distributed import DistributedSpec, Member


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (FileNotFoundError, ValueError):
        return None


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def write_private(path: Path, text: str) -> None:
    """``path`` holding ``text``, readable by this user only from its creation (a shim's config holds the job's
    token and environment): a file left by an earlier start is replaced, never reused with its mode."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def private_dir(path: Path, gid: int | None = None) -> None:
    """``path`` made (its parent must exist) for this user only: mode 0700, or with ``gid`` (the job's group,
    that reads the attempt's notice and parameters through it) 0750 and that group."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    if gid is not None:
        os.chown(path, -1, gid)
    os.chmod(path, 0o750 if gid is not None else 0o700)  # also one made before, and the umask's cut of mkdir


def free_port() -> int:
    """A port free now on the loopback interface; the member binds it moments later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gang_layout(attempt_dir: Path, spec: DistributedSpec, roles: list[tuple[str, int]]) -> dict[str, Any]:
    """The gang's ``gang.json``: each member's role, index, host, port, directory and whether it runs a shim."""
    gang_file = attempt_dir / "gang.json"
    layout = read_json(gang_file)
    if layout is None:  # first start: fix ports and directories once, so a restarted server starts the same
        members = [Member(role, index, "127.0.0.1", free_port()) for role, index in roles]
        layout = {
            "members": [
                {
                    "role": m.role,
                    "index": m.index,
                    "host": m.host,
                    "port": m.port,
                    "dir": f"members/{m.role}-{m.index}",
                    # mpirun in worker 0 starts every rank; the other slots only hold their resources.
                    "runs": spec.framework != "mpi" or position == 0,
                }
                for position, m in enumerate(members)
            ]
        }
        write_json_atomic(gang_file, layout)
    return layout


def member_dirs(handle: dict[str, Any]) -> list[tuple[str, int, Path]]:
    """(role, index, dir) of each member that runs a shim; the attempt dir itself for a single job."""
    attempt_dir = Path(handle["dir"])
    layout = read_json(attempt_dir / "gang.json")
    if layout is None:
        return [("worker", 0, attempt_dir)]
    return [(m["role"], int(m["index"]), attempt_dir / m["dir"]) for m in layout["members"] if m["runs"]]
