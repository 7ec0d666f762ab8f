"""policy.decide: the reservation for the first job that does not fit, EASY backfill when its start is known,
quota-blocked jobs. (When its start is unknown: test_policy_borrowing.py.)"""

from __future__ import annotations

from kiln.domain.placement.policy import decide
from kiln.domain.placement.types import Running
from kiln.domain.quota import Limits, OrgUsage

from .policy_helpers import NOW, check_waits, job, kinds, node, placed, running


def test_small_jobs_cannot_delay_the_big_job_at_the_head() -> None:
    run = [running("r", ("n1", 4, (0, 1, 2, 3)), deadline=NOW + 600)]  # half the node
    jobs = [job("big", submitted=1, cpus=8, gpus=8)] + [job(f"s{i}", submitted=2 + i, gpus=1) for i in range(4)]
    decision = decide(jobs, [node(cpus=16, gpus=8)], run, now=NOW)
    assert placed(decision) == {}
    assert decision.reservation == "big"
    assert decision.waiting["big"].kind == "capacity"
    assert decision.waiting["big"].ahead == ("r",)
    for i in range(4):
        wait = decision.waiting[f"s{i}"]
        assert wait.kind == "reservation"
        assert wait.message == (
            "reservation: the free resources it needs are reserved for big, next in line; "
            "a job with a timeout of at most 600s could backfill"
        )
        assert wait.ahead == ("big",)
        assert wait.position == 2 + i
    check_waits(decision)


def test_small_jobs_may_use_what_the_reservation_does_not_need() -> None:
    # big needs a whole 8-GPU node; node a frees first (deadline), so a's free GPUs are earmarked, b's are not.
    nodes = [node("a", gpus=8), node("b", gpus=8)]
    run = [
        running("ra", ("a", 1, (0, 1, 2, 3)), deadline=NOW + 600),
        running("rb", ("b", 1, (0, 1, 2, 3))),
    ]
    jobs = [job("big", submitted=1, gpus=8)] + [job(f"s{i}", submitted=2 + i, gpus=1) for i in range(6)]
    decision = decide(jobs, nodes, run, now=NOW)
    got = placed(decision)
    assert sorted(got) == ["s0", "s1", "s2", "s3"]
    assert all(w[0].node == "b" for w in got.values())
    assert decision.waiting["big"].message == (
        "capacity: GPUs 8 asked, at most 4 free on one node; next in line, resources reserved (it can start in "
        "600s): it needs what ra (ends by its timeout in 600s) holds"
    )
    assert kinds(decision) == {"big": "capacity", "s4": "reservation", "s5": "reservation"}
    assert "a job with a timeout of at most 600s could backfill" in decision.waiting["s4"].message


def test_a_short_job_backfills_when_it_surely_ends_before_the_reserved_job_can_start() -> None:
    run = [running("r", ("n1", 1, (0, 1, 2, 3)), deadline=NOW + 600)]
    jobs = [
        job("big", submitted=1, gpus=8),
        job("long", submitted=2, gpus=1, timeout=3600),
        job("untimed", submitted=3, gpus=1),
        job("short", submitted=4, gpus=2, timeout=300),
        job("exact", submitted=5, gpus=1, timeout=600),
    ]
    decision = decide(jobs, [node(gpus=8)], run, now=NOW)
    assert sorted(placed(decision)) == ["exact", "short"]
    assert placed(decision)["short"][0].gpus == (4, 5)
    assert decision.waiting["long"].kind == "reservation"
    assert "its timeout 3600s ends after big can start (in 600s)" in decision.waiting["long"].message
    assert decision.waiting["untimed"].kind == "reservation"
    check_waits(decision)


def test_backfill_when_the_reserved_start_is_unknown_borrows_from_it() -> None:
    run = [running("r", ("n1", 1, (0, 1, 2, 3)))]  # no deadline
    jobs = [job("big", submitted=1, gpus=8), job("short", submitted=2, gpus=1, timeout=1), job("long", gpus=2)]
    decision = decide(jobs, [node(gpus=8)], run, now=NOW)
    assert {p.job_id: p.backfill_for for p in decision.placements} == {"short": "big", "long": "big"}


def test_backfill_counts_jobs_placed_earlier_in_the_same_decision() -> None:
    # "first" is placed now with a 100 s timeout; big then needs its GPUs too, so it can start in 100 s at best.
    jobs = [
        job("first", priority="high", submitted=1, gpus=4, timeout=100),
        job("big", submitted=2, gpus=8),
        job("short", submitted=3, gpus=2, timeout=50),
        job("longer", submitted=4, gpus=2, timeout=200),
    ]
    decision = decide(jobs, [node(gpus=8)], [], now=NOW)
    assert sorted(placed(decision)) == ["first", "short"]
    assert decision.waiting["longer"].kind == "reservation"


def test_quota_blocked_jobs_do_not_hold_the_queue() -> None:
    usage = OrgUsage()
    usage.add("train", 4, 4000, None)
    jobs = [job("blocked", org="capped", submitted=1, gpus=1), job("other", org="free", submitted=2, gpus=1)]
    decision = decide(
        jobs, [node(gpus=8)], [], limits={"capped": {"train": Limits(gpus=4)}}, usage={"capped": usage}, now=NOW
    )
    assert list(placed(decision)) == ["other"]
    assert decision.waiting["blocked"].kind == "quota"
    assert decision.waiting["blocked"].message == "quota: gpus 4 of 4 in use (org capped, category train)"
    assert decision.waiting["blocked"].ahead == ()
    assert decision.reservation is None


def test_quota_counts_what_this_decision_places() -> None:
    jobs = [job(f"j{i}", submitted=i, gpus=1) for i in range(4)]
    limits = {"acme": {"train": Limits(gpus=2)}}
    decision = decide(jobs, [node(gpus=8)], [], limits=limits, now=NOW)
    assert sorted(placed(decision)) == ["j0", "j1"]
    assert kinds(decision) == {"j2": "quota", "j3": "quota"}
    assert decision.waiting["j2"].message == "quota: gpus 2 of 2 in use (org acme, category train)"
    assert [decision.waiting[j].position for j in ("j2", "j3")] == [1, 2]


def test_a_job_that_would_not_fit_anyway_waits_for_capacity_not_the_reservation() -> None:
    run = [running("r", ("n1", 1, (0, 1, 2, 3, 4, 5)))]
    jobs = [job("big", submitted=1, gpus=8), job("four", submitted=2, gpus=4)]
    decision = decide(jobs, [node(gpus=8)], run, now=NOW)
    assert decision.waiting["four"].kind == "capacity"
    assert decision.waiting["four"].message == "capacity: GPUs 4 asked, 2 free"
    assert decision.waiting["four"].ahead == ("big",)


def test_only_one_reservation() -> None:
    run = [running("r", ("n1", 1, (0, 1, 2, 3, 4, 5, 6)))]
    jobs = [job("a", submitted=1, gpus=4), job("b", submitted=2, gpus=2)]
    decision = decide(jobs, [node(gpus=8)], run, now=NOW)
    assert decision.reservation == "a"
    assert decision.reserved == ["a"]


def test_a_stream_of_small_jobs_does_not_starve_the_big_one() -> None:
    """Passes of the loop over time: 1-GPU jobs with 10 s timeouts keep arriving; the 8-GPU job starts by the
    time the small ones that were running when it arrived have ended."""
    now = NOW
    run: list[Running] = [running(f"old{i}", ("n1", 1, (i,)), deadline=now + 5 + i) for i in range(4)]
    waiting = [job("big", submitted=now, gpus=8)]
    started_big = None
    for tick in range(40):
        waiting += [job(f"s{tick}-{k}", submitted=now + 0.1 * k, gpus=1, timeout=10) for k in range(3)]
        run = [r for r in run if r.deadline is None or r.deadline > now]
        decision = decide(waiting, [node(gpus=8)], run, now=now)
        check_waits(decision)
        for p in decision.placements:
            spec = next(j for j in waiting if j.job_id == p.job_id)
            run.append(Running(p.job_id, "acme", "train", 1, p.workers, now, now + 10 if spec.timeout else None))
        done = {p.job_id for p in decision.placements}
        if "big" in done:
            started_big = now
            break
        waiting = [j for j in waiting if j.job_id not in done]
        now += 1
    assert started_big is not None and started_big <= NOW + 12
