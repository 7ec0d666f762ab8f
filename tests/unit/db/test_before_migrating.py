"""Before the server migrates a SQLite database that has a revision, it copies it aside as
``kiln.db.before-<revision>`` (SQLite's backup API), says so in its log with the revisions it migrates from and
to, and keeps the last three such copies: the way back from a migration that goes wrong (20261205_0016 deleted
every metric point)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from kiln.db import migrate
from kiln.db.session import Database

OLD = ["20261204_0015", "20261205_0016", "20261206_0017", "20261207_0018"]


def test_a_database_at_an_older_revision_is_copied_aside_before_it_is_migrated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = Database(f"sqlite:///{tmp_path / 'kiln.db'}")
    try:
        migrate.upgrade(db.engine, OLD[0])
        assert not list(tmp_path.glob("kiln.db.before-*"))  # an empty database has nothing to keep
        with db.engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO organizations (id, name, created_at) VALUES ('org-1', 'acme', 0)")
        caplog.set_level(logging.INFO, logger="kiln.db")
        migrate.upgrade(db.engine)
    finally:
        db.dispose()
    copy = tmp_path / f"kiln.db.before-{OLD[0]}"
    assert copy.is_file()
    conn = sqlite3.connect(copy)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(OLD[0],)]
        assert conn.execute("SELECT name FROM organizations").fetchall() == [("acme",)]
    finally:
        conn.close()
    text = caplog.text
    assert f"copied the database at revision {OLD[0]} to {copy}" in text
    assert f"migrating the database from {OLD[0]} to {migrate.head_revision()}" in text


def test_the_last_three_copies_are_kept(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'kiln.db'}")
    try:
        for revision in [*OLD, "head"]:
            migrate.upgrade(db.engine, revision)
    finally:
        db.dispose()
    kept = sorted(p.name for p in tmp_path.glob("kiln.db.before-*"))
    assert kept == [f"kiln.db.before-{r}" for r in OLD[1:]]
