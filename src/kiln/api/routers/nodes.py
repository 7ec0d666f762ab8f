"""The machines: what each node offers and what holds it now."""

from __future__ import annotations

from fastapi import APIRouter

from kiln.api.deps import Caller, Kiln
from kiln.api.responses import errors
from kiln.domain.nodes import NodeList

router = APIRouter(prefix="/nodes", tags=["scheduling"], responses=errors(403))


@router.get(
    "",
    response_model=NodeList,
    summary="Machine inventory: each node's CPUs, memory and GPUs, and the jobs that hold them",
)
def list_nodes(caller: Caller, kiln: Kiln) -> NodeList:
    return NodeList(items=kiln.nodes.list_nodes(caller))
