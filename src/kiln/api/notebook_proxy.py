"""The notebook proxy: ``/notebooks/{id}/…`` (HTTP and WebSocket) forwarded to the notebook's JupyterLab.

Where JupyterLab answers is its backend's to say (:class:`~kiln.backends.capabilities.NotebookHost`): on the
local executor a Unix socket in its job's work dir (kiln.injob.notebook), inside the job's network namespace:
nothing else reaches it, and no port is open anywhere; on Kubernetes the notebook's ClusterIP Service, whose
NetworkPolicy admits only Kiln's server. Every request here is authenticated first —
a signed request (as any API request) or the console's session cookie — and must be from the notebook's own user
(another user of the organisation: 403; of another organisation: 404, as for anything of theirs). A request
authenticated by the cookie that changes something, and every WebSocket opened with it, must come from a page of
this server: its ``Origin`` (or ``Referer``) names this host (the cookie is ``SameSite=Strict`` too), so no other
site can make a signed-in browser act in a notebook.

Nothing of a request's body is read before its headers are authenticated: a body of an unauthenticated
request is never read at all (the answer closes the connection), and a ``Content-Length`` over the cap is a 413
before anything else. A signed request's body (at most ``limits.MAX_SIGNED_BODY_BYTES``, as on ``/api/v1``) is
read and hashed once its signature has been checked on the headers, and forwarded only once its hash matches the
signed one. A cookie-authenticated request's body (a notebook saved from the console, up to ``MAX_BODY``) is
streamed to JupyterLab as it comes, never held whole: its caller is known, and holding it would cost the server
as much memory as the notebook's size. A refused authentication (a bad signature, a forged or expired cookie) is
logged and audited as on ``/api/v1`` (kiln.api.auth.record_unauthenticated).

Forwarded, a request carries JupyterLab's token (Kiln's, never the caller's credentials: the ``Authorization``
header and Kiln's session cookie are removed). What passes counts as activity for the idle check: any request
that changes something, and every message a client sends on a WebSocket (a cell run, a keystroke in a terminal),
never the polling an open tab does (GETs).
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send
from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import ConnectionClosed

from kiln.api import session
from kiln.api.auth import record_unauthenticated
from kiln.api.errors import error_response
from kiln.api.proxybody import Upload, content_length, has_body, read_signed
from kiln.auth import signing
from kiln.backends.capabilities import NotebookAddress, NotebookHost
from kiln.domain import limits
from kiln.errors import (
    Conflict,
    CsrfRefused,
    KilnError,
    NotebookUnavailable,
    PayloadTooLarge,
    Unauthenticated,
)
from kiln.usecases.access.identity import AuthFailure, Principal

log = logging.getLogger("kiln.notebooks")

PREFIX = "/notebooks/"
MAX_BODY = 256 * 1024 * 1024  # a cookie-authenticated request's body (a notebook saved through the contents API)
MAX_SIGNED_BODY = limits.MAX_SIGNED_BODY_BYTES  # a signed request's body: read whole to check its hash, as the API
TARGET_TTL = 2.0  # seconds a (caller, notebook) → address lookup is used
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
}
WS_DROPPED = HOP_BY_HOP | {
    "host",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-extensions",
    "sec-websocket-protocol",
    "authorization",
    "cookie",
}
CROSS_SITE = (
    "this request changes something in a notebook and is authenticated by the console's session cookie: it must "
    "come from a page of this server (its Origin header names another site, or it has none)"
)


@dataclass
class Target:
    notebook_id: str
    address: NotebookAddress
    at: float
    every_request: bool = False  # a TensorBoard: any request is someone looking (it has no kernel to be busy)

    @property
    def key(self) -> str:
        """What one kept-alive client serves: the socket's path, or the URL."""
        return self.address.socket or self.address.url


class NotebookProxy:
    """The ASGI application mounted at ``/notebooks``."""

    def __init__(self) -> None:
        self._targets: dict[tuple[str, str], Target] = {}
        # socket path or URL → (the socket's O_PATH fd or None, client)
        self._clients: dict[str, tuple[int | None, httpx.AsyncClient]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return
        path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")  # the whole path, as sent
        notebook_id = path[len(PREFIX) :].split("/", 1)[0] if path.startswith(PREFIX) else ""
        websocket = scope["type"] == "websocket"
        if not notebook_id and not websocket:  # /notebooks itself: the console's page that lists them
            await scope["app"].router.default(scope, receive, send)
            return
        headers = _headers(scope)
        body: bytes | Upload = b""
        try:
            if not notebook_id or len(notebook_id) > 40:
                raise Conflict("name a notebook: /notebooks/{id}/lab")
            principal, cookie, body = await self._authenticate(scope, receive, headers)
            if cookie and (websocket or scope["method"] not in SAFE_METHODS) and not _same_origin(scope):
                raise CsrfRefused(CROSS_SITE)
            target = await self._target(scope, principal, notebook_id)
        except (KilnError, AuthFailure) as exc:
            await self._refuse(scope, receive, send, exc, close=has_body(headers))
            return
        platform = scope["app"].state.platform
        if websocket:
            await self._websocket(scope, receive, send, target, platform)
        else:
            if scope["method"] not in SAFE_METHODS or target.every_request:
                platform.notebooks.touch(target.notebook_id)
            if await self._http(scope, send, body, target):
                return
            # Not reached: the lookup may be stale (stopped since), or the kept-alive client's socket gone. Look
            # again (a stopped notebook is then a 409 saying so) and try once more, unless a streamed body has
            # begun to go (what went is gone: the caller tries again).
            self._forget(target)
            if isinstance(body, Upload) and body.started:
                message = f"notebook {notebook_id} stopped answering while the request's body was sent to it"
                await error_response(NotebookUnavailable(message))(scope, _no_body, send)
                return
            try:
                target = await self._target(scope, principal, notebook_id)
            except KilnError as exc:
                await self._refuse(scope, receive, send, exc)
                return
            if not await self._http(scope, send, body, target):
                self._forget(target)
                message = f"notebook {notebook_id} did not answer; it may be stopping or starting again"
                await error_response(NotebookUnavailable(message))(scope, _no_body, send)

    # ---- who asks, and where it goes

    async def _authenticate(
        self, scope: Scope, receive: Receive, headers: dict[str, str]
    ) -> tuple[Principal, bool, bytes | Upload]:
        """(caller, whether by the cookie, the body to forward), from the headers alone: nothing of the body is
        read before the caller is known. A Content-Length over the cap is refused before anything else."""
        app = scope["app"]
        signed = headers.get("authorization", "").startswith(signing.ALGORITHM)
        with_body = scope["type"] == "http" and has_body(headers)
        length = content_length(headers)
        cap = MAX_SIGNED_BODY if signed else MAX_BODY
        if length is not None and length > cap:
            raise PayloadTooLarge(f"a {'signed ' if signed else ''}request to a notebook carries at most {cap} bytes")
        if signed:
            identity = app.state.platform.identity
            request = {
                "method": "GET" if scope["type"] == "websocket" else scope["method"],
                "path": (scope.get("raw_path") or scope["path"].encode()).decode("latin-1"),
                "query": scope.get("query_string", b"").decode("latin-1"),
                "headers": headers,
                # A body's hash is checked below, as it is read; no body is the empty one's.
                "body_sha256": None if with_body else signing.body_sha256(b""),
                "allow_unsigned_payload": False,
            }
            principal = identity.authenticate_nonblocking(**request)
            if principal is None:
                principal = await run_in_threadpool(identity.authenticate, **request)
            if not with_body:
                return principal, False, b""
            signed_hash = headers[signing.HEADER_CONTENT.lower()]
            return principal, False, await read_signed(receive, signed_hash, principal, MAX_SIGNED_BODY)
        token = session.session_cookie(headers)
        if token is None:
            raise Unauthenticated("a notebook opens for a signed-in user: sign in to the console (or sign the request)")
        principal, _ = await session.authenticate(app, token)
        return principal, True, Upload(receive, MAX_BODY, length) if with_body else b""

    async def _target(self, scope: Scope, principal: Principal, notebook_id: str) -> Target:
        key = (principal.key_id, notebook_id)
        known = self._targets.get(key)
        if known is not None and time.monotonic() - known.at < TARGET_TTL:
            return known
        platform = scope["app"].state.platform
        _, job, kind = await run_in_threadpool(platform.notebooks.target, principal, notebook_id)
        backend = platform.backend
        if not isinstance(backend, NotebookHost):
            raise Conflict(f"this server's backend ({backend.name}) does not run notebooks")
        address = await run_in_threadpool(backend.notebook_address, job.id, job.handle)
        if address is None:
            raise Conflict(f"notebook {notebook_id} is starting: it is not answering yet")
        target = Target(notebook_id, address, time.monotonic(), kind == "tensorboard")
        if len(self._targets) > 10_000:
            self._targets.clear()
        self._targets[key] = target
        return target

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, exc: KilnError | AuthFailure, close: bool = False
    ) -> None:
        """The refusal's answer; ``close``: the request's body is (maybe) unread, so the connection is closed after
        the answer rather than the rest of the body read and thrown away."""
        if isinstance(exc, AuthFailure):
            status, body = 401, exc.to_body()
            method = "GET" if scope["type"] == "websocket" else scope["method"]
            client = (scope.get("client") or ("-", 0))[0]
            await record_unauthenticated(scope["app"].state.platform, method, scope["path"], client, exc)
        else:
            status, body = exc.status, exc.to_body()
            log.info("%s %s %s: %s", status, scope.get("method", "WS"), scope["path"], body.get("message", ""))
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 4000 + status, "reason": str(body.get("code", ""))})
            return
        response = error_response(exc) if isinstance(exc, KilnError) else JSONResponse(body, status_code=status)
        if close:
            response.headers["connection"] = "close"
        await response(scope, _no_body, send)

    # ---- HTTP

    def _client(self, target: Target) -> httpx.AsyncClient:
        known = self._clients.get(target.key)
        if known is not None:
            return known[1]
        timeout = httpx.Timeout(300.0, connect=5.0)
        fd = None
        if target.address.socket:
            fd = _open_socket(target.address.socket)
            transport = httpx.AsyncHTTPTransport(uds=f"/proc/self/fd/{fd}")
        else:
            transport = httpx.AsyncHTTPTransport()
        client = httpx.AsyncClient(transport=transport, timeout=timeout, trust_env=False)
        self._clients[target.key] = (fd, client)
        return client

    def _forget(self, target: Target) -> None:
        """Drop what was known of where ``target`` listens: its lookups and its client (closed soon)."""
        self._targets = {k: v for k, v in self._targets.items() if v.key != target.key}
        known = self._clients.pop(target.key, None)
        if known is not None:
            fd = known[0]
            task = asyncio.ensure_future(known[1].aclose())
            if fd is not None:
                task.add_done_callback(lambda _: os.close(fd))

    async def _http(self, scope: Scope, send: Send, body: bytes | Upload, target: Target) -> bool:
        """Forward the request and its answer; False when JupyterLab could not be reached (nothing was sent)."""
        headers = _forwarded_headers(scope, target.address.token, drop=HOP_BY_HOP | {"authorization"})
        if isinstance(body, Upload) and body.length is not None:
            headers.append(("content-length", str(body.length)))  # streamed as it comes: chunked without it
        url = target.address.url + (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        query = _without_token(scope.get("query_string", b"").decode("latin-1"))
        if query:
            url += "?" + query
        try:
            client = self._client(target)
            request = client.build_request(scope["method"], url, headers=headers, content=body)
            upstream = await client.send(request, stream=True)
        except (OSError, httpx.HTTPError):
            return False
        except PayloadTooLarge as exc:  # a streamed body passed the cap on its way
            await self._refuse(scope, _no_body, send, exc, close=True)
            return True
        try:
            out = [
                (k.encode("latin-1"), v.encode("latin-1"))
                for k, v in upstream.headers.multi_items()
                if k.lower() not in HOP_BY_HOP
            ]
            if "content-length" in upstream.headers:
                out.append((b"content-length", upstream.headers["content-length"].encode("latin-1")))
            await send({"type": "http.response.start", "status": upstream.status_code, "headers": out})
            async for chunk in upstream.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await upstream.aclose()
        return True

    # ---- WebSocket

    async def _websocket(self, scope: Scope, receive: Receive, send: Send, target: Target, platform: Any) -> None:
        first = await receive()
        if first["type"] != "websocket.connect":
            return
        path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        query = _without_token(scope.get("query_string", b"").decode("latin-1"))
        if query:
            path += "?" + query
        headers = _forwarded_headers(scope, target.address.token, drop=WS_DROPPED)
        protocols = [p for p in scope.get("subprotocols", []) if p]
        options: dict[str, Any] = {
            "additional_headers": headers,
            "subprotocols": protocols or None,
            "max_size": None,
            "open_timeout": 10,
            "compression": None,
        }
        socket = target.address.socket
        fd = None
        try:
            if socket:
                fd = _open_socket(socket)
                upstream = await unix_connect(f"/proc/self/fd/{fd}", uri=f"ws://notebook{path}", **options)
            else:
                url = "ws" + target.address.url.removeprefix("http") + path
                upstream = await connect(url, proxy=None, **options)  # never through $HTTPS_PROXY
        except Exception as exc:  # refused by JupyterLab (a kernel gone: 404), or not answering
            log.info("notebook %s: WebSocket %s refused upstream: %s", target.notebook_id, path, exc)
            await send({"type": "websocket.close", "code": 1011, "reason": "refused by the notebook"})
            return
        finally:
            if fd is not None:  # the descriptor named the socket's file only for connect()
                os.close(fd)
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
        try:
            await _pump(receive, send, upstream, lambda: platform.notebooks.touch(target.notebook_id))
        finally:
            await upstream.close()


async def _no_body() -> Message:
    return {"type": "http.disconnect"}


async def _pump(receive: Receive, send: Send, upstream: ClientConnection, touch: Any) -> None:
    """Both directions until either side closes."""

    async def client_to_notebook() -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            touch()
            if message.get("bytes") is not None:
                await upstream.send(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send(message["text"])

    async def notebook_to_client() -> None:
        try:
            async for data in upstream:
                if isinstance(data, bytes):
                    await send({"type": "websocket.send", "bytes": data})
                else:
                    await send({"type": "websocket.send", "text": data})
        except ConnectionClosed:
            pass
        try:
            await send({"type": "websocket.close", "code": upstream.close_code or 1000})
        except Exception:  # the client went first
            pass

    tasks = [asyncio.ensure_future(client_to_notebook()), asyncio.ensure_future(notebook_to_client())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _open_socket(path: str) -> int:
    """An ``O_PATH`` descriptor of the socket file at ``path``, never through a symbolic link (the work dir is
    the job's to write): connecting to ``/proc/self/fd/N`` reaches that very file, whatever its path's length."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not stat.S_ISSOCK(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConnectionRefusedError(f"{path} is not a socket")
    return fd


def _forwarded_headers(scope: Scope, token: str, drop: set[str]) -> list[tuple[str, str]]:
    """The caller's headers, less hop-by-hop ones and Kiln's credentials, with JupyterLab's token."""
    out: list[tuple[str, str]] = []
    for raw_key, raw_value in scope["headers"]:
        key, value = raw_key.decode("latin-1").lower(), raw_value.decode("latin-1")
        if key in drop or key.startswith("x-kiln-"):
            continue
        if key == "cookie":
            value = _without_kiln_cookie(value)
            if not value:
                continue
        out.append((key, value))
    out.append(("authorization", f"token {token}"))
    return out


def _without_token(query: str) -> str:
    """The query less any ``token`` parameter: JupyterLab takes one over the token Kiln sends (a wrong one
    would be refused), and the caller's is never needed."""
    if "token" not in query:
        return query
    return "&".join(p for p in query.split("&") if p and p.split("=", 1)[0] != "token")


def _without_kiln_cookie(header: str) -> str:
    parts = [p.strip() for p in header.split(";")]
    return "; ".join(p for p in parts if p and p.split("=", 1)[0].strip() != session.COOKIE)


def _same_origin(scope: Scope) -> bool:
    """Whether the request's Origin (or, without one, its Referer) is this server as the request addressed it."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    host = headers.get("host", "")
    origin = headers.get("origin") or headers.get("referer")
    if not origin or not host or origin == "null":
        return False
    return urlsplit(origin).netloc.lower() == host.lower()


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
