"""scheduler.capacity.FreeCapacity: the re-check a placement passes in the transaction that writes it, one row
per case. Pure: nodes, the slots the active jobs hold, and the placements to check in order."""

from __future__ import annotations

import pytest

from kiln.backends.base import Slot
from kiln.domain.placement.types import Node
from kiln.scheduler.capacity import FreeCapacity

GIB = 1024**3
NODE = Node("a", millicores=2000, memory=4 * GIB, gpus=(0, 1))
OTHER = Node("b", millicores=1000, memory=GIB)


def slot(cpus: float, node: str = "a", memory: int | None = None, gpus: tuple[int, ...] = ()) -> Slot:
    return Slot(node, cpus, memory, gpus)


@pytest.mark.parametrize(
    ("held", "placements", "taken"),
    [
        ([], [(slot(1),), (slot(1),), (slot(0.001),)], [True, True, False]),  # the third is over by 1m
        ([slot(1.5)], [(slot(0.5),), (slot(0.1),)], [True, False]),  # what is held counts
        ([slot(0.1)] * 3, [(slot(1.7),)], [True]),  # 0.1 * 3 is 300m exactly, no float residue
        ([], [(slot(0.5, gpus=(0,)),), (slot(0.5, gpus=(0,)),), (slot(0.5, gpus=(1,)),)], [True, False, True]),
        ([slot(0, gpus=(1,))], [(slot(0, gpus=(1,)),)], [False]),  # a GPU held by a running job
        ([], [(slot(0.1, memory=3 * GIB),), (slot(0.1, memory=2 * GIB),)], [True, False]),
        ([], [(slot(0.1, gpus=(0,)), slot(0.1, gpus=(0,)))], [False]),  # one GPU given to two gang members
        ([], [(slot(1.5), slot(1, node="b")), (slot(0.5),)], [True, True]),  # a gang across nodes fits whole
        ([], [(slot(1.5), slot(1.5, node="b")), (slot(2),)], [False, True]),  # ... or counts nothing
        ([], [(slot(1, node="gone"),)], [False]),  # a node no longer offered
        ([slot(8, node="gone")], [(slot(2),)], [True]),  # what a vanished node holds takes nothing of the others
    ],
)
def test_a_placement_is_taken_only_while_it_is_free(
    held: list[Slot], placements: list[tuple[Slot, ...]], taken: list[bool]
) -> None:
    free = FreeCapacity([NODE, OTHER], held)
    assert [free.take(p) for p in placements] == taken
