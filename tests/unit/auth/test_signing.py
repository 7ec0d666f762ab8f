"""KILN-HMAC-SHA256: canonical query, string to sign, signature, Authorization header."""

from __future__ import annotations

import hashlib
import hmac
import time

import pytest

from kiln.auth import signing

EMPTY_SHA = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


# -- canonical query ----------------------------------------------------------------------------------------------


def test_pairs_are_sorted_by_name() -> None:
    assert signing.canonical_query([("state", "RUNNING"), ("limit", "5"), ("before", "job-1")]) == (
        "before=job-1&limit=5&state=RUNNING"
    )


def test_repeated_names_are_sorted_by_value() -> None:
    assert signing.canonical_query([("state", "RUNNING"), ("state", "QUEUED"), ("a", "z")]) == (
        "a=z&state=QUEUED&state=RUNNING"
    )


def test_sorting_is_by_byte_order_of_the_encoded_text() -> None:
    assert signing.canonical_query([("b", "1"), ("B", "1"), ("a", "1"), ("_", "1")]) == "B=1&_=1&a=1&b=1"


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        ("a b", "a%20b"),
        ("a~b", "a~b"),
        ("A-Z_a.z~0", "A-Z_a.z~0"),
        ("a/b", "a%2Fb"),
        ("a+b", "a%2Bb"),
        ("a&b=c", "a%26b%3Dc"),
        ("100%", "100%25"),
        ("é", "%C3%A9"),
        ("?#", "%3F%23"),
        ("", ""),
    ],
)
def test_values_are_rfc3986_encoded(value: str, encoded: str) -> None:
    assert signing.canonical_query([("k", value)]) == f"k={encoded}"


def test_names_are_encoded_too() -> None:
    assert signing.canonical_query([("a b", "1")]) == "a%20b=1"


def test_empty_value_keeps_the_equals_sign() -> None:
    assert signing.canonical_query([("flag", ""), ("a", "1")]) == "a=1&flag="


def test_no_pairs_is_the_empty_string() -> None:
    assert signing.canonical_query([]) == ""
    assert signing.canonical_query_from_raw("") == ""


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("b=2&a=1", "a=1&b=2"),
        ("state=RUNNING&state=QUEUED", "state=QUEUED&state=RUNNING"),
        ("q=a+b", "q=a%20b"),
        ("q=a%20b", "q=a%20b"),
        ("q=a%7Eb", "q=a~b"),
        ("q=%2F", "q=%2F"),
        ("flag=", "flag="),
        ("flag", "flag="),
        ("x=%C3%A9", "x=%C3%A9"),
    ],
)
def test_canonical_query_from_raw(raw: str, canonical: str) -> None:
    assert signing.canonical_query_from_raw(raw) == canonical


def test_a_canonical_query_is_its_own_canonical_form() -> None:
    canonical = signing.canonical_query([("q", "a b/c~"), ("k", ""), ("k", "é")])
    assert signing.canonical_query_from_raw(canonical) == canonical


# -- string to sign and signature ---------------------------------------------------------------------------------


def test_string_to_sign_layout() -> None:
    text = signing.string_to_sign("get", "/api/v1/jobs", "limit=5", "1700000000", "n" * 16, EMPTY_SHA)
    assert text == f"KILN-HMAC-SHA256\nGET\n/api/v1/jobs\nlimit=5\n1700000000\n{'n' * 16}\n{EMPTY_SHA}"
    assert text.split("\n") == ["KILN-HMAC-SHA256", "GET", "/api/v1/jobs", "limit=5", "1700000000", "n" * 16, EMPTY_SHA]


def test_empty_query_is_an_empty_line() -> None:
    text = signing.string_to_sign("POST", "/api/v1/jobs", "", "1", "nonce", "abc")
    assert text == "KILN-HMAC-SHA256\nPOST\n/api/v1/jobs\n\n1\nnonce\nabc"


def test_body_sha256() -> None:
    assert signing.body_sha256(b"") == EMPTY_SHA
    assert signing.body_sha256(b'{"a":1}') == hashlib.sha256(b'{"a":1}').hexdigest()


def test_known_answer_against_independent_hmac() -> None:
    secret = "test-secret"
    query = signing.canonical_query([("state", "RUNNING"), ("limit", "5")])
    text = signing.string_to_sign("GET", "/api/v1/jobs", query, "1700000000", "nonce-0123456789abcdef", EMPTY_SHA)
    expected_text = (
        b"KILN-HMAC-SHA256\nGET\n/api/v1/jobs\nlimit=5&state=RUNNING\n1700000000\nnonce-0123456789abcdef\n"
        + EMPTY_SHA.encode()
    )
    expected = hmac.new(b"test-secret", expected_text, hashlib.sha256).hexdigest()
    assert signing.signature(secret, text) == expected
    # Also computed once with: printf '...' | openssl dgst -sha256 -hmac test-secret
    assert expected == "64423e5dd1d07a2a65d8018c1236d844433c2d3f86aecd0db2c6fd07b3e1f361"


def test_secret_is_used_as_utf8() -> None:
    expected = hmac.new("sécret".encode(), b"text", hashlib.sha256).hexdigest()
    assert signing.signature("sécret", "text") == expected


def test_sign_headers_with_fixed_date_and_nonce() -> None:
    body = b'{"spec":{"command":"echo hi"}}'
    headers = signing.sign_headers(
        access_key="AKTEST",
        secret_key="s3cret",
        method="post",
        path="/api/v1/jobs",
        query="",
        content_sha256=signing.body_sha256(body),
        date=1700000000,
        nonce="abcdefghijklmnop",
    )
    text = "\n".join(
        [
            "KILN-HMAC-SHA256",
            "POST",
            "/api/v1/jobs",
            "",
            "1700000000",
            "abcdefghijklmnop",
            hashlib.sha256(body).hexdigest(),
        ]
    )
    sig = hmac.new(b"s3cret", text.encode(), hashlib.sha256).hexdigest()
    assert headers == {
        "X-Kiln-Date": "1700000000",
        "X-Kiln-Nonce": "abcdefghijklmnop",
        "X-Kiln-Content-SHA256": hashlib.sha256(body).hexdigest(),
        "Authorization": f"KILN-HMAC-SHA256 Credential=AKTEST, Signature={sig}",
    }


def test_sign_headers_defaults_to_now_and_a_fresh_valid_nonce() -> None:
    kwargs = {"access_key": "AK", "secret_key": "s", "method": "GET", "path": "/", "query": "", "content_sha256": "x"}
    before = int(time.time())
    first = signing.sign_headers(**kwargs)  # type: ignore[arg-type]
    second = signing.sign_headers(**kwargs)  # type: ignore[arg-type]
    after = int(time.time())
    assert before <= int(first["X-Kiln-Date"]) <= after
    assert signing.NONCE_PATTERN.fullmatch(first["X-Kiln-Nonce"])
    assert first["X-Kiln-Nonce"] != second["X-Kiln-Nonce"]


def test_sign_headers_date_zero_is_kept() -> None:
    headers = signing.sign_headers(
        access_key="AK", secret_key="s", method="GET", path="/", query="", content_sha256="x", date=0, nonce="n" * 16
    )
    assert headers["X-Kiln-Date"] == "0"


def test_every_part_changes_the_signature() -> None:
    base = ("GET", "/api/v1/jobs", "a=1", "1700000000", "n" * 16, EMPTY_SHA)
    reference = signing.signature("k", signing.string_to_sign(*base))
    for i, changed in enumerate(["POST", "/api/v1/job", "a=2", "1700000001", "m" * 16, "0" * 64]):
        parts = list(base)
        parts[i] = changed
        assert signing.signature("k", signing.string_to_sign(*parts)) != reference, i
    assert signing.signature("K", signing.string_to_sign(*base)) != reference


# -- Authorization header and nonces ------------------------------------------------------------------------------

SIG = "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "value",
    [
        f"KILN-HMAC-SHA256 Credential=AK123, Signature={SIG}",
        f"KILN-HMAC-SHA256 Credential=AK123,Signature={SIG}",
        f"KILN-HMAC-SHA256   Credential=AK123 ,  Signature={SIG}  ",
    ],
)
def test_parse_authorization_accepts_spacing_variants(value: str) -> None:
    assert signing.parse_authorization(value) == ("AK123", SIG)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "Bearer abc",
        f"AWS4-HMAC-SHA256 Credential=AK123, Signature={SIG}",
        f"KILN-HMAC-SHA256 Credential=AK123, Signature={SIG.upper()}",
        f"KILN-HMAC-SHA256 Credential=AK123, Signature={SIG[:-1]}",
        f"KILN-HMAC-SHA256 Credential=AK123, Signature={SIG}0",
        f"KILN-HMAC-SHA256 Credential=, Signature={SIG}",
        f"KILN-HMAC-SHA256 Credential=AK123 Signature={SIG}",
        f"KILN-HMAC-SHA256 Signature={SIG}, Credential=AK123",
        f"KILN-HMAC-SHA256Credential=AK123, Signature={SIG}",
        f"kiln-hmac-sha256 Credential=AK123, Signature={SIG}",
    ],
)
def test_parse_authorization_rejects_malformed_values(value: str) -> None:
    assert signing.parse_authorization(value) is None


def test_parse_authorization_of_none_is_none() -> None:
    assert signing.parse_authorization(None) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("nonce", "ok"),
    [
        ("a" * 15, False),
        ("a" * 16, True),
        ("a" * 64, True),
        ("a" * 65, False),
        ("Az09_-" * 3, True),
        ("abcdefghijklmnop.", False),
        ("abcdefghijklmno p", False),
    ],
)
def test_nonce_pattern(nonce: str, ok: bool) -> None:
    assert bool(signing.NONCE_PATTERN.fullmatch(nonce)) is ok


def test_nonce_pattern_rejects_a_trailing_newline() -> None:
    # Regression test (found by this suite, since fixed):
    # src/kiln/auth/signing.py NONCE_PATTERN/SHA256_HEX): "$" also matches before a final "\n", so
    # "abcdefghijklmnop\n" passes as a nonce. Not reachable over HTTP today (servers reject newlines in header
    # values) but the documented rule is 16-64 chars of [A-Za-z0-9_-]; use \Z or fullmatch.
    assert signing.NONCE_PATTERN.fullmatch("abcdefghijklmnop\n") is None
    assert signing.SHA256_HEX.fullmatch(EMPTY_SHA + "\n") is None


def test_signatures_equal() -> None:
    assert signing.signatures_equal(SIG, SIG)
    assert not signing.signatures_equal(SIG, SIG[:-1] + "0")
    assert not signing.signatures_equal(SIG, SIG[:-1])
