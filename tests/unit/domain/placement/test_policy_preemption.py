"""policy.decide with preemption: victims, only when useful, never equal priority, jobs already preempting."""

from __future__ import annotations

from kiln.domain.placement.policy import decide
from kiln.domain.quota import Limits, OrgUsage

from .policy_helpers import NOW, check_waits, job, kinds, node, placed, running

FULL = [
    running("low-old", ("n1", 1, (0, 1)), priority="low", started=NOW - 500),
    running("low-new", ("n1", 1, (2, 3)), priority="low", started=NOW - 100),
    running("normal", ("n1", 1, (4, 5)), priority="normal", started=NOW - 50),
    running("high", ("n1", 1, (6, 7)), priority="high", started=NOW - 10),
]


def test_preempts_the_lowest_priority_most_recently_started_first() -> None:
    decision = decide([job("h", priority="high", gpus=2)], [node(gpus=8)], FULL, now=NOW, preemption=True)
    assert decision.preemptions == {"low-new": "preempted by h (priority high)"}
    assert placed(decision) == {}
    wait = decision.waiting["h"]
    assert (wait.kind, wait.ahead) == ("preempting", ("low-new",))
    assert wait.message == "preempting: waits until low-new stops (being preempted for it)"
    assert decision.reservation == "h"
    check_waits(decision)


def test_only_as_many_victims_as_needed() -> None:
    decision = decide([job("h", priority="high", gpus=4)], [node(gpus=8)], FULL, now=NOW, preemption=True)
    assert set(decision.preemptions) == {"low-new", "low-old"}
    decision = decide([job("h", priority="high", gpus=6)], [node(gpus=8)], FULL, now=NOW, preemption=True)
    assert set(decision.preemptions) == {"low-new", "low-old", "normal"}


def test_never_preempts_equal_or_higher_priority() -> None:
    decision = decide([job("n", priority="normal", gpus=6)], [node(gpus=8)], FULL, now=NOW, preemption=True)
    assert decision.preemptions == {}  # two low jobs give 4 GPUs; the normal one may not be touched
    assert decision.waiting["n"].kind == "capacity"


def test_does_not_preempt_uselessly() -> None:
    decision = decide([job("h", priority="high", gpus=8)], [node(gpus=8)], FULL, now=NOW, preemption=True)
    assert decision.preemptions == {}
    assert decision.waiting["h"].kind == "capacity"


def test_unneeded_victims_are_spared() -> None:
    # The most recent low job runs on the other node (CPU only): preempting it would not help the GPU job.
    nodes = [node("gpu", gpus=2), node("cpu", cpus=8)]
    run = [
        running("gpu-low", ("gpu", 1, (0, 1)), priority="low", started=NOW - 500),
        running("cpu-low", ("cpu", 8, ()), priority="low", started=NOW - 10),
    ]
    decision = decide([job("h", priority="high", gpus=2)], nodes, run, now=NOW, preemption=True)
    assert decision.preemptions == {"gpu-low": "preempted by h (priority high)"}


def test_a_victim_gang_is_preempted_whole() -> None:
    nodes = [node("a", gpus=2), node("b", gpus=2)]
    gang = running("gang", ("a", 1, (0, 1)), ("b", 1, (0, 1)), priority="low")
    decision = decide([job("h", priority="high", gpus=2)], nodes, [gang], now=NOW, preemption=True)
    assert decision.preemptions == {"gang": "preempted by h (priority high)"}
    # what the gang frees beyond h's needs is free soon for the next job, which waits on it too
    decision = decide(
        [job("h", priority="high", submitted=1, gpus=2), job("h2", priority="high", submitted=2, gpus=2)],
        nodes,
        [gang],
        now=NOW,
        preemption=True,
    )
    assert list(decision.preemptions) == ["gang"]
    assert kinds(decision) == {"h": "preempting", "h2": "preempting"}
    assert decision.reserved == ["h", "h2"]


def test_preemption_off_means_no_preemption() -> None:
    decision = decide([job("h", priority="high", gpus=2)], [node(gpus=8)], FULL, now=NOW)
    assert decision.preemptions == {}
    assert decision.waiting["h"].kind == "capacity"


def test_jobs_already_preempting_are_not_preempted_again_and_count_as_free_soon() -> None:
    run = [
        running("going", ("n1", 1, (0, 1)), priority="low", started=NOW - 5, preempting=True),
        *FULL[1:],
    ]
    jobs = [job("h", priority="high", submitted=1, gpus=2), job("small", priority="low", submitted=2, cpus=1)]
    decision = decide(jobs, [node(gpus=8)], run, now=NOW, preemption=True)
    assert decision.preemptions == {}
    assert decision.waiting["h"].kind == "preempting"
    assert decision.waiting["h"].message == "preempting: waits until going stops (being preempted for it)"
    assert decision.reservation == "h"
    assert list(placed(decision)) == ["small"]  # CPUs are free; the GPUs being freed are claimed by h


def test_free_soon_resources_are_not_stolen_by_backfill() -> None:
    run = [running("going", ("n1", 1, (0, 1)), priority="low", preempting=True)]
    run += [running(f"r{i}", ("n1", 1, (i,)), priority="high") for i in range(2, 8)]
    jobs = [job("h", priority="high", submitted=1, gpus=2), job("n", priority="normal", submitted=2, gpus=1)]
    decision = decide(jobs, [node(gpus=8)], run, now=NOW)  # works with preemption off, too
    assert decision.waiting["h"].kind == "preempting"
    assert decision.waiting["n"].kind == "capacity"
    assert decision.waiting["n"].ahead == ("h",)


def test_never_preempts_for_a_quota_blocked_job() -> None:
    usage = OrgUsage()
    usage.add("train", 4, 4000, None)
    decision = decide(
        [job("h", priority="high", gpus=2)],
        [node(gpus=8)],
        FULL,
        limits={"acme": {"train": Limits(gpus=4)}},
        usage={"acme": usage},
        now=NOW,
        preemption=True,
    )
    assert decision.preemptions == {}
    assert decision.waiting["h"].kind == "quota"


def test_each_victim_is_preempted_once() -> None:
    jobs = [job(f"h{i}", priority="high", submitted=i, gpus=2) for i in range(3)]
    decision = decide(jobs, [node(gpus=8)], FULL, now=NOW, preemption=True)
    assert decision.preemptions == {
        "low-new": "preempted by h0 (priority high)",
        "low-old": "preempted by h1 (priority high)",
        "normal": "preempted by h2 (priority high)",
    }
    assert kinds(decision) == {"h0": "preempting", "h1": "preempting", "h2": "preempting"}
    check_waits(decision)
