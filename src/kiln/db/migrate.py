"""Apply and inspect Alembic migrations programmatically (the server migrates itself at start)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext, MigrationInfo
from alembic.script import Script, ScriptDirectory
from sqlalchemy import Connection, Engine

from kiln.db.backup import keep_before_migrating, sqlite_path

log = logging.getLogger(__name__)

_MIGRATIONS = Path(__file__).parent / "migrations"
PROGRESS_EVERY = 10.0  # seconds between the "still migrating" lines of a long step
# How long a migration's transaction may stay without a statement on PostgreSQL, where the server's sessions are ended
# after ``database_idle_transaction_seconds`` (15 s; kiln.db.session): between two revisions Alembic loads the next
# one's module, and a data migration computes in Python, for longer than that on a loaded machine or a big database
# (test servers, whose limit is 2 s, failed to start). Still bounded: a server frozen in the middle of migrating lets
# go of the tables it locked, and another server can migrate.
MIGRATION_IDLE_SECONDS = 600


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
    """Migrate up to ``revision`` in one transaction (SQLite: with foreign keys off, see ``_migrating``), saying in
    the log how far it is (``_Progress``)."""
    start, target = current_revision(engine), head_revision() if revision == "head" else revision
    if start == target:
        return  # every start of a server: no transaction, no reference check
    began = time.monotonic()
    with _Progress() as progress:
        database = sqlite_path(engine.url)
        if start is not None and database is not None and database.exists():
            # A copy to go back to should the migration go wrong (kiln.db.backup.keep_before_migrating).
            progress.begin(f"copying the database at revision {start} before migrating it")
            copy = keep_before_migrating(database, start)
            log.info(
                "copied the database at revision %s to %s before migrating it, in %.1f s", start, copy, progress.end()
            )
        plan = _plan(start, target, up=True)
        log.info("migrating the database from %s to %s (%d step(s))", start or "an empty database", target, len(plan))
        progress.steps(plan, "to")
        _run(engine, lambda cfg: command.upgrade(cfg, revision), progress)
    log.info("migrated the database to %s in %.1f s", target, time.monotonic() - began)


def downgrade(engine: Engine, revision: str) -> None:
    """Migrate down to ``revision``, the same way as ``upgrade``."""
    start = current_revision(engine)
    log.info("migrating the database down from %s to %s", start, revision)
    with _Progress() as progress:
        progress.steps(_plan(start, revision, up=False), "down from")
        _run(engine, lambda cfg: command.downgrade(cfg, revision), progress)


def _plan(start: str | None, target: str | None, *, up: bool) -> list[Script]:
    """The revisions a migration from ``start`` to ``target`` applies (up) or removes (down), in order; empty when
    Alembic cannot say beforehand (a relative target: the steps are then logged without their number)."""
    try:
        scripts = ScriptDirectory.from_config(_config())
        if up:
            return list(reversed(list(scripts.iterate_revisions(target, start or "base"))))
        return list(scripts.iterate_revisions(start, target or "base"))
    except Exception:  # only the log's step numbers depend on it
        return []


class ForeignKeyViolation(RuntimeError):
    """A migration left rows whose references point nowhere; it was rolled back whole."""


def _run(engine: Engine, step: Callable[[Config], None], progress: _Progress) -> None:
    cfg = _config()
    # env.py hands it to Alembic, which calls it after each revision (its version row written, in the transaction).
    cfg.attributes["on_version_apply"] = progress.applied
    with _migrating(engine, progress) as conn:
        cfg.attributes["connection"] = conn
        progress.next_step()
        step(cfg)


class _Progress:
    """What a migration is doing, said in the log as it goes: each phase (the copy kept before migrating, each
    revision, the reference check) as it begins and as it ends with its time, and while one lasts, a line every
    ``every`` seconds from a thread of its own. A migration of a big database takes a while (issue 44: 10M metric
    points); a server that says nothing meanwhile looks hung and gets restarted mid-migration."""

    def __init__(self, every: float | None = None) -> None:
        self.every = PROGRESS_EVERY if every is None else every
        self._what: str | None = None
        self._since = self._said = time.monotonic()  # when the phase began; when it was last said to go on
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="migration-progress", daemon=True)
        self._plan: list[Script] = []
        self._word = "to"
        self._done = 0

    def __enter__(self) -> _Progress:
        self._watcher.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._watcher.join()

    def begin(self, what: str, detail: str = "", *, say: bool = True) -> None:
        with self._lock:
            self._what, self._since = what, time.monotonic()
            self._said = self._since
        if say:
            log.info("%s%s", what, detail)

    def end(self) -> float:
        """Seconds since the phase began; the watcher stops repeating it."""
        with self._lock:
            self._what = None
            return time.monotonic() - self._since

    def steps(self, plan: list[Script], word: str) -> None:
        self._plan, self._word, self._done = plan, word, 0

    def next_step(self) -> None:
        if not self._plan:
            self.begin(f"migrating {self._word} the next revision", say=False)  # said once it is known
        elif self._done < len(self._plan):
            script = self._plan[self._done]
            summary = (script.doc or "").strip().splitlines()[0][:120] if script.doc else ""
            self.begin(f"migrating {self._word} {script.revision}{self._numbered()}", f": {summary}" if summary else "")

    def applied(self, *, step: MigrationInfo, **_: object) -> None:
        """Alembic's ``on_version_apply``: one revision applied (or, going down, removed)."""
        took = self.end()
        log.info("migrated %s %s%s in %.1f s", self._word, step.up_revision_id, self._numbered(), took)
        self._done += 1
        self.next_step()

    def _numbered(self) -> str:
        return f" (step {self._done + 1} of {len(self._plan)})" if self._plan else ""

    def _watch(self) -> None:
        """Every ``every`` seconds of one phase, a line (none for a phase that ends sooner)."""
        while not self._stop.wait(self.every / 4):
            with self._lock:
                what, since, now = self._what, self._since, time.monotonic()
                due = what is not None and now - self._said >= self.every
                if due:
                    self._said = now
            if due:
                log.info("still %s: %.0f s so far", what, now - since)


@contextmanager
def _migrating(engine: Engine, progress: _Progress) -> Iterator[Connection]:
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
                if conn.dialect.name == "postgresql":
                    _allow_idle(conn, MIGRATION_IDLE_SECONDS)
                before = _violations(conn, progress, "before") if raw is not None else set()
                yield conn
                if raw is not None:
                    made = _violations(conn, progress, "after") - before
                    if made:
                        tables = ", ".join(sorted({table for table, _, _ in made}))
                        raise ForeignKeyViolation(
                            f"the migration left {len(made)} row(s) referencing rows that do not exist (in {tables}); "
                            "it was rolled back, nothing was changed"
                        )
        finally:
            if raw is not None:
                raw.execute("PRAGMA foreign_keys=ON")


def _allow_idle(conn: Connection, seconds: int) -> None:
    """For the rest of this transaction: PostgreSQL ends the session only after ``seconds`` without a statement,
    unless its own limit is off (0) or longer already."""
    current = conn.exec_driver_sql(
        "SELECT setting::int FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'"
    ).scalar_one()
    if 0 < current < seconds * 1000:
        conn.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = {seconds * 1000}")
        log.info("migrating with PostgreSQL's idle-in-transaction limit at %d s (it was %g s)", seconds, current / 1000)


def _violations(conn: Connection, progress: _Progress, when: str) -> set[tuple[str, int, str]]:
    """SQLite's dangling references: (table, rowid, the table it references). Every table is checked: at 10M metric
    points one check took 0.5 s (benchmarks/upgrade.py), each reference being a lookup of its parent's rowid or
    primary key, so checking only the tables a migration touched would save little and could miss a row it wrote."""
    progress.begin(f"checking every reference {when} the migration (PRAGMA foreign_key_check)")
    found = {(str(t), int(r or 0), str(p)) for t, r, p, _ in conn.exec_driver_sql("PRAGMA foreign_key_check")}
    log.info("checked every reference %s the migration in %.1f s: %d dangling", when, progress.end(), len(found))
    return found


def is_up_to_date(engine: Engine) -> bool:
    return current_revision(engine) == head_revision()
