"""The runtime catalog."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from kiln.api.deps import Caller, Kiln
from kiln.api.params import Framework
from kiln.api.responses import errors
from kiln.domain import limits
from kiln.domain.schemas import RuntimeList, RuntimeRead

router = APIRouter(prefix="/runtimes", tags=["runtimes"], responses=errors(403))


@router.get("", response_model=RuntimeList)
def list_runtimes(caller: Caller, kiln: Kiln) -> RuntimeList:
    return RuntimeList(items=kiln.runtimes.list(caller))


@router.post(
    "/{framework}/install",
    response_model=RuntimeRead,
    status_code=202,
    summary="Build ahead of first use",
    responses=errors(404, 422),
)
def install_runtime(
    framework: Framework,
    caller: Caller,
    kiln: Kiln,
    version: Annotated[str | None, Query(max_length=limits.MAX_NAME_LENGTH)] = None,
) -> RuntimeRead:
    return kiln.runtimes.install(caller, framework, version)
