"""The model registry: register a version from a job's outputs, read models, versions (by number, alias or
``latest``) and their files, move aliases, remove versions and models (use cases:
kiln.usecases.models.model_registry)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import Response

from kiln.api.deps import Caller, Kiln
from kiln.api.idempotency import Idempotent, mark_replayed, replayable
from kiln.api.params import FilePath
from kiln.api.responses import REDIRECT, errors, links, stored_file
from kiln.domain import models as refs
from kiln.domain.models import (
    AliasRead,
    AliasSet,
    ModelList,
    ModelRead,
    ModelRegister,
    ModelRemoved,
    ModelVersionList,
    ModelVersionRead,
)
from kiln.errors import BadRequest

router = APIRouter(prefix="/models", tags=["models"], responses=errors(403))

# Twice the longest name or alias: a longer one is refused by their own rules (400, saying what they are).
ModelName = Annotated[
    str, Path(max_length=200, description="A model's name: lowercase letters, digits and . _ - (at most 100)")
]
VersionRef = Annotated[
    str, Path(max_length=126, description="A version number (from 1), an alias, or 'latest' where allowed")
]
AliasName = Annotated[str, Path(max_length=126, description="An alias: lowercase, starting with a letter")]
VERSION = {"model": "$response.body#/name", "version": "$response.body#/version"}
NAMED = {"model": "$response.body#/name"}


def _number(text: str) -> int:
    """A version to remove: by its number only (an alias moves; removing through one is too easy to get wrong)."""
    try:
        version = refs.parse_version(text)
    except refs.ModelRefError as exc:
        raise BadRequest(str(exc)) from None
    if not isinstance(version, int):
        raise BadRequest(f"version {text!r}: remove a version by its number, not an alias or 'latest'")
    return version


@router.get("", response_model=ModelList, summary="The organisation's models: latest version, aliases, size")
def list_models(caller: Caller, kiln: Kiln) -> ModelList:
    return ModelList(items=kiln.models.list_models(caller))


@router.get(
    "/{model}",
    response_model=ModelRead,
    summary="A model: its aliases and versions (newest first) with their files and lineage",
    responses=errors(400, 404, 422),
)
def get_model(model: ModelName, caller: Caller, kiln: Kiln) -> ModelRead:
    return kiln.models.get_model(caller, model)


@router.delete(
    "/{model}",
    response_model=ModelRemoved,
    summary="Remove a model: every version and alias (409 while a service serves it or a running job reads it)",
    responses=errors(400, 404, 409, 422),
)
def delete_model(model: ModelName, caller: Caller, kiln: Kiln) -> ModelRemoved:
    return kiln.models.remove(caller, model, None)


@router.post(
    "/{model}/versions",
    response_model=ModelVersionRead,
    status_code=201,
    summary="Register the next version from an ended job's output file or directory (creates the model)",
    responses=replayable(
        {
            **errors(400, 404, 409, 422),
            **links(201, "The new version", get_model_version=VERSION, delete_model_version=VERSION, get_model=NAMED),
            200: {
                "model": ModelVersionRead,
                "description": "No new version: the one registered earlier from the same job with the same "
                "framework and files (already_registered: true), which is the one to use",
            },
        }
    ),
)
def register_model_version(
    model: ModelName, body: ModelRegister, caller: Caller, kiln: Kiln, idempotency: Idempotent, response: Response
) -> ModelVersionRead:
    version = kiln.models.register(caller, model, body, idempotency)
    mark_replayed(response, idempotency)
    if version.already_registered:
        response.status_code = 200
    return version


@router.get(
    "/{model}/versions",
    response_model=ModelVersionList,
    summary="A model's versions, oldest first (their files: GET a version)",
    responses=errors(400, 404, 422),
)
def model_versions(model: ModelName, caller: Caller, kiln: Kiln) -> ModelVersionList:
    return ModelVersionList(name=model, items=kiln.models.versions(caller, model))


@router.get(
    "/{model}/versions/{version}",
    response_model=ModelVersionRead,
    summary="One version, by number, alias or 'latest': its files and lineage",
    responses=errors(400, 404, 422),
)
def get_model_version(model: ModelName, version: VersionRef, caller: Caller, kiln: Kiln) -> ModelVersionRead:
    return kiln.models.version(caller, model, version)


@router.get(
    "/{model}/versions/{version}/files/{path:path}",
    summary="A file's bytes: streamed, or a 307 redirect to a short-lived store URL (S3)",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}, **REDIRECT, **errors(400, 404, 422)},
)
def model_file(model: ModelName, version: VersionRef, path: FilePath, caller: Caller, kiln: Kiln) -> Response:
    key, entry = kiln.models.file(caller, model, version, path)
    return stored_file(kiln.store, key, entry.sha256, entry.size, kiln.models.presigned_get(key, entry.path))


@router.delete(
    "/{model}/versions/{version}",
    response_model=ModelRemoved,
    summary="Remove one version, by number, and the aliases naming it (409 while it is served or read by a job)",
    responses=errors(400, 404, 409, 422),
)
def delete_model_version(model: ModelName, version: VersionRef, caller: Caller, kiln: Kiln) -> ModelRemoved:
    return kiln.models.remove(caller, model, _number(version))


@router.put(
    "/{model}/aliases/{alias}",
    response_model=AliasRead,
    summary="Point an alias at a version (created, or moved from the version it named)",
    responses=errors(400, 404, 422),
)
def set_model_alias(model: ModelName, alias: AliasName, body: AliasSet, caller: Caller, kiln: Kiln) -> AliasRead:
    return kiln.models.set_alias(caller, model, alias, body.version)


@router.delete(
    "/{model}/aliases/{alias}",
    response_model=AliasRead,
    summary="Remove an alias (the version stays); answers the version it named",
    responses=errors(400, 404, 422),
)
def delete_model_alias(model: ModelName, alias: AliasName, caller: Caller, kiln: Kiln) -> AliasRead:
    return kiln.models.delete_alias(caller, model, alias)
