"""How the members of a gang make one attempt status (backends/local/gang.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kiln.backends.base import AttemptStatus, Phase
from kiln.backends.local.gang import GANG_STOPPED, MemberStatus, aggregate

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def running(role: str = "worker", index: int = 0) -> MemberStatus:
    return MemberStatus(role, index, AttemptStatus(Phase.RUNNING, running_at=T0))


def exited(role: str, index: int, code: int, reason: str = "Completed", after: float = 1.0) -> MemberStatus:
    status = AttemptStatus(
        Phase.EXITED,
        exit_code=code,
        reason=reason,
        message=f"exit code {code}",
        running_at=T0,
        finished_at=T0 + timedelta(seconds=after),
    )
    return MemberStatus(role, index, status)


def test_all_running_is_running() -> None:
    view = aggregate([running("worker", 0), running("worker", 1)])
    assert view.status.phase is Phase.RUNNING and view.stop == ()


def test_one_still_starting_keeps_the_gang_starting() -> None:
    starting = MemberStatus("worker", 1, AttemptStatus(Phase.STARTING))
    view = aggregate([running(), starting])
    assert view.status.phase is Phase.STARTING and view.status.running_at is None


def test_a_failed_worker_stops_the_others_then_reports_its_own_exit() -> None:
    members = [running("worker", 0), exited("worker", 1, 3, reason="Error"), running("worker", 2)]
    view = aggregate(members)
    assert view.status.phase is Phase.RUNNING  # not ended until every member has
    assert view.stop == (0, 2) and view.stop_reason == GANG_STOPPED and "worker 1" in view.stop_message
    stopped = [
        exited("worker", 0, 143, reason=GANG_STOPPED, after=2),
        exited("worker", 1, 3, "Error"),
        exited("worker", 2, 143, GANG_STOPPED, 2),
    ]
    final = aggregate(stopped)
    assert final.status.phase is Phase.EXITED and final.stop == ()
    assert (final.status.exit_code, final.status.reason) == (3, "Error")
    assert final.status.message.startswith("worker 1:")


def test_the_first_failure_is_the_one_reported() -> None:
    final = aggregate([exited("worker", 0, 1, "Error", after=5), exited("worker", 1, 2, "OOMKilled", after=1)])
    assert (final.status.exit_code, final.status.reason) == (2, "OOMKilled")


def test_parameter_servers_are_stopped_once_every_worker_succeeded() -> None:
    members = [exited("worker", 0, 0), exited("worker", 1, 0), running("ps", 0)]
    view = aggregate(members)
    assert view.status.phase is Phase.RUNNING and view.stop == (2,)
    done = aggregate([exited("worker", 0, 0), exited("worker", 1, 0), exited("ps", 0, 143, GANG_STOPPED)])
    assert (done.status.phase, done.status.exit_code, done.status.reason) == (Phase.EXITED, 0, "Completed")


def test_preempted_members_report_preempted() -> None:
    final = aggregate([exited("worker", 0, 0, "Preempted"), exited("worker", 1, 143, "Preempted")])
    assert final.status.phase is Phase.EXITED and final.status.reason == "Preempted"


def test_a_lost_member_fails_the_gang() -> None:
    lost = MemberStatus("worker", 1, AttemptStatus(Phase.LOST, reason="ShimLost", message="gone"))
    view = aggregate([running(), lost])
    assert view.stop == (0,)
    final = aggregate([exited("worker", 0, 143, GANG_STOPPED), lost])
    assert final.status.phase is Phase.LOST and final.status.reason == "ShimLost"


def unlaunched(role: str, index: int) -> MemberStatus:
    return MemberStatus(role, index, AttemptStatus(Phase.UNLAUNCHED, reason="NotLaunched", message="never launched"))


def test_members_a_crash_kept_from_launching_make_the_gang_unlaunched() -> None:
    """The server died while it launched the gang: the attempt is launched again (the members already up are
    adopted by the executor's start), and the message names who is missing."""
    view = aggregate([running("worker", 0), unlaunched("worker", 1), unlaunched("ps", 0)])
    assert view.status.phase is Phase.UNLAUNCHED and view.stop == ()
    assert "worker 1, ps 0" in view.status.message


def test_a_failure_with_members_never_launched_stops_them_instead() -> None:
    view = aggregate([exited("worker", 0, 2, reason="Error"), unlaunched("worker", 1)])
    assert view.status.phase is Phase.RUNNING and view.stop == (1,) and view.stop_reason == GANG_STOPPED


def test_the_gangs_unbilled_wait_is_its_longest_members() -> None:
    """Members build or wait for a runtime side by side: the hold waited as long as the slowest of them."""
    slow = MemberStatus("worker", 1, AttemptStatus(Phase.RUNNING, running_at=T0, unbilled_seconds=4.5))
    fast = MemberStatus("worker", 0, AttemptStatus(Phase.RUNNING, running_at=T0, unbilled_seconds=1.0))
    assert aggregate([fast, slow]).status.unbilled_seconds == 4.5
    assert aggregate([running("worker", 0), running("worker", 1)]).status.unbilled_seconds == 0.0
