"""status_from: a Kubernetes Job and its pods (raw API JSON) → Kiln's AttemptStatus. Pure, no client."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from kiln.backends.base import Phase
from kiln.backends.kubernetes.status import member_of, status_from

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
T0 = "2026-01-01T11:59:00Z"


def job(parallelism: int = 1, conditions: list[dict[str, Any]] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "kiln-j-a1", "labels": {"kiln.io/role": "worker"}, **meta},
        "spec": {"parallelism": parallelism},
        "status": {"conditions": conditions or []},
    }


def pod(index: int | None = 0, phase: str = "Pending", role: str = "worker", **status: Any) -> dict[str, Any]:
    labels = {"kiln.io/role": role}
    if index is not None:
        labels["batch.kubernetes.io/job-completion-index"] = str(index)
    return {
        "metadata": {"name": f"p-{role}-{index}", "labels": labels, "creationTimestamp": T0},
        "spec": {"nodeName": "node-1"},
        "status": {"phase": phase, **status},
    }


def running(index: int | None = 0, started: str = T0) -> dict[str, Any]:
    return pod(index, "Running", containerStatuses=[{"name": "job", "state": {"running": {"startedAt": started}}}])


def terminated(index: int | None, code: int, reason: str = "Error", finished: str = T0) -> dict[str, Any]:
    phase = "Succeeded" if code == 0 else "Failed"
    state = {"terminated": {"exitCode": code, "reason": reason, "startedAt": T0, "finishedAt": finished}}
    return pod(index, phase, containerStatuses=[{"name": "job", "state": state}])


def test_member_names() -> None:
    assert member_of(pod(3)) == "worker3"
    assert member_of(pod(1, role="ps")) == "ps1"
    assert member_of(pod(None)) == "worker0"


def test_no_pods_yet_is_starting() -> None:
    status = status_from(job(), [], now=NOW)
    assert status.phase is Phase.STARTING
    assert "0 of 1" in status.message


def test_all_pods_running_is_running() -> None:
    assert status_from(job(2), [running(0)], now=NOW).phase is Phase.STARTING  # one of two
    status = status_from(job(2), [running(0), running(1, "2026-01-01T11:59:30Z")], now=NOW)
    assert status.phase is Phase.RUNNING
    assert status.running_at == datetime(2026, 1, 1, 11, 59, 30, tzinfo=UTC)  # when the gang was complete


def test_complete_job_is_exited_zero() -> None:
    done = job(conditions=[{"type": "Complete", "status": "True", "lastTransitionTime": T0}])
    status = status_from(done, [terminated(0, 0, "Completed")], now=NOW)
    assert (status.phase, status.exit_code, status.reason) == (Phase.EXITED, 0, "Completed")
    assert status.finished_at == datetime(2026, 1, 1, 11, 59, tzinfo=UTC)


def test_success_policy_and_success_index() -> None:
    met = job(2, conditions=[{"type": "SuccessCriteriaMet", "status": "True"}])
    assert status_from(met, [terminated(0, 0), running(1)], now=NOW).exit_code == 0
    # Before successPolicy (Kubernetes < 1.31): the annotation says worker 0's success is the gang's.
    annotated = job(2, annotations={"kiln.io/success-index": "0"})
    status = status_from(annotated, [terminated(0, 0, "Completed"), running(1)], now=NOW)
    assert (status.phase, status.exit_code, status.reason) == (Phase.EXITED, 0, "Completed")
    assert status_from(job(2), [terminated(0, 0), running(1)], now=NOW).phase is Phase.RUNNING


def test_failed_pod_gives_its_exit_code_and_member() -> None:
    status = status_from(job(2), [running(0), terminated(1, 3)], now=NOW)
    assert (status.phase, status.exit_code, status.reason) == (Phase.EXITED, 3, "Error")
    assert "worker1" in status.message and "3" in status.message


def test_first_failure_wins() -> None:
    first = terminated(1, 3, finished="2026-01-01T11:59:10Z")
    later = terminated(0, 143, finished="2026-01-01T11:59:20Z")
    assert status_from(job(2), [later, first], now=NOW).exit_code == 3


def test_oom_killed() -> None:
    status = status_from(job(), [terminated(0, 137, "OOMKilled")], now=NOW)
    assert (status.exit_code, status.reason) == (137, "OOMKilled")


def test_evicted() -> None:
    evicted = pod(0, "Failed", reason="Evicted", message="The node was low on resource: memory.")
    status = status_from(job(), [evicted], now=NOW)
    assert (status.phase, status.reason, status.exit_code) == (Phase.EXITED, "Evicted", None)
    assert "low on resource" in status.message


def test_image_pull_error_after_grace() -> None:
    waiting = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x:1"'}
    pulling = pod(
        0,
        startTime="2026-01-01T11:59:50Z",
        containerStatuses=[{"name": "job", "image": "x:1", "state": {"waiting": waiting}}],
    )
    early = status_from(job(), [pulling], now=NOW, image_pull_grace=60)
    assert early.phase is Phase.STARTING and "ImagePullBackOff" in early.message
    late = status_from(job(), [pulling], now=NOW + timedelta(minutes=2), image_pull_grace=60)
    assert (late.phase, late.reason) == (Phase.EXITED, "ImagePullError")
    assert "x:1" in late.message


def test_unschedulable_keeps_starting_with_the_message() -> None:
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    status = status_from(job(), [pod(0, conditions=[cond])], now=NOW)
    assert status.phase is Phase.STARTING
    assert message in status.message and "Unschedulable" in status.message


def test_node_lost() -> None:
    assert status_from(job(), [pod(0, "Unknown")], now=NOW).phase is Phase.LOST
    status = status_from(job(), [], deleted=[running(0)], now=NOW)
    assert (status.phase, status.reason) == (Phase.LOST, "NodeLost")
    # A pod that had finished and was then removed (TTL) is not a loss.
    done = job(conditions=[{"type": "Complete", "status": "True"}])
    assert status_from(done, [], deleted=[terminated(0, 0)], now=NOW).phase is Phase.EXITED


def test_job_failed_without_a_failed_pod() -> None:
    deadline = job(
        conditions=[{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "too long"}]
    )
    status = status_from(deadline, [], now=NOW)
    assert (status.phase, status.reason) == (Phase.EXITED, "Timeout")


def test_init_container_failure() -> None:
    init = [{"name": "kiln-fetch", "state": {"terminated": {"exitCode": 2, "message": "digest mismatch"}}}]
    status = status_from(job(), [pod(0, "Failed", initContainerStatuses=init)], now=NOW)
    assert status.exit_code == 2 and "kiln-fetch" in status.message and "digest mismatch" in status.message


def test_parameter_servers_count_and_fail() -> None:
    ps_job = {"metadata": {"labels": {"kiln.io/role": "ps"}}, "spec": {"parallelism": 1}, "status": {}}
    ps_running = running(0)
    ps_running["metadata"]["labels"]["kiln.io/role"] = "ps"
    assert status_from(job(1), [running(0)], others=[ps_job], now=NOW).phase is Phase.STARTING
    assert status_from(job(1), [running(0), ps_running], others=[ps_job], now=NOW).phase is Phase.RUNNING
    ps_failed = terminated(0, 1)
    ps_failed["metadata"]["labels"]["kiln.io/role"] = "ps"
    assert "ps0" in status_from(job(1), [running(0), ps_failed], others=[ps_job], now=NOW).message


def test_suspended_job_waits_for_admission() -> None:
    suspended = job()
    suspended["spec"]["suspend"] = True
    assert "admission" in status_from(suspended, [], now=NOW).message


def test_job_failed_before_its_pod_event_waits_for_the_pod() -> None:
    """The Jobs' watch may deliver Failed before the pods' watch delivers the failed pod: wait for the pod."""
    cond = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "lastTransitionTime": T0}
    failed = job(conditions=[cond])
    assert status_from(failed, [running(0)], now=datetime(2026, 1, 1, 11, 59, 5, tzinfo=UTC)).phase is Phase.RUNNING
    late = status_from(failed, [running(0)], now=NOW)  # a minute on: the Job's word is taken
    assert (late.phase, late.reason) == (Phase.EXITED, "Error")
    assert status_from(failed, [terminated(0, 3)], now=NOW).exit_code == 3
