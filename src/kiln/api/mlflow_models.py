"""MLflow 3's logged-model endpoints under ``/mlflow/api/2.0/mlflow/logged-models`` (create, get, finalize, search,
delete, tags, params, the directory listing MLflow's UI asks for) and ``runs/outputs``, translated to
kiln.usecases.models.logged_models. Paths, fields and enum names are MLflow's (``mlflow/protos/service.proto``); the
model's
files go through ``mlflow-artifacts`` at its ``artifact_uri`` (kiln.api.mlflow routes ``<exp>/models/<id>/...``
there)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from kiln.api.deps import caller_of
from kiln.domain import tracking
from kiln.errors import InvalidInput
from kiln.usecases.models.logged_models import MAX_PARAMS, MAX_RESULTS, MAX_TAGS, LoggedModelView

PREFIX = "/api/2.0/mlflow"
Id = Annotated[str, Field(max_length=64)]
Text = Annotated[str, Field(max_length=8000)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Pair(_Body):
    key: Annotated[str, Field(max_length=tracking.MAX_KEY)]
    value: Text = ""


class CreateLoggedModel(_Body):
    experiment_id: Id = tracking.DEFAULT_EXPERIMENT_ALIAS
    name: Annotated[str, Field(max_length=256)] | None = None
    model_type: Annotated[str, Field(max_length=256)] | None = None
    source_run_id: Id | None = None
    params: list[Pair] = Field(default_factory=list, max_length=MAX_PARAMS)
    tags: list[Pair] = Field(default_factory=list, max_length=MAX_TAGS)


class FinalizeLoggedModel(_Body):
    status: Annotated[str, Field(max_length=40)]


class Pairs(_Body):
    tags: list[Pair] = Field(default_factory=list, max_length=MAX_TAGS)
    params: list[Pair] = Field(default_factory=list, max_length=MAX_PARAMS)


class SearchLoggedModels(_Body):
    experiment_ids: list[Id] = Field(default_factory=list, max_length=100)
    filter: Annotated[str, Field(max_length=4000)] | None = None
    max_results: int = Field(100, ge=1, le=MAX_RESULTS)
    page_token: Annotated[str, Field(max_length=200)] | None = None


class ModelOutput(_Body):
    model_id: Id
    step: int = 0


class LogOutputs(_Body):
    run_id: Id
    models: list[ModelOutput] = Field(default_factory=list, max_length=100)


def artifact_uri(view: LoggedModelView) -> str:
    return f"mlflow-artifacts:/{view.experiment_id}/models/{view.id}/artifacts"


def logged_model(view: LoggedModelView) -> dict[str, Any]:
    """A LoggedModel message (service.proto) as JSON."""
    info: dict[str, Any] = {
        "model_id": view.id,
        "experiment_id": view.experiment_id,
        "name": view.name,
        "creation_timestamp_ms": view.created_ms,
        "last_updated_timestamp_ms": view.updated_ms,
        "artifact_uri": artifact_uri(view),
        "status": view.status,
        "tags": [{"key": k, "value": v} for k, v in view.tags.items()],
    }
    for key, value in (
        ("model_type", view.model_type),
        ("source_run_id", view.run_id),
        ("status_message", view.status_message),
    ):
        if value:
            info[key] = value
    return {"info": info, "data": {"params": [{"key": k, "value": v} for k, v in view.params.items()], "metrics": []}}


def add_logged_model_routes(
    app: FastAPI, platform: Callable[[], Any], body: Callable[[Request, type[Any]], Awaitable[Any]]
) -> None:
    """Add the routes to the ``/mlflow`` sub-application; ``body`` reads and validates a request's JSON body."""

    def models_of(_request: Request) -> Any:
        return platform().logged_models

    @app.post(f"{PREFIX}/logged-models")
    async def create_logged_model(request: Request) -> dict[str, Any]:
        got: CreateLoggedModel = await body(request, CreateLoggedModel)
        view = await run_in_threadpool(
            models_of(request).create,
            caller_of(request),
            got.experiment_id,
            got.name,
            got.model_type,
            got.source_run_id,
            {p.key: p.value for p in got.params},
            {t.key: t.value for t in got.tags},
        )
        return {"model": logged_model(view)}

    @app.post(f"{PREFIX}/logged-models/search")
    async def search_logged_models(request: Request) -> dict[str, Any]:
        got: SearchLoggedModels = await body(request, SearchLoggedModels)
        views, token = await run_in_threadpool(
            models_of(request).search,
            caller_of(request),
            got.experiment_ids,
            got.filter,
            got.max_results,
            got.page_token,
        )
        answer: dict[str, Any] = {"models": [logged_model(v) for v in views]}
        if token:
            answer["next_page_token"] = token
        return answer

    @app.get(f"{PREFIX}/logged-models/{{model_id}}")
    async def get_logged_model(request: Request, model_id: str, allow_deleted: bool = False) -> dict[str, Any]:
        view = await run_in_threadpool(models_of(request).get, caller_of(request), model_id, allow_deleted)
        return {"model": logged_model(view)}

    @app.patch(f"{PREFIX}/logged-models/{{model_id}}")
    async def finalize_logged_model(request: Request, model_id: str) -> dict[str, Any]:
        got: FinalizeLoggedModel = await body(request, FinalizeLoggedModel)
        view = await run_in_threadpool(models_of(request).finalize, caller_of(request), model_id, got.status)
        return {"model": logged_model(view)}

    @app.delete(f"{PREFIX}/logged-models/{{model_id}}")
    async def delete_logged_model(request: Request, model_id: str) -> dict[str, Any]:
        await run_in_threadpool(models_of(request).delete, caller_of(request), model_id)
        return {}

    @app.patch(f"{PREFIX}/logged-models/{{model_id}}/tags")
    async def set_logged_model_tags(request: Request, model_id: str) -> dict[str, Any]:
        got: Pairs = await body(request, Pairs)
        tags = {t.key: t.value for t in got.tags}
        view = await run_in_threadpool(models_of(request).set_tags, caller_of(request), model_id, tags)
        return {"model": logged_model(view)}

    @app.delete(f"{PREFIX}/logged-models/{{model_id}}/tags/{{key:path}}")
    async def delete_logged_model_tag(request: Request, model_id: str, key: str) -> dict[str, Any]:
        await run_in_threadpool(models_of(request).delete_tag, caller_of(request), model_id, key)
        return {}

    @app.post(f"{PREFIX}/logged-models/{{model_id}}/params")
    async def log_logged_model_params(request: Request, model_id: str) -> dict[str, Any]:
        got: Pairs = await body(request, Pairs)
        params = {p.key: p.value for p in got.params}
        await run_in_threadpool(models_of(request).log_params, caller_of(request), model_id, params)
        return {}

    @app.get(f"{PREFIX}/logged-models/{{model_id}}/artifacts/directories")
    async def list_logged_model_artifacts(
        request: Request, model_id: str, artifact_directory_path: Annotated[str, Query(max_length=4000)] = ""
    ) -> dict[str, Any]:
        principal = caller_of(request)
        view = await run_in_threadpool(models_of(request).get, principal, model_id)
        path = f"{view.experiment_id}/models/{view.id}/artifacts/{artifact_directory_path.strip('/')}"
        entries = await run_in_threadpool(models_of(request).listing, principal, path)
        base = artifact_directory_path.strip("/")
        files = [
            {
                "path": f"{base}/{e.path}" if base else e.path,
                "is_dir": e.is_dir,
                **({} if e.size is None else {"file_size": e.size}),
            }
            for e in entries
        ]
        return {"root_uri": artifact_uri(view), "files": files}

    @app.post(f"{PREFIX}/runs/outputs")
    async def log_outputs(request: Request) -> dict[str, Any]:
        """The run's outputs are its logged models (each names its run): checked, nothing more to keep."""
        got: LogOutputs = await body(request, LogOutputs)
        principal = caller_of(request)
        for output in got.models:
            view = await run_in_threadpool(models_of(request).get, principal, output.model_id)
            if view.run_id != got.run_id:
                raise InvalidInput(f"logged model {view.id} was not logged by run {got.run_id}")
        return {}
