"""A predict's (organisation, service name) → service lookup, a database read in a worker thread, is off the path of
the predicts that use it: predicts that find no route wait together for one lookup, and a route due for refresh is
looked up again in the background while the predicts go on with the one they have. Before, every predict that came
after the route expired looked it up itself, and at 16 clients those 16 waits in the worker threads, once a second,
were the p99 (issue 26)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from kiln.api.errors import install_error_handlers
from kiln.api.routers import services
from kiln.domain.traffic_split import Split
from kiln.errors import NotFound
from kiln.routing.router import Answer
from kiln.usecases.access.identity import Principal

CALLER = Principal(
    user_id="usr-1",
    user_name="ann",
    org_id="org-1",
    org_name="alpha",
    key_id="AKTEST",
    role="member",
    platform_admin=False,
)
GUARD = 60.0  # seconds: only against a hang (a predict waiting for a lookup that the test holds), never a measure


class Serving:
    """``route`` answers service ids svc-1, svc-2, ... in turn; while ``held`` is clear it waits (a worker thread
    busy behind other database work)."""

    def __init__(self) -> None:
        self.calls = 0
        self.held = threading.Event()
        self.held.set()

    def route(self, caller: Principal, name: str) -> tuple[str, float, Split]:
        self.calls += 1
        call = self.calls
        assert self.held.wait(GUARD)
        return f"svc-{call}", 30.0, Split(1)


class Router:
    def __init__(self) -> None:
        self.sent_to: list[str] = []

    async def predict(self, service_id: str, body: bytes, timeout: float, **split: object) -> Answer:
        self.sent_to.append(service_id)
        return Answer(200, b'{"outputs": [0]}', "digits@1", "rep-1", None)


class Platform:
    def __init__(self) -> None:
        self.serving = Serving()
        self.router = Router()


def app() -> FastAPI:
    application = FastAPI()
    install_error_handlers(application)
    application.include_router(services.router)

    def authenticated(inner: ASGIApp) -> ASGIApp:
        async def with_caller(scope: Scope, receive: Receive, send: Send) -> None:
            scope.setdefault("state", {})["principal"] = CALLER
            await inner(scope, receive, send)

        return with_caller

    application.add_middleware(authenticated)  # type: ignore[arg-type]
    application.state.platform = Platform()
    return application


@pytest.fixture(autouse=True)
def no_routes_cached() -> Iterator[None]:
    services._routes.clear()
    services._lookups.clear()
    yield
    services._routes.clear()
    services._lookups.clear()


async def predict(client: httpx.AsyncClient) -> Any:
    response = await asyncio.wait_for(client.post("/services/digits/predict", json={"inputs": [[1.0]]}), GUARD)
    assert response.status_code == 200, response.text
    return response.json()


async def settle(until: Any) -> None:
    """Let the loop run until ``until()`` (the requests reach their lookups without waiting on anything else)."""
    for _ in range(int(GUARD / 0.01)):
        if until():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never settled")


def test_predicts_without_a_route_wait_together_for_one_lookup() -> None:
    application = app()
    serving: Serving = application.state.platform.serving
    serving.held.clear()

    async def main() -> list[Any]:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://kiln") as client:
            waiting = [asyncio.create_task(predict(client)) for _ in range(16)]
            await settle(lambda: serving.calls >= 1)
            for _ in range(200):  # every request gets its turns: each would have started its own lookup by now
                await asyncio.sleep(0)
            serving.held.set()
            return await asyncio.gather(*waiting)

    answers = asyncio.run(main())
    assert serving.calls == 1
    assert len(answers) == 16 and all(a["outputs"] == [0] for a in answers)
    assert application.state.platform.router.sent_to == ["svc-1"] * 16


def test_a_route_due_for_refresh_is_looked_up_in_the_background(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(services, "ROUTE_REFRESH", 0.0)  # every use refreshes it...
    monkeypatch.setattr(services, "ROUTE_TTL", 3600.0)  # ...and it stays usable meanwhile
    application = app()
    serving: Serving = application.state.platform.serving
    router: Router = application.state.platform.router

    async def main() -> None:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://kiln") as client:
            await predict(client)  # no route yet: looked up (svc-1) on its path
            await settle(lambda: not services._lookups)
            serving.held.clear()  # the next lookup waits behind other work
            for _ in range(3):  # answered with svc-1 while the refresh (svc-2) is held: they never wait for it
                await predict(client)
            # The refresh's lookup runs in a worker thread: wait until it has started (make test saw the assertion
            # come first), then there must be that one, not one per predict.
            await settle(lambda: serving.calls >= 2)
            assert serving.calls == 2  # one refresh under way, not one per predict
            serving.held.set()
            await settle(lambda: not services._lookups)
            await predict(client)  # the refreshed route

    asyncio.run(main())
    assert router.sent_to == ["svc-1"] * 4 + ["svc-2"]


def test_a_failed_refresh_drops_the_route_and_the_next_predict_gets_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(services, "ROUTE_REFRESH", 0.0)
    monkeypatch.setattr(services, "ROUTE_TTL", 3600.0)
    application = app()
    serving: Serving = application.state.platform.serving

    async def main() -> int:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://kiln") as client:
            await predict(client)

            def gone(caller: Principal, name: str) -> tuple[str, float, Split]:
                raise NotFound(f"no service {name}")

            serving.route = gone  # type: ignore[method-assign]
            await predict(client)  # still routed: its refresh finds the service deleted
            await settle(lambda: not services._lookups and not services._routes)
            response = await client.post("/services/digits/predict", json={"inputs": [[1.0]]})
            return response.status_code

    assert asyncio.run(main()) == 404
