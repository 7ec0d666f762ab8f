"""policy.decide: best-fit packing, GPU type and node selector matching, jobs that can never fit."""

from __future__ import annotations

import pytest

from kiln.domain.placement.policy import decide
from kiln.domain.placement.types import Node, WorkerAlloc
from kiln.domain.quota import Limits

from .policy_helpers import GI, NOW, check_waits, job, node, placed, running


def test_two_single_gpu_jobs_leave_the_high_gpus_together() -> None:
    jobs = [job("a", submitted=1, gpus=1), job("b", submitted=2, gpus=1)]
    decision = decide(jobs, [node(gpus=4)], [], now=NOW)
    assert placed(decision) == {
        "a": (WorkerAlloc("n1", 1000, None, (0,)),),
        "b": (WorkerAlloc("n1", 1000, None, (1,)),),
    }


def test_a_single_gpu_job_goes_where_it_leaves_the_biggest_free_block() -> None:
    nodes = [node("empty", gpus=8), node("busy", gpus=8)]
    run = [running("r", ("busy", 1, (0, 1, 2, 3, 4, 5)))]
    decision = decide([job("one", gpus=1)], nodes, run, now=NOW)
    assert placed(decision)["one"] == (WorkerAlloc("busy", 1000, None, (6,)),)


def test_then_by_fewest_free_cpus() -> None:
    nodes = [node("roomy", cpus=32), node("tight", cpus=32)]
    run = [running("r", ("tight", 30, ()))]
    decision = decide([job("small", cpus=2)], nodes, run, now=NOW)
    assert placed(decision)["small"][0].node == "tight"


def test_cpu_jobs_keep_off_gpu_nodes() -> None:
    nodes = [node("gpu", cpus=64, gpus=8), node("cpu", cpus=64)]
    decision = decide([job("c", cpus=4)], nodes, [], now=NOW)
    assert placed(decision)["c"][0].node == "cpu"


def test_memory_is_packed_too() -> None:
    decision = decide(
        [job("a", submitted=1, memory=300 * GI), job("b", submitted=2, memory=300 * GI)],
        [node(memory=512 * GI)],
        [],
        now=NOW,
    )
    assert list(placed(decision)) == ["a"]
    assert decision.waiting["b"].message.startswith("capacity: memory 300 GiB asked, 212 GiB free")


def test_gpu_type_picks_matching_gpus() -> None:
    mixed = Node("mixed", 64_000, 512 * GI, (0, 1, 2, 3), {0: "T4", 1: "T4", 2: "H200", 3: "H200"})
    decision = decide([job("h", gpus=1, gpu_type="H200")], [mixed, node("t4", gpus=4, gpu_type="T4")], [], now=NOW)
    assert placed(decision)["h"] == (WorkerAlloc("mixed", 1000, None, (2,)),)


def test_gpu_type_absent_is_unschedulable() -> None:
    nodes = [node("a", gpus=8, gpu_type="H200"), node("b", gpus=8, gpu_type="H200")]
    decision = decide([job("x", gpus=1, gpu_type="A100")], nodes, [], now=NOW)
    assert decision.unschedulable == {"x": "asks gpu_type A100; nodes have H200"}


def test_node_selector() -> None:
    nodes = [node("a", labels={"zone": "us"}), node("b", labels={"zone": "eu", "disk": "ssd"})]
    jobs = [
        job("eu", node_selector={"zone": "eu"}),
        job("ssd-us", node_selector={"zone": "us", "disk": "ssd"}),
    ]
    decision = decide(jobs, nodes, [], now=NOW)
    assert placed(decision)["eu"][0].node == "b"
    assert decision.unschedulable == {"ssd-us": "node_selector disk=ssd,zone=us matches no node"}


def test_node_selector_and_gpu_type_together() -> None:
    nodes = [node("a", gpus=8, gpu_type="H200", labels={"zone": "us"}), node("b", gpus=8, gpu_type="T4")]
    decision = decide([job("x", gpus=1, gpu_type="T4", node_selector={"zone": "us"})], nodes, [], now=NOW)
    assert decision.unschedulable == {"x": "asks gpu_type T4; nodes matching node_selector zone=us have H200"}


def test_never_fits_names_the_resource() -> None:
    nodes = [node("a", cpus=32, memory=256 * GI, gpus=8), node("b", cpus=16, memory=64 * GI)]
    jobs = [
        job("gpus", gpus=9),
        job("cpus", cpus=48),
        job("mem", memory=300 * GI),
        job("combo", cpus=24, memory=100 * GI, gpus=0, node_selector={}),
        job("per-worker", workers=2, gpus=9),
    ]
    decision = decide(jobs, nodes, [], now=NOW)
    assert decision.unschedulable == {
        "gpus": "asks 9 GPUs; the largest node has 8",
        "cpus": "asks 48 CPUs; the largest node has 32",
        "mem": "asks 300 GiB memory; the largest node has 256 GiB",
        "per-worker": "asks 9 GPUs per worker; the largest node has 8",
    }
    assert list(placed(decision)) == ["combo"]


def test_never_fits_on_any_single_node_at_once() -> None:
    nodes = [node("cpu", cpus=64, memory=8 * GI), node("mem", cpus=4, memory=512 * GI)]
    decision = decide([job("x", cpus=32, memory=64 * GI)], nodes, [], now=NOW)
    assert decision.unschedulable == {"x": "no node has 32 CPUs, 64 GiB memory at once"}


def test_no_nodes() -> None:
    decision = decide([job("x")], [], [], now=NOW)
    assert decision.unschedulable == {"x": "there are no nodes to run on"}


def test_over_the_quota_limit_outright_is_unschedulable() -> None:
    decision = decide([job("x", gpus=8)], [node(gpus=8)], [], limits={"acme": {"train": Limits(gpus=4)}}, now=NOW)
    assert decision.unschedulable == {"x": "quota: the job asks gpus 8 but the limit is 4 (org acme, category train)"}


def test_a_gang_counts_against_quota_as_a_whole() -> None:
    decision = decide(
        [job("g", workers=3, gpus=2)], [node(gpus=8)], [], limits={"acme": {"train": Limits(gpus=4)}}, now=NOW
    )
    assert decision.unschedulable["g"].startswith("quota: the job asks gpus 6 but the limit is 4")


def test_capacity_message_on_many_nodes_speaks_of_one_node() -> None:
    nodes = [node("a", gpus=8), node("b", gpus=8)]
    run = [running("ra", ("a", 1, (0, 1, 2, 3, 4))), running("rb", ("b", 1, (0, 1, 2, 3, 4, 5)))]
    decision = decide([job("x", gpus=4)], nodes, run, now=NOW)
    assert decision.waiting["x"].message.startswith("capacity: GPUs 4 asked, at most 3 free on one node")
    check_waits(decision)


def test_running_jobs_on_unknown_nodes_are_ignored() -> None:
    decision = decide([job("x", gpus=1)], [node(gpus=1)], [running("r", ("gone", 1, (0,)))], now=NOW)
    assert placed(decision)["x"][0].gpus == (0,)


@pytest.mark.parametrize("asked", ["H200", "h200", "NVIDIA H200", "nvidia-h200", "nvidia_h200 "])
def test_gpu_type_matches_any_run_of_words_of_the_model_name(asked: str) -> None:
    nodes = [node("a", gpus=2, gpu_type="NVIDIA H200")]
    decision = decide([job("x", gpus=1, gpu_type=asked)], nodes, [], now=NOW)
    assert [p.job_id for p in decision.placements] == ["x"], decision


@pytest.mark.parametrize("asked", ["H100", "NVIDIA H2", "H200 NVIDIA"])
def test_gpu_type_does_not_match_a_partial_word_or_another_order(asked: str) -> None:
    nodes = [node("a", gpus=2, gpu_type="NVIDIA H200")]
    decision = decide([job("x", gpus=1, gpu_type=asked)], nodes, [], now=NOW)
    assert decision.unschedulable == {"x": f"asks gpu_type {asked}; nodes have NVIDIA H200"}
