"""The console's session token and CSRF token (kiln.auth.sessions): minted and verified under one server key,
worthless under another, dead once expired, and refused when altered in any part."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet

from kiln.auth import failures
from kiln.auth.sessions import SessionInvalid, SessionKeys

KEY_ID = "AK" + "A1B2C3D4E5F6G7H8I9"
NOW = 1_800_000_000


@pytest.fixture
def keys() -> SessionKeys:
    return SessionKeys(Fernet.generate_key())


def test_a_minted_token_names_its_key_and_expiry_and_verifies_until_then(keys: SessionKeys) -> None:
    token = keys.mint(KEY_ID, NOW + 3600)
    version, key_id, expiry, mac = token.split(".")
    assert (version, key_id, expiry) == ("v1", KEY_ID, str(NOW + 3600))
    assert len(mac) == 64
    assert keys.verify(token, NOW) == (KEY_ID, NOW + 3600)
    assert keys.verify(token, NOW + 3599.5) == (KEY_ID, NOW + 3600)
    with pytest.raises(SessionInvalid) as caught:
        keys.verify(token, NOW + 3600)
    assert (caught.value.reason, caught.value.key_id) == (failures.STALE, KEY_ID)
    assert "expired" in caught.value.message


def test_a_token_of_another_server_key_is_refused() -> None:
    server_key = Fernet.generate_key()
    token = SessionKeys(server_key).mint(KEY_ID, NOW + 60)
    assert SessionKeys(server_key).verify(token, NOW) == (KEY_ID, NOW + 60)  # the same key: another replica
    with pytest.raises(SessionInvalid) as caught:
        SessionKeys(Fernet.generate_key()).verify(token, NOW)
    assert (caught.value.reason, caught.value.key_id) == (failures.SIGNATURE, KEY_ID)
    assert "not made by this server" in caught.value.message


def test_changing_any_part_of_a_token_breaks_it(keys: SessionKeys) -> None:
    token = keys.mint(KEY_ID, NOW + 60)
    version, key_id, expiry, mac = token.split(".")
    other_key = KEY_ID[:-1] + ("X" if KEY_ID[-1] != "X" else "Y")
    other_mac = mac[:-1] + ("0" if mac[-1] != "0" else "1")
    altered = [
        f"{version}.{other_key}.{expiry}.{mac}",  # another user's key with this MAC
        f"{version}.{key_id}.{int(expiry) + 3600}.{mac}",  # a longer life
        f"{version}.{key_id}.{expiry}.{other_mac}",
    ]
    for forged in altered:
        with pytest.raises(SessionInvalid) as caught:
            keys.verify(forged, NOW)
        assert caught.value.reason == failures.SIGNATURE, forged


@pytest.mark.parametrize(
    "token",
    [
        "",
        "v1",
        "v2." + KEY_ID + ".1800000060." + "0" * 64,  # another version
        "v1.ak" + "a" * 18 + ".1800000060." + "0" * 64,  # not an access key id
        "v1." + KEY_ID + ".-5." + "0" * 64,
        "v1." + KEY_ID + ".1800000060." + "0" * 63,
        "v1." + KEY_ID + ".1800000060." + "G" * 64,
        "v1." + KEY_ID + ".1800000060." + "0" * 64 + ".extra",
        "v1." + KEY_ID + "." + "9" * 500 + "." + "0" * 64,  # too long to be a token
    ],
)
def test_what_is_not_a_token_is_malformed(keys: SessionKeys, token: str) -> None:
    with pytest.raises(SessionInvalid) as caught:
        keys.verify(token, NOW)
    assert caught.value.reason == failures.MALFORMED
    assert caught.value.key_id is None


def test_mint_refuses_what_would_not_verify(keys: SessionKeys) -> None:
    with pytest.raises(ValueError, match="key_id"):
        keys.mint("not-a-key", NOW)
    with pytest.raises(ValueError, match="expires_at"):
        keys.mint(KEY_ID, 0)


def test_the_csrf_token_belongs_to_one_session_and_one_server_key(keys: SessionKeys) -> None:
    token = keys.mint(KEY_ID, NOW + 60)
    csrf = keys.csrf(token)
    assert keys.csrf_matches(token, csrf)
    assert csrf != token and KEY_ID not in csrf
    assert not keys.csrf_matches(token, None)
    assert not keys.csrf_matches(token, "")
    assert not keys.csrf_matches(token, csrf.upper())
    assert not keys.csrf_matches(token, "é" + csrf[1:])  # not ASCII: refused, not an error
    assert not keys.csrf_matches(keys.mint(KEY_ID, NOW + 61), csrf)  # another session's
    assert not SessionKeys(Fernet.generate_key()).csrf_matches(token, csrf)  # another server's
