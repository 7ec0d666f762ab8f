"""The backend's background work as tasks, on every server (no lease: the work is this machine's or this
process's): each piece a ``BackgroundWork`` backend declares (the local executor's ``shim-notify``, which hands the
shims' notes to the reconciler and the metrics ingester as they come, and ``network-spares``, which makes isolated
networks ahead of need; the Kubernetes informers ``k8s-pods`` and ``k8s-jobs``, and ``k8s-pod-logs``, a task with
keys: one thread per pod whose log it follows), and ``backend-sweep`` for a backend that keeps job files on this
machine (about once a minute: the files of failed jobs kept for debugging, once their retention has passed)."""

from __future__ import annotations

from kiln.backends.base import Backend
from kiln.backends.capabilities import BackgroundWork, JobFiles, Work, WorkSet
from kiln.tasks.runner import Task, TaskContext


def backend_tasks(backend: Backend) -> list[Task]:
    tasks = [_task(work) for work in backend.background_work()] if isinstance(backend, BackgroundWork) else []
    if isinstance(backend, JobFiles):
        tasks.append(Task.of("backend-sweep", backend.sweep, 60))
    return tasks


def _task(work: Work | WorkSet) -> Task:
    if isinstance(work, WorkSet):
        step = work.step

        def run_key(ctx: TaskContext) -> float | None:
            return step(ctx.key)

        return Task(work.name, run_key, work.interval, wake=work.wake, interrupt=work.interrupt, keys=work.keys)

    def run_once(ctx: TaskContext) -> float | None:
        return work.step()

    return Task(work.name, run_once, work.interval, wake=work.wake, interrupt=work.interrupt)
