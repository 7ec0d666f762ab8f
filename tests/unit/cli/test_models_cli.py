"""`kiln models` without a server: what the commands send to a stand-in client, what they print (NAME@VERSION first
on stdout, tables with aliases and final metrics, a version's lineage), and the usage errors (exit 2, naming the
argument) refused before any request."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from typer.testing import CliRunner

from kiln.cli import models as cli
from kiln.cli.main import build_app
from kiln.domain.models import (
    AliasRead,
    ModelFileRead,
    ModelLineage,
    ModelRead,
    ModelRemoved,
    ModelSummary,
    ModelVersionRead,
)

NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
SHA = "ab" * 32


def version(number: int, aliases: list[str] | None = None, **metrics: float) -> ModelVersionRead:
    return ModelVersionRead(
        name="digits",
        version=number,
        framework="sklearn",
        source_path="model.pkl",
        file_count=1,
        size=2048,
        files=[ModelFileRead(path="model.pkl", size=2048, sha256=SHA)],
        aliases=aliases or [],
        lineage=ModelLineage(
            job_id=f"job-{number}",
            job_name="train",
            job_state="SUCCEEDED",
            metrics=metrics,
            study_id="study-7" if number == 2 else None,
            trial=3 if number == 2 else None,
        ),
        created_by="usr-1",
        created_at=NOW,
    )


class StandIn:
    """What the commands call on ``kiln.Client``, answering from fixed data and recording the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __enter__(self) -> StandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def register_model(self, name: str, job_id: str, path: str, **extra: Any) -> ModelVersionRead:
        self.calls.append(("register", (name, job_id, path, extra)))
        return version(3, val_acc=0.97, loss=0.1)

    def list_models(self) -> list[ModelSummary]:
        self.calls.append(("list", None))
        summary = {"latest_version": 3, "versions": 3, "size": 4096, "created_at": NOW, "updated_at": NOW}
        return [ModelSummary(name="digits", aliases={"production": 2}, **summary)]

    def get_model(self, name: str) -> ModelRead:
        self.calls.append(("get", name))
        return ModelRead(
            name=name,
            latest_version=2,
            versions=2,
            aliases={"production": 2},
            size=4096,
            created_at=NOW,
            updated_at=NOW,
            items=[version(2, ["production"], val_acc=0.97), version(1, val_acc=0.9)],
        )

    def model_version(self, ref: str) -> ModelVersionRead:
        self.calls.append(("version", ref))
        return version(2, ["production"], val_acc=0.97, loss=0.1)

    def model_versions(self, name: str) -> list[ModelVersionRead]:
        self.calls.append(("versions", name))
        many = {f"m{i}": float(i) for i in range(6)}
        return [version(1), version(2, ["production"], **many)]

    def set_alias(self, name: str, alias: str, number: int) -> AliasRead:
        self.calls.append(("alias", (name, alias, number)))
        return AliasRead(name=name, alias=alias, version=number)

    def delete_alias(self, name: str, alias: str) -> AliasRead:
        self.calls.append(("unalias", (name, alias)))
        return AliasRead(name=name, alias=alias, version=2)

    def delete_model_version(self, name: str, number: int) -> ModelRemoved:
        self.calls.append(("delete-version", (name, number)))
        return ModelRemoved(name=name, versions=[number], aliases=["production"], bytes_freed=2048)

    def delete_model(self, name: str) -> ModelRemoved:
        self.calls.append(("delete", name))
        return ModelRemoved(name=name, versions=[1, 2])


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    client = StandIn()
    monkeypatch.setattr(cli, "connect", lambda: client)
    yield client


def invoke(*argv: str, stdin: str | None = None) -> Any:
    return CliRunner().invoke(build_app(), ["models", *argv], input=stdin, env={"COLUMNS": "200"})


def test_register_says_when_the_version_was_already_registered(stand_in: StandIn, monkeypatch) -> None:
    existing = version(1, val_acc=0.97).model_copy(update={"already_registered": True})
    monkeypatch.setattr(stand_in, "register_model", lambda *a, **k: existing)
    result = invoke("register", "digits", "--from-job", "job-1", "--path", "model.pkl")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "digits@1"
    assert "digits@1 already holds these files (model.pkl of job job-1, sklearn): no new version registered" in (
        result.output
    )


def test_register_prints_the_new_version_first_and_its_metrics_on_stderr(stand_in: StandIn) -> None:
    result = invoke("register", "digits", "--from-job", "job-9", "--path", "out/model.pkl", "--framework", "sklearn")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "digits@3"
    assert "digits@3: 1 file (2 KiB, sklearn) from out/model.pkl of job job-9; val_acc=0.97 loss=0.1" in result.output
    assert stand_in.calls == [
        ("register", ("digits", "job-9", "out/model.pkl", {"framework": "sklearn", "description": None}))
    ]
    as_json = invoke("register", "digits", "-j", "job-9", "-p", "model.pkl", "-o", "json")
    assert json.loads(as_json.stdout)["lineage"]["metrics"] == {"val_acc": 0.97, "loss": 0.1}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("register", "Digits", "-j", "job-1", "-p", "m.pt"), "model name 'Digits'"),
        (("register", "digits", "-j", "job-1", "-p", "m.pt", "-f", "keras"), "'keras': one of torch, onnx, sklearn"),
        (("register", "digits", "-p", "m.pt"), "name --from-job JOB or --from-run RUN (one of them)"),
        (("show", "digits@Prod"), "version 'Prod'"),
        (("alias", "digits", "production"), "NAME@VERSION: which version the alias names"),
        (("alias", "digits@2", "latest"), "'latest' always means the newest version"),
        (("alias", "digits@2", "production", "--remove"), "with --remove, give the model's NAME alone"),
        (("delete", "digits@production", "--yes"), "remove a version by its number"),
    ],
)
def test_usage_errors_name_the_argument_and_send_nothing(
    stand_in: StandIn, argv: tuple[str, ...], message: str
) -> None:
    result = invoke(*argv)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert stand_in.calls == []


def test_list_show_and_versions_tables(stand_in: StandIn) -> None:
    listed = invoke("ls")
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.splitlines()[-1].split()[:6] == ["digits", "3", "3", "production→2", "4", "KiB"]

    shown = invoke("show", "digits")
    assert shown.exit_code == 0, shown.output
    assert "production → 2" in shown.stdout and "digits@2" in shown.stdout and "val_acc=0.97" in shown.stdout

    one = invoke("show", "digits@production")
    assert one.exit_code == 0, one.output
    lines = [" ".join(line.split()) for line in one.stdout.splitlines()]
    assert "Job job-2 (train, SUCCEEDED)" in lines and "Study study-7 trial 3" in lines
    assert "Metrics val_acc=0.97 loss=0.1" in lines
    assert any(line.startswith(f"model.pkl 2 KiB {SHA[:16]}") for line in lines)

    versions = invoke("versions", "digits")
    assert versions.exit_code == 0, versions.output
    last = " ".join(versions.stdout.splitlines()[-1].split())
    assert last.startswith("digits@2 sklearn 1 2 KiB production job-2 m0=0 m1=1 m2=2 m3=3 …")
    assert stand_in.calls == [
        ("list", None),
        ("get", "digits"),
        ("version", "digits@production"),
        ("versions", "digits"),
    ]


def test_an_alias_is_set_by_number_or_through_another_alias_and_removed(stand_in: StandIn) -> None:
    assert invoke("alias", "digits@3", "production").exit_code == 0
    moved = invoke("alias", "digits@production", "staging")
    assert moved.exit_code == 0 and "digits@staging now names digits@2" in moved.output
    removed = invoke("alias", "digits", "staging", "--remove")
    assert removed.exit_code == 0 and "digits@staging removed digits@2" in removed.output
    assert stand_in.calls == [
        ("alias", ("digits", "production", 3)),
        ("version", "digits@production"),
        ("alias", ("digits", "staging", 2)),
        ("unalias", ("digits", "staging")),
    ]


def test_delete_asks_unless_yes_and_removes_a_version_or_the_model(stand_in: StandIn) -> None:
    refused = invoke("delete", "digits@2")  # no terminal to ask on
    assert refused.exit_code == 2 and "pass --yes to confirm" in refused.output
    one = invoke("delete", "digits@2", "--yes")
    assert one.exit_code == 0 and "removed digits@2, aliases production; freed 2 KiB" in one.output
    whole = invoke("delete", "digits", "-y", "-o", "json")
    assert json.loads(whole.stdout)["versions"] == [1, 2]
    assert stand_in.calls == [("delete-version", ("digits", 2)), ("delete", "digits")]
