"""``kiln admin``: administration of the platform itself. Most of it is offline, run on the server's machine: it
reads $KILN_HOME (the settings, the server key, the database) directly and needs no running server — the way back in
when no platform-admin key works any more. ``kiln admin servers`` asks a server, with a platform admin's key: which
servers share the database and which jobs and task leases each holds."""

from __future__ import annotations

import fcntl
import os
import pwd
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kiln.cli.common import EXIT_USAGE, Output, OutputFormat, connect, emit_json, fail, info, out

if TYPE_CHECKING:
    from kiln.domain.servers import ServerList

app = typer.Typer(
    help="Administration of the platform: offline on the server's machine (backup, restore, recover-key read "
    "$KILN_HOME directly and need no running server), and `servers` (who holds what) through a server.",
    no_args_is_help=True,
)


def _server_running(run_dir: Path) -> bool:
    """Whether a server holds this home's lock (``kiln server`` takes it for as long as it runs)."""
    path = run_dir / "server.lock"
    if not path.exists():
        return False
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
    return False


@app.command("recover-key")
def recover_key(
    user: Annotated[
        str | None,
        typer.Option(
            help="The platform admin to give the key (default: the first one, normally admin). A new name creates "
            "a new platform admin; a disabled one is enabled again."
        ),
    ] = None,
    home: Annotated[Path | None, typer.Option(help="State directory (default: $KILN_HOME, else ~/.kiln).")] = None,
    env_file: Annotated[
        str | None,
        typer.Option(
            help="Where to write the credentials, mode 0600 (default: $KILN_HOME/recovery.env); - prints them."
        ),
    ] = None,
    expires: Annotated[
        str | None,
        typer.Option(help="When the key stops working: a duration from now (30d, 12h) or an ISO-8601 time."),
    ] = None,
) -> None:
    """Create a platform-admin access key straight in the database, with no server (stop a SQLite server first).

    The key's secret is encrypted with the server key like any other. The audit log records it at once (client
    "kiln admin (offline)"), and the server logs it when it next starts."""
    from pydantic import ValidationError

    from kiln.auth.secrets import SecretBox
    from kiln.cli.keys import SECRET_WARNING, env_lines
    from kiln.cli.parsing import parse_expiry
    from kiln.db import migrate
    from kiln.db.session import Database
    from kiln.sdk.config import write_config_file
    from kiln.settings import Settings
    from kiln.usecases.jobs.recovery import recover_platform_admin

    expires_at = None
    if expires is not None:
        try:
            seconds, expires_at = parse_expiry(expires)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--expires") from None
        if seconds is not None:
            expires_at = datetime.now(UTC) + timedelta(seconds=seconds)
    try:
        settings = Settings(**({"home": home} if home is not None else {}))  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        fail(f"invalid settings: {problems}", EXIT_USAGE)

    if settings.home.is_dir() and settings.home.stat().st_uid != os.geteuid():
        owner = settings.home.stat().st_uid
        try:
            owner_name = pwd.getpwuid(owner).pw_name
        except KeyError:
            owner_name = str(owner)
        # Files this would create (the database's journal, recovery.env) would not be the server's to open.
        fail(f"{settings.home} belongs to {owner_name}: run this as the server's user (sudo -u {owner_name} ...)")
    default_db = settings.database_url is None
    if default_db and not (settings.home / "kiln.db").exists():
        fail(f"no Kiln database in {settings.home}: is KILN_HOME the server's? (a server makes it at its first start)")
    running = _server_running(settings.run_dir)
    if running and default_db:
        fail(
            f"a Kiln server is running with KILN_HOME={settings.home}: its SQLite database is its alone while it "
            "runs; stop it, then run this again"
        )
    if settings.server_key:
        key = settings.server_key.encode()
    elif (settings.home / "server.key").exists():
        key = (settings.home / "server.key").read_bytes().strip()
    else:
        fail(f"no server key in {settings.home} (server.key) and no KILN_SERVER_KEY: the stored keys need it")

    db = Database(settings.resolved_database_url)
    try:
        migrate.upgrade(db.engine)  # what the server does at start: the offline_actions table may be new
        done = recover_platform_admin(db, SecretBox(key), user_name=user, expires_at=expires_at)
    finally:
        db.dispose()

    what = " (a new platform admin)" if done.created_user else (" (enabled again)" if done.reenabled_user else "")
    info(f"created platform-admin access key {done.key_id} for user {done.user_name}{what}, org {done.org_name}")
    if env_file == "-":
        sys.stdout.write(env_lines(settings.endpoint, done.key_id, done.secret_key))
        sys.stdout.flush()
        info(f"warning: {SECRET_WARNING}")
    else:
        path = Path(env_file) if env_file else settings.home / "recovery.env"
        write_config_file(path, settings.endpoint, done.key_id, done.secret_key)
        info(f"credentials written to {path} (mode 0600): set -a; . {path}; set +a")
    info(f"audit event {done.audit_event_id} records it; the server logs it when it next starts")
    if running:
        info("a server shares this database and is running: the key works with it now")


def _settings(home: Path | None) -> Any:
    from pydantic import ValidationError

    from kiln.settings import Settings

    try:
        return Settings(**({"home": home} if home is not None else {}))  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        fail(f"invalid settings: {problems}", EXIT_USAGE)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


@app.command("backup")
def backup(
    dest: Annotated[Path, typer.Argument(help="A new (or empty) directory to write the backup into.")],
    home: Annotated[Path | None, typer.Option(help="State directory (default: $KILN_HOME, else ~/.kiln).")] = None,
) -> None:
    """Copy a server's state while it runs: the database (SQLite's backup API, or pg_dump -Fc), the server key,
    the logs and a local store, with a manifest of every file's SHA-256 (docs/operations.md).

    The backup holds the server key and every encrypted secret: keep it as private as the home (it is written mode
    0700). An S3 store is listed (keys, sizes, ETags), not copied."""
    from kiln.db.backup import BackupError
    from kiln.usecases.operations.backup import backup_home

    settings = _settings(home)
    try:
        done = backup_home(settings, dest)
    except BackupError as exc:
        fail(str(exc))
    info(
        f"backed up {settings.home} to {done.path}: {done.database} database at migration {done.revision}, "
        f"{done.files} files, {_size(done.bytes)} in {done.seconds:.1f} s"
    )
    for note in done.notes:
        info(f"note: {note}")


@app.command("restore")
def restore(
    source: Annotated[Path, typer.Argument(help="A directory `kiln admin backup` wrote.")],
    home: Annotated[
        Path | None, typer.Option(help="The home to restore into (default: $KILN_HOME, else ~/.kiln).")
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Restore over a home that is not empty (moved aside to HOME.before-restore-TIME) or a PostgreSQL "
            "database that holds tables (what the backup holds is replaced).",
        ),
    ] = False,
) -> None:
    """Put a backup back as a server's home (and, for PostgreSQL, into the database of $KILN_DATABASE_URL).

    Every file is checked against the backup's manifest before anything is written; the home is assembled under a
    temporary name and renamed into place, a PostgreSQL dump is loaded in one transaction. Start the server after:
    it migrates a backup of an older release as it starts."""
    from kiln.db.backup import BackupError
    from kiln.usecases.operations.backup import restore_home

    settings = _settings(home)
    if _server_running(settings.run_dir):
        fail(f"a Kiln server is running with KILN_HOME={settings.home}: stop it before restoring into its home")
    try:
        done = restore_home(settings, source, force=force)
    except BackupError as exc:
        fail(str(exc))
    info(
        f"restored {source} into {done.path}: {done.database} database at migration {done.revision}, "
        f"{done.files} files, {_size(done.bytes)} checked and copied in {done.seconds:.1f} s"
    )
    for note in done.notes:
        info(f"note: {note}")


@app.command("servers")
def servers(
    wide: Annotated[bool, typer.Option("--wide", "-w", help="List the ids of the jobs each server holds.")] = False,
    output: Output = OutputFormat.table,
) -> None:
    """Which servers share the database, whether each is live, and the jobs and task leases each holds (platform
    admins). A job held by a server that is not live waits for its lease to run out; another server then takes it
    over (its events say so: TakenOver)."""
    with connect() as client:
        listed = client.servers()
    if output is OutputFormat.json:
        emit_json(listed.model_dump(mode="json"))
    elif not listed.items:
        info("no server has recorded itself in the database yet")
    else:
        _servers_table(listed, wide)


def _servers_table(listed: ServerList, wide: bool) -> None:
    from rich.table import Table
    from rich.text import Text

    from kiln.cli.output import _table, fmt_duration, fmt_time

    table: Table = _table("SERVER", "HOST", "PID", "VERSION", "STARTED", "LAST HEARTBEAT", "LIVE", "JOBS", "LEASES")
    table.columns[0].no_wrap = True
    for server in listed.items:
        if server.live_until is None:
            live = Text("yes" if server.live else "no", style="green" if server.live else "red")
        elif server.live:
            live = Text(f"yes, {fmt_duration((server.live_until - listed.now).total_seconds())} left", style="green")
        else:
            live = Text(f"no, for {fmt_duration((listed.now - server.live_until).total_seconds())}", style="red")
        jobs = str(server.jobs)
        if wide and server.job_ids:
            jobs += ": " + " ".join(server.job_ids)
        table.add_row(
            Text(server.id),
            Text(server.host or "-"),
            Text("-" if server.pid is None else str(server.pid)),
            Text(server.version or "-"),
            fmt_time(server.started_at),
            fmt_time(server.seen_at),
            live,
            Text(jobs),
            Text(" ".join(server.task_leases) or "-"),
        )
    out.print(table)
