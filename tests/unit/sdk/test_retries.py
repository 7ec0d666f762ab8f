"""When the SDK sends a request again by itself (kiln.sdk.retries), against a scripted httpx transport (no server:
tests/integration/api/test_idempotency.py does it across a real server's restart and a lost reply): a create's retries
carry its one Idempotency-Key and are signed anew each time; reads are retried; other writes, streamed bodies and
answers other than 502/503/504 are not; the retries end after ``retry_seconds`` with the usual error."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from kiln.auth import signing
from kiln.domain.idempotency import HEADER
from kiln.errors import InvalidInput, KilnError, Unavailable
from kiln.sdk.client import Client
from kiln.sdk.retries import RetryClock, RetryPolicy

NOW = "2026-12-03T09:00:00Z"
JOB = {
    "id": "job-1",
    "name": "j",
    "org_id": "org-1",
    "user_id": "usr-1",
    "state": "QUEUED",
    "spec": {"command": "true"},
    "attempt": 0,
    "restarts": 0,
    "created_at": NOW,
    "updated_at": NOW,
}
FAST = RetryPolicy(total=5.0, first=0.01, longest=0.02)
Step = Callable[[httpx.Request], httpx.Response]


def refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def reset(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadError("connection reset by peer", request=request)


def status(code: int, body: Any = None, headers: dict[str, str] | None = None) -> Step:
    return lambda request: httpx.Response(code, json=body if body is not None else {}, headers=headers)


class Script:
    """Answers the n-th request with the n-th step (the last one again after that) and keeps every request."""

    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.requests: list[httpx.Request] = []
        self.times: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        self.times.append(time.monotonic())
        return self.steps[min(len(self.requests), len(self.steps)) - 1](request)


@pytest.fixture
def connect() -> Iterator[Callable[..., tuple[Client, Script]]]:
    clients: list[Client] = []

    def make(*steps: Step, policy: RetryPolicy = FAST) -> tuple[Client, Script]:
        script = Script(*steps)
        client = Client("http://kiln.test", "AKTESTTESTTESTTEST00", "s3cret")
        client._http = httpx.Client(base_url=client.endpoint, transport=httpx.MockTransport(script))
        client.retries = policy
        clients.append(client)
        return client, script

    yield make
    for client in clients:
        client.close()


def test_a_submit_is_retried_after_lost_connections_with_one_key_and_a_new_signature_each_time(connect) -> None:
    client, script = connect(refuse, reset, status(503), status(201, JOB))
    job = client.submit({"command": "true"})
    assert job.id == "job-1" and len(script.requests) == 4
    keys = {r.headers[HEADER] for r in script.requests}
    assert len(keys) == 1  # one logical create, one key
    nonces = [r.headers[signing.HEADER_NONCE] for r in script.requests]
    assert len(set(nonces)) == 4  # the server refuses a nonce twice: every try is signed anew
    assert len({r.content for r in script.requests}) == 1  # the same body each time


def test_each_call_gets_its_own_key_unless_the_caller_gives_one(connect) -> None:
    client, script = connect(status(201, JOB))
    client.submit({"command": "true"})
    client.submit({"command": "true"})
    client.submit({"command": "true"}, idempotency_key="nightly-2026-12-03")
    first, second, given = (r.headers[HEADER] for r in script.requests)
    assert first != second and given == "nightly-2026-12-03"


def test_every_create_of_the_sdk_sends_a_key(connect) -> None:
    client, script = connect(status(201, JOB))
    client.rerun("job-1")
    assert script.requests[-1].headers.get(HEADER)
    for call in (
        lambda: client.submit_study({"trial": {"command": "true"}, "parameters": {}, "objective": {"metric": "m"}}),
        lambda: client.submit_service({"name": "s", "model": "m@1", "predictor": {"type": "sklearn"}}),
        lambda: client.register_model("m", "job-1", "model.pkl"),
    ):
        with pytest.raises(ValidationError):  # the scripted answer is a job, not what these return
            call()
        assert script.requests[-1].method == "POST" and script.requests[-1].headers.get(HEADER)


def test_reads_are_retried_and_a_dry_run_too(connect) -> None:
    client, script = connect(status(502), refuse, status(200, JOB))
    assert client.get_job("job-1").id == "job-1"
    assert len(script.requests) == 3 and HEADER not in script.requests[0].headers
    dry = {"spec": {"command": "true"}, "name": "j", "code_sha256": None, "code_stored": None}
    client, script = connect(status(504), status(200, dry))
    client.dry_run({"command": "true"})
    assert [r.url.path for r in script.requests] == ["/api/v1/jobs:dry-run"] * 2


def test_a_write_without_a_key_is_sent_once(connect) -> None:
    client, script = connect(reset, status(200, JOB))
    with pytest.raises(KilnError, match="cannot reach Kiln"):
        client.cancel("job-1")  # the server may have acted: sending it again is the caller's decision
    assert len(script.requests) == 1
    client, script = connect(status(503, {"code": "unavailable", "message": "no ready replica"}))
    with pytest.raises(Unavailable):
        client.predict("digits", [[0.0]])
    assert len(script.requests) == 1


def test_answers_other_than_502_503_504_are_not_retried(connect) -> None:
    refusal = {"code": "invalid_input", "message": "spec.command: required"}
    client, script = connect(status(422, refusal), status(201, JOB))
    with pytest.raises(InvalidInput, match=r"spec\.command"):
        client.submit({"command": "true"})
    client, script500 = connect(status(500, {"code": "internal", "message": "boom"}), status(201, JOB))
    with pytest.raises(KilnError, match="boom"):
        client.submit({"command": "true"})
    assert len(script.requests) == len(script500.requests) == 1


def test_retries_end_after_retry_seconds_with_the_usual_error(connect) -> None:
    client, script = connect(refuse, policy=RetryPolicy(total=0.3, first=0.02, longest=0.05))
    started = time.monotonic()
    with pytest.raises(
        KilnError, match=r"cannot reach Kiln at http://kiln.test: connection refused \(tried \d+ times\)"
    ):
        client.submit({"command": "true"})
    assert 0.3 <= time.monotonic() - started < 2.0
    assert len(script.requests) >= 3
    client, script = connect(status(503, {"code": "unavailable", "message": "down"}), policy=RetryPolicy(total=0.2))
    with pytest.raises(Unavailable, match="down"):
        client.get_job("job-1")  # the last answer is what the caller gets
    client, script = connect(refuse, policy=RetryPolicy(total=0))
    with pytest.raises(KilnError, match="cannot reach Kiln"):
        client.get_job("job-1")
    assert len(script.requests) == 1  # retry_seconds 0: never


def test_retry_seconds_comes_from_the_argument_or_kiln_retry_seconds(monkeypatch) -> None:
    assert Client("http://kiln.test", "AKTESTTESTTESTTEST00", "s").retries.total == 60.0
    assert Client("http://kiln.test", "AKTESTTESTTESTTEST00", "s", retry_seconds=5).retries.total == 5.0
    monkeypatch.setenv("KILN_RETRY_SECONDS", "0")
    assert Client("http://kiln.test", "AKTESTTESTTESTTEST00", "s").retries.total == 0.0


def test_a_503_retry_after_is_waited_for_within_the_budget(connect) -> None:
    client, script = connect(status(503, headers={"Retry-After": "0.3"}), status(200, JOB))
    client.get_job("job-1")
    assert script.times[1] - script.times[0] >= 0.3


def test_a_streamed_body_is_never_retried(connect) -> None:
    client, script = connect(reset, status(201, {}))
    with pytest.raises(KilnError):
        client.request("POST", "/jobs", content=iter([b"{}"]), content_sha256="0" * 64, idempotency_key="k")
    assert len(script.requests) == 1


def test_backoff_doubles_up_to_the_longest_wait_and_stops_at_the_deadline(monkeypatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    monkeypatch.setattr("kiln.sdk.retries.random.uniform", lambda low, high: high)
    clock = RetryClock(RetryPolicy(total=60, first=0.5, longest=4), deadline=time.monotonic() + 60)
    for _ in range(6):
        assert clock.wait()
    assert slept == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert clock.wait(retry_after=10) and slept[-1] == 10
    assert not RetryClock(RetryPolicy(total=60), deadline=time.monotonic() - 1).wait()


def test_an_unreachable_server_is_said_once_before_the_retries(caplog) -> None:  # type: ignore[no-untyped-def]
    """A wrong endpoint must not look like a hang: the first failed try says the SDK is trying again, and for
    how long; the later tries say nothing more."""
    import logging

    from kiln.errors import KilnError
    from kiln.sdk.client import Client

    client = Client("http://127.0.0.1:1", "AK", "SK" * 20, retry_seconds=0.6)
    with caplog.at_level(logging.WARNING, logger="kiln.sdk.client"):
        try:
            client.list_jobs()
        except KilnError as exc:
            assert "tried" in exc.message
        else:
            raise AssertionError("an unreachable server answered")
    said = [r.getMessage() for r in caplog.records if "trying again" in r.getMessage()]
    assert said == [
        "cannot reach Kiln at http://127.0.0.1:1 (ConnectError); trying again for up to 0.6 s (KILN_RETRY_SECONDS)"
    ]


# -- a wrong address fails in seconds; a server that answered before is waited for (kiln.sdk.reached) ---------------


@pytest.fixture
def fresh_endpoint(tmp_path, monkeypatch) -> Iterator[Callable[..., tuple[Client, Script]]]:  # type: ignore[no-untyped-def]
    """Clients of an endpoint nobody reached (a new name each), the client state directory empty."""
    monkeypatch.setenv("KILN_CLIENT_DIR", str(tmp_path))
    clients: list[Client] = []

    def make(*steps: Step, first_contact: float = 0.05, **creds: str) -> tuple[Client, Script]:
        script = Script(*steps)
        endpoint = f"http://never-{len(clients)}-{time.monotonic_ns()}.test"
        client = Client(endpoint, **creds) if creds else Client(endpoint, "AKTESTTESTTESTTEST00", "s3cret")
        client._http = httpx.Client(base_url=client.endpoint, transport=httpx.MockTransport(script))
        client.retries = RetryPolicy(total=60.0, first=0.01, longest=0.02)
        client.first_contact_seconds = first_contact
        clients.append(client)
        return client, script

    yield make
    for client in clients:
        client.close()


def test_a_read_at_an_address_that_never_answered_fails_in_the_first_contact_window(fresh_endpoint) -> None:
    client, script = fresh_endpoint(refuse)
    began = time.monotonic()
    with pytest.raises(KilnError, match="nothing has answered at this address") as caught:
        client.get_job("job-1")
    assert time.monotonic() - began < 30  # not the 60 s retry window (the window itself is 0.05 s here)
    assert "KILN_ENDPOINT" in str(caught.value)
    assert len(script.requests) >= 2  # still retried a little: a server coming up as the command runs


def test_an_endpoint_that_answered_once_is_waited_for_through_a_restart(fresh_endpoint) -> None:
    # 25 refusals take well over the 0.05 s first-contact window (each wait is at least 5 ms): only the whole
    # retry window carries the read across them.
    client, script = fresh_endpoint(status(200, JOB), *([refuse] * 25), status(200, JOB))
    assert client.get_job("job-1").id == "job-1"
    assert client.get_job("job-1").id == "job-1"
    assert len(script.requests) == 27


def test_the_next_command_on_this_machine_remembers_the_answer(fresh_endpoint, tmp_path) -> None:
    from kiln.sdk import reached

    client, _ = fresh_endpoint(status(200, JOB))
    client.get_job("job-1")
    reached.forget_this_process()  # as a new `kiln` process would start
    assert reached.seen(client.endpoint)  # from reached.json in the client's state directory
    assert client.endpoint in (tmp_path / "reached.json").read_text()
    other, script = fresh_endpoint(*([refuse] * 25), status(200, JOB))
    other.close()
    other._http = httpx.Client(base_url=client.endpoint, transport=httpx.MockTransport(script))
    other.endpoint = client.endpoint
    assert other.get_job("job-1").id == "job-1" and len(script.requests) == 26


def test_a_job_s_calls_always_get_the_whole_window(fresh_endpoint) -> None:
    client, script = fresh_endpoint(*([refuse] * 25), status(200, JOB), job_token="kjt_token")
    assert client.get_job("job-1").id == "job-1" and len(script.requests) == 26
