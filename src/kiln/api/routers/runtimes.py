"""The runtime catalog."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from kiln.api.deps import Caller, Kiln
from kiln.domain.schemas import RuntimeList, RuntimeRead

router = APIRouter(prefix="/runtimes", tags=["runtimes"])


@router.get("", response_model=RuntimeList)
def list_runtimes(caller: Caller, kiln: Kiln) -> RuntimeList:
    return RuntimeList(items=kiln.runtimes.list(caller))


@router.post("/{framework}/install", response_model=RuntimeRead, status_code=202, summary="Build ahead of first use")
def install_runtime(
    framework: str,
    caller: Caller,
    kiln: Kiln,
    version: Annotated[str | None, Query()] = None,
) -> RuntimeRead:
    return kiln.runtimes.install(caller, framework, version)
