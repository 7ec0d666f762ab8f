"""Apply and inspect Alembic migrations programmatically (the server migrates itself at start)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine

from kiln.db.backup import keep_before_migrating, sqlite_path

log = logging.getLogger(__name__)

_MIGRATIONS = Path(__file__).parent / "migrations"


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    return cfg


def head_revision() -> str | None:
    return ScriptDirectory.from_config(_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate up to ``revision`` in one transaction (SQLite: with foreign keys off, see ``_migrating``)."""
    start, target = current_revision(engine), head_revision() if revision == "head" else revision
    if start == target:
        return  # every start of a server: no transaction, no reference check
    database = sqlite_path(engine.url)
    if start is not None and database is not None and database.exists():
        # A copy to go back to should the migration go wrong (kiln.db.backup.keep_before_migrating).
        copy = keep_before_migrating(database, start)
        log.info("copied the database at revision %s to %s before migrating it", start, copy)
    log.info("migrating the database from %s to %s", start or "an empty database", target)
    _run(engine, lambda cfg: command.upgrade(cfg, revision))
    log.info("migrated the database to %s", target)


def downgrade(engine: Engine, revision: str) -> None:
    """Migrate down to ``revision``, the same way as ``upgrade``."""
    log.info("migrating the database down from %s to %s", current_revision(engine), revision)
    _run(engine, lambda cfg: command.downgrade(cfg, revision))


class ForeignKeyViolation(RuntimeError):
    """A migration left rows whose references point nowhere; it was rolled back whole."""


def _run(engine: Engine, step: Callable[[Config], None]) -> None:
    cfg = _config()
    with _migrating(engine) as conn:
        cfg.attributes["connection"] = conn
        step(cfg)


@contextmanager
def _migrating(engine: Engine) -> Iterator[Connection]:
    """A transaction to migrate in. On SQLite a table whose column changes is rebuilt (Alembic's batch mode:
    copied to a new table, the old one dropped, the new one renamed); with foreign keys enforced, dropping the old
    table deletes every row that references it through ON DELETE CASCADE (20261205_0016 rebuilt metric_series and
    so deleted every metric point). SQLite's own procedure for such a change is to turn enforcement off for it
    (outside the transaction: the pragma is a no-op inside one), check the references before committing
    (PRAGMA foreign_key_check: a violation the migration made rolls everything back), and turn it on again after.
    Violations that were there before (rows the metrics writer, which checks its own references, left) are not
    the migration's and do not stop it."""
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        raw = conn.connection.driver_connection if sqlite else None
        if raw is not None:
            raw.execute("PRAGMA foreign_keys=OFF")  # the driver runs in autocommit mode here: no transaction yet
        try:
            with conn.begin():
                before = _violations(conn) if raw is not None else set()
                yield conn
                if raw is not None:
                    made = _violations(conn) - before
                    if made:
                        tables = ", ".join(sorted({table for table, _, _ in made}))
                        raise ForeignKeyViolation(
                            f"the migration left {len(made)} row(s) referencing rows that do not exist (in {tables}); "
                            "it was rolled back, nothing was changed"
                        )
        finally:
            if raw is not None:
                raw.execute("PRAGMA foreign_keys=ON")


def _violations(conn: Connection) -> set[tuple[str, int, str]]:
    """SQLite's dangling references: (table, rowid, the table it references)."""
    return {(str(t), int(r or 0), str(p)) for t, r, p, _ in conn.exec_driver_sql("PRAGMA foreign_key_check")}


def is_up_to_date(engine: Engine) -> bool:
    return current_revision(engine) == head_revision()
