"""policy.decide: priority classes, FIFO within a class, positions, messages, determinism."""

from __future__ import annotations

import random

from kiln.domain.placement.policy import decide
from kiln.domain.placement.types import Decision
from kiln.domain.quota import Limits, OrgUsage

from .policy_helpers import NOW, check_waits, job, kinds, node, placed, running


def test_nothing_to_do() -> None:
    decision = decide([], [node()], [], now=NOW)
    assert decision == Decision()


def test_higher_priority_classes_go_first() -> None:
    jobs = [
        job("low", priority="low", submitted=1, cpus=1),
        job("normal", priority="normal", submitted=2, cpus=1),
        job("high", priority="high", submitted=3, cpus=1),
    ]
    decision = decide(jobs, [node(cpus=2)], [], now=NOW)
    assert list(placed(decision)) == ["high", "normal"]
    assert decision.waiting["low"].kind == "capacity"
    assert (
        decision.waiting["low"].message
        == "capacity: CPUs 1 asked, 0 free; next in line: it needs what high (about to start, no timeout) holds, "
        "with no end in sight"
    )
    assert decision.waiting["low"].position == 1
    check_waits(decision)


def test_fifo_within_a_class_by_submit_time_then_id() -> None:
    jobs = [job("c", submitted=5), job("b", submitted=3), job("a", submitted=3), job("d", submitted=9)]
    decision = decide(jobs, [node(cpus=3)], [], now=NOW)
    assert list(placed(decision)) == ["a", "b", "c"]
    assert list(decision.waiting) == ["d"]


def test_positions_follow_scheduling_order() -> None:
    jobs = [job(f"j{i}", submitted=i, cpus=2) for i in range(6)] + [
        job("urgent", priority="high", submitted=99, cpus=2)
    ]
    decision = decide(jobs, [node(cpus=4)], [], now=NOW)
    assert list(placed(decision)) == ["urgent", "j0"]
    positions = {job_id: wait.position for job_id, wait in decision.waiting.items()}
    assert positions == {"j1": 1, "j2": 2, "j3": 3, "j4": 4, "j5": 5}
    check_waits(decision)


def test_lower_class_held_by_a_higher_class_reservation_waits_for_priority() -> None:
    jobs = [job("big", priority="high", cpus=4), job("small", priority="low", cpus=1)]
    decision = decide(jobs, [node(cpus=4)], [running("r", ("n1", 2, ()), deadline=NOW + 60)], now=NOW)
    assert placed(decision) == {}
    assert decision.reservation == "big"
    small = decision.waiting["small"]
    assert small.kind == "priority"
    assert small.message.startswith("priority: the free resources it needs are reserved for big")
    assert "(priority high)" in small.message
    assert small.ahead == ("big",)
    assert decision.waiting["big"].ahead == ("r",)  # the running job it waits for
    check_waits(decision)


def test_decision_is_deterministic_whatever_the_input_order() -> None:
    jobs = [job(f"j{i}", org=f"o{i % 3}", submitted=i // 2, cpus=1 + i % 3, gpus=i % 2) for i in range(40)]
    nodes = [node("a", cpus=8, gpus=4), node("b", cpus=8, gpus=2)]
    first = decide(jobs, nodes, [], now=NOW)
    shuffled = list(jobs)
    random.Random(7).shuffle(shuffled)
    again = decide(shuffled, nodes, [], now=NOW)
    assert first.placements == again.placements
    assert first.waiting == again.waiting
    check_waits(first)


def test_every_wait_message_starts_with_its_kind() -> None:
    jobs = [
        job("quota", org="q", cpus=1, submitted=1),
        job("pre", priority="high", cpus=2, gpus=2, submitted=2, timeout=100),
        job("head", cpus=8, gpus=2, submitted=3),
        job("gang", workers=4, gpus=1, submitted=4),
        job("held", cpus=1, submitted=5),
    ]
    run = [
        running("victim", ("a", 4, (0, 1)), priority="low"),
        running("busy", ("a", 2, (2,)), priority="high", deadline=NOW + 60),
    ]
    usage = OrgUsage()
    usage.add("train", 0, 1000, None)
    decision = decide(
        jobs,
        [node("a", cpus=8, gpus=4)],
        run,
        limits={"q": {"train": Limits(millicores=1000)}},
        usage={"q": usage},
        now=NOW,
        preemption=True,
    )
    assert decision.preemptions == {"victim": "preempted by pre (priority high)"}
    assert kinds(decision) == {
        "pre": "preempting",
        "quota": "quota",
        "head": "capacity",
        "gang": "gang",
        "held": "reservation",
    }
    assert decision.reservation == "pre"
    assert decision.reserved == ["pre", "head"]
    assert decision.waiting["pre"].message == "preempting: waits until victim stops (being preempted for it)"
    assert decision.waiting["pre"].ahead == ("victim",)
    assert decision.waiting["head"].ahead == ("pre", "busy")
    assert decision.waiting["held"].ahead == ("head", "pre")
    assert decision.waiting["quota"].message == "quota: cpus 1 of 1 in use (org q, category train)"
    assert usage.total.millicores == 1000  # the caller's usage is left as it was
    check_waits(decision)
