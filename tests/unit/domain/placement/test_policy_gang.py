"""policy.decide: gangs (multi-worker jobs) are placed whole or not at all."""

from __future__ import annotations

from kiln.domain.placement.policy import decide
from kiln.domain.placement.types import WorkerAlloc

from .policy_helpers import NOW, check_waits, job, node, placed, running


def test_a_gang_with_room_for_only_some_workers_gets_nothing() -> None:
    run = [running("r", ("n1", 1, (0,)))]
    decision = decide([job("g", workers=4, gpus=1)], [node(gpus=4)], run, now=NOW)
    assert placed(decision) == {}
    wait = decision.waiting["g"]
    assert wait.kind == "gang"
    assert wait.message.startswith("gang: 3 of 4 workers fit now (each 1 GPU, 1 CPU); all 4 are placed together")
    check_waits(decision)


def test_a_gang_of_which_no_worker_fits_waits_for_capacity() -> None:
    run = [running("r", ("n1", 1, (0, 1, 2, 3)))]
    decision = decide([job("g", workers=2, gpus=1)], [node(gpus=4)], run, now=NOW)
    assert decision.waiting["g"].kind == "capacity"
    assert decision.waiting["g"].message.startswith("capacity: GPUs 1 asked, 0 free; none of the 2 workers fits")


def test_a_gang_is_placed_whole_across_nodes() -> None:
    nodes = [node("a", gpus=4), node("b", gpus=4)]
    run = [running("r", ("a", 1, (0, 1)))]
    decision = decide([job("g", workers=3, gpus=2)], nodes, run, now=NOW)
    assert placed(decision) == {
        "g": (
            WorkerAlloc("a", 1000, None, (2, 3)),  # the fuller node first (best fit)
            WorkerAlloc("b", 1000, None, (0, 1)),
            WorkerAlloc("b", 1000, None, (2, 3)),
        )
    }


def test_workers_may_share_a_node() -> None:
    decision = decide([job("g", workers=4, cpus=2, gpus=2)], [node(cpus=8, gpus=8)], [], now=NOW)
    assert [w.gpus for w in placed(decision)["g"]] == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_a_gang_larger_than_the_cluster_is_unschedulable() -> None:
    nodes = [node("a", gpus=8), node("b", gpus=8)]
    decision = decide([job("g", workers=5, gpus=4)], nodes, [], now=NOW)
    assert decision.unschedulable == {
        "g": "a gang of 5 workers (4 GPUs, 1 CPU each) can never be placed at once: the nodes hold at most 4"
    }
    assert decision.waiting == {}


def test_a_partly_fitting_gang_does_not_take_resources_from_jobs_behind_it() -> None:
    # The gang cannot be placed; what is free is earmarked for it, so the single job behind waits too.
    run = [running("r", ("n1", 1, (0,)), deadline=NOW + 60)]
    jobs = [job("g", workers=4, gpus=1, submitted=1), job("single", gpus=1, submitted=2)]
    decision = decide(jobs, [node(gpus=4)], run, now=NOW)
    assert placed(decision) == {}
    assert decision.reservation == "g"
    assert decision.waiting["single"].kind == "reservation"
    assert decision.waiting["single"].ahead == ("g",)
    check_waits(decision)
