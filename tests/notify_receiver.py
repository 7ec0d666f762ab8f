"""Real receivers of Kiln's notifications on loopback: an HTTP server that records every webhook POST (answering
each path with the statuses a test scripts, then 200) and an SMTP server (aiosmtpd) that records every e-mail."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiosmtpd.controller import Controller


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.time() when it arrived
    status: int


@dataclass
class WebhookReceiver:
    """``url(path)`` → where to subscribe; ``script(path, 500, 500)``: that path's next answers."""

    server: ThreadingHTTPServer | None = None
    received: list[Received] = field(default_factory=list)
    scripts: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    on_receive: Callable[[Received], None] | None = None
    answers: dict[str, bytes] = field(default_factory=dict)  # a path's answer body (default: ok)

    def start(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver.lock:
                    script = receiver.scripts.get(self.path) or []
                    status = script.pop(0) if script else 200
                    item = Received(
                        self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.time(), status
                    )
                    receiver.received.append(item)
                if receiver.on_receive is not None:
                    receiver.on_receive(item)
                answer = receiver.answers.get(self.path, b"ok")
                self.send_response(status)
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.server_address[1])

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def script(self, path: str, *statuses: int) -> None:
        with self.lock:
            self.scripts[path] = list(statuses)

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path == path]

    def wait(self, path: str, count: int = 1, timeout: float = 60) -> list[Received]:
        deadline = time.monotonic() + timeout
        while len(got := self.at(path)) < count:
            assert time.monotonic() < deadline, f"{path}: {len(got)} of {count} webhooks arrived in {timeout}s"
            time.sleep(0.05)
        return got

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class _Mailbox:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = message_from_bytes(envelope.content)
        message["X-Rcpt"] = ", ".join(envelope.rcpt_tos)
        self.messages.append(message)
        return "250 OK"


class SmtpReceiver:
    """An SMTP server on 127.0.0.1 (aiosmtpd) keeping what it receives."""

    def __init__(self) -> None:
        self.box = _Mailbox()
        with socket.socket() as probe:  # aiosmtpd's controller wants a port of its own to check it started
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        self.controller = Controller(self.box, hostname="127.0.0.1", port=free)

    def start(self) -> SmtpReceiver:
        self.controller.start()
        return self

    @property
    def port(self) -> int:
        return int(self.controller.port)

    def wait(self, to: str, timeout: float = 60) -> Message:
        deadline = time.monotonic() + timeout
        while True:
            for message in list(self.box.messages):
                if to in str(message["To"]):
                    return message
            assert time.monotonic() < deadline, f"no e-mail to {to} in {timeout}s"
            time.sleep(0.05)

    def stop(self) -> None:
        self.controller.stop()
