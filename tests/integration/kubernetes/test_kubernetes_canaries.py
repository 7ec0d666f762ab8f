"""A canary and a shadow of a service on Kubernetes (issue 48), against the FAKE Kubernetes API
(tests/fakes/kube_api.py): the serving task's deployed part (kiln.tasks.serving_deployed, serving_tracks) with the
real Kubernetes backend, on a SQLite database, in process.

Each track is a Deployment and a Service of its own, and one endpoint of Kiln's router, which splits the predicts
between them as between local replicas. No pod runs here, and a Service's cluster name resolves nowhere: each
track's address is answered by a local HTTP stand-in (the test's own name resolution, :class:`_Resolved`), and
the Deployments' readiness is set by the fake's test hook."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

from kiln.auth.secrets import SecretBox
from kiln.backends.capabilities import DeployTrack, ServiceAddress
from kiln.backends.kubernetes.backend import KubernetesBackend
from kiln.backends.kubernetes.inputs import KubeConfig
from kiln.backends.kubernetes.serving import service_selector, track_base
from kiln.db import migrate
from kiln.db.session import Database
from kiln.db.tables import Organization, Service, User, utcnow
from kiln.domain.serving import ServiceSpec
from kiln.domain.traffic_split import Split, choose
from kiln.routing.router import Router
from kiln.tasks.leases import TaskLeases
from kiln.tasks.runner import TaskContext
from kiln.tasks.serving_deployed import DeployedServices
from kiln.tasks.serving_rollout import Rollouts
from kiln.tasks.serving_routes import RouteSync
from kiln.usecases.models import rollout
from tests.fakes.kube_api import FakeKubeAPI

BOX = SecretBox(Fernet.generate_key())
SVC = "svc-canary1"
KINDS = ("Secret", "ConfigMap", "NetworkPolicy", "Deployment", "Service", "HorizontalPodAutoscaler")


class _StandIn:
    """A local HTTP server in place of one track's Kubernetes Service: answers POST /predict with its name."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen = 0
        self.failing = False  # answers 500, as a predictor that raises
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                stand_in.seen += 1
                answer = json.dumps({"outputs": [stand_in.name]}).encode()
                self.send_response(500 if stand_in.failing else 200)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Resolved(KubernetesBackend):
    """The Kubernetes backend, each track's Service address answered by a stand-in: what a cluster's DNS does."""

    stand_ins: dict[str, _StandIn]

    def apply_service(  # type: ignore[override]
        self, service_id: str, *args: Any, track: DeployTrack = "stable"
    ) -> ServiceAddress:
        address = super().apply_service(service_id, *args, track=track)
        assert address.url.startswith(f"http://{track_base(SVC, track)}.kiln.svc:")
        return ServiceAddress(self.stand_ins[track].url, address.secret)


@pytest.fixture
def fake() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI() as api:
        api.add_node("node-1", cpu="16", memory="64Gi")
        yield api


@pytest.fixture
def stand_ins() -> Iterator[dict[str, _StandIn]]:
    servers = {track: _StandIn(track) for track in ("stable", "canary", "shadow")}
    yield servers
    for server in servers.values():
        server.close()


@pytest.fixture
def backend(fake: FakeKubeAPI, stand_ins: dict[str, _StandIn]) -> Iterator[_Resolved]:
    resolved = _Resolved(fake.api_client(), KubeConfig(namespace="kiln"), endpoint="http://kiln:8080")
    resolved.stand_ins = stand_ins
    yield resolved
    resolved.close()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'kiln.db'}")
    migrate.upgrade(database.engine)
    spec = ServiceSpec.model_validate(
        {"name": "digits", "model": "digits@1", "predictor": {"type": "sklearn"}, "replicas": 2}
    )
    with database.transaction() as s:
        s.add(Organization(id="org-1", name="acme"))
        s.flush()
        s.add(User(id="usr-1", org_id="org-1", name="ann"))
        s.flush()
        s.add(
            Service(
                id=SVC,
                org_id="org-1",
                user_id="usr-1",
                name="digits",
                spec=spec.model_dump(mode="json", by_alias=True),
                state="DEPLOYING",
                message="",
                model_name="digits",
                model_version=1,
                desired_replicas=2,
            )
        )
    yield database
    database.dispose()


class World:
    def __init__(self, db: Database, fake: FakeKubeAPI, backend: _Resolved, stand_ins: dict[str, _StandIn]) -> None:
        self.db, self.fake, self.stand_ins = db, fake, stand_ins
        self.router = Router()
        self.serving = DeployedServices(db, backend, self.router, "kubernetes", BOX, Rollouts(self.router))
        self.ctx = TaskContext("serving", None, False, threading.Event(), TaskLeases(db, "srv-a"))

    def drive(self) -> None:
        self.serving.drive(self.ctx, SVC)

    def change(self, **fields: Any) -> None:
        with self.db.transaction() as s:
            row = s.get(Service, SVC)
            assert row is not None
            for key, value in fields.items():
                setattr(row, key, value)

    def row(self) -> Service:
        with self.db.read() as s:
            row = s.get(Service, SVC)
            assert row is not None
            s.expunge(row)
            return row

    def objects(self, track: str | None = None) -> dict[tuple[str, str], dict[str, Any]]:
        selector = service_selector(SVC, track)
        found = {(k, o["metadata"]["name"]): o for k in KINDS for o in self.fake.list(k, "kiln", selector)["items"]}
        if track is None:  # the stable track's: those without a track label
            found = {key: o for key, o in found.items() if "kiln.io/track" not in o["metadata"]["labels"]}
        return found

    def ready(self, track: str, count: int) -> None:
        self.fake.set_deployment_ready(track_base(SVC, track), count)

    def predict(
        self,
        n: int = 1,
        *,
        version: str | None = None,
        key: str | None = None,
        draw: random.Random | None = None,
        router: Router | None = None,
    ) -> list[str]:
        """Which track's stand-in answered each of ``n`` predicts, the track chosen as the API server does (from
        the service's row and the headers' values)."""
        row = self.row()
        split = Split(row.model_version, row.canary_version, row.canary_weight, row.shadow_version)
        draw = draw or random.Random(0)
        tracks = [choose(split, version, key, draw) for _ in range(n)]
        return asyncio.run(_predict(router or self.router, tracks, int(version) if version is not None else None))


async def _predict(router: Router, tracks: list[Any], version: int | None) -> list[str]:
    """One predict after another (a steady client), on one event loop."""
    names = []
    try:
        for track in tracks:
            answer = await router.predict(SVC, b'{"inputs": [[0.0]]}', timeout=5, track=track, version=version)
            names.append(json.loads(answer.body)["outputs"][0] if answer.status == 200 else f"{answer.status}")
    finally:
        await router.aclose()
        router._client, router._loop = None, None  # the next predicts run on another event loop
        router._changed.clear()
    return names


@pytest.fixture
def world(db: Database, fake: FakeKubeAPI, backend: _Resolved, stand_ins: dict[str, _StandIn]) -> World:
    w = World(db, fake, backend, stand_ins)
    w.drive()
    w.ready("stable", 2)
    w.drive()
    assert w.row().state == "READY"
    return w


def test_a_canary_is_a_second_deployment_that_the_router_splits_to(world: World) -> None:
    world.change(canary_version=2, canary_weight=30, canary_replicas=3)
    world.drive()
    canary = world.fake.get("Deployment", "kiln", track_base(SVC, "canary"))
    assert canary["spec"]["replicas"] == 3
    assert canary["metadata"]["annotations"]["kiln.io/model"] == "digits@2"
    kinds = sorted(kind for kind, _ in world.objects("canary"))
    assert kinds == ["ConfigMap", "Deployment", "NetworkPolicy", "Service"]
    stable = world.fake.get("Deployment", "kiln", track_base(SVC))
    assert stable["metadata"]["annotations"]["kiln.io/model"] == "digits@1"  # untouched
    assert stable["metadata"]["generation"] == 1
    assert world.row().route_tracks in (None, {})  # no canary replica ready: not routed yet
    assert set(world.predict(20)) == {"stable"}

    world.ready("canary", 3)
    world.drive()
    assert set(world.row().route_tracks or {}) == {"canary"}
    answers = world.predict(400, draw=random.Random(7))
    expected = random.Random(7)
    split = Split(1, 2, 30)
    assert answers == [choose(split, None, None, expected) for _ in range(400)]  # each reached the split's choice
    assert 0 < answers.count("canary") < answers.count("stable")
    # A routing key always reaches one version; a targeted version answers whatever its share.
    assert len(set(world.predict(20, key="user-17"))) == 1
    assert world.predict(5, version="2") == ["canary"] * 5 and world.predict(5, version="1") == ["stable"] * 5
    # Every server routes alike: another server's router, from the rows alone.
    other = Router()
    RouteSync(world.db, other, BOX, "srv-b", lambda: 15.0).refresh()
    assert sorted(other.ready(SVC)) == sorted([SVC, f"{SVC}-canary"])
    assert world.predict(3, version="2", router=other) == ["canary"] * 3
    # The router counted each version's figures for the rollout policy.
    figures = world.router.version_traffic(SVC)
    assert figures[2].requests >= answers.count("canary") and figures[1].requests >= answers.count("stable")

    # Rollback: its route leaves the rows and the router, then its objects go; the stable ones stay.
    world.change(canary_version=None, canary_weight=0)
    world.drive()
    assert world.row().route_tracks in (None, {})
    assert world.objects("canary") == {}
    assert sorted(world.router.ready(SVC)) == [SVC]
    assert len(world.objects()) == 5
    assert set(world.predict(40)) == {"stable"}


def test_promote_rolls_the_stable_deployment_then_deletes_the_canary(world: World) -> None:
    world.change(canary_version=2, canary_weight=50, canary_replicas=1)
    world.drive()
    world.ready("canary", 1)
    world.drive()
    with world.db.transaction() as s:
        row = s.get(Service, SVC)
        assert row is not None
        rollout.promote(s, row, "by hand", "hand")
    world.drive()
    stable = world.fake.get("Deployment", "kiln", track_base(SVC))
    assert stable["metadata"]["annotations"]["kiln.io/model"] == "digits@2"  # rolled to the canary's version
    assert stable["metadata"]["generation"] == 2
    # The stable track's new replicas are not ready yet: the canary answers stable predicts beside the old ones.
    assert world.objects("canary")
    assert (world.row().route_tracks or {})["canary"]["role"] == "stable"
    assert set(world.predict(40)) == {"stable", "canary"}

    world.ready("stable", 2)  # the new revision's replicas are ready
    world.drive()
    assert world.objects("canary") == {}
    assert world.row().route_tracks in (None, {})
    assert world.router.ready(SVC) == [SVC]
    assert set(world.predict(20)) == {"stable"}


def test_a_shadow_gets_a_deployment_of_its_own_with_one_replica(world: World) -> None:
    world.change(shadow_version=3)
    world.drive()
    shadow = world.fake.get("Deployment", "kiln", track_base(SVC, "shadow"))
    assert shadow["spec"]["replicas"] == 1
    assert shadow["metadata"]["annotations"]["kiln.io/model"] == "digits@3"
    world.ready("shadow", 1)
    world.drive()
    assert set(world.row().route_tracks or {}) == {"shadow"}
    # No client's predict reaches it (only copies, and a predict that targets its version).
    assert set(world.predict(40)) == {"stable"}
    assert world.predict(3, version="3") == ["shadow"] * 3
    world.change(shadow_version=None)
    world.drive()
    assert world.objects("shadow") == {}
    assert world.row().route_tracks in (None, {})


def test_a_failing_canary_is_rolled_back_by_its_policy_from_the_routers_figures(world: World) -> None:
    """The rollout policy judges a deployed canary from what the router counted per version, as for local
    replicas: a canary whose every predict fails is rolled back, its event written, its Deployment deleted."""
    policy = {"max_error_rate": 0.05, "min_requests": 5}
    world.change(canary_version=2, canary_weight=50, canary_step_at=utcnow(), canary_policy=policy)
    world.drive()  # the policy's window begins
    world.ready("canary", 1)
    world.drive()
    assert world.row().canary_version == 2  # no verdict before min_requests
    world.stand_ins["canary"].failing = True
    answers = world.predict(40, draw=random.Random(3))
    assert answers.count("500") >= 5 and "stable" in answers
    world.drive()
    row = world.row()
    assert row.canary_version is None
    assert (row.rollout_events or [])[-1]["move"] == "rolled_back"
    world.drive()
    assert world.objects("canary") == {}
    assert set(world.predict(20)) == {"stable"}
