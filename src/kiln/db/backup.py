"""Consistent copies of a live database: SQLite through its online backup API, PostgreSQL through ``pg_dump -Fc``
(and ``pg_restore`` back). Used by ``kiln admin backup``/``restore`` (kiln.usecases.operations.backup) and by the
migration
runner, which copies a SQLite database aside before it migrates it (``keep_before_migrating``)."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import URL, make_url

log = logging.getLogger(__name__)

# Pages per backup step (4 KiB pages: 16 MiB). Between steps SQLite lets go of its read lock, so a step this size
# keeps the server's writers waiting for no more than a few milliseconds, and the per-step overhead is nil.
STEP_PAGES = 4096
# A write by another connection between two steps restarts the copy from its first page; a server writing faster
# than the copy can finish would restart it forever. After this many restarts the rest is copied in one step: one
# read transaction, which in WAL mode (Kiln's) blocks no writer, only holds back checkpoints until it ends.
MAX_RESTARTS = 2
KEEP_BEFORE_MIGRATING = 3  # kiln.db.before-<revision> files kept beside the database
CHUNK = 1024 * 1024


class BackupError(Exception):
    """A backup could not be made, checked or restored (the message says which file or tool, and why); the CLI
    prints it as one line. Not a KilnError: no API answers with it."""


class _Restarting(Exception):
    pass


def sqlite_path(url: str | URL) -> Path | None:
    """The file of a SQLite URL; None for another database or an in-memory one."""
    parsed = make_url(url) if isinstance(url, str) else url
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:") or database.startswith("file:"):
        return None
    return Path(database)


def sqlite_copy(source: Path, dest: Path, step_pages: int = STEP_PAGES) -> tuple[int, str]:
    """A consistent copy of the SQLite database ``source`` (live: other processes may write it meanwhile) at
    ``dest``, written beside it under a temporary name and renamed, so ``dest`` is never half a database. Returns
    the copy's (size, SHA-256): hashed from the page cache while the copy is synced to disk, the two overlap (one
    after the other, they took 1.6 times as long as `sqlite3 .backup`)."""
    partial = dest.with_name(dest.name + ".partial")
    partial.unlink(missing_ok=True)
    src = sqlite3.connect(source, timeout=30)
    try:
        try:
            _backup(src, partial, step_pages)
        except _Restarting:
            log.info("the database kept changing under a stepwise copy: copying %s in one read transaction", source)
            partial.unlink(missing_ok=True)
            _backup(src, partial, -1)
        with ThreadPoolExecutor(1) as pool:  # hashlib and fsync both release the GIL
            hashed = pool.submit(file_digest, partial)
            with open(partial, "rb+") as fh:
                os.fsync(fh.fileno())
            digest = hashed.result()
        os.chmod(partial, 0o600)  # every encrypted secret and the audit log, as the database itself
        os.replace(partial, dest)
        return digest
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        src.close()


def _backup(src: sqlite3.Connection, dest: Path, pages: int) -> None:
    last = [-1, 0]  # remaining after the previous step, restarts seen

    def progress(_status: int, remaining: int, _total: int) -> None:
        if last[0] >= 0 and remaining > last[0]:
            last[1] += 1
            if last[1] > MAX_RESTARTS:
                raise _Restarting
        last[0] = remaining

    dst = sqlite3.connect(dest)
    try:
        # The copy is synced once when it is complete (sqlite_copy), not page by page.
        dst.execute("PRAGMA synchronous=OFF")
        # An exception in ``progress`` (_Restarting) ends the copy and comes out of backup() as it is.
        src.backup(dst, pages=pages, progress=progress if pages > 0 else None, sleep=0.05)
    finally:
        dst.close()


def sqlite_revision(path: Path) -> str | None:
    """The Alembic revision a SQLite database file is at (None: no alembic_version table, or an empty one)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.OperationalError:
        return None
    finally:
        conn.close()
    return str(row[0]) if row else None


def keep_before_migrating(database: Path, revision: str, keep: int = KEEP_BEFORE_MIGRATING) -> Path:
    """Copy the SQLite database aside as ``<name>.before-<revision>`` before a migration changes it, and remove all
    but the ``keep`` newest such copies: a migration that goes wrong (as 20261205_0016 did, deleting every metric
    point) is undone by stopping the server and putting the copy back."""
    dest = database.with_name(f"{database.name}.before-{revision}")
    sqlite_copy(database, dest)
    copies = sorted(database.parent.glob(f"{database.name}.before-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in (p for p in copies[keep:] if not p.name.endswith(".partial")):
        old.unlink(missing_ok=True)
        log.info("removed %s (the last %d copies from before a migration are kept)", old, keep)
    return dest


# -- PostgreSQL ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PgTarget:
    """How libpq's tools reach a database: a URL without the password, which goes in PGPASSWORD (a command line
    is readable by every user of the machine)."""

    conninfo: str
    env: dict[str, str]


def pg_target(url: str) -> PgTarget:
    parsed = make_url(url)
    env = dict(os.environ)
    if parsed.password is not None:
        env["PGPASSWORD"] = str(parsed.password)
    bare = parsed.set(drivername="postgresql", password=None)
    return PgTarget(bare.render_as_string(hide_password=False), env)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BackupError(
            f"{name} is not installed (not on PATH): PostgreSQL databases are copied with {name}; install "
            "PostgreSQL's client tools of the server's major version or newer (Debian: postgresql-client)"
        )
    return path


def pg_dump(url: str, dest: Path, on_bytes: Callable[[bytes], None] | None = None) -> None:
    """``pg_dump -Fc`` of the database at ``url`` into ``dest``: one snapshot (a REPEATABLE READ transaction), so
    the servers using it go on meanwhile. The dump streams through this process, each chunk given to ``on_bytes``
    (a hash) as it is written."""
    target = pg_target(url)
    cmd = [_tool("pg_dump"), "--format=custom", "--no-password", f"--dbname={target.conninfo}"]
    with open(dest, "wb") as out:
        os.fchmod(out.fileno(), 0o600)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=target.env)
        assert proc.stdout is not None and proc.stderr is not None
        while chunk := proc.stdout.read(CHUNK):
            out.write(chunk)
            if on_bytes is not None:
                on_bytes(chunk)
        err = proc.stderr.read().decode(errors="replace").strip()
        if proc.wait() != 0:
            raise BackupError(f"pg_dump failed (exit {proc.returncode}): {err or 'no message'}")
        out.flush()
        os.fsync(out.fileno())


def pg_is_empty(url: str) -> bool:
    """Whether the database at ``url`` holds no table of anyone's (a fresh ``CREATE DATABASE``)."""
    import psycopg

    target = pg_target(url)
    password = target.env.get("PGPASSWORD")
    with psycopg.connect(target.conninfo, password=password, connect_timeout=10) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
        ).fetchone()
    return not row or int(row[0]) == 0


def pg_restore(url: str, dump: Path, *, clean: bool = False) -> None:
    """Load a ``pg_dump -Fc`` file into the database at ``url`` in one transaction: it is there whole, or nothing
    changed. ``clean`` drops what the dump holds first (restoring over a database in use)."""
    target = pg_target(url)
    cmd = [
        _tool("pg_restore"),
        "--single-transaction",
        "--exit-on-error",
        "--no-owner",  # the restoring role owns what it creates: it need not be the role that dumped
        "--no-privileges",
        "--no-password",
        f"--dbname={target.conninfo}",
    ]
    if clean:
        cmd += ["--clean", "--if-exists"]
    done = subprocess.run([*cmd, str(dump)], capture_output=True, env=target.env, check=False)
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()
        raise BackupError(f"pg_restore failed (exit {done.returncode}), nothing was restored: {err or 'no message'}")


def file_digest(path: Path) -> tuple[int, str]:
    """(size, SHA-256 hex) of a file, read in large chunks (hashlib releases the GIL on them)."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK * 4):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()
