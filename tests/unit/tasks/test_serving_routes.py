"""What every server reads of the replicas' rows and writes of its traffic (kiln.tasks.serving_routes), on a
SQLite database: a replica whose socket is on this machine is routed, one on another machine is not and a predict's
503 says where it runs, a secret sealed under another server key is not used, and a server's traffic is summed by
the serving task's read only while that server is live."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from kiln.auth.secrets import SecretBox
from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import Job, Organization, Service, ServiceReplica, User, utcnow
from kiln.routing.router import Router
from kiln.tasks.presence import ServerPresence
from kiln.tasks.serving_routes import RouteSync, remote_traffic

BOX = SecretBox(Fernet.generate_key())


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'kiln.db'}")
    migrate.upgrade(database.engine)
    with database.transaction() as s:
        s.add(Organization(id="org-1", name="acme"))
        s.flush()
        s.add(User(id="usr-1", org_id="org-1", name="ann"))
        s.flush()
        s.add(
            Service(
                id="svc-1",
                org_id="org-1",
                user_id="usr-1",
                name="web",
                spec={},
                state="READY",
                model_name="m",
                model_version=1,
                desired_replicas=1,
            )
        )
    yield database
    database.dispose()


def replica(db: Database, replica_id: str, path: str, node: str, box: SecretBox = BOX) -> None:
    with db.transaction() as s:
        s.add(Job(id=f"job-{replica_id}", org_id="org-1", user_id="usr-1", name="r", spec={}, state="RUNNING"))
        s.flush()
        s.add(
            ServiceReplica(
                id=replica_id,
                service_id="svc-1",
                job_id=f"job-{replica_id}",
                revision=1,
                model_version=1,
                state="READY",
                socket=path,
                secret=box.seal("s3cret"),
                node=node,
            )
        )


def test_a_replica_on_this_machine_is_routed_and_one_on_another_is_named(db: Database, tmp_path: Path) -> None:
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(tmp_path / "r.sock"))
    try:
        replica(db, "rep-here", str(tmp_path / "r.sock"), "host-a")
        replica(db, "rep-there", "/elsewhere/jobs/job-x/work/.kiln-replica.sock", "host-b")
        router = Router()
        routes = RouteSync(db, router, BOX, "srv-a", lambda: 15.0, node="host-a")
        routes.refresh()
        assert router.ready("svc-1") == ["rep-here"]
        assert router._services["svc-1"]["rep-here"].secret == "s3cret"
        assert routes.why_unreachable("svc-1") is None  # one is reachable: no excuse
        with db.transaction() as s:
            row = s.get(ServiceReplica, "rep-here")
            assert row is not None
            row.state = "STOPPED"
        routes.refresh()
        assert router.ready("svc-1") == []
        why = routes.why_unreachable("svc-1")
        assert why is not None and "another machine (host-b)" in why and "(host-a)" in why, why
    finally:
        listening.close()


def test_a_secret_sealed_under_another_server_key_is_not_used(db: Database, tmp_path: Path) -> None:
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(tmp_path / "r.sock"))
    try:
        replica(db, "rep-1", str(tmp_path / "r.sock"), "host-a", box=SecretBox(Fernet.generate_key()))
        router = Router()
        RouteSync(db, router, BOX, "srv-a", lambda: 15.0, node="host-a").refresh()
        assert router.ready("svc-1") == []
    finally:
        listening.close()


def test_the_traffic_of_live_servers_is_summed(db: Database) -> None:
    for server_id in ("srv-a", "srv-b"):
        ServerPresence(db, server_id, "", 5.0).beat()
    busy = Router()
    busy.requests["svc-1"], busy.last_request["svc-1"] = 3, 0.0  # what predicts through srv-b left
    RouteSync(db, busy, BOX, "srv-b", lambda: 15.0).publish({"svc-1"})
    read = remote_traffic(db, "srv-a", lambda: 15.0)()  # what the serving task on srv-a reads
    assert set(read) == {"svc-1"} and read["svc-1"].last_request_at is not None
    assert read["svc-1"].last_request_at <= utcnow()
    assert remote_traffic(db, "srv-b", lambda: 15.0)() == {}  # a server's own is in its router
    ServerPresence(db, "srv-b", "", 5.0).leave()
    assert remote_traffic(db, "srv-a", lambda: 15.0)() == {}  # not live: not counted
