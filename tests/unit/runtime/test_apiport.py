"""The forwarder of a ``network: none`` job's API port (``injob/apiport.py``), on the machine's loopback here (in a
job it listens inside the job's namespace; tests/integration/local/test_job_network.py tries it there): bytes copied
as they are both ways, half-closes passed on, one connection to the API per connection of the job and no more
than the bound at once (the rest wait in the kernel's backlog, then go through), a job's connection reset when
the API cannot be reached, and at close the idle connections closed at once while a request in flight finishes."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from kiln.injob import apiport


class Upstream:
    """The API's stand-in: answers each connection with what it read, reversed, once the client half-closes
    (after ``delay`` seconds); counts the connections it got and holds open."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.open = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                self.open += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        data = b""
        try:
            while chunk := conn.recv(65536):
                data += chunk
            time.sleep(self.delay)
            conn.sendall(data[::-1])
        except OSError:
            pass
        finally:
            conn.close()
            with self._lock:
                self.open -= 1


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    yield up
    up.sock.close()


def _port(upstream: Upstream, connections: int | None = None) -> apiport.ApiPort:
    listener = socket.socket()
    apiport.listen(listener, 0)
    return apiport.ApiPort(listener, ("127.0.0.1", upstream.port), connections)


def _ask(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        threading.Thread(target=lambda: (s.sendall(payload), s.shutdown(socket.SHUT_WR)), daemon=True).start()
        got = b""
        while chunk := s.recv(1 << 20):
            got += chunk
        return got


def test_bytes_go_through_both_ways_as_they_are(upstream: Upstream) -> None:
    fw = _port(upstream)
    port = fw.listener.getsockname()[1]
    try:
        payload = os.urandom(3_000_000)  # larger than the buffers, both ways at once
        assert _ask(port, payload) == payload[::-1]
        assert _ask(port, b"") == b""  # a half-close with nothing sent is passed on too
        assert (fw.accepted, upstream.accepted) == (2, 2)  # one connection to the API per connection
    finally:
        fw.close()


def test_no_more_than_the_bound_reach_the_api_at_once_and_the_rest_wait(upstream: Upstream) -> None:
    fw = _port(upstream, connections=4)
    port = fw.listener.getsockname()[1]
    try:
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(20)]  # in the backlog
        time.sleep(0.3)
        assert upstream.open == 4 and fw.most == 4
        for s in held:  # each one that ends lets one more through; all are served in the end
            s.sendall(b"abc")
            s.shutdown(socket.SHUT_WR)
        answers = [s.recv(10) for s in held]
        assert answers == [b"cba"] * 20
        assert fw.most == 4 and upstream.accepted == 20
        for s in held:
            s.close()
    finally:
        fw.close()


def test_a_job_connection_is_reset_when_the_api_is_not_there() -> None:
    gone = socket.socket()
    gone.bind(("127.0.0.1", 0))
    dead_port = gone.getsockname()[1]
    gone.close()  # nothing listens there
    listener = socket.socket()
    apiport.listen(listener, 0)
    fw = apiport.ApiPort(listener, ("127.0.0.1", dead_port))
    try:
        port = listener.getsockname()[1]
        with pytest.raises(ConnectionResetError), socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.recv(10)  # reset (here, or as it connects), not left hanging: the job's SDK tries again
        deadline = time.monotonic() + 5
        while fw.refused < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        fw.close()


def test_close_ends_idle_connections_at_once_and_lets_a_request_in_flight_finish() -> None:
    slow = Upstream(delay=1.0)  # answers 1 s after the request ends
    fw = apiport.ApiPort(_listening(), ("127.0.0.1", slow.port))
    port = fw.listener.getsockname()[1]
    try:
        idle = socket.create_connection(("127.0.0.1", port), timeout=10)
        busy = socket.create_connection(("127.0.0.1", port), timeout=10)
        busy.sendall(b"request")
        busy.shutdown(socket.SHUT_WR)
        time.sleep(apiport.QUIET_SECONDS + 0.1)  # the idle one has been quiet a while
        closing = threading.Thread(target=fw.close)
        closing.start()
        assert idle.recv(10) == b""  # closed at once ...
        assert closing.is_alive()  # ... while the close waits for the request in flight
        assert busy.recv(100) == b"tseuqer"  # which is answered
        closing.join(apiport.LINGER_SECONDS + 5)
        assert not closing.is_alive()
        with pytest.raises(OSError):  # and nothing listens any more
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        fw.close()
        slow.sock.close()


def _listening() -> socket.socket:
    listener = socket.socket()
    apiport.listen(listener, 0)
    return listener
