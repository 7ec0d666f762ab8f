"""policy.decide when the reserved job's start is unknown (it needs what a job with no end holds: a service's
replica, a notebook, a job without a timeout): jobs behind it borrow what is free, and it takes that back once it
can start; and the reason that says what holds it and what would let it start."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kiln.domain.placement.policy import decide
from kiln.domain.placement.types import Decision, Pending, Running

from .policy_helpers import NOW, check_waits, job, kinds, node, placed, running

MACHINE = [node(cpus=2)]  # the default local inventory of the issue: two CPUs


def replica(job_id: str = "web-1", cpus: float = 0.5, **kw: Any) -> Running:
    return running(job_id, ("n1", cpus, ()), org="acme", priority="normal", service="web", **kw)


def borrowers(decision: Decision) -> dict[str, str | None]:
    return {p.job_id: p.backfill_for for p in decision.placements}


def started(decision: Decision, waiting: list[Pending], now: float) -> list[Running]:
    """The running jobs the decision's placements become (as the loop records them)."""
    by_id = {j.job_id: j for j in waiting}
    return [
        Running(
            p.job_id,
            by_id[p.job_id].org_id,
            "train",
            by_id[p.job_id].priority,
            p.workers,
            now,
            now + timeout if (timeout := by_id[p.job_id].timeout) else None,
            backfill_for=p.backfill_for,
        )
        for p in decision.placements
    ]


def test_a_small_job_starts_behind_a_whole_machine_job_that_waits_for_a_service() -> None:
    """The stalled queue of issue 26: a replica holds 0.5 CPU for ever, the whole-machine job waits, and the
    small job behind it starts (it cannot delay a start that has no time), borrowing from the big one."""
    jobs = [job("big", submitted=1, cpus=2), job("small", submitted=2, cpus=1)]
    decision = decide(jobs, MACHINE, [replica()], now=NOW, preemption=True)
    assert borrowers(decision) == {"small": "big"}
    wait = decision.waiting["big"]
    assert wait.kind == "capacity"
    assert wait.ahead == ("web-1",)
    assert wait.message == (
        "capacity: CPUs 2 asked, 0.5 free; next in line: it needs what web-1 (a replica of service web: scale the "
        "service down or stop it) holds, with no end in sight; it could start now asking for at most 0.5 CPUs; "
        "meanwhile jobs behind it may use the free resources (backfill) and are preempted to give them back once "
        "it can start"
    )
    check_waits(decision)


def test_the_reason_names_each_holder_and_what_would_end_it() -> None:
    run = [
        replica(),
        running("notebook", ("n1", 0.5, ()), org="acme"),
        running("timed", ("n1", 0.5, ()), org="acme", deadline=NOW + 300),
    ]
    decision = decide([job("big", cpus=2)], MACHINE, run, now=NOW, preemption=True)
    message = decision.waiting["big"].message
    assert "web-1 (a replica of service web: scale the service down or stop it)" in message
    assert "notebook (no timeout: wait for it to end or cancel it)" in message
    assert "timed (ends by its timeout in 300s)" in message
    assert "it could start now asking for at most 0.5 CPUs" in message
    assert set(decision.waiting["big"].ahead) == {"web-1", "notebook", "timed"}


def test_nothing_free_to_ask_for_and_nothing_to_lend() -> None:
    decision = decide([job("big", cpus=2)], MACHINE, [replica(cpus=2)], now=NOW, preemption=True)
    message = decision.waiting["big"].message
    assert message == (
        "capacity: CPUs 2 asked, 0 free; next in line: it needs what web-1 (a replica of service web: scale the "
        "service down or stop it) holds, with no end in sight"
    )


def test_borrowers_keep_borrowing_while_the_service_runs_and_nobody_is_preempted() -> None:
    run = [replica(), running("small", ("n1", 1, ()), org="acme", priority="normal", backfill_for="big")]
    jobs = [job("big", submitted=1, cpus=2), job("tiny", submitted=3, cpus=0.5)]
    decision = decide(jobs, MACHINE, run, now=NOW, preemption=True)
    assert borrowers(decision) == {"tiny": "big"}
    assert decision.preemptions == {}
    assert "small (backfilled on its resources; preempted to give them back once it can start)" in (
        decision.waiting["big"].message
    )


def test_once_the_service_is_gone_the_big_job_takes_back_what_was_borrowed() -> None:
    run = [
        running("small", ("n1", 1, ()), org="acme", priority="normal", backfill_for="big"),
        running("tiny", ("n1", 0.5, ()), org="acme", priority="normal", backfill_for="big", deadline=NOW + 3600),
    ]
    jobs = [job("big", submitted=1, cpus=2), job("later", submitted=5, cpus=0.5)]
    decision = decide(jobs, MACHINE, run, now=NOW, preemption=True)
    assert set(decision.preemptions) == {"small", "tiny"}  # a timed borrower too: it was lent, not given
    assert decision.preemptions["small"] == (
        "preempted by big: this job had backfilled on resources reserved for it, which it can use now"
    )
    assert kinds(decision) == {"big": "preempting", "later": "reservation"}
    assert decision.waiting["later"].message.startswith(
        "reservation: the free resources it needs are held for big, which waits on a preemption"
    )
    check_waits(decision)


def test_only_as_many_borrowers_as_needed_are_preempted() -> None:
    run = [  # the service is gone: 0.5 CPU free
        running(f"b{i}", ("n1", 0.5, ()), org="acme", priority="normal", backfill_for="big", started=NOW - 50 + i)
        for i in range(3)
    ]
    decision = decide([job("big", cpus=1.5)], MACHINE, run, now=NOW, preemption=True)
    assert sorted(decision.preemptions) == ["b1", "b2"]  # the most recently started


def test_another_job_does_not_preempt_what_was_borrowed_from_the_big_one() -> None:
    run = [running("small", ("n1", 2, ()), org="acme", priority="normal", backfill_for="big")]
    # big is gone (cancelled); a job of the same priority does not preempt its borrower.
    decision = decide([job("other", cpus=2)], MACHINE, run, now=NOW, preemption=True)
    assert decision.preemptions == {}
    assert decision.waiting["other"].kind == "capacity"


def test_without_preemption_the_big_job_stops_lending_once_only_its_borrowers_hold_it_back() -> None:
    run = [running("small", ("n1", 1, ()), org="acme", priority="normal", backfill_for="big")]
    jobs = [job("big", submitted=1, cpus=2), job("tiny", submitted=3, cpus=0.5)]
    decision = decide(jobs, MACHINE, run, now=NOW, preemption=False)
    assert placed(decision) == {} and decision.preemptions == {}
    assert decision.waiting["tiny"].message == (
        "reservation: the free resources it needs are reserved for big, next in line; no backfill: it waits for "
        "the jobs that already backfilled there (preemption is off)"
    )
    assert decision.waiting["big"].message == (
        "capacity: CPUs 2 asked, 1 free; next in line, resources reserved as they free up: it needs what small "
        "(backfilled on its resources, no timeout; preemption is off) holds; it could start now asking for at most "
        "1 CPU"
    )


def test_without_preemption_it_still_lends_while_a_job_with_no_end_holds_it_back() -> None:
    jobs = [job("big", submitted=1, cpus=2), job("small", submitted=2, cpus=1)]
    decision = decide(jobs, MACHINE, [replica()], now=NOW, preemption=False)
    assert borrowers(decision) == {"small": "big"}
    assert decision.waiting["big"].message.endswith("and it then waits for them too (preemption is off)")


def test_a_known_start_keeps_easy_backfill_even_with_borrowers_around() -> None:
    # The service has a deadline here (a timed job): the start is known, untimed jobs may not borrow.
    run = [running("timed", ("n1", 0.5, ()), org="acme", priority="normal", deadline=NOW + 100)]
    jobs = [job("big", submitted=1, cpus=2), job("untimed", submitted=2, cpus=1), job("quick", cpus=1, timeout=50)]
    decision = decide(jobs, MACHINE, run, now=NOW, preemption=True)
    assert borrowers(decision) == {"quick": None}  # EASY: it ends before big can start, nothing to give back
    assert decision.waiting["untimed"].kind == "reservation"


def test_a_lower_class_borrows_from_a_higher_class_reservation() -> None:
    jobs = [job("big", priority="high", submitted=1, cpus=2), job("low", priority="low", submitted=2, cpus=1)]
    decision = decide(jobs, MACHINE, [replica()], now=NOW, preemption=False)  # (with it, big preempts the replica)
    assert borrowers(decision) == {"low": "big"}


def test_the_big_job_is_not_starved_by_a_stream_of_endless_small_jobs() -> None:
    """Passes over time: the service runs until tick 5, small jobs without a timeout keep arriving. The big job
    starts within two passes of the service's end (one to preempt its borrowers, one once they stopped)."""
    now = NOW
    run: list[Running] = [replica()]
    waiting: list[Pending] = [job("big", submitted=now, cpus=2)]
    big_started = None
    stopping: set[str] = set()
    for tick in range(20):
        if tick == 5:
            run = [r for r in run if r.job_id != "web-1"]  # `kiln services delete web`
        run = [r for r in run if r.job_id not in stopping]  # preempted jobs stopped: queued again
        waiting += [replace(j, submitted=now) for j in requeued(stopping)]
        stopping = set()
        waiting += [job(f"s{tick}", submitted=now + 0.5, cpus=0.5)]
        decision = decide(waiting, MACHINE, run, now=now, preemption=True)
        check_waits(decision)
        stopping = set(decision.preemptions)
        run = [replace(r, preempting=True) if r.job_id in stopping else r for r in run]
        run += started(decision, waiting, now)
        done = {p.job_id for p in decision.placements}
        if "big" in done:
            big_started = tick
            break
        assert tick < 5 or all(r.backfill_for == "big" for r in run if r.job_id != "web-1")
        waiting = [j for j in waiting if j.job_id not in done]
        now += 1
    assert big_started is not None and big_started <= 7


def requeued(ids: set[str]) -> list[Pending]:
    return [job(i, cpus=0.5) for i in sorted(ids)]
