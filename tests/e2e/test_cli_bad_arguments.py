"""A bad path or id given to the real ``kiln`` command is one line saying what was wrong and a non-zero exit, never
a traceback: ``kiln models register --path ../`` printed pydantic's ValidationError with its traceback; an empty
id raised a ValueError (``kiln users show ""``) or parsed the console's page as JSON (``kiln jobs show ""``); and
an id holding ``..`` or ``?`` was resolved by the URL into another route (``kiln jobs show ../whoami`` called GET
/api/v1/whoami)."""

from __future__ import annotations

import pytest

from tests.e2e.test_cli import base_env, kiln
from tests.kilnserver import KilnServer


@pytest.fixture
def env(shared_server: KilnServer, tmp_path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {**base_env(tmp_path), **shared_server.credentials(), "KILN_ENDPOINT": shared_server.url}


def one_line_error(result, *expected: str) -> str:  # type: ignore[no-untyped-def]
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        # The report's: pydantic's ValidationError and its traceback; now the option, its value and the rule.
        (("--from-job", "job-01abc", "--path", "../"), "--path '../': a path inside the job's outputs, without '..'"),
        (("--from-job", "", "--path", "model.pt"), "--from-job '': string should have at least 1 character"),
    ],
)
def test_models_register_names_the_bad_option(env: dict[str, str], argv: tuple[str, ...], said: str) -> None:
    result = kiln(env, "models", "register", "m", *argv)
    assert result.returncode == 2, result.stderr  # a usage error, found before anything is sent
    one_line_error(result, said)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("jobs", "show", "../whoami"), "'..' is not an id or a name (in the request path /api/v1/jobs/../whoami)"),
        (("jobs", "cancel", ""), "an empty id or name (in the request path /api/v1/jobs//cancel)"),
        (("users", "show", ""), "an empty id or name"),
    ],
)
def test_a_bad_id_is_one_line_and_never_reaches_another_route(
    env: dict[str, str], argv: tuple[str, ...], said: str
) -> None:
    one_line_error(kiln(env, *argv), said)
