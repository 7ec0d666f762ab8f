"""Router.sync: every server's router follows the replicas' rows (kiln.tasks.serving_routes) without fighting the
serving task, which on the lease holder's server adds, drains and removes the same replicas directly."""

from __future__ import annotations

import time

from kiln.routing.router import Endpoint, Router

SERVICE = "svc-1"


def endpoint(replica_id: str, *, draining: bool = False, socket: str | None = None) -> Endpoint:
    path = socket or f"/jobs/{replica_id}.sock"
    return Endpoint(replica_id, f"job-{replica_id}", path, "s", "m@1", draining=draining)


def test_rows_are_added_and_ended_ones_removed() -> None:
    router = Router()
    router.sync({SERVICE: [endpoint("a"), endpoint("b")]}, time.monotonic())
    assert sorted(router.ready(SERVICE)) == ["a", "b"]
    router.sync({SERVICE: [endpoint("b")]}, time.monotonic())
    assert router.ready(SERVICE) == ["b"]
    router.sync({}, time.monotonic())  # the service is gone
    assert router.ready(SERVICE) == []


def test_a_replica_the_serving_task_added_after_the_read_began_is_kept() -> None:
    router = Router()
    read_began = time.monotonic()
    router.add(SERVICE, endpoint("new"))  # made READY and routed while the read ran: the read did not see it
    router.sync({SERVICE: []}, read_began)
    assert router.ready(SERVICE) == ["new"]
    router.sync({SERVICE: []}, time.monotonic())  # a later read that still does not name it: it ended
    assert router.ready(SERVICE) == []


def test_the_serving_tasks_own_entry_keeps_its_requests_in_flight_and_a_drain_is_never_undone() -> None:
    router = Router()
    own = endpoint("a")
    router.add(SERVICE, own)
    own.in_flight, own.requests = 3, 7
    router.sync({SERVICE: [endpoint("a")]}, time.monotonic())  # the same replica, read from its row
    assert router.in_flight(SERVICE, "a") == 3 and router.take_stats(SERVICE)["a"][0] == 7
    router.drain(SERVICE, "a")  # drained by the serving task before its row says so
    router.sync({SERVICE: [endpoint("a")]}, time.monotonic())  # a read from before the row said DRAINING
    assert router.ready(SERVICE) == []
    router.sync({SERVICE: [endpoint("a", draining=True)]}, time.monotonic())
    assert router.ready(SERVICE) == [] and router.in_flight(SERVICE, "a") == 3


def test_a_draining_row_drains_a_replica_this_server_routes() -> None:
    router = Router()
    router.sync({SERVICE: [endpoint("a"), endpoint("b")]}, time.monotonic())
    router.sync({SERVICE: [endpoint("a", draining=True), endpoint("b")]}, time.monotonic())
    assert router.ready(SERVICE) == ["b"]


def test_a_replica_at_another_address_is_replaced() -> None:
    router = Router()
    router.sync({SERVICE: [endpoint("a", socket="/old.sock")]}, time.monotonic())
    router.sync({SERVICE: [endpoint("a", socket="/new.sock")]}, time.monotonic())
    assert router._services[SERVICE]["a"].socket == "/new.sock"
