"""Where the client's credentials and state come from, and the advice a refused request turns into (no server:
the real server's answers are checked end to end in tests/e2e/test_cli_credentials.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from kiln.auth import failures
from kiln.errors import Unauthenticated
from kiln.sdk import credentials
from kiln.sdk.client import Client
from kiln.settings import ClientSettings

KEY = "AKTESTKEY00000000001"
URL = "http://kiln.test:8080"


@pytest.fixture(autouse=True)
def _no_kiln_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("ENDPOINT", "ACCESS_KEY", "SECRET_KEY", "JOB_TOKEN", "CONFIG", "HOME", "CLIENT_DIR"):
        monkeypatch.delenv(f"KILN_{name}", raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def test_the_config_file_lies_in_the_client_state_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert ClientSettings().config == tmp_path / "home" / ".kiln" / "config"
    monkeypatch.setenv("KILN_HOME", str(tmp_path / "server-home"))
    assert ClientSettings().config == tmp_path / "server-home" / "config"
    monkeypatch.setenv("KILN_CLIENT_DIR", str(tmp_path / "client"))
    assert ClientSettings().config == tmp_path / "client" / "config"
    monkeypatch.setenv("KILN_CONFIG", str(tmp_path / "elsewhere.env"))
    assert ClientSettings().config == tmp_path / "elsewhere.env"


def test_no_credentials_name_the_server_admin_env_and_the_config_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KILN_HOME", str(tmp_path / "srv"))
    with pytest.raises(Unauthenticated) as refused:
        Client()
    config = tmp_path / "srv" / "config"
    assert refused.value.message == (
        f"no Kiln credentials: KILN_ENDPOINT, KILN_ACCESS_KEY and KILN_SECRET_KEY are not set, and {config} does "
        f"not exist. On the server's machine, load the admin key it wrote: `set -a; . {tmp_path}/srv/admin.env; "
        f"set +a`; or run `kiln login` to save credentials to {config}"
    )
    assert refused.value.details == {"missing": ["KILN_ENDPOINT", "KILN_ACCESS_KEY", "KILN_SECRET_KEY"]}

    # Without KILN_HOME the server's home is ~/.kiln; the client's directory may be elsewhere.
    monkeypatch.delenv("KILN_HOME")
    monkeypatch.setenv("KILN_CLIENT_DIR", str(tmp_path / "cli"))
    monkeypatch.setenv("KILN_ENDPOINT", URL)
    monkeypatch.setenv("KILN_ACCESS_KEY", KEY)
    with pytest.raises(Unauthenticated) as partial:
        Client()
    assert partial.value.message.startswith(
        f"incomplete Kiln credentials: KILN_SECRET_KEY is not set, in the environment or in {tmp_path}/cli/config. "
        f"On the server's machine, load the admin key it wrote: `set -a; . {tmp_path}/home/.kiln/admin.env; set +a`"
    )


def test_each_value_remembers_where_it_came_from(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(f"KILN_ENDPOINT={URL}\nKILN_ACCESS_KEY=AKFROMTHEFILE0000001\nKILN_SECRET_KEY=file-secret\n")
    monkeypatch.setenv("KILN_CONFIG", str(config))
    monkeypatch.setenv("KILN_ACCESS_KEY", KEY)
    creds = credentials.resolve(None, None, None, None, ClientSettings())
    assert (creds.endpoint, creds.access_key, creds.secret_key) == (URL, KEY, "file-secret")
    assert creds.origin("access_key") == "KILN_ACCESS_KEY (environment variable)"
    assert creds.origin("secret_key") == f"KILN_SECRET_KEY in {config}"
    assert creds.origin("endpoint") == f"KILN_ENDPOINT in {config}"
    given = credentials.resolve("http://given", KEY, "s", None, ClientSettings())
    assert (
        given.origin("secret_key") == "the secret key you gave" and given.origin("endpoint") == "the endpoint you gave"
    )
    assert "file-secret" not in repr(creds)


def refusal(reason: str, message: str = "", **details: object) -> Unauthenticated:
    return Unauthenticated(message or failures.MESSAGES.get(reason, ""), details={"reason": reason, **details})


def test_refusals_say_what_to_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KILN_ENDPOINT", URL)
    monkeypatch.setenv("KILN_ACCESS_KEY", KEY)
    monkeypatch.setenv("KILN_SECRET_KEY", "wrong")
    env = credentials.resolve(None, None, None, None, ClientSettings())
    assert env.explain(refusal("signature")).message == (
        f"the secret key does not match access key {KEY} at {URL} — check KILN_SECRET_KEY (environment variable)"
    )
    assert env.explain(refusal("unknown_key")).message == (
        f"the access key id you provided does not exist: {URL} has no access key {KEY} — check KILN_ACCESS_KEY "
        "(environment variable) and KILN_ENDPOINT (environment variable)"
    )
    expired = env.explain(refusal("key_expired", failures.key_expired(KEY, datetime.now(UTC))))
    assert expired.message.startswith(f"access key {KEY} expired at 20")
    assert expired.message.endswith(
        f"(server {URL}) — ask an admin of your organisation for a new key (`kiln keys create --user NAME`), "
        "then set KILN_ACCESS_KEY and KILN_SECRET_KEY (environment variables)"
    )
    text, facts = failures.skew(1_800_000_000, 1_800_000_750, 300)
    stale = env.explain(refusal("stale", text, **facts))
    assert stale.message == (
        f"this machine's clock is 750 s behind the server's at {URL} (server time 2027-01-15T08:12:30Z, this "
        "machine's 2027-01-15T08:00:00Z; at most 300 s either way is accepted) — set this machine's clock right, "
        "e.g. turn on NTP: `timedatectl set-ntp true`"
    )
    assert stale.details == {"reason": "stale", **facts} and isinstance(stale, Unauthenticated)

    config = tmp_path / "config"
    config.write_text(f"KILN_ENDPOINT={URL}\nKILN_ACCESS_KEY={KEY}\nKILN_SECRET_KEY=wrong\n")
    for name in ("ENDPOINT", "ACCESS_KEY", "SECRET_KEY"):
        monkeypatch.delenv(f"KILN_{name}")
    monkeypatch.setenv("KILN_CLIENT_DIR", str(tmp_path))
    saved = credentials.resolve(None, None, None, None, ClientSettings())
    assert saved.explain(refusal("signature")).message == (
        f"the secret key does not match access key {KEY} at {URL} — check KILN_SECRET_KEY in {config}, or run "
        "`kiln login` again"
    )
    assert saved.explain(refusal("key_disabled", failures.key_disabled(KEY, user=False))).message == (
        f"access key {KEY} is disabled (server {URL}) — ask an admin of your organisation for a new key "
        "(`kiln keys create --user NAME`), then run `kiln login` with it"
    )


def test_a_secret_in_place_of_the_key_id_is_never_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    swapped = credentials.resolve(URL, "kiln-secret-pasted-in-the-wrong-place", "AK", None, ClientSettings())
    message = swapped.explain(refusal("malformed", failures.NOT_AN_ACCESS_KEY)).message
    assert "pasted" not in message
    assert message == (
        f"{failures.NOT_AN_ACCESS_KEY} — check the access key id you gave: an access key id is AK and 18 capitals "
        "or digits"
    )


def test_a_stale_answer_outside_the_calendar_still_has_a_message() -> None:
    text, facts = failures.skew(999_999_999_999, 1_800_000_000, 300)
    assert "999999999999 s after 1970" in text and facts["request_time"] == 999_999_999_999
