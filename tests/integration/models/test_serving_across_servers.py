"""Every server on one PostgreSQL answers predicts (issue 27): two real servers with their own KILN_HOME on one
machine, one store and one server key. One of them holds the ``serving`` lease and runs the replicas; every server
routes to them from what the database records (kiln.tasks.serving_routes), and the serving task scales on the
traffic of both.

- a service deployed through one server answers predicts through either; before, only the lease holder's router
  knew the replicas, and a predict through the other waited out its timeout and got 503 ``no_replica``;
- with scale to zero, a cold start through the server that does not hold the lease brings a replica up and answers,
  and a steady trickle of predicts through that server alone keeps the service from scaling to zero (before, the
  holder saw no request of it and stopped the replica after ``idle_seconds``), while an idle one still does;
- a canary with a rollout policy, all of whose predicts go through the server that does not run the serving task,
  is rolled back by the holder's policy on what that server publishes per version (before, the holder judged its
  own router's figures alone: none);
- the lease holder killed (-9): the replica outlives it (its shim does) and the survivor answers every predict
  meanwhile, and takes the serving lease over after its TTL (before, the survivor had no route at all).

The predictor is the cheapest there is: a custom class that multiplies, on this interpreter (no runtime to build).
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cryptography.fernet import Fernet

from kiln.domain.serving import ServiceState
from kiln.errors import KilnError
from kiln.sdk.client import Client
from tests.components import require
from tests.conftest import _pg_connect, postgres_available
from tests.helpers import spec, wait_for
from tests.kilnserver import KilnServer

LEASE_SECONDS = 4  # the task leases' TTL: the survivor takes the serving lease this long after the holder died
SETTLE = 120.0  # seconds a service may take to reach a state on a loaded two-CPU machine

PREDICTOR = """
import json, pathlib

class Model:
    def load(self, path):
        path = pathlib.Path(path)
        self.scale = json.loads((path / "weights.json" if path.is_dir() else path).read_text())["scale"]

    def predict(self, batch):
        return [x * self.scale for x in batch]
"""
WEIGHTS = "import json, os; json.dump({'scale': 3}, open(os.environ['KILN_OUTPUT_DIR'] + '/weights.json', 'w'))"


@dataclass
class World:
    servers: list[KilnServer]
    code: Path  # the predictor's code bundle

    def client(self, server: KilnServer) -> Client:
        creds = self.servers[0].credentials()  # the first server's admin: the same account on every server
        return Client(server.url, creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"], timeout=180)

    def holder(self) -> KilnServer:
        """The server holding the serving lease, as its /readyz says."""
        deadline = time.monotonic() + 30
        while True:
            for server in self.servers:
                if server.proc is not None and server.proc.poll() is None and holds_serving(server):
                    return server
            assert time.monotonic() < deadline, "no server holds the serving lease"
            time.sleep(0.2)

    def other(self, server: KilnServer) -> KilnServer:
        (other,) = [s for s in self.servers if s is not server]
        return other


def holds_serving(server: KilnServer) -> bool:
    tasks = httpx.get(server.url + "/readyz", timeout=10).json()["tasks"]
    return any(task["name"] == "serving" and task["holds_lease"] for task in tasks)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    require("postgresql", postgres_available())
    root = tmp_path_factory.mktemp("serving-across")
    pg_name = f"kiln_test_{uuid.uuid4().hex[:12]}"
    with _pg_connect() as conn:
        conn.execute(f'CREATE DATABASE "{pg_name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{pg_name}"
    shared = {
        "server_key": Fernet.generate_key().decode(),
        "storage_url": str(root / "store"),
        "lease_seconds": str(LEASE_SECONDS),
        # Live for 6 s: a heartbeat late on a loaded machine does not drop the other server's traffic from the sum.
        "server_heartbeat_seconds": "2",
        "rate_limit_per_second": "0",  # no rate limit: a predict's answer is the router's doing alone
        "cpus": "4",
    }
    code = root / "code"
    code.mkdir()
    (code / "predictor.py").write_text(PREDICTOR)
    servers: list[KilnServer] = []
    try:
        for name in ("home-a", "home-b"):
            servers.append(KilnServer(root / name, url, **shared).start())
        world = World(servers, code)
        with world.client(servers[0]) as client:
            job = client.submit(spec(["python", "-c", WEIGHTS]))
            assert wait_for(client, job.id, timeout=120).state == "SUCCEEDED"
            client.register_model("scaler", job.id, "weights.json", framework="custom")
        yield world
    finally:
        for server in servers:
            server.stop()
        with _pg_connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')


def service(name: str, **changes: object) -> dict[str, object]:
    return {
        "name": name,
        "model": "scaler@1",
        "predictor": {"type": "custom", "class": "predictor:Model"},
        "runtime": {"python": sys.executable},
        "resources": {"cpus": 0.5},
        "request_timeout": 30,
        **changes,
    }


@pytest.mark.timeout(600)
def test_a_service_deployed_through_one_server_answers_through_both(world: World) -> None:
    holder = world.holder()
    other = world.other(holder)
    with world.client(other) as client:  # deployed through the server that does not run the replicas
        client.serve(service("both", replicas=1), code_dir=world.code)
        ready = client.wait_service("both", timeout=SETTLE)
        assert ready.state == ServiceState.READY, f"{ready.message}: {ready.replicas}"
    for server in (other, holder, other):
        with world.client(server) as client:
            answer = client.predict("both", [1, 2, 3])
            assert (answer.outputs, answer.model) == ([3, 6, 9], "scaler@1"), server.url


@pytest.mark.timeout(600)
def test_traffic_and_a_cold_start_through_the_other_server_count(world: World) -> None:
    holder = world.holder()
    other = world.other(holder)
    idle_seconds = 5
    autoscale = {"min": 0, "max": 1, "idle_seconds": idle_seconds, "target_concurrency": 4}
    scaled = service("trickle", autoscale=autoscale, request_timeout=120)  # a cold start on a loaded machine
    with world.client(other) as client:
        created = client.serve(scaled, code_dir=world.code)
        assert (created.state, created.desired_replicas) == (ServiceState.IDLE, 0)
        # A cold start through the server that does not run the serving task: recorded in the database, where the
        # holder finds it; the replica it starts is routed here once ready.
        assert client.predict("trickle", [2]).outputs == [6]
        # Requests through this server alone, for well over idle_seconds: the service stays up.
        until = time.monotonic() + 2.5 * idle_seconds
        while time.monotonic() < until:
            assert client.predict("trickle", [1]).outputs == [3]
            now = client.get_service("trickle")
            assert (now.state, now.desired_replicas) == (ServiceState.READY, 1), (now.message, now.replicas)
            time.sleep(0.3)
        # Quiet: it scales to zero (so the trickle was what kept it up), then another cold start through here.
        idle = client.wait_service("trickle", ServiceState.IDLE, timeout=idle_seconds + 60)
        assert (idle.state, idle.desired_replicas) == (ServiceState.IDLE, 0)
        assert client.predict("trickle", [5]).outputs == [15]
        client.delete_service("trickle")


@pytest.mark.timeout(600)
def test_a_canarys_rollout_policy_judges_the_predicts_of_the_other_server(world: World) -> None:
    holder = world.holder()
    other = world.other(holder)
    with world.client(other) as client:
        # scaler@2 multiplies by None: every predict of it fails (a TypeError, answered 500).
        broken = (
            "import json, os; json.dump({'scale': None}, open(os.environ['KILN_OUTPUT_DIR'] + '/weights.json', 'w'))"
        )
        job = client.submit(spec(["python", "-c", broken]))
        assert wait_for(client, job.id, timeout=120).state == "SUCCEEDED"
        assert client.register_model("scaler", job.id, "weights.json", framework="custom").version == 2
        client.serve(service("judged", replicas=1), code_dir=world.code)
        assert client.wait_service("judged", timeout=SETTLE).state == ServiceState.READY
        policy = {"max_error_rate": 0.1, "min_requests": 10}
        client.update_service("judged", model="scaler@2", canary=50, rollout=policy)
        deadline = time.monotonic() + SETTLE
        while not any(r.canary and r.state == "READY" for r in client.get_service("judged").replicas):
            assert time.monotonic() < deadline, "the canary's replica never got ready"
            time.sleep(0.2)
        # Every predict through the server that does not run the serving task: the holder's router forwards none,
        # so only what this server publishes of each version can tell the policy that the canary fails.
        failed = 0
        while (now := client.get_service("judged")).canary is not None:
            for i in range(10):
                try:
                    assert client.predict("judged", [i]).outputs == [3 * i]
                except KilnError:
                    failed += 1
            assert time.monotonic() < deadline + 120, f"not rolled back after {failed} failed predicts: {now.versions}"
        (event,) = now.rollout_events
        assert (event.move, event.by, event.version) == ("rolled_back", "policy", 2), event
        assert failed > 0
        client.delete_service("judged")


@pytest.mark.timeout(600)
def test_the_survivor_answers_when_the_serving_lease_holder_is_killed(world: World) -> None:
    holder = world.holder()
    survivor = world.other(holder)
    with world.client(survivor) as client:
        if "both" not in {found.name for found in client.list_services()}:  # run alone: the first test deploys it
            client.serve(service("both", replicas=1), code_dir=world.code)
        before = client.wait_service("both", timeout=SETTLE)
        assert before.state == ServiceState.READY, before.message
        (replica,) = [r.id for r in before.replicas if r.state == "READY"]
        assert client.predict("both", [1]).outputs == [3]
        holder.kill()
        killed = time.monotonic()
        answered = 0
        # Through the lease's expiry and the survivor's take-over: every predict is answered by the replica, which
        # outlived the server that started it.
        while time.monotonic() < killed + 2 * LEASE_SECONDS or not holds_serving(survivor):
            assert client.predict("both", [answered]).outputs == [3 * answered]
            answered += 1
            assert time.monotonic() < killed + 60, "the survivor never took the serving lease over"
            time.sleep(0.2)
        after = client.get_service("both")
        assert after.state == ServiceState.READY, after.message
        assert [r.id for r in after.replicas if r.state == "READY"] == [replica]
        assert client.predict("both", [7]).outputs == [21]
