"""Every server routes predicts from the database: task ``serving-routes``, on every server (no lease).

One server at a time runs the ``serving`` task (kiln.tasks.serving), which starts the replicas and
records where each ready one is reached: its Unix socket's absolute path, the machine it runs on (``node``) and its
request secret sealed with the server key (``service_replicas``); for a backend that runs the replicas itself (a
Kubernetes Service) the service's address (``services.route_url``, and its canary's and shadow's in
``services.route_tracks``). This task, every ``INTERVAL`` and at once when
a predict finds no replica, reads those rows and keeps this server's router in step (``Router.sync``): a replica
is routable from here when it has an address, or its socket is on this machine (servers on one machine share the
file system; another machine's socket cannot be reached, and a predict that finds only such replicas answers 503
``no_replica`` saying so). The serving task's own router entries on the server that runs it are the same replicas
and stay as they are (their requests in flight counted once).

It also writes what this server forwarded per service (``service_traffic``: requests in flight, in all and per
replica, the count, the last request, and per model version its counts and latency histogram), when that changed
and at least every ``TRAFFIC_REFRESH`` seconds, so that the serving task scales on the requests of every live
server (``remote_traffic``), not only its own, and a canary's rollout policy judges the predicts every live server
forwarded.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError

from kiln.auth.secrets import SecretBox
from kiln.db.session import Database
from kiln.db.tables import Server, Service, ServiceReplica, ServiceTraffic, utcnow
from kiln.domain.rollout import VersionStats
from kiln.domain.serving import ReplicaState, ServiceState
from kiln.errors import KilnError
from kiln.routing.router import Endpoint, Router
from kiln.tasks.runner import Task, TaskContext

log = logging.getLogger(__name__)

INTERVAL = 0.5
TRAFFIC_REFRESH = 2.0  # an unchanged traffic row is written again this often: its server is seen serving
FORGET_TRAFFIC = timedelta(hours=1)  # rows not written this long (their server is gone) are deleted
FORGET_EVERY = 60.0  # ... by a server's run at most this often


def this_node() -> str:
    """The machine this server runs on, as replicas' rows name it."""
    return socket.gethostname()


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


@dataclass
class Traffic:
    """The other live servers' traffic to one service, summed."""

    in_flight: int = 0
    replica_in_flight: dict[str, int] | None = None
    last_request_at: datetime | None = None
    versions: dict[int, VersionStats] = field(default_factory=dict)  # per model version, forwarded since each began


def track_endpoints(
    service_id: str, tracks: dict[str, Any] | None, open_secret: Callable[[str], str | None]
) -> list[Endpoint]:
    """The router's endpoints of a deployed service's canary and shadow tracks as its row records them
    (``services.route_tracks``: url, secret sealed, model, role), each one named ``<service id>-<track>``."""
    out = []
    for track, route in sorted((tracks or {}).items()):
        if not isinstance(route, dict) or not route.get("url") or not route.get("model") or not route.get("secret"):
            continue
        secret = open_secret(str(route["secret"]))
        if secret is None:
            continue
        role = route.get("role")
        out.append(
            Endpoint(
                f"{service_id}-{track}",
                "",
                None,
                secret,
                str(route["model"]),
                base_url=str(route["url"]),
                canary=role == "canary",
                shadow=role == "shadow",
            )
        )
    return out


class RouteSync:
    """Keeps this server's router in step with the replicas the database records, and records its traffic."""

    def __init__(
        self,
        db: Database,
        router: Router,
        box: SecretBox,
        server_id: str,
        live_for: Callable[[], float],
        node: str | None = None,
    ) -> None:
        self.db = db
        self.router = router
        self.box = box
        self.server_id = server_id
        self.live_for = live_for  # seconds a server's heartbeat counts it live (kiln.tasks.presence)
        self.node = node or this_node()
        self._task = Task("serving-routes", self.run_once, INTERVAL, stop=self.leave)
        self._unreachable: dict[str, list[tuple[str, str]]] = {}  # service id → (replica id, node) beyond reach
        self._published: dict[str, tuple[object, float]] = {}  # service id → (what, when)
        self._insert = postgresql_insert if db.dialect == "postgresql" else sqlite_insert
        self._lock = threading.Lock()
        self._forgot = 0.0  # monotonic time old traffic rows were last deleted
        self._warned = False  # a secret this server's key cannot open was logged
        router.why_unreachable = self.why_unreachable

    def task(self) -> Task:
        return self._task

    def wake(self) -> None:
        self._task.wake.set()

    def why_unreachable(self, service_id: str) -> str | None:
        with self._lock:
            beyond = self._unreachable.get(service_id)
        if not beyond:
            return None
        nodes = ", ".join(sorted({node for _, node in beyond}))
        return (
            f"this service's ready replicas run on another machine ({nodes}), and this server ({self.node}) cannot "
            "reach their Unix sockets; send its predicts to a Kiln server on that machine"
        )

    def run_once(self, ctx: TaskContext) -> None:
        existing = self.refresh()
        self.publish(existing)
        if time.monotonic() - self._forgot >= FORGET_EVERY:
            with self.db.transaction() as s:
                s.execute(delete(ServiceTraffic).where(ServiceTraffic.updated_at < utcnow() - FORGET_TRAFFIC))
            self._forgot = time.monotonic()

    # ---- routes

    def refresh(self) -> set[str]:
        """Read every routable replica and hand the router those this server reaches; the ids of the services that
        exist (not being deleted)."""
        since = time.monotonic()
        routes: dict[str, list[Endpoint]] = {}
        unreachable: dict[str, list[tuple[str, str]]] = {}
        with self.db.read() as s:
            services = {row.id: row for row in s.scalars(select(Service).where(Service.state != ServiceState.DELETING))}
            replicas = s.scalars(
                select(ServiceReplica).where(
                    ServiceReplica.state.in_([str(ReplicaState.READY), str(ReplicaState.DRAINING)]),
                    ServiceReplica.socket.is_not(None),
                )
            ).all()
        for service in services.values():
            routes[service.id] = []
            if service.route_url and service.route_secret:
                secret = self._open(service.route_secret)
                if secret is not None:
                    model = service.route_model or f"{service.model_name}@{service.model_version}"
                    routes[service.id].append(Endpoint(service.id, "", None, secret, model, base_url=service.route_url))
            routes[service.id] += track_endpoints(service.id, service.route_tracks, self._open)
        for row in replicas:
            owner = services.get(row.service_id)
            if owner is None or row.socket is None or row.secret is None or row.job_id is None:
                continue
            if not _is_socket(row.socket):  # not on this machine (or gone already)
                if row.state == ReplicaState.READY and row.node and row.node != self.node:
                    unreachable.setdefault(row.service_id, []).append((row.id, row.node))
                continue
            secret = self._open(row.secret)
            if secret is None:
                continue
            routes[row.service_id].append(
                Endpoint(
                    row.id,
                    row.job_id,
                    row.socket,
                    secret,
                    f"{owner.model_name}@{row.model_version}",
                    canary=row.canary,
                    shadow=row.shadow,
                    draining=row.state == ReplicaState.DRAINING,
                )
            )
        # Named in a predict's 503 only where nothing here is routable: else the wait had another cause.
        unreachable = {k: v for k, v in unreachable.items() if not any(not e.draining for e in routes.get(k, []))}
        with self._lock:
            self._unreachable = unreachable
        self.router.sync(routes, since)
        return set(services)

    def _open(self, sealed: str) -> str | None:
        try:
            return self.box.open(sealed)
        except KilnError:  # another server key: this server cannot use the route
            if not self._warned:
                log.warning(
                    "a replica's secret cannot be opened with this server's key (KILN_SERVER_KEY differs from the "
                    "server that runs the replicas): this server does not route to them"
                )
                self._warned = True
            return None

    # ---- traffic

    def publish(self, existing: set[str]) -> None:
        """Write this server's traffic per service where it changed (or is due again)."""
        now_mono, now = time.monotonic(), utcnow()
        rows = []
        for service_id, (in_flight, per_replica, requests, last) in self.router.traffic().items():
            if service_id not in existing:
                continue
            versions = self.router.version_traffic(service_id)
            what = (in_flight, per_replica, requests, {v: (x.requests, x.errors) for v, x in versions.items()})
            previous = self._published.get(service_id)
            if previous is not None and previous[0] == what and now_mono - previous[1] < TRAFFIC_REFRESH:
                continue
            last_at = now - timedelta(seconds=now_mono - last) if last is not None else None
            rows.append(
                {
                    "server_id": self.server_id,
                    "service_id": service_id,
                    "in_flight": in_flight,
                    "replica_in_flight": per_replica,
                    "requests": requests,
                    "last_request_at": last_at,
                    "versions": {str(v): x.to_json() for v, x in versions.items()},
                    "updated_at": now,
                }
            )
            self._published[service_id] = (what, now_mono)
        if not rows:
            return
        try:
            with self.db.transaction() as s:
                for row in rows:
                    upsert = (
                        self._insert(ServiceTraffic)
                        .values(**row)
                        .on_conflict_do_update(
                            index_elements=["server_id", "service_id"],
                            set_={k: v for k, v in row.items() if k not in ("server_id", "service_id")},
                        )
                    )
                    s.execute(upsert)
        except IntegrityError:  # a service deleted meanwhile: written again at the next run, without it
            for row in rows:
                self._published.pop(str(row["service_id"]), None)

    def leave(self) -> None:
        """Delete this server's traffic rows (at shutdown)."""
        try:
            with self.db.transaction() as s:
                s.execute(delete(ServiceTraffic).where(ServiceTraffic.server_id == self.server_id))
        except Exception:
            log.exception("could not delete this server's traffic rows; they stop counting once it is not live")


def remote_traffic(db: Database, server_id: str, live_for: Callable[[], float]) -> Callable[[], dict[str, Traffic]]:
    """What the serving task reads each run: per service, the traffic of every other live server (one that wrote
    its heartbeat within ``live_for()`` seconds), summed. This server's own is in its router, fresher."""

    def read() -> dict[str, Traffic]:
        since = utcnow() - timedelta(seconds=live_for())
        out: dict[str, Traffic] = {}
        with db.read() as s:
            rows = s.scalars(
                select(ServiceTraffic)
                .join(Server, Server.id == ServiceTraffic.server_id)
                .where(ServiceTraffic.server_id != server_id, Server.seen_at >= since)
            ).all()
        for row in rows:
            sum_ = out.setdefault(row.service_id, Traffic(0, {}, None))
            sum_.in_flight += row.in_flight
            assert sum_.replica_in_flight is not None
            for replica_id, count in (row.replica_in_flight or {}).items():
                sum_.replica_in_flight[replica_id] = sum_.replica_in_flight.get(replica_id, 0) + int(count)
            if row.last_request_at is not None and (
                sum_.last_request_at is None or row.last_request_at > sum_.last_request_at
            ):
                sum_.last_request_at = row.last_request_at
            for version, data in (row.versions or {}).items():
                if str(version).isdigit():
                    figures = VersionStats.from_json(data)
                    have = sum_.versions.get(int(version))
                    sum_.versions[int(version)] = have.plus(figures) if have is not None else figures
        return out

    return read
