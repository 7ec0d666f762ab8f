"""Platform-admin access cannot be lost through the API, and can be recovered offline.

The last working platform-admin key cannot be disabled or deleted, nor the last platform admin disabled (409),
also when two such requests race (on SQLite and PostgreSQL); ``kiln admin recover-key``, run with no server on
the server's KILN_HOME, makes a key that works once the server is back, and the audit log and the server's log
say so."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import event, select, update

from kiln.auth.secrets import SecretBox, new_access_key_id
from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import AccessKey, AuditEvent, OfflineAction, Organization, User, utcnow
from kiln.errors import Conflict, KilnError, Unauthenticated
from kiln.sdk.client import Client
from kiln.sdk.config import read_config_file
from kiln.settings import Settings
from kiln.usecases.access.accounts import AccountService
from kiln.usecases.access.identity import IdentityService, Principal
from kiln.usecases.jobs.recovery import announce_offline_actions, recover_platform_admin
from tests.kilnserver import KilnServer, free_port


def kiln_admin(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kiln", "admin", "recover-key", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def client_from(path: Path, url: str) -> Client:
    creds = read_config_file(path)
    return Client(url, creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"])


# -- through a real server -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    server = KilnServer(tmp_path_factory.mktemp("recovery") / "home").start()
    try:
        yield server
    finally:
        server.stop()


def test_the_last_admin_key_and_user_stay_and_a_recovery_key_is_made_offline(server: KilnServer) -> None:
    admin = server.client()
    first = server.credentials()["KILN_ACCESS_KEY"]

    # The sole platform admin's only key: neither disabled nor deleted, and it still works afterwards.
    with pytest.raises(Conflict) as refused:
        admin.disable_key(first)
    assert "last enabled platform-admin key" in refused.value.message
    assert refused.value.details == {"reason": "last_platform_admin_key"}
    with pytest.raises(Conflict, match="last enabled platform-admin key"):
        admin.delete_key(first)
    with pytest.raises(Conflict, match="last enabled platform admin") as refused:
        admin.disable_user("admin")
    assert refused.value.details == {"reason": "last_platform_admin"}
    assert admin.whoami().platform_admin
    assert [k.enabled for k in admin.list_keys("admin")] == [True]

    # With a second working key the first can go; then the second is the last.
    second = admin.create_key("admin", description="second")
    with Client(server.url, second.id, second.secret_key) as other:
        assert not other.disable_key(first).enabled
        with pytest.raises(Unauthenticated):
            admin.whoami()
        with pytest.raises(Conflict, match=f"access key {second.id} is the last"):
            other.disable_key(second.id)
        other.delete_key(first)  # a key that opens nothing may go

        # Offline recovery refuses while the SQLite server runs: its database is its alone.
        running = kiln_admin(server.env)
        assert running.returncode == 1 and "is running" in running.stderr, running.stderr

        server.stop()
        env = {**server.env, "KILN_ENDPOINT": f"http://127.0.0.1:{free_port()}"}  # nothing listens: not needed
        done = kiln_admin(env)
        assert done.returncode == 0, done.stderr
        recovery = server.home / "recovery.env"
        assert stat.S_IMODE(recovery.stat().st_mode) == 0o600
        key_id = read_config_file(recovery)["KILN_ACCESS_KEY"]
        assert f"created platform-admin access key {key_id} for user admin" in done.stderr
        assert "kiln admin recover-key" not in server.log()

        server.start()
        with client_from(recovery, server.url) as recovered:
            me = recovered.whoami()
            assert (me.user_name, me.platform_admin, me.access_key) == ("admin", True, key_id)
            events = recovered.audit(action="admin_recover_key")
            assert [(e.resource, e.client, e.outcome, e.user_id) for e in events] == [
                (f"id={key_id}", "kiln admin (offline)", "success", me.user_id)
            ]
            assert f"a platform-admin access key {key_id} for user admin was created offline" in server.log()
            assert other.disable_key(second.id).enabled is False  # the recovered key is the last one now
            with pytest.raises(Conflict):
                recovered.disable_key(key_id)
    admin.close()


def test_recover_key_needs_no_server(tmp_path: Path, database_url: str) -> None:
    """A home whose server never ran as a process here: the command works on the database alone (and migrates it,
    here from before the offline_actions table); the next start's announcement logs it once."""
    home = tmp_path / "home"
    home.mkdir()
    server_key = Fernet.generate_key()
    (home / "server.key").write_bytes(server_key + b"\n")
    db = Database(database_url)
    try:
        migrate.upgrade(db.engine, "20261130_0005")
        with db.transaction() as s:  # what the first start makes
            s.add(Organization(id="org-admin", name="admin"))
            s.flush()
            s.add(User(id="usr-admin", org_id="org-admin", name="admin", role="admin", platform_admin=True))
            s.flush()
            s.add(AccessKey(id="AKFIRST", user_id="usr-admin", secret_encrypted=SecretBox(server_key).seal("s")))
    finally:
        db.dispose()

    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update(KILN_HOME=str(home), KILN_DATABASE_URL=database_url, KILN_PORT=str(free_port()))
    done = kiln_admin(env, "--user", "ops", "--env-file", "-", "--expires", "30d")
    assert done.returncode == 0, done.stderr
    assert "(a new platform admin)" in done.stderr
    printed = dict(line.split("=", 1) for line in done.stdout.splitlines())

    db = Database(database_url)
    try:
        assert migrate.is_up_to_date(db.engine)
        with db.read() as s:
            key, user = s.execute(
                select(AccessKey, User).join(User).where(AccessKey.id == printed["KILN_ACCESS_KEY"])
            ).one()
            assert SecretBox(server_key).open(key.secret_encrypted) == printed["KILN_SECRET_KEY"]
            assert (user.name, user.platform_admin, user.role) == ("ops", True, "admin")
            assert key.expires_at is not None
            audit = s.scalars(select(AuditEvent).where(AuditEvent.action == "admin_recover_key")).one()
            assert (audit.client, audit.resource, audit.user_id) == ("kiln admin (offline)", f"id={key.id}", user.id)
            assert "created the user" in audit.detail
        logged = announce_offline_actions(db)
        assert len(logged) == 1 and key.id in logged[0] and f"audit event {audit.id}" in logged[0]
        assert announce_offline_actions(db) == []  # once

        # Recovery gives access back; it promotes nobody, and it needs the server's own key.
        with db.transaction() as s:
            org = s.scalars(select(Organization)).one()
            s.add(User(id="usr-member", org_id=org.id, name="mia", role="member"))
        with pytest.raises(Conflict, match="not a platform admin"):
            recover_platform_admin(db, SecretBox(server_key), user_name="mia")
        with pytest.raises(KilnError, match="does not open the stored access keys"):
            recover_platform_admin(db, SecretBox(Fernet.generate_key()))
        with db.read() as s:
            assert len(s.scalars(select(OfflineAction)).all()) == 1
    finally:
        db.dispose()


def test_recover_key_on_a_home_without_a_database(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env["KILN_HOME"] = str(tmp_path / "empty")
    result = kiln_admin(env)
    assert result.returncode == 1 and "no Kiln database" in result.stderr
    result = kiln_admin(env, "--expires", "nonsense")
    assert result.returncode == 2 and "--expires" in result.stderr
    if os.geteuid() == 0:  # root on another user's home would leave files the server cannot open
        other = tmp_path / "other"
        other.mkdir()
        os.chown(other, 65534, 65534)
        result = kiln_admin({**env, "KILN_HOME": str(other)})
        assert result.returncode == 1 and "run this as the server's user" in result.stderr, result.stderr
    assert not (tmp_path / "empty" / "kiln.db").exists()


# -- races, at the service -------------------------------------------------------------------------------------


@pytest.fixture
def accounts(tmp_path: Path, database_url: str) -> Iterator[tuple[Database, AccountService]]:
    db = Database(database_url)
    migrate.upgrade(db.engine)
    key = Fernet.generate_key()
    box = SecretBox(key)
    identity = IdentityService(db, box, Settings(home=tmp_path / "home", database_url=database_url), key)
    try:
        yield db, AccountService(db, box, identity)
    finally:
        db.dispose()


def admins(db: Database, *names: str, keys: int = 1) -> dict[str, tuple[Principal, list[str]]]:
    """Platform admins, each with ``keys`` enabled keys: name → (a principal for them, their key ids)."""
    out: dict[str, tuple[Principal, list[str]]] = {}
    with db.transaction() as s:
        s.add(Organization(id="org-admin", name="admin"))
        s.flush()
        for name in names:
            s.add(User(id=f"usr-{name}", org_id="org-admin", name=name, role="admin", platform_admin=True))
            s.flush()
            ids = [new_access_key_id() for _ in range(keys)]
            s.add_all(AccessKey(id=k, user_id=f"usr-{name}", secret_encrypted="x") for k in ids)
            principal = Principal(f"usr-{name}", name, "org-admin", "admin", ids[0], "admin", True)
            out[name] = (principal, ids)
    return out


def race(db: Database, write: str, *calls: Callable[[], Any]) -> list[Any]:
    """Run ``calls`` at once, each holding at its write (a statement starting with ``write``) until the other has
    reached its own or 0.5 s went by: without serialisation both check first, then both write."""
    barrier = threading.Barrier(len(calls), timeout=0.5)

    def hold(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith(write):
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                pass

    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except Exception as exc:
            results[i] = exc

    event.listen(db.engine, "before_cursor_execute", hold)
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        event.remove(db.engine, "before_cursor_execute", hold)
    return results


def test_two_concurrent_disables_of_the_last_two_admin_keys_leave_one(
    accounts: tuple[Database, AccountService],
) -> None:
    db, service = accounts
    principal, (k1, k2) = admins(db, "admin", keys=2)["admin"]
    # An expired key opens nothing: it is not a second way in.
    with db.transaction() as s:
        s.add(AccessKey(id="AKEXPIRED", user_id=principal.user_id, secret_encrypted="x", expires_at=utcnow()))
    service.disable_key(principal, k2)
    with pytest.raises(Conflict, match=f"access key {k1} is the last enabled platform-admin key"):
        service.disable_key(principal, k1)
    service.delete_key(principal, "AKEXPIRED")
    service.delete_key(principal, k2)

    with db.transaction() as s:
        k2 = new_access_key_id()
        s.add(AccessKey(id=k2, user_id=principal.user_id, secret_encrypted="x"))
    results = race(
        db,
        "UPDATE access_keys SET enabled",
        lambda: service.disable_key(principal, k1),
        lambda: service.disable_key(principal, k2),
    )
    assert sorted(type(r).__name__ for r in results) == ["Conflict", "KeyRead"], results
    with db.read() as s:
        assert len(s.scalars(select(AccessKey).where(AccessKey.enabled.is_(True))).all()) == 1

    with db.transaction() as s:
        s.execute(update(AccessKey).values(enabled=True))
    deleted = race(
        db,
        "DELETE FROM access_keys",
        lambda: service.delete_key(principal, k1),
        lambda: service.delete_key(principal, k2),
    )
    assert sorted(type(r).__name__ for r in deleted) == ["Conflict", "NoneType"], deleted
    with db.read() as s:
        assert len(s.scalars(select(AccessKey)).all()) == 1


def test_two_admins_disabling_each_other_at_once_leave_one(accounts: tuple[Database, AccountService]) -> None:
    db, service = accounts
    people = admins(db, "ann", "bob")
    (ann, _), (bob, _) = people["ann"], people["bob"]
    results = race(
        db,
        "UPDATE users SET disabled",
        lambda: service.set_user_disabled(ann, "bob", True),
        lambda: service.set_user_disabled(bob, "ann", True),
    )
    assert sorted(type(r).__name__ for r in results) == ["Conflict", "UserRead"], results
    with db.read() as s:
        assert s.scalars(select(User.name).where(User.disabled.is_(False))).all() in (["ann"], ["bob"])
