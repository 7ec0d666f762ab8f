"""A real server reads a request head as long as any operation allows (limits.MAX_REQUEST_HEAD_BYTES, given to
uvicorn by kiln.api.serve), so an over-long parameter is the route's 422 naming it, not h11's bare 400
"Invalid HTTP request received." (tests/unit/test_request_head.py sizes the schema against the limit).

h11 checks its limit only while a head is incomplete: a long head that arrives in one read passes, one that arrives
in pieces (a loaded machine, a real network) did not; so the request is sent here in 1 KiB pieces, as the flake that
found it (schemathesis, in CI) had it arrive."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

from kiln.domain import limits
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api

EMOJI = "\U0001f600"  # four UTF-8 bytes, twelve characters percent-encoded


def _send_in_pieces(url: str, request: bytes) -> bytes:
    where = urlsplit(url)
    with socket.create_connection((where.hostname, where.port), timeout=30) as sock:
        for at in range(0, len(request), 1024):
            sock.sendall(request[at : at + 1024])
            time.sleep(0.001)
        answer = b""
        while chunk := sock.recv(65536):  # Connection: close: the whole answer, to its end
            answer += chunk
        return answer


def test_an_over_long_encoded_parameter_is_the_routes_422(shared_server: KilnServer) -> None:
    jobs = EMOJI * (limits.MAX_COMPARE_JOBS * (limits.MAX_ID_LENGTH + 1) + 1)  # ~39 KB on the wire, over h11's 16
    api = Api.admin(shared_server)
    try:
        built = api.build("GET", "/metrics/compare", params={"jobs": jobs})
    finally:
        api.close()
    head = f"GET {built.url.raw_path.decode()} HTTP/1.1\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in built.headers.items()) + "Connection: close\r\n\r\n"
    assert len(head) > 16 * limits.KiB
    answer = _send_in_pieces(shared_server.url, head.encode())
    status = answer.split(b"\r\n", 1)[0]
    assert status.endswith(b"422 Unprocessable Entity"), answer[:500]
    assert b'"query.jobs"' in answer, answer[:1000]
