"""While it migrates, the server says how far it is (issue 44: an upgrade of a home with 10M metric points takes a
while): each revision as it begins (its number in the plan and what it does) and as it ends with its time, the
reference check's time on SQLite, and while a phase lasts, a "still ..." line every PROGRESS_EVERY seconds."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from kiln.db import migrate
from kiln.db.session import Database

FROM = "20261210_0021"


def _plan() -> list[str]:
    scripts = ScriptDirectory.from_config(migrate._config())
    return [s.revision for s in reversed(list(scripts.iterate_revisions(migrate.head_revision(), FROM)))]


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kiln.db.migrate"]


def test_an_upgrade_logs_each_revision_as_it_begins_and_ends(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = Database(f"sqlite:///{tmp_path / 'kiln.db'}")
    try:
        migrate.upgrade(db.engine, FROM)
        caplog.set_level(logging.INFO, logger="kiln.db")
        caplog.clear()
        migrate.upgrade(db.engine)
        up = _messages(caplog)
        caplog.clear()
        migrate.downgrade(db.engine, FROM)
        down = _messages(caplog)
    finally:
        db.dispose()
    plan = _plan()
    assert len(plan) >= 2  # 0022 and 0023 at least
    n = len(plan)
    assert f"migrating the database from {FROM} to {plan[-1]} ({n} step(s))" in up
    said: list[int] = []  # where each expected line is in the log: they come in this order
    for i, revision in enumerate(plan, 1):
        began = [k for k, m in enumerate(up) if m.startswith(f"migrating to {revision} (step {i} of {n}): ")]
        ended = [k for k, m in enumerate(up) if m.startswith(f"migrated to {revision} (step {i} of {n}) in ")]
        assert len(began) == 1 and len(ended) == 1, up
        said += [began[0], ended[0]]
    checks = [k for k, m in enumerate(up) if m.startswith("checked every reference ")]
    assert len(checks) == 2, up  # before and after, each with its time and what it found
    assert up[checks[0]].startswith("checked every reference before the migration in ")
    assert up[checks[1]].startswith("checked every reference after the migration in ")
    assert up[checks[1]].endswith(": 0 dangling")
    assert checks[0] < said[0] and said[-1] < checks[1]
    assert said == sorted(said)
    assert up[-1].startswith(f"migrated the database to {plan[-1]} in ")
    for i, revision in enumerate(reversed(plan), 1):  # going down: the newest first
        assert any(m.startswith(f"migrating down from {revision} (step {i} of {n}): ") for m in down), down
        assert any(m.startswith(f"migrated down from {revision} (step {i} of {n}) in ") for m in down), down


def test_a_long_phase_is_said_to_go_on_every_few_seconds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy kept before migrating is made to last until a "still ..." line has been logged about it."""
    monkeypatch.setattr(migrate, "PROGRESS_EVERY", 0.05)
    copy = migrate.keep_before_migrating

    def slow_copy(database: Path, revision: str) -> Path:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(m.startswith("still copying") for m in _messages(caplog)):
            time.sleep(0.02)
        return copy(database, revision)

    monkeypatch.setattr(migrate, "keep_before_migrating", slow_copy)
    db = Database(f"sqlite:///{tmp_path / 'kiln.db'}")
    try:
        migrate.upgrade(db.engine, FROM)
        caplog.set_level(logging.INFO, logger="kiln.db")
        migrate.upgrade(db.engine)
    finally:
        db.dispose()
    still = [m for m in _messages(caplog) if m.startswith("still ")]
    assert still, _messages(caplog)
    assert still[0].startswith(f"still copying the database at revision {FROM} before migrating it: ")
    assert still[0].endswith(" s so far")
    # Once the migration is over, the watcher says nothing more.
    count = len(_messages(caplog))
    time.sleep(0.2)
    assert len(_messages(caplog)) == count
