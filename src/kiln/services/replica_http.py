"""The router's HTTP/1.1 client for replicas on this machine: kept-alive loopback connections, one request at a
time each, with nothing else on the path.

httpx costs the event loop about 1.7 ms of CPU per request (its pool checks every pooled socket and looks for
other async libraries each time); a replica answers in well under a millisecond, so that was the router's limit
(~80 predicts/s, too few for batching to matter). A replica (kiln.runtime.serve) always answers with a
Content-Length, which is all this client reads.
"""

from __future__ import annotations

import asyncio

MAX_IDLE = 64  # kept-alive connections per replica


class ReplicaUnreachable(OSError):
    """The replica did not answer: refused, reset, closed mid-answer, or timed out."""


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class LoopbackPool:
    def __init__(self) -> None:
        self._idle: dict[int, list[Connection]] = {}

    async def post(
        self, port: int, path: str, headers: dict[str, str], body: bytes, timeout: float
    ) -> tuple[int, dict[str, str], bytes]:
        """(status, headers lower-cased, body). A kept-alive connection the replica closed meanwhile is
        replaced by a new one once, silently; any other failure is ReplicaUnreachable."""
        head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        idle = self._idle.setdefault(port, [])
        try:
            async with asyncio.timeout(timeout):
                while idle:
                    conn = idle.pop()
                    try:
                        return await self._exchange(port, conn, request)
                    except (OSError, asyncio.IncompleteReadError) as exc:
                        conn[1].close()
                        if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                            raise  # it had begun to answer: the replica failed, not an idle connection
                conn = await asyncio.open_connection("127.0.0.1", port)
                return await self._exchange(port, conn, request)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            raise ReplicaUnreachable(f"{type(exc).__name__}: {exc}") from exc

    async def _exchange(self, port: int, conn: Connection, request: bytes) -> tuple[int, dict[str, str], bytes]:
        reader, writer = conn
        writer.write(request)
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        data = await reader.readexactly(int(headers.get("content-length", "0")))
        idle = self._idle.setdefault(port, [])
        if headers.get("connection", "").lower() == "close" or len(idle) >= MAX_IDLE:
            writer.close()
        else:
            idle.append(conn)
        return status, headers, data
