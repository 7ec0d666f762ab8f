"""Model services: deploy, read, list, update (roll out a model version, scale), delete, tokens, logs, render for
Kubernetes, and predict — forwarded by Kiln's router to a ready replica."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from kiln.api.deps import Caller, Kiln, caller_of, model_response, platform_of
from kiln.api.idempotency import Idempotent, mark_replayed, replayable
from kiln.api.params import ServiceName
from kiln.api.responses import errors
from kiln.domain import limits
from kiln.domain.serving import (
    PredictRequest,
    PredictResponse,
    ServiceList,
    ServiceManifests,
    ServiceRead,
    ServiceSubmit,
    ServiceToken,
    ServiceUpdate,
    check_predict_inputs,
)
from kiln.domain.traffic_split import ROUTING_KEY_HEADER, VERSION_HEADER, Split, choose
from kiln.platform import Platform
from kiln.routing.router import outputs_of
from kiln.usecases.access.identity import Principal

router = APIRouter(prefix="/services", tags=["services"], responses=errors(403))
PREDICT_SCHEMA = PredictRequest.model_json_schema()
ROUTE_TTL = 1.0  # seconds a predict's (caller organisation, name) → service lookup is used
ROUTE_REFRESH = 0.5  # seconds after which a predict that uses it has it looked up again, without waiting for that


@router.post(
    "",
    response_model=ServiceRead,
    status_code=201,
    summary="Deploy a model service",
    responses=replayable(errors(400, 409, 422)),
)
def create_service(
    body: ServiceSubmit, caller: Caller, kiln: Kiln, idempotency: Idempotent, response: Response
) -> ServiceRead:
    service = kiln.serving.create(caller, body, idempotency)
    mark_replayed(response, idempotency)
    return service


@router.post(
    ":render",
    response_model=ServiceManifests,
    summary="The Kubernetes objects a service spec renders to (Deployment, Service, HPA...); creates nothing",
    responses=errors(400, 404, 422),
)
def render_service(body: ServiceSubmit, caller: Caller, kiln: Kiln) -> ServiceManifests:
    from kiln.backends.kubernetes.serving import render_service as render
    from kiln.backends.kubernetes.settings import job_network, kube_config

    caller.require("services:write")  # what a deploy would create: for those who may deploy
    model = kiln.models.resolve(caller.org_id, body.spec.model)
    service_id = kiln.serving.id_for(caller, body.spec.name)
    cfg = kube_config(kiln.settings.kubernetes, **job_network(kiln.settings))
    manifests = render(
        service_id,
        caller.org_id,
        body.spec,
        model,
        cfg,
        kiln.catalog,
        kiln.settings.endpoint,
        code_sha256=body.code_sha256,
    )
    return ServiceManifests(manifests=manifests)


@router.get("", response_model=ServiceList, summary="List services")
def list_services(caller: Caller, kiln: Kiln) -> ServiceList:
    return ServiceList(items=kiln.serving.list_services(caller))


@router.get("/{service}", response_model=ServiceRead, responses=errors(404, 422))
def get_service(service: ServiceName, caller: Caller, kiln: Kiln) -> Response:
    return model_response(kiln.serving.get(caller, service))


@router.patch(
    "/{service}",
    response_model=ServiceRead,
    summary="Roll out another model version or spec (one replica at a time), or scale",
    responses=errors(400, 404, 422),
)
def update_service(service: ServiceName, body: ServiceUpdate, caller: Caller, kiln: Kiln) -> ServiceRead:
    return kiln.serving.update(caller, service, body)


@router.post(
    "/{service}/promote",
    response_model=ServiceRead,
    summary="The canary becomes the stable version (rolled over one replica at a time, no request dropped)",
    responses=errors(404, 409, 422),
)
def promote_service(service: ServiceName, caller: Caller, kiln: Kiln) -> ServiceRead:
    return kiln.serving.promote(caller, service)


@router.post(
    "/{service}/rollback",
    response_model=ServiceRead,
    summary="End the canary: predicts go to the stable version only, the canary's replicas drain",
    responses=errors(404, 409, 422),
)
def rollback_service(service: ServiceName, caller: Caller, kiln: Kiln) -> ServiceRead:
    return kiln.serving.rollback(caller, service)


@router.delete(
    "/{service}",
    status_code=204,
    response_class=Response,
    summary="Delete (its replicas stop)",
    responses=errors(404, 422),
)
def delete_service(service: ServiceName, caller: Caller, kiln: Kiln) -> Response:
    kiln.serving.delete(caller, service)
    return Response(status_code=204)


@router.post(
    "/{service}/tokens",
    response_model=ServiceToken,
    status_code=201,
    summary="A token that may predict on this service and do nothing else (its secret is shown once)",
    responses=errors(404, 422),
)
def create_service_token(service: ServiceName, caller: Caller, kiln: Kiln) -> ServiceToken:
    return kiln.serving.create_token(caller, service)


@router.get(
    "/{service}/logs",
    summary="A replica's log lines (the newest replica's by default)",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **errors(404, 422)},
)
def service_logs(
    service: ServiceName,
    caller: Caller,
    kiln: Kiln,
    replica: Annotated[str | None, Query(max_length=limits.MAX_ID_LENGTH, description="A replica id")] = None,
    offset: Annotated[int, Query(ge=0, le=limits.MAX_INT64)] = 0,
) -> Response:
    job_id = kiln.serving.replica_job(caller, service, replica)
    data, next_offset, ended = kiln.outputs.read_log(caller, job_id, offset, limits.MAX_LOG_READ_BYTES)
    headers = {"X-Kiln-Next-Offset": str(next_offset), "X-Kiln-Job-Ended": "true" if ended else "false"}
    return Response(data, media_type="text/plain", headers=headers)


@router.post(
    "/{service}/predict",
    response_model=PredictResponse,
    summary="Predict: forwarded to a ready replica (least outstanding requests; one retry if it dies)",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": PREDICT_SCHEMA}}}},
    responses=errors(404, 422, 502, 503),
)
async def predict(service: ServiceName, request: Request) -> Response:
    caller, kiln = caller_of(request), platform_of(request)
    caller.require("services:predict")  # before the cache: a viewer's request never reuses a member's lookup
    service_id, timeout, split = await _route(kiln, caller, service)
    target = request.headers.get(VERSION_HEADER)
    track = choose(split, target, request.headers.get(ROUTING_KEY_HEADER))
    body = await request.body()
    if len(body) > 2 * limits.MAX_PREDICT_INPUTS:  # long enough to hold too many instances: parsed off the loop
        await run_in_threadpool(check_predict_inputs, body)
    version = int(target) if target is not None else None  # choose() checked it is a version the service serves
    answer = await kiln.router.predict(service_id, body, timeout, track=track, version=version)
    if answer.status != 200:  # the replica's own answer (a 422 naming the field, a predict error)
        return Response(answer.body, status_code=answer.status, media_type="application/json")
    data = outputs_of(answer)
    data["model"] = answer.model
    copy = None
    if split.shadow_version is not None and target is None:  # a copy to the shadow, once the answer went
        copy = BackgroundTask(kiln.shadows.copy, service_id, split.shadow_version, body, answer.body, timeout)
    return Response(json.dumps(data, separators=(",", ":")), media_type="application/json", background=copy)


RouteKey = tuple[str, str | None, str]  # (caller's organisation, its service token's service, the service's name)


@dataclass(frozen=True)
class _Route:
    service_id: str
    timeout: float
    split: Split
    at: float  # monotonic time its lookup began


_routes: dict[RouteKey, _Route] = {}
_lookups: dict[RouteKey, asyncio.Task[_Route]] = {}  # the lookup in flight per key: one at a time


async def _route(kiln: Platform, caller: Principal, service: str) -> tuple[str, float, Split]:
    """(service id, request timeout, traffic split) of the service a predict names, from a lookup at most
    ``ROUTE_TTL`` old.

    The lookup is a database read in a worker thread, and those threads are shared with every request's database
    work: a predict that waits for one waits for whatever is queued before it. So a predict never waits for a
    lookup of a route it has used within ``ROUTE_TTL``: past ``ROUTE_REFRESH`` one lookup starts in the background
    and the predicts go on with the one they have; and predicts that find no usable route wait together for one
    lookup, never one each (at 16 clients, the expiry of the route once a second sent 16 lookups into the worker
    threads, and those 16 predicts were the p99)."""
    key = (caller.org_id, caller.service_id, service)
    known = _routes.get(key)
    age = time.monotonic() - known.at if known is not None else ROUTE_TTL
    if known is not None and age < ROUTE_TTL:
        if age >= ROUTE_REFRESH:
            _look_up(kiln, caller, service, key)
        return known.service_id, known.timeout, known.split
    route = await asyncio.shield(_look_up(kiln, caller, service, key))  # a cancelled predict leaves it to the others
    return route.service_id, route.timeout, route.split


def _look_up(kiln: Platform, caller: Principal, service: str, key: RouteKey) -> asyncio.Task[_Route]:
    """The lookup of ``key`` in flight, started if there is none: it replaces the cached route when it succeeds and
    drops it when it fails (the next predict looks it up itself and gets the error: 404, 403)."""
    loop = asyncio.get_running_loop()
    task = _lookups.get(key)
    if task is not None and task.get_loop() is loop and not task.done():
        return task

    async def look_up() -> _Route:
        at = time.monotonic()
        service_id, timeout, split = await run_in_threadpool(kiln.serving.route, caller, service)
        return _Route(service_id, timeout, split, at)

    def done(task: asyncio.Task[_Route]) -> None:
        if _lookups.get(key) is task:
            del _lookups[key]
        if task.cancelled() or task.exception() is not None:  # read here, so a refresh nobody awaited is quiet
            _routes.pop(key, None)
            return
        if len(_routes) > 10_000:
            _routes.clear()
        _routes[key] = task.result()

    task = loop.create_task(look_up())
    task.add_done_callback(done)
    _lookups[key] = task
    return task
