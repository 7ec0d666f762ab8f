"""The runtime catalog, installing a runtime ahead of its first use, and the state and log of that build."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from kiln.api.deps import Caller, Kiln
from kiln.api.params import Framework
from kiln.api.responses import errors
from kiln.domain import limits
from kiln.domain.runtime_builds import RuntimeDetail
from kiln.domain.schemas import RuntimeList

router = APIRouter(prefix="/runtimes", tags=["runtimes"], responses=errors(403))

RuntimeName = Annotated[
    str,
    Path(
        max_length=limits.MAX_NAME_LENGTH,
        description="A catalog runtime, e.g. pytorch-2.13, or a framework (its default version), e.g. pytorch",
    ),
]


@router.get("", response_model=RuntimeList)
def list_runtimes(caller: Caller, kiln: Kiln) -> RuntimeList:
    return RuntimeList(items=kiln.runtimes.list(caller))


@router.get(
    "/{name}",
    response_model=RuntimeDetail,
    summary="A runtime, with the state of its latest build started through the API",
    responses=errors(404, 422),
)
def get_runtime(name: RuntimeName, caller: Caller, kiln: Kiln) -> RuntimeDetail:
    return kiln.runtimes.get(caller, name)


@router.get(
    "/{name}/log",
    summary="The log of a runtime's latest build, '<time> <O|E|K> <text>' lines, a page at a time",
    response_class=Response,
    responses={
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "headers": {
                "X-Kiln-Next-Offset": {"description": "The offset of the next page", "schema": {"type": "string"}},
                "X-Kiln-Build-Ended": {
                    "description": "true: the build has ended and nothing is left to read",
                    "schema": {"type": "string"},
                },
            },
        },
        **errors(404, 422),
    },
)
def runtime_log(
    name: RuntimeName,
    caller: Caller,
    kiln: Kiln,
    offset: Annotated[int, Query(ge=0, le=limits.MAX_INT64, description="Byte offset to start from")] = 0,
    limit: Annotated[int, Query(ge=1, le=limits.MAX_LOG_READ_BYTES)] = 1024 * 1024,
) -> Response:
    data, next_offset, ended = kiln.runtimes.read_log(caller, name, offset, limit)
    headers = {"X-Kiln-Next-Offset": str(next_offset), "X-Kiln-Build-Ended": "true" if ended else "false"}
    return Response(data, media_type="text/plain", headers=headers)


@router.post(
    "/{framework}/install",
    response_model=RuntimeDetail,
    status_code=202,
    summary="Build ahead of first use; follow the build with GET /runtimes/{name} and its log",
    responses=errors(404, 422),
)
def install_runtime(
    framework: Framework,
    caller: Caller,
    kiln: Kiln,
    version: Annotated[str | None, Query(max_length=limits.MAX_NAME_LENGTH)] = None,
) -> RuntimeDetail:
    return kiln.runtimes.install(caller, framework, version)
