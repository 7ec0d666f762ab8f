"""`kiln notebooks show` and `kiln notebooks delete` against a stand-in client: sizes and the idle timeout read as
a person writes them (2 GiB, 2h: not 2147483648 and 7200s), and deleting a notebook (its home with it) asks first
or wants --yes, as `kiln jobs delete` does."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from kiln.cli import notebooks as cli
from kiln.cli.main import build_app
from kiln.domain.notebooks import NotebookRead, NotebookSpec, NotebookState

NOW = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


class StandIn:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    def __enter__(self) -> StandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def get_notebook(self, ref: str) -> NotebookRead:
        spec = NotebookSpec.model_validate(
            {"name": ref, "resources": {"cpus": 2, "memory": "2Gi"}, "idle_timeout": "2h"}
        )
        return NotebookRead(
            id="nb-1", name=ref, org_id="org-1", user_id="usr-1", state=NotebookState.RUNNING, spec=spec,
            job_id="job-1", url="http://127.0.0.1/notebooks/nb-1/", created_at=NOW, updated_at=NOW,
        )  # fmt: skip

    def delete_notebook(self, ref: str) -> None:
        self.deleted.append(ref)


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[StandIn, Console]]:
    client = StandIn()
    console = Console(file=io.StringIO(), width=200, color_system=None, highlight=False)
    monkeypatch.setattr(cli, "connect", lambda: client)
    monkeypatch.setattr(cli, "out", console)
    yield client, console


def invoke(*argv: str, stdin: str | None = None) -> Any:
    return CliRunner().invoke(build_app(), list(argv), input=stdin, env={"COLUMNS": "200"})


def test_show_prints_sizes_and_the_idle_timeout_as_people_write_them(stand_in: tuple[StandIn, Console]) -> None:
    _, console = stand_in
    result = invoke("notebooks", "show", "explore")
    assert result.exit_code == 0, result.output
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "memory 2 GiB" in text and "2147483648" not in text
    assert "idle after 2h" in text and "7200" not in text


def test_delete_wants_yes_where_it_cannot_ask(stand_in: tuple[StandIn, Console]) -> None:
    client, _ = stand_in
    refused = invoke("notebooks", "delete", "explore")  # no terminal to ask on: refused, nothing deleted
    assert refused.exit_code == 2 and "--yes" in refused.output and client.deleted == []
    given = invoke("notebooks", "delete", "explore", "--yes")
    assert given.exit_code == 0, given.output
    assert client.deleted == ["explore"]
