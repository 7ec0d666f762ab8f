"""Where an attempt is, from its Kubernetes objects: a pure function of the Job(s) and pods (raw API JSON).

:func:`status_from` maps, in this order of precedence:

- a pod deleted while it still ran (its node was lost or someone deleted it), or a pod in phase ``Unknown``
  (the node stopped reporting) → ``LOST`` ``NodeLost``;
- the main Job ``Complete`` (or ``SuccessCriteriaMet``: successPolicy), or — on clusters without successPolicy —
  the pod at the ``kiln.io/success-index`` annotation's index succeeded → ``EXITED`` 0 ``Completed``;
- a failed pod (the first to finish): ``Evicted`` (pod status reason), ``OOMKilled`` (the container's terminated
  reason), else ``Error`` with the container's exit code; the message names the member (``worker1``);
- the Job ``Failed`` without a failed pod (``DeadlineExceeded`` → ``Timeout``; else ``Error``) — for a pod
  failure (``BackoffLimitExceeded``) only once ``FAILED_POD_WAIT`` seconds passed while a pod still looks
  unfinished, since the pods' and the Jobs' watches race and the failed pod's own event says more;
- a container that cannot get its image (``ErrImagePull``/``ImagePullBackOff``/``InvalidImageName``) for longer
  than ``image_pull_grace`` seconds since the pod started → ``EXITED`` ``ImagePullError`` with the kubelet's
  message (before that grace: ``STARTING`` with the message);
- every expected pod started (running or already succeeded) and at least one running → ``RUNNING``;
- otherwise ``STARTING``, with the scheduler's message when a pod is unschedulable (``PodScheduled=False``) or
  a note that the Job waits for admission (suspended by Kueue).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from kiln.backends.base import AttemptStatus, Phase

LABEL_ROLE = "kiln.io/role"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
SUCCESS_INDEX_ANNOTATION = "kiln.io/success-index"
MAIN_CONTAINER = "job"
FAILED_POD_WAIT = 30.0  # seconds to wait for the failed pod's event after its Job's (two watches race)
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})

Obj = dict[str, Any]


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def member_of(pod: Obj) -> str:
    """``worker0``, ``ps1``: the member a pod runs (its role label and completion index)."""
    meta = pod.get("metadata") or {}
    role = (meta.get("labels") or {}).get(LABEL_ROLE, "worker")
    index = (meta.get("labels") or {}).get(INDEX_LABEL) or (meta.get("annotations") or {}).get(INDEX_ANNOTATION)
    return f"{role}{index if index is not None else 0}"


def _sort_key(pod: Obj) -> tuple[int, int, str]:
    member = member_of(pod)
    role = 0 if member.startswith("worker") else 1
    digits = "".join(ch for ch in member if ch.isdigit())
    return role, int(digits or 0), (pod.get("metadata") or {}).get("name", "")


def _container(pod: Obj, name: str = MAIN_CONTAINER) -> Obj:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == name:
            return dict(status)
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return dict(statuses[0]) if statuses else {}


def _terminated(pod: Obj) -> Obj | None:
    state = _container(pod).get("state") or {}
    terminated = state.get("terminated")
    return dict(terminated) if terminated else None


def _failed_init(pod: Obj) -> tuple[str, Obj] | None:
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode", 0) != 0:
            return str(status.get("name")), dict(terminated)
    return None


def _condition(obj: Obj, kind: str) -> Obj | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def _is_true(obj: Obj | None, kind: str) -> Obj | None:
    cond = _condition(obj, kind) if obj else None
    return cond if cond and cond.get("status") == "True" else None


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _waiting(pod: Obj) -> tuple[str, str] | None:
    """(reason, message) of a container (init or main) that waits because its image cannot be pulled."""
    status = pod.get("status") or {}
    for item in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (item.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            image = item.get("image") or ""
            text = waiting.get("message") or waiting["reason"]
            return str(waiting["reason"]), f"image {image!r}: {text}" if image else str(text)
    return None


def _failure(pod: Obj) -> AttemptStatus:
    status = pod.get("status") or {}
    member = member_of(pod)
    terminated = _terminated(pod)
    code = terminated.get("exitCode") if terminated else None
    finished = parse_time(terminated.get("finishedAt")) if terminated else None
    if status.get("reason") == "Evicted":
        message = f"{member} was evicted: {status.get('message') or 'no message'}"
        return AttemptStatus(Phase.EXITED, code, "Evicted", message, finished_at=finished)
    init = _failed_init(pod)
    if init is not None and terminated is None:
        name, term = init
        code = term.get("exitCode")
        message = f"{member}: the init container {name} (fetching code and inputs) failed with exit code {code}"
        if term.get("message"):
            message += f": {str(term['message']).strip()[-300:]}"
        return AttemptStatus(Phase.EXITED, code, "Error", message, finished_at=parse_time(term.get("finishedAt")))
    if terminated and terminated.get("reason") == "OOMKilled":
        return AttemptStatus(
            Phase.EXITED, code, "OOMKilled", f"{member} was killed: out of memory (OOMKilled)", finished_at=finished
        )
    if code is None:
        text = status.get("message") or status.get("reason") or "no container status"
        return AttemptStatus(Phase.EXITED, None, "Error", f"{member} failed: {text}", finished_at=finished)
    message = f"{member} exited with code {code}"
    if terminated and terminated.get("message"):
        message += f": {str(terminated['message']).strip()[-300:]}"
    return AttemptStatus(Phase.EXITED, code, "Error", message, finished_at=finished)


def _running_at(pods: Iterable[Obj]) -> datetime | None:
    times = []
    for pod in pods:
        state = _container(pod).get("state") or {}
        started = (state.get("running") or state.get("terminated") or {}).get("startedAt")
        when = parse_time(started) or parse_time((pod.get("status") or {}).get("startTime"))
        if when is not None:
            times.append(when)
    return max(times) if times else None


def status_from(
    job: Obj | None,
    pods: Sequence[Obj],
    *,
    others: Sequence[Obj] = (),
    deleted: Sequence[Obj] = (),
    now: datetime | None = None,
    image_pull_grace: float = 60.0,
) -> AttemptStatus:
    """The attempt's status from its main Job (``None``: not seen), every pod of the attempt, its other Jobs
    (the parameter servers'), and the pods that were deleted while they had not finished."""
    now = now or datetime.now(UTC)
    pods = sorted(pods, key=_sort_key)
    running_at = _running_at(p for p in pods if _phase(p) in ("Running", "Succeeded"))

    for pod in sorted(deleted, key=_sort_key):
        if _phase(pod) not in ("Succeeded", "Failed"):
            name = (pod.get("metadata") or {}).get("name")
            message = f"{member_of(pod)} (pod {name}) was deleted while it ran: its node was lost or it was removed"
            return AttemptStatus(Phase.LOST, None, "NodeLost", message, running_at=running_at, finished_at=now)
    for pod in pods:
        if _phase(pod) == "Unknown":
            node = (pod.get("spec") or {}).get("nodeName") or "its node"
            message = f"{member_of(pod)}: {node} stopped reporting (pod phase Unknown)"
            return AttemptStatus(Phase.LOST, None, "NodeLost", message, running_at=running_at, finished_at=now)

    complete = _is_true(job, "Complete") or _is_true(job, "SuccessCriteriaMet")
    success_index = (((job or {}).get("metadata") or {}).get("annotations") or {}).get(SUCCESS_INDEX_ANNOTATION)
    if not complete and success_index is not None:
        for pod in pods:
            if member_of(pod) == f"worker{success_index}" and _phase(pod) == "Succeeded":
                complete = {"lastTransitionTime": (_terminated(pod) or {}).get("finishedAt")}
    if complete:
        finished = parse_time(((job or {}).get("status") or {}).get("completionTime")) or parse_time(
            complete.get("lastTransitionTime")
        )
        return AttemptStatus(Phase.EXITED, 0, "Completed", "", running_at=running_at, finished_at=finished or now)

    failed = [p for p in pods if _phase(p) == "Failed"]
    if failed:
        failed.sort(key=lambda p: parse_time((_terminated(p) or {}).get("finishedAt")) or now)
        status = _failure(failed[0])
        return AttemptStatus(
            status.phase,
            status.exit_code,
            status.reason,
            status.message,
            running_at=running_at,
            finished_at=status.finished_at or now,
        )
    unfinished = any(_phase(p) not in ("Succeeded", "Failed") for p in pods)
    for obj in (job, *others):
        cond = _is_true(obj, "Failed")
        since = parse_time(cond.get("lastTransitionTime")) if cond else None
        recent = since is not None and (now - since).total_seconds() < FAILED_POD_WAIT
        if cond and unfinished and recent and cond.get("reason") in ("BackoffLimitExceeded", "PodFailurePolicy"):
            continue  # a pod failed: its own event (exit code, reason) is on its way on the pods' watch
        if cond:
            reason = "Timeout" if cond.get("reason") == "DeadlineExceeded" else "Error"
            message = f"the Job failed: {cond.get('reason') or ''}: {cond.get('message') or ''}".rstrip(": ")
            finished = parse_time(cond.get("lastTransitionTime")) or now
            return AttemptStatus(Phase.EXITED, None, reason, message, running_at=running_at, finished_at=finished)

    messages = []
    for pod in pods:
        waiting = _waiting(pod)
        if waiting is None:
            continue
        since = parse_time((pod.get("status") or {}).get("startTime")) or parse_time(
            (pod.get("metadata") or {}).get("creationTimestamp")
        )
        message = f"{member_of(pod)}: {waiting[0]}: {waiting[1]}"
        if since is None or (now - since).total_seconds() >= image_pull_grace:
            return AttemptStatus(Phase.EXITED, None, "ImagePullError", message, running_at=running_at, finished_at=now)
        messages.append(message)

    expected = sum(int(((obj or {}).get("spec") or {}).get("parallelism", 1) or 0) for obj in (job, *others) if obj)
    started = [p for p in pods if _phase(p) in ("Running", "Succeeded")]
    if job is not None and pods and len(started) >= max(expected, 1) and any(_phase(p) == "Running" for p in pods):
        return AttemptStatus(Phase.RUNNING, running_at=running_at)

    for pod in pods:
        cond = _condition(pod, "PodScheduled")
        if cond and cond.get("status") == "False":
            reason = cond.get("reason") or "Unschedulable"
            messages.append(f"{member_of(pod)}: {reason}: {cond.get('message') or 'waiting for a node'}")
    if job is not None and ((job.get("spec") or {}).get("suspend")):
        messages.append("the Job is suspended: waiting for admission by the queue (Kueue)")
    if not messages and job is not None:
        messages.append(f"{len(started)} of {max(expected, 1)} pod(s) started")
    return AttemptStatus(Phase.STARTING, message="; ".join(messages), running_at=running_at)
