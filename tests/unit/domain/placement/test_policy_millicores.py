"""CPUs are counted in whole millicores (as Kubernetes counts them): a hundred jobs of 0.1 CPU fill exactly ten
CPUs, a job that fits exactly fits, and no reason reads a float residue (issue 26: ``capacity: CPUs 0.1 asked,
1.16851e-14 free``)."""

from __future__ import annotations

from kiln.domain.placement.policy import decide

from .policy_helpers import NOW, check_waits, job, node, placed, running


def test_a_hundred_tenth_cpu_jobs_fill_exactly_ten_cpus() -> None:
    jobs = [job(f"j{i:03d}", submitted=i, cpus=0.1) for i in range(101)]
    decision = decide(jobs, [node(cpus=10)], [], now=NOW)
    assert len(placed(decision)) == 100
    assert all(w.millicores == 100 for p in decision.placements for w in p.workers)
    assert decision.waiting["j100"].message.startswith("capacity: CPUs 0.1 asked, 0 free")
    check_waits(decision)


def test_the_last_tenth_of_a_cpu_fits_exactly_after_ninety_nine() -> None:
    run = [running(f"r{i}", ("n1", 0.1, ())) for i in range(99)]
    assert 10 - sum(0.1 for _ in range(100)) != 0  # float counting leaves a residue (~2e-14) either way
    decision = decide([job("last", cpus=0.1), job("more", cpus=0.1, submitted=NOW)], [node(cpus=10)], run, now=NOW)
    assert list(placed(decision)) == ["last"]
    assert decision.waiting["more"].message.startswith("capacity: CPUs 0.1 asked, 0 free")


def test_free_cpus_read_as_people_write_them() -> None:
    run = [running(f"r{i}", ("n1", 0.1, ())) for i in range(7)]
    decision = decide([job("big", cpus=9.5)], [node(cpus=10)], run, now=NOW)
    assert decision.waiting["big"].message.startswith("capacity: CPUs 9.5 asked, 9.3 free")


def test_a_job_asking_more_cpus_than_any_node_says_so_exactly() -> None:
    decision = decide([job("x", cpus=2.125)], [node(cpus=2)], [], now=NOW)
    assert decision.unschedulable == {"x": "asks 2.125 CPUs; the largest node has 2"}
