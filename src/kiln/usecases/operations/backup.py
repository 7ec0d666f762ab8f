"""``kiln admin backup`` and ``restore``: a copy of a server's state made while it runs, and put back whole.

A backup is a directory:

- ``database/kiln.db`` (and ``kiln-optuna.db``, the tuning studies' storage) through SQLite's backup API, or
  ``database/kiln.pgdump`` (``pg_dump -Fc``, one snapshot; the studies' schema is in the same database);
- ``keys/server.key``, the Fernet key every stored secret is encrypted with (without it the database's access keys
  and service tokens are lost), and ``keys/admin.env``, the first admin's credentials, when the home has them;
- ``logs/``, the jobs' logs this server holds, and ``store/``, the object store, when it is a local directory
  (copies, not links); an S3 store is not copied (it is the operator's to replicate or version), only listed:
  ``store-objects.jsonl`` holds each key with its size and ETag as they were just after the database's copy;
- ``manifest.json``: the Kiln version, the database's kind and migration revision, and every file's size and
  SHA-256, written last. Restore checks every file against it before anything is put in place.

The database is copied first and the files after: objects are written to the store before the database rows that
name them, so whatever the copied database refers to is in the copy of the store (the store may hold more: objects
of work that went on during the backup, unreferenced). The backup is written under a temporary name beside its
destination and renamed when complete.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kiln.db import backup as dbcopy
from kiln.db.backup import BackupError
from kiln.settings import Settings
from kiln.storage.snapshot import Copied, copy_hashed, copy_tree, fsync_tree
from kiln.version import full_version

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = 1
SECRET_FILES = ("server.key", "admin.env")
OPTUNA_DB = "kiln-optuna.db"  # beside kiln.db: kiln.usecases.tuning.tuning_engine.storage_location


def _skip_in_store(name: str) -> bool:
    # A local store's uploads in flight (storage/store.py writes them as .upload-* and renames them).
    return name.startswith(".upload-")


@dataclass
class Summary:
    """What a backup or restore did, for the operator."""

    path: Path
    database: str
    revision: str | None
    files: int
    bytes: int
    seconds: float
    notes: list[str] = field(default_factory=list)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def _staging(final: Path, what: str) -> Path:
    """A new private directory beside ``final``, renamed onto it once complete (one file system: an atomic rename)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    path = final.parent / f".{final.name}.{what}-{secrets.token_hex(4)}"
    path.mkdir(mode=0o700)
    return path


def _local_store_root(settings: Settings) -> Path | None:
    url = settings.resolved_storage_url
    if "://" in url:
        return Path(url.removeprefix("file://")) if url.startswith("file://") else None
    return Path(url)


# -- backup ---------------------------------------------------------------------------------------------------


def backup_home(settings: Settings, dest: Path) -> Summary:
    """Copy the state of the server of ``settings`` (which may be running) into the new directory ``dest``."""
    if dest.exists() and not _empty_dir(dest):
        raise BackupError(f"{dest} exists and is not empty: a backup goes into a new directory")
    started = time.monotonic()
    staging = _staging(dest, "partial")
    try:
        manifest, notes = _write_backup(settings, staging)
        fsync_tree(staging)
        if dest.exists():
            dest.rmdir()
        os.rename(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    files = manifest["files"]
    return Summary(
        dest,
        manifest["database"]["kind"],
        manifest["database"]["revision"],
        len(files),
        sum(f["size"] for f in files),
        time.monotonic() - started,
        notes,
    )


def _write_backup(settings: Settings, out: Path) -> tuple[dict[str, Any], list[str]]:
    files: list[Copied] = []
    notes: list[str] = []
    database = _backup_database(settings, out, files)
    keys = out / "keys"
    keys.mkdir(mode=0o700)
    server_key: dict[str, Any] = {"in_backup": False}
    if settings.server_key:
        server_key["source"] = "KILN_SERVER_KEY"
        notes.append("the server key comes from KILN_SERVER_KEY and is not in the backup: keep it with the backup")
    for name in SECRET_FILES:
        path = settings.home / name
        if path.is_file() and not (name == "server.key" and settings.server_key):
            size, sha = copy_hashed(path, keys / name)
            os.chmod(keys / name, 0o600)
            files.append(Copied(f"keys/{name}", size, sha))
            if name == "server.key":
                server_key = {"in_backup": True, "source": "server.key"}
    logs, _ = copy_tree(settings.logs_dir, out / "logs", "logs")
    files += logs
    store: dict[str, Any]
    root = _local_store_root(settings)
    if root is not None:
        copied, vanished = copy_tree(root, out / "store", "store", skip=_skip_in_store)
        files += copied
        store = {"kind": "local", "objects": len(copied)}
        if vanished:
            notes.append(f"{len(vanished)} store object(s) were removed while the backup ran (not in it)")
    else:
        store = _list_s3(settings, out, files)
        notes.append(
            f"the S3 store {store['url']} is not copied: store-objects.jsonl lists its {store['objects']} keys"
        )
    manifest = {
        "format": FORMAT,
        "kiln_version": full_version(),
        "created_at": _now(),
        "database": database,
        "server_key": server_key,
        "store": store,
        "files": [f.as_dict() for f in files],
    }
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, out / MANIFEST)
    return manifest, notes


def _backup_database(settings: Settings, out: Path, files: list[Copied]) -> dict[str, Any]:
    (out / "database").mkdir(mode=0o700)
    url = settings.resolved_database_url
    path = dbcopy.sqlite_path(url)
    if path is not None:
        if not path.exists():
            raise BackupError(
                f"no database at {path}: is KILN_HOME the server's? (a server makes it at its first start)"
            )
        names = [(path, "kiln.db")]
        optuna = path.with_name(f"{path.stem}-optuna{path.suffix or '.db'}")
        if optuna.exists():
            names.append((optuna, OPTUNA_DB))
        for source, name in names:
            size, sha = dbcopy.sqlite_copy(source, out / "database" / name)
            files.append(Copied(f"database/{name}", size, sha))
        return {"kind": "sqlite", "revision": dbcopy.sqlite_revision(out / "database" / "kiln.db")}
    if not url.startswith("postgresql"):
        raise BackupError(f"kiln admin backup copies SQLite and PostgreSQL databases, not {url.split(':', 1)[0]}")
    import hashlib

    revision = _pg_revision(url)
    digest = hashlib.sha256()
    dumped = [0]

    def seen(chunk: bytes) -> None:
        digest.update(chunk)
        dumped[0] += len(chunk)

    dbcopy.pg_dump(url, out / "database" / "kiln.pgdump", seen)
    files.append(Copied("database/kiln.pgdump", dumped[0], digest.hexdigest()))
    return {"kind": "postgresql", "revision": revision}


def _pg_revision(url: str) -> str | None:
    from kiln.db import migrate
    from kiln.db.session import make_engine

    engine = make_engine(url)
    try:
        return migrate.current_revision(engine)
    finally:
        engine.dispose()


def _list_s3(settings: Settings, out: Path, files: list[Copied]) -> dict[str, Any]:
    from kiln.storage.store import ObjectStore

    store = ObjectStore(settings.resolved_storage_url, **settings.storage_options)
    found: dict[str, Any] = store.fs.find(store.root, detail=True)
    count = 0
    with open(out / "store-objects.jsonl", "w") as fh:
        for path, info in sorted(found.items()):
            if info.get("type") == "directory":
                continue
            etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
            key = path[len(store.root) :].lstrip("/")
            fh.write(json.dumps({"key": key, "size": int(info.get("size") or 0), "etag": etag}) + "\n")
            count += 1
    size, sha = dbcopy.file_digest(out / "store-objects.jsonl")
    files.append(Copied("store-objects.jsonl", size, sha))
    return {"kind": "s3", "url": store.url, "objects": count}


# -- restore --------------------------------------------------------------------------------------------------


def read_manifest(backup: Path) -> dict[str, Any]:
    try:
        manifest: dict[str, Any] = json.loads((backup / MANIFEST).read_text())
    except FileNotFoundError:
        raise BackupError(f"{backup} is not a Kiln backup (no {MANIFEST}; an unfinished one has none)") from None
    except ValueError as exc:
        raise BackupError(f"{backup / MANIFEST} is not valid JSON: {exc}") from None
    if manifest.get("format") != FORMAT:
        raise BackupError(f"{backup} is a backup of format {manifest.get('format')}; this Kiln reads format {FORMAT}")
    return manifest


def verify(backup: Path, manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check every file of the backup against its manifest (size, then SHA-256); raise naming the first that
    differs or is missing."""
    manifest = manifest or read_manifest(backup)
    for entry in manifest["files"]:
        path = backup / entry["path"]
        if not path.is_file():
            raise BackupError(f"the backup is damaged: {entry['path']} is missing")
        size, sha = dbcopy.file_digest(path)
        if size != entry["size"] or sha != entry["sha256"]:
            raise BackupError(
                f"the backup is damaged: {entry['path']} does not match its manifest "
                f"({size} bytes, SHA-256 {sha[:12]}…; the manifest says {entry['size']} bytes, {entry['sha256'][:12]}…)"
            )
    return manifest


def _check_revision(manifest: dict[str, Any]) -> None:
    """A backup whose database is at a revision this Kiln does not have was made by a newer release."""
    from alembic.script import ScriptDirectory

    from kiln.db import migrate

    revision = manifest["database"].get("revision")
    if revision is None:
        return
    if ScriptDirectory.from_config(migrate._config()).get_revision(revision) is None:
        raise BackupError(
            f"the backup's database is at migration {revision}, which Kiln {full_version()} does not know: it was "
            f"made by a newer Kiln ({manifest.get('kiln_version')}); restore it with that release"
        )


def restore_home(settings: Settings, backup: Path, *, force: bool = False) -> Summary:
    """Put the backup at ``backup`` in place as the home (and database) of ``settings``.

    Every file is checked against the manifest first. The home is assembled under a temporary name beside it and
    renamed into place last; a PostgreSQL dump is loaded in one transaction. A non-empty home, or a PostgreSQL
    database that holds tables, is refused unless ``force``: the old home is then moved aside, not deleted."""
    started = time.monotonic()
    manifest = verify(backup)
    _check_revision(manifest)
    home = settings.home
    if home.exists() and not _empty_dir(home) and not force:
        raise BackupError(f"{home} is not empty: restore into a new home, or pass --force to move this one aside")
    database = manifest["database"]
    url = settings.resolved_database_url
    path = dbcopy.sqlite_path(url)
    if (database["kind"] == "sqlite") != (path is not None):
        target = "SQLite" if path is not None else "PostgreSQL"
        raise BackupError(f"the backup holds a {database['kind']} database and KILN_DATABASE_URL names {target}")
    if path is not None and home.resolve() not in path.resolve().parents:
        raise BackupError(f"restore puts the SQLite database in the home; KILN_DATABASE_URL names {path}, outside it")
    root = _local_store_root(settings)
    if manifest["store"]["kind"] == "local" and (root is None or home.resolve() not in root.resolve().parents):
        raise BackupError("the backup holds a local store; restore puts it in the home (KILN_STORAGE_URL unset)")
    notes: list[str] = []
    if database["kind"] == "postgresql":
        empty = dbcopy.pg_is_empty(url)
        if not empty and not force:
            raise BackupError(
                "the PostgreSQL database of KILN_DATABASE_URL holds tables: restore into a new database "
                "(CREATE DATABASE), or pass --force to replace what the backup holds"
            )
    staging = _staging(home, "restore")
    try:
        count, size = _assemble(settings, manifest, backup, staging, path, root)
        if database["kind"] == "postgresql":
            dbcopy.pg_restore(url, backup / "database" / "kiln.pgdump", clean=not empty)
        fsync_tree(staging)
        if home.exists():
            if _empty_dir(home):
                home.rmdir()
            else:
                aside = home.with_name(f"{home.name}.before-restore-{datetime.now(UTC):%Y%m%dT%H%M%S}")
                os.rename(home, aside)
                notes.append(f"the home that was there is now {aside}")
        os.rename(staging, home)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if manifest["server_key"].get("source") == "KILN_SERVER_KEY":
        notes.append("the backup's server key came from KILN_SERVER_KEY: set it to the same key before starting")
    if manifest["store"]["kind"] == "s3":
        notes.append(f"the S3 store is not in the backup: {backup / 'store-objects.jsonl'} lists what it held")
    return Summary(home, database["kind"], database.get("revision"), count, size, time.monotonic() - started, notes)


def _assemble(
    settings: Settings,
    manifest: dict[str, Any],
    backup: Path,
    staging: Path,
    database: Path | None,
    store: Path | None,
) -> tuple[int, int]:
    """Copy the backup's files into ``staging`` (the future home), each where ``settings`` will look for it."""
    home = settings.home.resolve()
    places = {
        "keys/": staging,
        "logs/": staging / settings.logs_dir.resolve().relative_to(home),
    }
    if store is not None:
        places["store/"] = staging / store.resolve().relative_to(home)
    count = size = 0
    for entry in manifest["files"]:
        name: str = entry["path"]
        if name.startswith("database/"):
            if database is None:
                continue  # the dump: pg_restore reads it where it is
            rel = database.resolve().relative_to(home)
            optuna = rel.with_name(f"{rel.stem}-optuna{rel.suffix or '.db'}")  # tuning_engine.storage_location
            target = staging / (rel if name == "database/kiln.db" else optuna)
        elif name == "store-objects.jsonl":
            continue
        else:
            prefix = name.split("/", 1)[0] + "/"
            target = places[prefix] / name.removeprefix(prefix)
        got, sha = copy_hashed(backup / name, target)
        if got != entry["size"] or sha != entry["sha256"]:  # changed since verify(): nothing is in place yet
            raise BackupError(f"the backup is damaged: {name} changed while it was being restored")
        if name.startswith(("keys/", "database/")):
            os.chmod(target, 0o600)
        count += 1
        size += got
    return count, size
