"""The router's HTTP/1.1 client for replicas on this machine: kept-alive connections to each replica's Unix socket
(in its job's work dir), one request at a time each, with nothing else on the path; and the serving task's health
probe over the same socket.

httpx costs the event loop about 1.7 ms of CPU per request (its pool checks every pooled socket and looks for
other async libraries each time); a replica answers in well under a millisecond, so that was the router's limit
(~80 predicts/s, too few for batching to matter). A replica (kiln.injob.serve) always answers with a
Content-Length, which is all this client reads.

A replica runs in its own network namespace: no port of its is reachable from here, its socket's file is. The path
``<jobs dir>/<job id>/work/<name>`` may be longer than a socket address holds (108 bytes), and its last component
is the job's to write: so the socket's file is opened first (``O_PATH``, a symbolic link not followed: a link the
job put there to another socket of this machine is refused, as is anything but a socket), and the connection is made
to ``/proc/self/fd/N``, which names that very file in a few bytes.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

MAX_IDLE = 64  # kept-alive connections per replica


class ReplicaUnreachable(OSError):
    """The replica did not answer: refused, reset, closed mid-answer, or timed out."""


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@contextmanager
def socket_address(path: str) -> Iterator[str]:
    """A short address that connects to the Unix socket at ``path`` (any length) while the block runs. OSError when
    there is no socket there (FileNotFoundError: none yet or any more; ConnectionRefusedError: a link or another
    kind of file)."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise ConnectionRefusedError(f"{path} is not a socket")
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def healthy(path: str, secret: str, timeout: float = 2.0) -> bool:
    """Whether the replica at the Unix socket ``path`` answers ``GET /healthz`` with 200."""
    try:
        with socket_address(path) as address:
            transport = httpx.HTTPTransport(uds=address)
            with httpx.Client(transport=transport, timeout=timeout, trust_env=False) as client:
                answer = client.get("http://replica/healthz", headers={"Authorization": f"Bearer {secret}"})
    except (OSError, httpx.HTTPError):
        return False
    return answer.status_code == 200


class ReplicaPool:
    def __init__(self) -> None:
        self._idle: dict[str, list[Connection]] = {}  # socket path → kept-alive connections

    async def post(
        self, path: str, target: str, headers: dict[str, str], body: bytes, timeout: float
    ) -> tuple[int, dict[str, str], bytes]:
        """POST ``target`` to the replica listening on the Unix socket at ``path``: (status, headers lower-cased,
        body). A kept-alive connection the replica closed meanwhile is replaced by a new one once, silently; any
        other failure is ReplicaUnreachable."""
        head = [f"POST {target} HTTP/1.1", "Host: replica", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        idle = self._idle.setdefault(path, [])
        try:
            async with asyncio.timeout(timeout):
                while idle:
                    conn = idle.pop()
                    try:
                        return await self._exchange(path, conn, request)
                    except (OSError, asyncio.IncompleteReadError) as exc:
                        conn[1].close()
                        if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                            raise  # it had begun to answer: the replica failed, not an idle connection
                with socket_address(path) as address:
                    conn = await asyncio.open_unix_connection(address)
                return await self._exchange(path, conn, request)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            raise ReplicaUnreachable(f"{type(exc).__name__}: {exc}") from exc

    async def _exchange(self, path: str, conn: Connection, request: bytes) -> tuple[int, dict[str, str], bytes]:
        reader, writer = conn
        writer.write(request)
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        data = await reader.readexactly(int(headers.get("content-length", "0")))
        idle = self._idle.setdefault(path, [])
        if headers.get("connection", "").lower() == "close" or len(idle) >= MAX_IDLE:
            writer.close()
        else:
            idle.append(conn)
        return status, headers, data
