"""MLflow's REST tracking protocol, served under ``/mlflow`` (``MLFLOW_TRACKING_URI=<endpoint>/mlflow``), so that code
instrumented for MLflow logs into Kiln unchanged: experiments, runs, params, metrics, tags, metric history, run
search, artifacts (``mlflow-artifacts``) and MLflow 3's logged models (kiln.api.mlflow_models), translated to
Kiln's tracking use cases (kiln.usecases.tracking.tracking, kiln.usecases.tracking.run_artifacts,
kiln.usecases.models.logged_models), where
every job is a run.

Authentication is the signature middleware's (kiln.api.auth): an access key as basic authentication
(``MLFLOW_TRACKING_USERNAME``/``PASSWORD``), a job's token as a bearer token (``MLFLOW_TRACKING_TOKEN``, which Kiln
sets in every job), or a signed request. Errors answer as MLflow's client reads them: ``{"error_code",
"message"}`` with MLflow's codes (RESOURCE_DOES_NOT_EXIST, INVALID_PARAMETER_VALUE, RESOURCE_ALREADY_EXISTS,
PERMISSION_DENIED, ...).

This is a sub-application of its own (no part of Kiln's OpenAPI document: the protocol is MLflow's, documented by
MLflow); requests with fields it does not use (``run_uuid`` beside ``run_id``) are accepted, as MLflow's server does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, NotRequired

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, StreamingResponse
from typing_extensions import TypedDict

from kiln.api.deps import caller_of
from kiln.api.mlflow_models import add_logged_model_routes
from kiln.api.routers.jobs import at_most
from kiln.domain import limits, run_table, tracking
from kiln.domain.tracking import Batch, MetricPoint, PointIn
from kiln.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InvalidInput,
    KilnError,
    NotFound,
    PayloadTooLarge,
    Unauthenticated,
)
from kiln.usecases.tracking.tracking import ExperimentView, RunView

PREFIX = "/api/2.0/mlflow"
ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts"
Text = Annotated[str, Field(max_length=8000)]
Key = Annotated[str, Field(max_length=tracking.MAX_KEY)]
Id = Annotated[str, Field(max_length=64)]

_CODES: list[tuple[type[KilnError], int, str]] = [
    (NotFound, 404, "RESOURCE_DOES_NOT_EXIST"),
    (Conflict, 400, "RESOURCE_ALREADY_EXISTS"),
    (InvalidInput, 400, "INVALID_PARAMETER_VALUE"),
    (BadRequest, 400, "INVALID_PARAMETER_VALUE"),
    (Forbidden, 403, "PERMISSION_DENIED"),
    (Unauthenticated, 401, "UNAUTHENTICATED"),
    (PayloadTooLarge, 413, "INVALID_PARAMETER_VALUE"),
]


def mlflow_error(exc: KilnError) -> JSONResponse:
    for kind, status, code in _CODES:
        if isinstance(exc, kind):
            return JSONResponse({"error_code": code, "message": exc.message}, status_code=status)
    return JSONResponse({"error_code": "INTERNAL_ERROR", "message": exc.message}, status_code=exc.status)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TagIn(_Body):
    key: Key
    value: Text = ""


class MetricIn(_Body):
    key: Key
    value: float
    timestamp: int = Field(ge=0, le=10**15)
    step: int = Field(0, ge=-(2**63), le=2**63 - 1)


class MetricItem(TypedDict):
    """A point of a log-batch: validated into a plain dict (a model per point would cost more than storing it)."""

    key: Key
    value: float
    timestamp: Annotated[int, Field(ge=0, le=10**15)]
    step: NotRequired[Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]]


class ParamIn(_Body):
    key: Key
    value: Annotated[str, Field(max_length=tracking.MAX_PARAM_VALUE)] = ""


class CreateExperiment(_Body):
    name: Annotated[str, Field(max_length=tracking.MAX_EXPERIMENT_NAME)]
    artifact_location: Annotated[str, Field(max_length=2000)] | None = None
    tags: list[TagIn] = Field(default_factory=list, max_length=100)


class ExperimentRef(_Body):
    experiment_id: Id


class UpdateExperiment(_Body):
    experiment_id: Id
    new_name: Annotated[str, Field(max_length=tracking.MAX_EXPERIMENT_NAME)]


class ExperimentTag(_Body):
    experiment_id: Id
    key: Key
    value: Text = ""


class SearchExperiments(_Body):
    max_results: int = Field(1000, ge=1, le=tracking.MAX_SEARCH_RESULTS)
    page_token: Annotated[str, Field(max_length=200)] | None = None
    view_type: Annotated[str, Field(max_length=20)] = "ACTIVE_ONLY"


class CreateRun(_Body):
    experiment_id: Id = tracking.DEFAULT_EXPERIMENT_ALIAS
    run_name: Annotated[str, Field(max_length=tracking.MAX_RUN_NAME)] | None = None
    start_time: int | None = Field(None, ge=0, le=10**15)
    tags: list[TagIn] = Field(default_factory=list, max_length=tracking.MAX_BATCH_TAGS)


class RunRef(_Body):
    run_id: Id | None = None
    run_uuid: Id | None = None

    @property
    def id(self) -> str:
        found = self.run_id or self.run_uuid
        if not found:
            raise InvalidInput("run_id: required", details={"field": "run_id"})
        return found


class UpdateRun(RunRef):
    status: Annotated[str, Field(max_length=16)] | None = None
    end_time: int | None = Field(None, ge=0, le=10**15)
    run_name: Annotated[str, Field(max_length=tracking.MAX_RUN_NAME)] | None = None


class LogMetric(RunRef, MetricIn):
    pass


class LogParam(RunRef, ParamIn):
    pass


class SetTag(RunRef):
    key: Key
    value: Text = ""


class DeleteTag(RunRef):
    key: Key


class LogBatch(RunRef):
    metrics: list[MetricItem] = Field(default_factory=list, max_length=tracking.MAX_BATCH_METRICS)
    params: list[ParamIn] = Field(default_factory=list, max_length=tracking.MAX_BATCH_PARAMS)
    tags: list[TagIn] = Field(default_factory=list, max_length=tracking.MAX_BATCH_TAGS)


class SearchRuns(_Body):
    experiment_ids: list[Id] = Field(default_factory=list, max_length=100)
    filter: Annotated[str, Field(max_length=4000)] | None = None
    run_view_type: Annotated[str, Field(max_length=20)] = "ACTIVE_ONLY"
    max_results: int = Field(tracking.DEFAULT_SEARCH_RESULTS, ge=1, le=tracking.MAX_SEARCH_RESULTS)
    order_by: list[Annotated[str, Field(max_length=500)]] = Field(default_factory=list, max_length=10)
    page_token: Annotated[str, Field(max_length=200)] | None = None
    # Kiln's, for a table (the console's Runs page): only these of each run (params.X, metrics.X, tags.X), and/or
    # the columns a person would be shown (answered as "columns", sent). Neither: everything, as MLflow answers.
    # Experiments by name as well as by id.
    columns: list[Annotated[str, Field(max_length=500)]] | None = Field(None, max_length=100)
    default_columns: bool = Field(False, strict=True)
    experiment_names: list[Annotated[str, Field(max_length=tracking.MAX_EXPERIMENT_NAME)]] = Field(
        default_factory=list, max_length=100
    )


def _experiment(view: ExperimentView) -> dict[str, Any]:
    return {
        "experiment_id": view.id,
        "name": view.name,
        "artifact_location": f"mlflow-artifacts:/{view.id}",
        "lifecycle_stage": view.lifecycle_stage,
        "creation_time": view.created_ms,
        "last_update_time": view.updated_ms,
        "tags": [{"key": k, "value": v} for k, v in view.tags.items()],
    }


def _info(view: RunView) -> dict[str, Any]:
    info: dict[str, Any] = {
        "run_id": view.id,
        "run_uuid": view.id,
        "run_name": view.name,
        "experiment_id": view.experiment_id,
        "user_id": view.user,
        "status": view.status,
        "start_time": view.start_time,
        "artifact_uri": f"mlflow-artifacts:/{view.experiment_id}/{view.id}/artifacts",
        "lifecycle_stage": view.lifecycle_stage,
    }
    if view.end_time is not None:
        info["end_time"] = view.end_time
    return info


def _metric(point: MetricPoint) -> dict[str, Any]:
    return {"key": point.key, "value": point.value, "timestamp": point.timestamp, "step": point.step}


def _run(view: RunView) -> dict[str, Any]:
    tags = {"mlflow.runName": view.name, "mlflow.user": view.user, **view.tags}
    if view.job_id:
        tags.setdefault("kiln.job_id", view.job_id)
    # What a table shows beside MLflow's status (kiln.domain.run_table): the state in Kiln's words, a trial's objective.
    tags[run_table.STATE_TAG] = view.state
    if view.objective:
        tags[run_table.OBJECTIVE_TAG] = view.objective
        tags[run_table.DIRECTION_TAG] = view.direction or "minimize"
    return {
        "info": _info(view),
        "data": {
            "metrics": [_metric(p) for p in view.metrics],
            "params": [{"key": k, "value": v} for k, v in view.params.items()],
            "tags": [{"key": k, "value": v} for k, v in tags.items()],
        },
        "inputs": {},
    }


async def _body(request: Request, model: type[_Body]) -> Any:
    raw = await request.body()
    try:  # parsed and validated in one go by pydantic's own JSON reader (no Python dict of the body between)
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        errors = exc.errors()
        kind, where = (errors[0]["type"], errors[0]["loc"]) if errors else ("", ())
        if kind == "json_invalid":
            raise InvalidInput("the request body is not JSON") from None
        if kind == "model_type" and not where:
            raise InvalidInput("the request body is not a JSON object") from None
        raise


def _query(request: Request, model: type[_Body]) -> Any:
    params = request.query_params
    data: dict[str, Any] = {k: params.get(k) for k in params}
    for many in ("experiment_ids", "order_by", "columns", "experiment_names"):
        if many in params:
            data[many] = params.getlist(many)
    if data.get("default_columns") in ("true", "false"):  # a query's boolean: these two words only
        data["default_columns"] = data["default_columns"] == "true"
    return model.model_validate(data)


def create_mlflow_app(platform: Callable[[], Any]) -> FastAPI:
    """The ``/mlflow`` sub-application; ``platform`` gives the running platform (the parent application's: a
    mounted application's requests name it, not the parent)."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @app.exception_handler(KilnError)
    async def _kiln_error(_request: Request, exc: KilnError) -> JSONResponse:
        return mlflow_error(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query"))
        return mlflow_error(InvalidInput(f"{where}: {first.get('msg', 'invalid')}"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "ENDPOINT_NOT_FOUND" if exc.status_code == 404 else "BAD_REQUEST"
        return JSONResponse({"error_code": code, "message": str(exc.detail)}, status_code=exc.status_code)

    @app.exception_handler(ValueError)
    async def _value(_request: Request, exc: ValueError) -> JSONResponse:  # pydantic's, from model_validate
        return mlflow_error(InvalidInput(str(exc).splitlines()[0] if str(exc) else "invalid request"))

    def tracking_of(_request: Request) -> Any:
        return platform().tracking

    # ---- experiments

    @app.post(f"{PREFIX}/experiments/create")
    async def create_experiment(request: Request) -> dict[str, Any]:
        body: CreateExperiment = await _body(request, CreateExperiment)
        tags = {t.key: t.value for t in body.tags}
        made = await run_in_threadpool(tracking_of(request).create_experiment, caller_of(request), body.name, tags)
        return {"experiment_id": made}

    @app.get(f"{PREFIX}/experiments/get")
    async def get_experiment(request: Request, experiment_id: Annotated[str, Query(max_length=64)]) -> dict[str, Any]:
        view = await run_in_threadpool(tracking_of(request).get_experiment, caller_of(request), experiment_id)
        return {"experiment": _experiment(view)}

    @app.get(f"{PREFIX}/experiments/get-by-name")
    async def get_experiment_by_name(
        request: Request, experiment_name: Annotated[str, Query(max_length=tracking.MAX_EXPERIMENT_NAME)]
    ) -> dict[str, Any]:
        view = await run_in_threadpool(tracking_of(request).experiment_by_name, caller_of(request), experiment_name)
        return {"experiment": _experiment(view)}

    @app.api_route(f"{PREFIX}/experiments/search", methods=["GET", "POST"])
    async def search_experiments(request: Request) -> dict[str, Any]:
        if request.method == "POST":
            body: SearchExperiments = await _body(request, SearchExperiments)
        else:
            body = _query(request, SearchExperiments)
        views, token = await run_in_threadpool(
            tracking_of(request).search_experiments,
            caller_of(request),
            body.view_type,
            body.max_results,
            body.page_token,
        )
        answer: dict[str, Any] = {"experiments": [_experiment(v) for v in views]}
        if token:
            answer["next_page_token"] = token
        return answer

    @app.post(f"{PREFIX}/experiments/delete")
    async def delete_experiment(request: Request) -> dict[str, Any]:
        body: ExperimentRef = await _body(request, ExperimentRef)
        await run_in_threadpool(
            tracking_of(request).set_experiment_stage, caller_of(request), body.experiment_id, tracking.DELETED
        )
        return {}

    @app.post(f"{PREFIX}/experiments/restore")
    async def restore_experiment(request: Request) -> dict[str, Any]:
        body: ExperimentRef = await _body(request, ExperimentRef)
        await run_in_threadpool(
            tracking_of(request).set_experiment_stage, caller_of(request), body.experiment_id, tracking.ACTIVE
        )
        return {}

    @app.post(f"{PREFIX}/experiments/update")
    async def update_experiment(request: Request) -> dict[str, Any]:
        body: UpdateExperiment = await _body(request, UpdateExperiment)
        await run_in_threadpool(
            tracking_of(request).rename_experiment, caller_of(request), body.experiment_id, body.new_name
        )
        return {}

    @app.post(f"{PREFIX}/experiments/set-experiment-tag")
    async def set_experiment_tag(request: Request) -> dict[str, Any]:
        body: ExperimentTag = await _body(request, ExperimentTag)
        await run_in_threadpool(
            tracking_of(request).set_experiment_tag, caller_of(request), body.experiment_id, body.key, body.value
        )
        return {}

    # ---- runs

    @app.post(f"{PREFIX}/runs/create")
    async def create_run(request: Request) -> dict[str, Any]:
        body: CreateRun = await _body(request, CreateRun)
        view = await run_in_threadpool(
            tracking_of(request).create_run,
            caller_of(request),
            body.experiment_id,
            body.run_name,
            body.start_time,
            {t.key: t.value for t in body.tags},
        )
        return {"run": _run(view)}

    @app.get(f"{PREFIX}/runs/get")
    async def get_run(request: Request) -> dict[str, Any]:
        ref: RunRef = _query(request, RunRef)
        view = await run_in_threadpool(tracking_of(request).get_run, caller_of(request), ref.id)
        return {"run": _run(view)}

    @app.post(f"{PREFIX}/runs/update")
    async def update_run(request: Request) -> dict[str, Any]:
        body: UpdateRun = await _body(request, UpdateRun)
        view = await run_in_threadpool(
            tracking_of(request).update_run, caller_of(request), body.id, body.status, body.end_time, body.run_name
        )
        return {"run_info": _info(view)}

    @app.post(f"{PREFIX}/runs/delete")
    async def delete_run(request: Request) -> dict[str, Any]:
        body: RunRef = await _body(request, RunRef)
        await run_in_threadpool(tracking_of(request).set_run_stage, caller_of(request), body.id, tracking.DELETED)
        return {}

    @app.post(f"{PREFIX}/runs/restore")
    async def restore_run(request: Request) -> dict[str, Any]:
        body: RunRef = await _body(request, RunRef)
        await run_in_threadpool(tracking_of(request).set_run_stage, caller_of(request), body.id, tracking.ACTIVE)
        return {}

    async def log(request: Request, run_id: str, batch: Batch) -> dict[str, Any]:
        await run_in_threadpool(tracking_of(request).log, caller_of(request), run_id, batch)
        return {}

    @app.post(f"{PREFIX}/runs/log-metric")
    async def log_metric(request: Request) -> dict[str, Any]:
        body: LogMetric = await _body(request, LogMetric)
        point: PointIn = {"key": body.key, "value": body.value, "timestamp": body.timestamp, "step": body.step}
        return await log(request, body.id, Batch(metrics=[point]))

    @app.post(f"{PREFIX}/runs/log-parameter")
    async def log_parameter(request: Request) -> dict[str, Any]:
        body: LogParam = await _body(request, LogParam)
        return await log(request, body.id, Batch(params={body.key: body.value}))

    @app.post(f"{PREFIX}/runs/set-tag")
    async def set_tag(request: Request) -> dict[str, Any]:
        body: SetTag = await _body(request, SetTag)
        return await log(request, body.id, Batch(tags={body.key: body.value}))

    @app.post(f"{PREFIX}/runs/delete-tag")
    async def delete_tag(request: Request) -> dict[str, Any]:
        body: DeleteTag = await _body(request, DeleteTag)
        await run_in_threadpool(tracking_of(request).delete_tag, caller_of(request), body.id, body.key)
        return {}

    @app.post(f"{PREFIX}/runs/log-batch")
    async def log_batch(request: Request) -> dict[str, Any]:
        body: LogBatch = await _body(request, LogBatch)
        params: dict[str, str] = {}
        for p in body.params:
            if params.get(p.key, p.value) != p.value:
                raise InvalidInput(f"param {p.key} is given twice with different values", details={"field": "params"})
            params[p.key] = p.value
        batch = Batch(
            metrics=body.metrics,  # type: ignore[arg-type]  # the same keys, with pydantic's constraints
            params=params,
            tags={t.key: t.value for t in body.tags},
        )
        return await log(request, body.id, batch)

    @app.post(f"{PREFIX}/runs/log-inputs")
    async def log_inputs(request: Request) -> dict[str, Any]:
        body: RunRef = await _body(request, RunRef)  # datasets of a run: accepted and not kept yet
        await run_in_threadpool(tracking_of(request).get_run, caller_of(request), body.id)
        return {}

    @app.api_route(f"{PREFIX}/runs/search", methods=["GET", "POST"])
    async def search_runs(request: Request) -> dict[str, Any]:
        body: SearchRuns = await _body(request, SearchRuns) if request.method == "POST" else _query(request, SearchRuns)
        page = await run_in_threadpool(
            tracking_of(request).search_table,
            caller_of(request),
            body.experiment_ids,
            body.filter,
            body.run_view_type,
            body.max_results,
            body.order_by,
            body.page_token,
            body.columns,
            body.default_columns,
            body.experiment_names,
        )
        answer: dict[str, Any] = {"runs": [_run(v) for v in page.runs]}
        if page.next_page_token:
            answer["next_page_token"] = page.next_page_token
        if page.columns is not None:
            answer["columns"] = page.columns
        return answer

    add_logged_model_routes(app, platform, _body)

    @app.get(f"{PREFIX}/metrics/get-history")
    async def get_metric_history(
        request: Request,
        metric_key: Annotated[str, Query(max_length=tracking.MAX_KEY)],
        max_results: Annotated[int, Query(ge=1, le=100_000)] = 25000,
        page_token: Annotated[str | None, Query(max_length=200)] = None,
    ) -> dict[str, Any]:
        ref: RunRef = _query(request, RunRef)
        points, token = await run_in_threadpool(
            tracking_of(request).metric_history, caller_of(request), ref.id, metric_key, max_results, page_token
        )
        answer: dict[str, Any] = {"metrics": [_metric(p) for p in points]}
        if token:
            answer["next_page_token"] = token
        return answer

    # ---- artifacts (mlflow-artifacts: the run's artifact_uri resolves here)

    def artifacts_of(_request: Request, path: str) -> Any:
        """A run's artifacts (``<exp>/<run>/artifacts/..``) or a logged model's (``<exp>/models/<id>/artifacts/..``)."""
        parts = path.strip("/").split("/", 2)
        return platform().logged_models if len(parts) > 1 and parts[1] == "models" else platform().run_artifacts

    @app.put(f"{ARTIFACTS}/{{path:path}}")
    async def upload_artifact(request: Request, path: str) -> dict[str, Any]:
        length = request.headers.get("content-length", "")
        if length.isascii() and length.isdigit() and int(length) > limits.MAX_FILE_BYTES:
            raise PayloadTooLarge(f"an artifact is at most {limits.MAX_FILE_BYTES} bytes, not {length}")
        chunks = at_most(request.stream(), limits.MAX_FILE_BYTES)
        await artifacts_of(request, path).upload(caller_of(request), path, chunks)
        return {}

    @app.get(ARTIFACTS)
    async def list_artifacts(request: Request, path: Annotated[str, Query(max_length=4000)] = "") -> dict[str, Any]:
        entries = await run_in_threadpool(artifacts_of(request, path).listing, caller_of(request), path)
        files = [
            {"path": e.path, "is_dir": e.is_dir, **({} if e.size is None else {"file_size": e.size})} for e in entries
        ]
        return {"files": files}

    @app.get(f"{ARTIFACTS}/{{path:path}}")
    async def download_artifact(request: Request, path: str) -> StreamingResponse:
        chunks = await run_in_threadpool(artifacts_of(request, path).read, caller_of(request), path)
        return StreamingResponse(chunks, media_type="application/octet-stream")

    return app
