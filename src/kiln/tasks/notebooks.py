"""The notebook task: writes down what the proxy passed, sees when a notebook's JupyterLab answers, when its job
ended by itself or never got JupyterLab to answer (saying why: the launcher's last lines), and stops notebooks
that are idle.

Idle, predictably: no kernel busy, no terminal open, and no action through the proxy (a request that changes
something, a message on a WebSocket: a cell run, a keystroke) for the notebook's ``idle_timeout``. A kernel busy
computing is never idle, however long it runs; a tab left open, which only polls, is. A culled notebook is
STOPPED with its reason as its message and on its job's events; ``kiln notebooks start`` brings it back.

A TensorBoard has no kernel: it is idle when nothing reached it through the proxy (any request: an open tab that
reloads is someone looking) for its ``idle_timeout``.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import select

from kiln.backends.base import Backend
from kiln.backends.capabilities import NotebookAddress, NotebookHost
from kiln.db.session import Database
from kiln.db.tables import Job, Notebook, utcnow
from kiln.domain.durations import format_duration
from kiln.domain.notebooks import NotebookSpec
from kiln.domain.states import JobState
from kiln.routing.replica_http import socket_address
from kiln.storage.logs import LogStore
from kiln.tasks.runner import Task, TaskContext
from kiln.usecases.notebooks import RUNNING, NotebookService, notebook_path

log = logging.getLogger(__name__)

INTERVAL = 2.0
START_TIMEOUT = 300.0  # seconds a RUNNING job may take to get JupyterLab answering
BUSY = {"busy", "starting"}


class NotebookControl:
    def __init__(self, db: Database, notebooks: NotebookService, backend: Backend, logs: LogStore) -> None:
        self.db = db
        self.notebooks = notebooks
        self.host = backend if isinstance(backend, NotebookHost) else None
        self.logs = logs

    def task(self) -> Task:
        return Task.of("notebooks", self.run_once, INTERVAL)

    def run_once(self, ctx: TaskContext | None = None) -> None:
        self.notebooks.flush_activity()
        with self.db.read() as s:
            rows = s.execute(
                select(Notebook, Job).join(Job, Job.id == Notebook.job_id).where(Notebook.desired == RUNNING)
            ).all()
            for notebook, job in rows:
                s.expunge(notebook)
                s.expunge(job)
        for notebook, job in rows:
            try:
                self._check(notebook, job)
            except Exception:
                log.exception("notebook %s: check failed", notebook.id)

    def _check(self, notebook: Notebook, job: Job) -> None:
        state = JobState(job.state)
        if state.terminal:
            self.notebooks.ended(notebook.id, job.id, self._why_ended(job))
            return
        if state is not JobState.RUNNING:
            return
        lab = self._lab(job)
        spec = NotebookSpec.model_validate(notebook.spec)
        probe = "data/environment" if spec.kind == "tensorboard" else "api/status"
        if notebook.ready_job != job.id:
            if lab is not None and _get(lab, notebook.id, probe) is not None:
                self.notebooks.answered(notebook.id, job.id)
                log.info("notebook %s (%s) answers in job %s", notebook.name, notebook.id, job.id)
            elif job.started_at is not None and utcnow() - job.started_at > timedelta(seconds=START_TIMEOUT):
                what = "TensorBoard" if spec.kind == "tensorboard" else "JupyterLab"
                why = f"{what} did not answer within {format_duration(START_TIMEOUT)}: {self._last_lines(job)}"
                self.notebooks.cull(notebook.id, job.id, why)
            return
        if not spec.idle_timeout or lab is None:
            return
        if spec.kind != "tensorboard" and self._active(lab, notebook.id):
            self.notebooks.record_activity({notebook.id: utcnow()})
            return
        since = notebook.last_activity or job.started_at or utcnow()
        if utcnow() - since > timedelta(seconds=spec.idle_timeout):
            rule = (
                "nothing reached it through the proxy"
                if spec.kind == "tensorboard"
                else "no kernel busy, no terminal, no action through the proxy"
            )
            why = (
                f"culled: idle for {format_duration(spec.idle_timeout)} ({rule} since {since:%Y-%m-%d %H:%M:%S} "
                f"UTC); `kiln notebooks start {notebook.name}` brings it back"
                + ("" if spec.kind == "tensorboard" else " with its home")
            )
            if self.notebooks.cull(notebook.id, job.id, why):
                log.info("notebook %s (%s) %s", notebook.name, notebook.id, why)

    def _lab(self, job: Job) -> NotebookAddress | None:
        """Where the job's JupyterLab (TensorBoard) answers, as its backend says."""
        if self.host is None:
            return None
        try:
            return self.host.notebook_address(job.id, job.handle)
        except Exception as exc:  # the backend's API unreachable: not answering, this time
            log.warning("notebook job %s: where it answers is unknown: %s", job.id, exc)
            return None

    def _active(self, lab: NotebookAddress, notebook_id: str) -> bool:
        """A kernel busy, or a terminal open."""
        kernels = _get(lab, notebook_id, "api/kernels")
        if isinstance(kernels, list) and any(k.get("execution_state") in BUSY for k in kernels if isinstance(k, dict)):
            return True
        terminals = _get(lab, notebook_id, "api/terminals")
        return isinstance(terminals, list) and len(terminals) > 0

    def _why_ended(self, job: Job) -> str:
        if job.state == JobState.CANCELLED:
            return f"its job {job.id} was cancelled: {job.message}"
        return f"its job {job.id} ended ({str(job.state).lower()}, {job.reason}): {self._last_lines(job)}"

    def _last_lines(self, job: Job, count: int = 5) -> str:
        try:
            tail = self.logs.path(job.id).read_bytes()[-8192:].decode("utf-8", "replace").splitlines()
        except OSError:
            tail = []
        lines = [line.strip() for line in tail if line.strip()][-count:]
        return " | ".join(lines)[:1500] if lines else "(it printed nothing)"


def _get(lab: NotebookAddress, notebook_id: str, what: str) -> Any:
    """GET ``what`` of JupyterLab's REST API (its socket's or its URL's); None when it does not answer 200."""
    url = f"{lab.url}{notebook_path(notebook_id)}{what}"
    headers = {"Authorization": f"token {lab.token}"}
    try:
        with contextlib.ExitStack() as stack:
            address = stack.enter_context(socket_address(lab.socket)) if lab.socket else None
            transport = httpx.HTTPTransport(uds=address)
            with httpx.Client(transport=transport, timeout=5.0, trust_env=False) as client:
                answer = client.get(url, headers=headers)
    except (OSError, httpx.HTTPError):
        return None
    if answer.status_code != 200:
        return None
    try:
        return answer.json()
    except ValueError:
        return None
