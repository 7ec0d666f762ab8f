"""placement.decide: strict FIFO, head-of-line blocking, GPU packing, never-fits jobs."""

from __future__ import annotations

from kiln.backends.base import Inventory
from kiln.scheduler.placement import Held, Placement, Request, decide, never_fits

GI = 1024**3


def req(job_id: str, cpus: float = 1, memory: int | None = None, gpus: int = 0) -> Request:
    return Request(job_id, cpus, memory, gpus)


def test_empty_queue_places_nothing() -> None:
    decision = decide([], Inventory(cpus=4, memory=8 * GI), [])
    assert (decision.placements, decision.waiting, decision.unschedulable) == ([], {}, {})


def test_fifo_places_in_queue_order_until_full() -> None:
    queue = [req("a", 1, GI), req("b", 2, GI), req("c", 1, GI), req("d", 1, GI)]
    decision = decide(queue, Inventory(cpus=4, memory=8 * GI), [])
    assert decision.placements == [
        Placement("a", 1, GI, ()),
        Placement("b", 2, GI, ()),
        Placement("c", 1, GI, ()),
    ]
    assert decision.waiting == {"d": "capacity: CPUs 1 asked, 0 free"}
    assert decision.unschedulable == {}


def test_big_job_at_the_head_blocks_smaller_ones_behind_it() -> None:
    inventory = Inventory(cpus=4, memory=8 * GI)
    held = [Held(cpus=2, memory=None, gpus=())]
    queue = [req("big", 4), req("small1", 1), req("small2", 1)]
    decision = decide(queue, inventory, held)
    assert decision.placements == []  # the small ones would fit, but must not overtake
    assert decision.waiting == {
        "big": "capacity: CPUs 4 asked, 2 free",
        "small1": "queued: position 2, behind big",
        "small2": "queued: position 3, behind big",
    }


def test_jobs_before_the_blocker_are_placed_and_positions_count_from_the_blocker() -> None:
    inventory = Inventory(cpus=4, memory=8 * GI)
    queue = [req("a", 2), req("big", 4), req("c", 1)]
    decision = decide(queue, inventory, [])
    assert [p.job_id for p in decision.placements] == ["a"]
    assert decision.waiting == {
        "big": "capacity: CPUs 4 asked, 2 free",
        "c": "queued: position 2, behind big",
    }


def test_memory_blocks_like_cpus() -> None:
    inventory = Inventory(cpus=16, memory=8 * GI)
    held = [Held(cpus=1, memory=6 * GI, gpus=())]
    decision = decide([req("m", 1, 4 * GI), req("tiny", 1, GI)], inventory, held)
    assert decision.placements == []
    assert decision.waiting == {
        "m": "capacity: memory 4Gi asked, 2Gi free",
        "tiny": "queued: position 2, behind m",
    }


def test_jobs_without_memory_do_not_consume_memory() -> None:
    inventory = Inventory(cpus=8, memory=GI)
    decision = decide([req("a", 1, None), req("b", 1, None), req("c", 1, GI)], inventory, [])
    assert [p.job_id for p in decision.placements] == ["a", "b", "c"]
    assert decision.placements[0].memory is None


def test_every_shortfall_is_named() -> None:
    inventory = Inventory(cpus=4, memory=4 * GI, gpus=(0, 1))
    held = [Held(cpus=3, memory=3 * GI, gpus=(0,))]
    decision = decide([req("x", 2, 2 * GI, 2)], inventory, held)
    assert decision.waiting == {"x": "capacity: CPUs 2 asked, 1 free; memory 2Gi asked, 1Gi free; GPUs 2 asked, 1 free"}


def test_gpu_packing_takes_the_lowest_free_indices() -> None:
    inventory = Inventory(cpus=32, memory=64 * GI, gpus=(0, 1, 2, 3, 4, 5, 6, 7))
    held = [Held(cpus=1, memory=None, gpus=(1, 4))]
    decision = decide([req("two", gpus=2), req("one", gpus=1), req("three", gpus=3)], inventory, held)
    assert [(p.job_id, p.gpus) for p in decision.placements] == [
        ("two", (0, 2)),
        ("one", (3,)),
        ("three", (5, 6, 7)),
    ]


def test_gpu_jobs_wait_when_the_free_gpus_are_too_few() -> None:
    inventory = Inventory(cpus=32, memory=64 * GI, gpus=(0, 1, 2, 3))
    held = [Held(cpus=1, memory=None, gpus=(0, 1, 2))]
    decision = decide([req("two", gpus=2), req("cpu_only", gpus=0)], inventory, held)
    assert decision.placements == []
    assert decision.waiting == {"two": "capacity: GPUs 2 asked, 1 free", "cpu_only": "queued: position 2, behind two"}


def test_gpu_packing_is_lowest_first_even_when_the_inventory_lists_gpus_out_of_order() -> None:
    # KILN_GPUS="3,1,0,2" keeps the operator's order (backends/local/inventory.parse_gpu_list does not sort).
    # Regression test (found by this suite, since fixed):
    # (src/kiln/scheduler/placement.py, decide): free GPUs are taken in inventory order, not lowest index first as
    # its comment promises; this job gets (3, 1) instead of (0, 1).
    inventory = Inventory(cpus=8, memory=8 * GI, gpus=(3, 1, 0, 2))
    decision = decide([req("two", gpus=2)], inventory, [])
    assert decision.placements[0].gpus == (0, 1)


def test_never_fitting_jobs_are_unschedulable_and_do_not_block() -> None:
    inventory = Inventory(cpus=4, memory=8 * GI, gpus=(0,))
    queue = [
        req("too_many_cpus", 8),
        req("too_much_memory", 1, 16 * GI),
        req("too_many_gpus", 1, None, 2),
        req("fits", 4, 8 * GI, 1),
    ]
    decision = decide(queue, inventory, [])
    assert decision.unschedulable == {
        "too_many_cpus": "asks 8 CPUs; this backend has 4 in all",
        "too_much_memory": "asks 16Gi memory; this backend has 8Gi in all",
        "too_many_gpus": "asks 2 GPUs; this backend has 1 in all",
    }
    assert decision.placements == [Placement("fits", 4, 8 * GI, (0,))]
    assert decision.waiting == {}


def test_never_fitting_jobs_do_not_count_in_queue_positions() -> None:
    inventory = Inventory(cpus=4, memory=8 * GI)
    queue = [req("blocker", 4), req("huge", 100), req("next", 1)]
    decision = decide(queue, inventory, [Held(1, None, ())])
    assert decision.unschedulable.keys() == {"huge"}
    assert decision.waiting == {
        "blocker": "capacity: CPUs 4 asked, 3 free",
        "next": "queued: position 2, behind blocker",
    }


def test_a_job_that_fits_the_whole_inventory_exactly_is_schedulable() -> None:
    inventory = Inventory(cpus=4, memory=8 * GI, gpus=(0, 1))
    assert never_fits(req("all", 4, 8 * GI, 2), inventory) is None
    assert never_fits(req("more", 4.5), inventory) is not None


def test_held_allocations_reduce_free_capacity() -> None:
    inventory = Inventory(cpus=8, memory=16 * GI, gpus=(0, 1))
    held = [Held(cpus=3, memory=4 * GI, gpus=(0,)), Held(cpus=2, memory=None, gpus=())]
    # 3 CPUs, 12 GiB and GPU 1 are left.
    decision = decide([req("a", 3, 12 * GI, 1), req("b", 0.5)], inventory, held)
    assert decision.placements == [Placement("a", 3, 12 * GI, (1,))]
    assert decision.waiting == {"b": "capacity: CPUs 0.5 asked, 0 free"}


def test_overcommitted_held_shows_zero_free_not_negative() -> None:
    inventory = Inventory(cpus=2, memory=2 * GI)
    decision = decide([req("a", 1, GI)], inventory, [Held(cpus=3, memory=3 * GI, gpus=())])
    assert decision.waiting == {"a": "capacity: CPUs 1 asked, 0 free; memory 1Gi asked, 0B free"}


def test_fractional_cpus_fill_exactly_despite_float_rounding() -> None:
    inventory = Inventory(cpus=0.3, memory=GI)
    decision = decide([req("a", 0.1), req("b", 0.1), req("c", 0.1), req("d", 0.1)], inventory, [])
    assert [p.job_id for p in decision.placements] == ["a", "b", "c"]
    assert list(decision.waiting) == ["d"]


def test_decide_is_pure() -> None:
    inventory = Inventory(cpus=2, memory=GI, gpus=(0, 1))
    queue = [req("a", 1, None, 1), req("b", 1, None, 1)]
    held: list[Held] = []
    first = decide(queue, inventory, held)
    second = decide(queue, inventory, held)
    assert first == second
    assert held == []
    assert inventory.gpus == (0, 1)
