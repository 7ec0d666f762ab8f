"""policy.decide / fairshare.fair_order: weighted dominant-resource fair share between organisations."""

from __future__ import annotations

from collections import Counter

from kiln.domain.placement.fairshare import fair_order
from kiln.domain.placement.policy import decide
from kiln.domain.placement.types import Decision

from .policy_helpers import GI, NOW, check_waits, job, node, placed, running


def orgs_placed(decision: Decision) -> Counter[str]:
    return Counter(job_id.split("-")[0] for job_id in placed(decision))


def test_a_fast_submitter_does_not_crowd_out_a_slow_one() -> None:
    # Org a submits 100 jobs, all before org b's 10: capacity for 10 is shared half and half.
    jobs = [job(f"a-{i}", org="a", submitted=i) for i in range(100)]
    jobs += [job(f"b-{i}", org="b", submitted=1000 + i) for i in range(10)]
    decision = decide(jobs, [node(cpus=10)], [], now=NOW)
    assert orgs_placed(decision) == {"a": 5, "b": 5}
    check_waits(decision)
    # and the waiting jobs keep interleaving: b's remaining 5 are among the first 10 positions
    assert max(decision.waiting[f"b-{i}"].position for i in range(5, 10)) <= 10


def test_fifo_within_each_organisation() -> None:
    jobs = [job(f"a-{i}", org="a", submitted=100 - i) for i in range(6)]
    jobs += [job(f"b-{i}", org="b", submitted=200 - i) for i in range(6)]
    decision = decide(jobs, [node(cpus=4)], [], now=NOW)
    assert set(placed(decision)) == {"a-5", "a-4", "b-5", "b-4"}  # the oldest two of each


def test_weights_scale_the_share() -> None:
    jobs = [job(f"a-{i}", org="a", submitted=i) for i in range(50)]
    jobs += [job(f"b-{i}", org="b", submitted=i) for i in range(50)]
    decision = decide(jobs, [node(cpus=8)], [], weights={"a": 3.0}, now=NOW)
    assert orgs_placed(decision) == {"a": 6, "b": 2}


def test_an_organisation_already_holding_the_cluster_goes_last() -> None:
    run = [running(f"r{i}", ("n1", 1, (i,)), org="a") for i in range(6)]  # a holds 6 of 8 GPUs
    jobs = [job("a-new", org="a", submitted=1, gpus=1), job("b-new", org="b", submitted=2, gpus=1)]
    jobs.append(job("b-next", org="b", submitted=3, gpus=1))
    decision = decide(jobs, [node(cpus=64, gpus=8)], run, now=NOW)
    assert set(placed(decision)) == {"b-new", "b-next"}
    assert decision.waiting["a-new"].kind == "capacity"


def test_dominant_resource_is_what_counts() -> None:
    # a uses 50% of the memory but few CPUs; b uses 25% of the CPUs: b's dominant share is lower, b goes first.
    nodes = [node(cpus=16, memory=64 * GI)]
    run = [running("ra", ("n1", 1, ()), org="a", memory=32 * GI), running("rb", ("n1", 4, ()), org="b")]
    order = fair_order(
        [job("a-1", org="a", submitted=1), job("b-1", org="b", submitted=2)], (0.0, 16_000.0, 64.0 * GI), run
    )
    assert [j.job_id for j in order] == ["b-1", "a-1"]
    decision = decide(
        [job("a-1", org="a", submitted=1, cpus=11), job("b-1", org="b", submitted=2, cpus=11)], nodes, run, now=NOW
    )
    assert set(placed(decision)) == {"b-1"}


def test_demand_is_counted_as_the_order_is_built() -> None:
    # a's jobs ask 4 GPUs each, b's 1: after one of a's, b gets four turns before a's share is matched.
    jobs = [job(f"a-{i}", org="a", submitted=i, gpus=4) for i in range(3)]
    jobs += [job(f"b-{i}", org="b", submitted=10 + i, gpus=1) for i in range(8)]
    order = [j.job_id for j in fair_order(jobs, (16.0, 64_000.0, 512.0 * GI))]
    assert order[:6] == ["a-0", "b-0", "b-1", "b-2", "b-3", "a-1"]


def test_priority_classes_come_before_fair_share() -> None:
    run = [running(f"r{i}", ("n1", 1, ()), org="a") for i in range(10)]
    jobs = [job("a-high", org="a", priority="high", submitted=5), job("b-normal", org="b", submitted=1)]
    order = [j.job_id for j in fair_order(jobs, (0.0, 64_000.0, 512.0 * GI), run)]
    assert order == ["a-high", "b-normal"]


def test_zero_weight_goes_last_without_breaking() -> None:
    jobs = [job("a-1", org="a", submitted=1), job("b-1", org="b", submitted=2)]
    run = [running("r", ("n1", 1, ()), org="a")]
    order = [j.job_id for j in fair_order(jobs, (0.0, 64_000.0, 512.0 * GI), run, {"a": 0.0})]
    assert order == ["b-1", "a-1"]
