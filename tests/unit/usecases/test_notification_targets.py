"""Where a webhook may go, and when a failed attempt is tried again: the pure decisions and the sender's check,
with no receiver reachable by anything the check refuses (nothing is sent to a refused target)."""

from __future__ import annotations

import socket
import threading

import pytest

from kiln.auth.secrets import SecretBox, load_or_create_server_key
from kiln.domain.notifications import next_wait, parse_networks, refusal, retryable, wants
from kiln.settings.notifications import NotificationSettings
from kiln.usecases.notifications.notification_outbox import Send
from kiln.usecases.notifications.notification_sending import Sender, TargetRefused, resolve_target


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "127.9.9.9", "::1", "169.254.169.254", "fe80::1", "0.0.0.0", "::", "224.0.0.1", "::ffff:127.0.0.1"],
)
def test_refused_by_default(address: str) -> None:
    assert refusal(address, [], own=()) is not None


def test_own_address_refused_and_allow_list_opens_only_its_networks() -> None:
    assert "own address" in (refusal("192.0.2.10", [], own=["192.0.2.10"]) or "")
    allowed = parse_networks(["127.0.0.1/32"])
    assert refusal("127.0.0.1", allowed, own=()) is None
    assert refusal("127.0.0.2", allowed, own=()) is not None
    assert refusal("::1", allowed, own=()) is not None


def test_a_name_that_resolves_to_loopback_is_refused() -> None:
    with pytest.raises(TargetRefused, match="loopback"):
        resolve_target("http://localhost:9/hook", [])


@pytest.mark.parametrize(
    "url", ["ftp://example.com/x", "http:///x", "http://user:pw@127.0.0.1/x", "file:///etc/passwd"]
)
def test_not_a_webhook_url(url: str) -> None:
    with pytest.raises(TargetRefused):
        resolve_target(url, parse_networks(["127.0.0.0/8"]))


def test_a_refused_target_is_sent_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    accepted: list[object] = []

    def accept() -> None:
        try:
            accepted.append(listener.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    port = listener.getsockname()[1]
    box = SecretBox(load_or_create_server_key(tmp_path / "key"))
    sender = Sender(NotificationSettings(webhook_allow=[]), box, "http://kiln.invalid")
    try:
        send = Send(
            "dlv-1",
            "evt-1",
            {"id": "evt-1", "type": "test"},
            "webhook",
            f"http://localhost:{port}/x",
            "standard",
            None,
            0,
        )
        outcome = sender.send(send)
    finally:
        sender.close()
        thread.join()
        listener.close()
    assert outcome.refused and not outcome.ok and not outcome.retry
    assert accepted == []


def test_retry_decisions() -> None:
    assert retryable(None) and retryable(500) and retryable(503) and retryable(429)
    assert not retryable(400) and not retryable(404) and not retryable(410) and not retryable(301)
    assert [next_wait(n, 10) for n in (1, 2, 3)] == [10, 20, 40]
    assert next_wait(30, 10) == 3600


def test_subscription_filters() -> None:
    event = {"type": "job.failed", "labels": {"team": "vision"}, "name": "resnet-3", "user_id": "usr-1"}
    assert wants(["job.*"], {}, None, None, event)
    assert not wants(["job.succeeded"], {}, None, None, event)
    assert wants(["job.failed"], {"team": "vision"}, "resnet-*", "usr-1", event)
    assert not wants(["*"], {"team": "nlp"}, None, None, event)
    assert not wants(["*"], {}, "bert-*", None, event)
    assert not wants(["*"], {}, None, "usr-2", event)
