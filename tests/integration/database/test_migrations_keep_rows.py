"""Migrations keep every row on SQLite: a table Alembic's batch mode rebuilds (copy, drop, rename) must not take
the rows that reference it with it (ON DELETE CASCADE). 20261205_0016 rebuilt metric_series with foreign keys on
and deleted every metric point and chunk recorded before the upgrade; kiln.db.migrate now runs every migration
with enforcement off and checks the references after, and the migration environment refuses a SQLite connection
that enforces them, so no future migration can run the old way."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from kiln.db import migrate
from kiln.db.session import Database, make_engine
from kiln.db.tables import utcnow
from kiln.domain.states import JobState

BEFORE_TRACKING = "20261204_0015"


def _counts(db: Database) -> dict[str, int]:
    with db.engine.connect() as conn:
        return {
            table: int(conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar() or 0)
            for table in ("jobs", "metric_series", "metric_points", "metric_chunks")
        }


def _row(table: sa.Table, **values: object) -> dict[str, object]:
    """``values`` and a plain value for every other column the table requires (NOT NULL, no default)."""
    for column in table.columns:
        if column.name in values or column.nullable or column.server_default is not None:
            continue
        if column.primary_key and isinstance(column.type, sa.Integer):
            continue
        kind = column.type.python_type if not isinstance(column.type, sa.JSON) else dict
        values[column.name] = {bool: False, int: 0, float: 0.0, str: "", dict: {}}.get(kind, utcnow())
    return values


def _seed_metrics(db: Database) -> None:
    """A job with two series, their points and chunk summaries, written as the release of 20261204_0015 had its
    tables (reflected, not the ORM's head schema)."""
    meta = sa.MetaData()
    with db.engine.begin() as conn:
        tables = {n: sa.Table(n, meta, autoload_with=conn) for n in ("organizations", "users", "jobs")}
        series, points, chunks = (
            sa.Table(n, meta, autoload_with=conn) for n in ("metric_series", "metric_points", "metric_chunks")
        )
        for name, values in (
            ("organizations", {"id": "org-1", "name": "acme"}),
            ("users", {"id": "usr-1", "org_id": "org-1", "name": "ann"}),
            (
                "jobs",
                {
                    "id": "job-a",
                    "org_id": "org-1",
                    "user_id": "usr-1",
                    "spec": {"command": "true"},
                    "state": str(JobState.SUCCEEDED),
                },
            ),
        ):
            conn.execute(tables[name].insert().values(_row(tables[name], **values)))
        for name in ("loss", "acc"):
            sid = conn.execute(
                series.insert().values(_row(series, job_id="job-a", worker="worker0", name=name, kind="scalar"))
            ).inserted_primary_key[0]
            conn.execute(
                points.insert(),
                [{"series_id": sid, "seq": i, "step": i, "time": float(i), "value": 1.0} for i in range(10)],
            )
            v = {f"{w}_{c}": 0.0 for w in ("first", "last", "min", "max") for c in ("x", "t", "v")}
            conn.execute(chunks.insert().values(_row(chunks, series_id=sid, chunk=0, count=10, **v)))


def test_an_upgrade_through_the_tracking_rebuild_keeps_every_metric_point(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'kiln.db'}")
    try:
        migrate.upgrade(db.engine, BEFORE_TRACKING)
        _seed_metrics(db)
        before = _counts(db)
        assert before == {"jobs": 1, "metric_series": 2, "metric_points": 20, "metric_chunks": 2}
        migrate.upgrade(db.engine)
        assert _counts(db) == before
        migrate.downgrade(db.engine, BEFORE_TRACKING)  # 0016's downgrade rebuilds the table the same way
        assert _counts(db) == before
        migrate.upgrade(db.engine)
        assert _counts(db) == before
        with db.engine.connect() as conn:  # enforcement is back on for the server's own connections
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        db.dispose()


def test_the_migration_environment_refuses_a_sqlite_connection_that_enforces_foreign_keys(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'kiln.db'}")
    try:
        cfg = migrate._config()
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            with pytest.raises(RuntimeError, match="foreign keys off"):
                command.upgrade(cfg, "head")
    finally:
        engine.dispose()


BEFORE_KEPT_BYTES = "20261211_0022"


def test_the_checkpoint_and_event_bytes_columns_keep_every_job_and_its_values(database_url: str) -> None:
    """20261212_0023 adds jobs.checkpoint_bytes and jobs.event_bytes (batch mode: SQLite rebuilds the table): each
    job, its storage counts and the rows that reference it are kept, and the new counts start at 0."""
    db = Database(database_url)
    try:
        migrate.upgrade(db.engine, BEFORE_KEPT_BYTES)
        _seed_metrics(db)
        meta = sa.MetaData()
        with db.engine.begin() as conn:
            jobs = sa.Table("jobs", meta, autoload_with=conn)
            assert "checkpoint_bytes" not in jobs.columns
            conn.execute(jobs.update().values(output_bytes=7 * 2**20, log_bytes=1234))
            second = _row(jobs, id="job-b", org_id="org-1", user_id="usr-1", spec={}, state=str(JobState.RUNNING))
            conn.execute(jobs.insert().values(second))
        before = _counts(db)
        migrate.upgrade(db.engine)
        assert _counts(db) == before
        with db.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT id, state, output_bytes, log_bytes, checkpoint_bytes, event_bytes FROM jobs ORDER BY id"
                )
            ).all()
        assert [tuple(r) for r in rows] == [
            ("job-a", str(JobState.SUCCEEDED), 7 * 2**20, 1234, 0, 0),
            ("job-b", str(JobState.RUNNING), 0, 0, 0, 0),
        ]
        migrate.downgrade(db.engine, BEFORE_KEPT_BYTES)
        assert _counts(db) == before
    finally:
        db.dispose()
