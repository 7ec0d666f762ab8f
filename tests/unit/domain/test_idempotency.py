"""An Idempotency-Key and a request's fingerprint (kiln.domain.idempotency): which keys are refused and how the
refusal names the header, and which requests count as the same request."""

from __future__ import annotations

import json

import pytest

from kiln.domain.idempotency import HEADER, canonical_body, check_key, describe_span, fingerprint, new_key
from kiln.errors import InvalidInput

BODY = {"spec": {"command": "python train.py", "runtime": {"python": "/usr/bin/python3"}}, "code_sha256": "ab" * 32}


# A key new_key() makes, written out: a parameter made at collection would differ between pytest-xdist's
# workers, which then refuse to run the suite (they must collect the same tests).
@pytest.mark.parametrize(
    "key", ["a", "0" * 255, "job 1 of 3", "~!@#$%^&*()_+{}|:<>?", "db1f1c73-eeb5-45af-96b0-74ade6ed7c78"]
)
def test_printable_ascii_keys_of_1_to_255_characters_are_kept_as_they_are(key: str) -> None:
    assert check_key(key) == key


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("", "is empty"),
        (" ", "is empty"),
        ("k" * 256, "is 256 characters long"),
        ("café", "not printable ASCII"),
        ("tab\there", "not printable ASCII"),
        ("nul\x00", "not printable ASCII"),
        ("new\nline", "not printable ASCII"),
        (" padded", "starts or ends with a space"),
    ],
)
def test_any_other_key_is_a_422_that_names_the_header_and_says_why(key: str, why: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_key(key)
    assert caught.value.status == 422
    assert caught.value.message.startswith(f"{HEADER}: ") and why in caught.value.message
    assert caught.value.details == {"field": f"header.{HEADER}"}


def test_new_keys_are_fresh_and_valid() -> None:
    keys = {new_key() for _ in range(100)}
    assert len(keys) == 100 and all(check_key(k) for k in keys)


def test_the_same_json_written_another_way_is_the_same_request() -> None:
    compact = json.dumps(BODY, separators=(",", ":")).encode()
    spaced = json.dumps(BODY, indent=2).encode()
    reordered = json.dumps({"code_sha256": BODY["code_sha256"], "spec": dict(reversed(BODY["spec"].items()))}).encode()
    first = fingerprint("POST", "/api/v1/jobs", compact)
    assert fingerprint("post", "/api/v1/jobs", spaced) == first
    assert fingerprint("POST", "/api/v1/jobs", reordered) == first
    assert len(first) == 64 and int(first, 16) >= 0


def test_another_method_path_or_body_is_another_request() -> None:
    body = json.dumps(BODY).encode()
    first = fingerprint("POST", "/api/v1/jobs", body)
    other_body = json.dumps({**BODY, "code_sha256": "cd" * 32}).encode()
    assert fingerprint("POST", "/api/v1/jobs", other_body) != first
    assert fingerprint("POST", "/api/v1/studies", body) != first
    assert fingerprint("PUT", "/api/v1/jobs", body) != first
    # The parts are length-prefixed: moving bytes from the path to the body does not give the same hash.
    assert fingerprint("POST", "/a", b"bc") != fingerprint("POST", "/ab", b"c")


def test_a_body_that_is_not_json_is_hashed_as_it_is() -> None:
    assert canonical_body(b"\xff\x00 not json") == b"\xff\x00 not json"
    assert canonical_body(b"") == b""
    assert fingerprint("POST", "/p", b"raw") != fingerprint("POST", "/p", b"raw ")
    assert canonical_body(b'{"b": 1, "a": "\xc3\xa9"}') == '{"a":"é","b":1}'.encode()


def test_a_retention_reads_as_people_write_it() -> None:
    assert describe_span(24 * 3600) == "24 h"
    assert describe_span(90 * 60) == "90 min"
    assert describe_span(45) == "45 s"
    assert describe_span(0.5) == "0.5 s"
