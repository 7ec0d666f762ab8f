"""Notebook use cases: create, read, start, stop, delete; the home a notebook keeps in the store; what the proxy
and the idle check need (kiln.domain.notebooks).

A start submits a job of quota category ``dev`` through the same checks and admission as any job; a stop cancels
that job (its launcher saves the home first); the notebook task (kiln.tasks.notebooks) notices when JupyterLab
answers, when the job ended by itself, and culls idle notebooks. A TensorBoard (kind ``tensorboard``) is the same,
its launcher reading the event files of the jobs it shows from here (``events``, ``open_event``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import IO

from sqlalchemy import select
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import Job, Notebook, utcnow
from kiln.domain import tracking
from kiln.domain.ids import new_id
from kiln.domain.notebooks import (
    CATEGORY,
    NOTEBOOK_LABEL,
    EventFile,
    EventSource,
    NotebookRead,
    NotebookSpec,
    NotebookState,
)
from kiln.domain.spec import JobSpec
from kiln.domain.states import JobState
from kiln.errors import Conflict, Forbidden, InvalidInput, KilnError, NotFound
from kiln.storage.keys import events_prefix
from kiln.storage.store import ObjectStore
from kiln.usecases.access.idempotency import Idempotency, IdempotentRequest, Remember
from kiln.usecases.access.identity import Principal
from kiln.usecases.access.quotas import QuotaService, lock_org
from kiln.usecases.jobs.jobs import JobService, request_cancel
from kiln.usecases.notifications import notification_outbox
from kiln.usecases.notifications.notification_outbox import Subject

RUNNING, STOPPED = "RUNNING", "STOPPED"
HOME_SYNC_SECONDS = 60.0
FAILED_STATES = {JobState.FAILED}


def home_key(org_id: str, notebook_id: str) -> str:
    """Where a notebook's home is kept: one gzip'd tar, replaced by each save."""
    return f"orgs/{org_id}/notebooks/{notebook_id}/home.tar.gz"


def notebook_path(notebook_id: str) -> str:
    return f"/notebooks/{notebook_id}/"


def opens_at(spec: dict[str, object]) -> str:
    """Where under its path a notebook opens: JupyterLab's ``lab``, TensorBoard's root."""
    return "" if spec.get("kind") == "tensorboard" else "lab"


def run_names(jobs: list[tuple[str, str]]) -> dict[str, str]:
    """A TensorBoard run name for each (job id, job name): the name, made safe as a directory name; with the id
    where two jobs share one."""
    safe = {job_id: re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:60] or job_id for job_id, name in jobs}
    counts: dict[str, int] = {}
    for name in safe.values():
        counts[name] = counts.get(name, 0) + 1
    return {job_id: name if counts[name] == 1 else f"{name}-{job_id}" for job_id, name in safe.items()}


def job_spec(
    notebook_id: str, spec: NotebookSpec, version: str, sync_seconds: float, runs: dict[str, str] | None = None
) -> JobSpec:
    """The job one start of the notebook runs: the launcher (kiln.injob.notebook, or kiln.injob.tensorboard with
    ``runs``: job id → run name) in the +lab (+tensorboard) variant of the notebook's runtime, at catalog version
    ``version``."""
    tensorboard = spec.kind == "tensorboard"
    params: dict[str, object] = {"notebook_id": notebook_id, "base_url": notebook_path(notebook_id)}
    if tensorboard:  # params are scalars: "job-…=run,job-…=run" (run names have neither '=' nor ',')
        params["runs"] = ",".join(f"{job_id}={run}" for job_id, run in (runs or {}).items())
    else:
        params["sync_seconds"] = sync_seconds
    return JobSpec.model_validate(
        {
            "name": f"{'tensorboard' if tensorboard else 'notebook'} {spec.name}",
            "command": ["python", "-m", f"kiln.injob.{'tensorboard' if tensorboard else 'notebook'}"],
            "runtime": {"framework": spec.runtime.framework, "version": version + spec.suffix},
            "resources": spec.resources.model_dump(exclude_none=True),
            "env": spec.env,
            "inputs": [item.model_dump(exclude_none=True) for item in spec.inputs],
            "network": spec.network,
            "labels": {NOTEBOOK_LABEL: notebook_id},
            "params": params,
            "metrics": {"builtin": False, "system": True, "tensorboard": False},
            "experiment": tracking.NOTEBOOKS_EXPERIMENT,  # not a run among the team's trainings
        }
    )


def notebook_state(desired: str, job_state: str | None, ready: bool) -> NotebookState:
    """What a notebook is, from whether it should run, its job's state, and whether JupyterLab answered."""
    state = JobState(job_state) if job_state else None
    if desired == STOPPED:
        if state is None or state.terminal:
            return NotebookState.FAILED if state in FAILED_STATES else NotebookState.STOPPED
        return NotebookState.STOPPING
    if state is None or state.terminal:
        return NotebookState.FAILED if state in FAILED_STATES else NotebookState.STOPPED
    return NotebookState.RUNNING if state is JobState.RUNNING and ready else NotebookState.STARTING


class NotebookService:
    def __init__(
        self,
        db: Database,
        jobs: JobService,
        store: ObjectStore,
        endpoint: str,
        wake: Callable[[], None],
        quotas: QuotaService | None = None,
        idempotency: Idempotency | None = None,
        sync_seconds: float = HOME_SYNC_SECONDS,
    ) -> None:
        self.db = db
        self.jobs = jobs
        self.store = store
        self.endpoint = endpoint.rstrip("/")
        self.wake = wake  # the notebook task
        self.quotas = quotas
        self.idempotency = idempotency or jobs.idempotency
        self.sync_seconds = sync_seconds
        self._seen: dict[str, datetime] = {}  # what the proxy passed since the last flush: notebook → newest
        self._seen_lock = threading.Lock()

    # ---- reading

    def load(self, s: Session, principal: Principal, ref: str, *, lock: bool = False) -> Notebook:
        """The caller's organisation's notebook named ``ref`` (a name or an id); 404 for any other."""
        column = Notebook.id if ref.startswith("nb-") else Notebook.name
        query = select(Notebook).where(column == ref)
        if not principal.platform_admin:
            query = query.where(Notebook.org_id == principal.org_id)
        if lock and self.db.dialect == "postgresql":
            query = query.with_for_update()
        notebook = s.scalar(query)
        if notebook is None:
            raise NotFound(f"notebook {ref} not found")
        return notebook

    def _read(self, s: Session, notebook: Notebook) -> NotebookRead:
        job = s.execute(select(Job.state, Job.reason, Job.message).where(Job.id == notebook.job_id)).first()
        job_state = job.state if job is not None else None
        ready = notebook.job_id is not None and notebook.ready_job == notebook.job_id
        message = notebook.message
        if not message and job is not None and JobState(job.state).terminal:  # the notebook task says why soon
            message = f"its job {notebook.job_id} ended ({str(job.state).lower()}, {job.reason}): {job.message or ''}"
        return NotebookRead(
            id=notebook.id,
            name=notebook.name,
            org_id=notebook.org_id,
            user_id=notebook.user_id,
            state=notebook_state(notebook.desired, job_state, ready),
            message=message,
            spec=NotebookSpec.model_validate(notebook.spec),
            job_id=notebook.job_id,
            url=f"{self.endpoint}{notebook_path(notebook.id)}{opens_at(notebook.spec)}",
            last_activity=notebook.last_activity,
            created_at=notebook.created_at,
            updated_at=notebook.updated_at,
        )

    def get(self, principal: Principal, ref: str) -> NotebookRead:
        principal.require("notebooks:read")
        with self.db.read() as s:
            return self._read(s, self.load(s, principal, ref))

    def list_notebooks(self, principal: Principal) -> list[NotebookRead]:
        principal.require("notebooks:read")
        with self.db.read() as s:
            query = select(Notebook).order_by(Notebook.name)
            if not principal.platform_admin:
                query = query.where(Notebook.org_id == principal.org_id)
            return [self._read(s, x) for x in s.scalars(query)]

    # ---- changing

    def _checked_job(self, principal: Principal, notebook_id: str, spec: NotebookSpec) -> JobSpec:
        """The job of a start of ``spec``, through every check a submit makes (quota category ``dev``)."""
        entry = self.jobs.catalog.resolve(spec.runtime.framework or "python", spec.runtime.version)
        runs = self._runs(principal, spec) if spec.kind == "tensorboard" else None
        try:
            job = job_spec(notebook_id, spec, entry.version, self.sync_seconds, runs)
            return self.jobs.check_submit(principal, job, None, category=CATEGORY, kiln_labels=True)
        except KilnError as exc:
            if isinstance(exc, InvalidInput):
                raise InvalidInput(f"notebook: {exc.message}", details={"field": "spec"}) from None
            raise
        except ValueError as exc:  # the spec's env or inputs, as a job's
            raise InvalidInput(f"notebook: {exc}", details={"field": "spec"}) from None

    def _runs(self, principal: Principal, spec: NotebookSpec) -> dict[str, str]:
        """The run name of each job a TensorBoard shows; 404 for a job the caller cannot read."""
        principal.require("jobs:read")
        with self.db.read() as s:
            named = [(job_id, self.jobs.load(s, principal, job_id).name or job_id) for job_id in spec.jobs]
        return run_names(named)

    def create(
        self, principal: Principal, spec: NotebookSpec, idempotency: IdempotentRequest | None = None
    ) -> NotebookRead:
        """A new notebook, started (409 when the organisation has one of that name)."""
        principal.require("notebooks:write")
        return self.idempotency.create(
            principal, idempotency, "notebook", lambda remember: self._create(principal, spec, remember), self._by_id
        )

    def _by_id(self, s: Session, notebook_id: str) -> NotebookRead | None:
        notebook = s.get(Notebook, notebook_id)
        return None if notebook is None else self._read(s, notebook)

    def _create(self, principal: Principal, spec: NotebookSpec, remember: Remember) -> NotebookRead:
        notebook_id = new_id("nb")
        job_spec_ = self._checked_job(principal, notebook_id, spec)
        now = utcnow()
        with self.db.transaction() as s:
            taken = s.scalar(select(Notebook.id).where(Notebook.org_id == principal.org_id, Notebook.name == spec.name))
            if taken is not None:
                raise Conflict(f"notebook {spec.name} exists; start it with `kiln notebooks start {spec.name}`")
            notebook = Notebook(
                id=notebook_id,
                org_id=principal.org_id,
                user_id=principal.user_id,
                name=spec.name,
                spec=spec.model_dump(mode="json"),
                desired=RUNNING,
                message="",
                last_activity=now,
                home_size=0,
                created_at=now,
                updated_at=now,
            )
            s.add(notebook)
            s.flush()
            self._start_job(s, principal, notebook, job_spec_, f"notebook {spec.name} created by {principal.user_name}")
            remember(s, notebook.id)
            read = self._read(s, notebook)
        self.jobs.wake()
        self.wake()
        return read

    def _start_job(self, s: Session, principal: Principal, notebook: Notebook, spec: JobSpec, note: str) -> None:
        self.jobs.check_admission(s, principal, spec, CATEGORY)
        job = self.jobs.new_job(s, notebook.org_id, notebook.user_id, spec, None, note, category=CATEGORY)
        s.flush()
        notebook.job_id = job.id
        notebook.desired = RUNNING
        notebook.message = ""
        notebook.last_activity = utcnow()
        notebook.updated_at = utcnow()

    def start(self, principal: Principal, ref: str) -> NotebookRead:
        """Start a stopped (or failed, or culled) notebook again, with its home; a running one: nothing to do."""
        principal.require("notebooks:write")
        with self.db.read() as s:
            current = self.load(s, principal, ref)
            notebook_id, spec = current.id, NotebookSpec.model_validate(current.spec)
            self._check_owner(principal, current, "start")
        job = self._checked_job(principal, notebook_id, spec)
        with self.db.transaction() as s:
            notebook = self.load(s, principal, notebook_id, lock=True)
            state = s.scalar(select(Job.state).where(Job.id == notebook.job_id)) if notebook.job_id else None
            if state is not None and not JobState(state).terminal:
                if notebook.desired == STOPPED:
                    raise Conflict(f"notebook {notebook.name} is stopping; start it once it has stopped")
                return self._read(s, notebook)
            self._start_job(s, principal, notebook, job, f"notebook {notebook.name} started by {principal.user_name}")
            read = self._read(s, notebook)
        self.jobs.wake()
        self.wake()
        return read

    def stop(self, principal: Principal, ref: str, why: str | None = None) -> NotebookRead:
        """Stop it: its job is cancelled (the launcher saves the home first); ``start`` brings it back."""
        principal.require("notebooks:write")
        with self.db.transaction() as s:
            notebook = self.load(s, principal, ref, lock=True)
            read = self._stop(s, notebook, why or f"stopped by {principal.user_name}")
        self.jobs.wake()
        return read

    def _stop(self, s: Session, notebook: Notebook, why: str) -> NotebookRead:
        notebook.desired = STOPPED
        notebook.message = why
        notebook.updated_at = utcnow()
        if notebook.job_id is not None:
            job = s.get(Job, notebook.job_id)
            if job is not None and not JobState(job.state).terminal:
                request_cancel(s, job, f"cancelled: notebook {notebook.name} {why}")
        return self._read(s, notebook)

    def cull(self, notebook_id: str, job_id: str, why: str) -> bool:
        """Stop a notebook found idle (the notebook task), unless it started again or was stopped meanwhile."""
        with self.db.transaction() as s:
            notebook = s.get(Notebook, notebook_id)
            if notebook is None or notebook.desired != RUNNING or notebook.job_id != job_id:
                return False
            self._stop(s, notebook, why)
            about = Subject("notebook", notebook.org_id, notebook.id, notebook.name, notebook.user_id, "/notebooks")
            notification_outbox.recorded(s, "notebook.culled", about, state="stopped", message=why)
        self.jobs.wake()
        return True

    def answered(self, notebook_id: str, job_id: str) -> None:
        """JupyterLab answered in this job of the notebook (the notebook task's probe): it is RUNNING."""
        with self.db.transaction() as s:
            notebook = s.get(Notebook, notebook_id)
            if notebook is not None and notebook.job_id == job_id:
                notebook.ready_job = job_id
                notebook.last_activity = utcnow()  # its idle time starts once it answers, not while it starts

    def ended(self, notebook_id: str, job_id: str, why: str) -> None:
        """Its job ended by itself (JupyterLab exited, the job failed or was lost): it is stopped, saying why."""
        with self.db.transaction() as s:
            notebook = s.get(Notebook, notebook_id)
            if notebook is not None and notebook.desired == RUNNING and notebook.job_id == job_id:
                notebook.desired = STOPPED
                notebook.message = why
                notebook.updated_at = utcnow()

    def delete(self, principal: Principal, ref: str) -> None:
        """Stop it and forget it, with its home (its jobs stay, as any job's history)."""
        principal.require("notebooks:write")
        with self.db.transaction() as s:
            notebook = self.load(s, principal, ref, lock=True)
            self._check_owner(principal, notebook, "delete", admins_may=True)
            self._stop(s, notebook, f"deleted by {principal.user_name}")
            org_id, notebook_id = notebook.org_id, notebook.id
            s.delete(notebook)
        self.jobs.wake()
        try:
            self.store.delete(home_key(org_id, notebook_id))
        except FileNotFoundError:
            pass

    @staticmethod
    def _check_owner(principal: Principal, notebook: Notebook, what: str, *, admins_may: bool = False) -> None:
        """A notebook runs code as its user, with their data: it opens (and starts) for its user alone; an
        organisation's admins may stop and delete its notebooks (someone who left, a notebook holding GPUs)."""
        if admins_may and principal.role == "admin":
            return
        if notebook.user_id != principal.user_id and not principal.platform_admin:
            raise Forbidden(f"notebook {notebook.name} is another user's: only its user may {what} it")

    # ---- the proxy and the idle check

    def target(self, principal: Principal, notebook_id: str) -> tuple[str, Job, str]:
        """(notebook id, its running job, its kind) for the proxy: the caller's own notebook of their
        organisation."""
        principal.require("notebooks:write")
        with self.db.read() as s:
            notebook = self.load(s, principal, notebook_id)
            if notebook.user_id != principal.user_id:
                raise Forbidden(f"notebook {notebook.name} is another user's: it opens for its user only")
            job = s.get(Job, notebook.job_id) if notebook.job_id else None
            if notebook.desired != RUNNING or job is None or job.state != JobState.RUNNING:
                state = self._read(s, notebook).state
                raise Conflict(
                    f"notebook {notebook.name} is {state}"
                    + ("; start it with `kiln notebooks start`" if state != NotebookState.STARTING else "; wait")
                )
            s.expunge(job)
            return notebook.id, job, str(notebook.spec.get("kind") or "jupyterlab")

    def touch(self, notebook_id: str) -> None:
        """An action through the proxy (kept in memory; the notebook task writes it down)."""
        with self._seen_lock:
            self._seen[notebook_id] = utcnow()

    def flush_activity(self) -> None:
        with self._seen_lock:
            seen, self._seen = self._seen, {}
        if seen:
            self.record_activity(seen)

    def record_activity(self, seen: dict[str, datetime]) -> None:
        """Actions seen (through the proxy, or a kernel busy): the newest per notebook, never going back."""
        with self.db.transaction() as s:
            for notebook in s.scalars(select(Notebook).where(Notebook.id.in_(list(seen)))):
                when = seen[notebook.id]
                if notebook.last_activity is None or notebook.last_activity < when:
                    notebook.last_activity = when

    # ---- a TensorBoard's event files

    def _source(
        self, s: Session, principal: Principal, notebook_id: str, job_id: str | None
    ) -> tuple[Notebook, Job | None]:
        notebook = self._home_notebook(s, principal, notebook_id, "read the event files of")
        jobs = list(notebook.spec.get("jobs") or [])
        if notebook.spec.get("kind") != "tensorboard":
            raise NotFound(f"notebook {notebook.name} is not a tensorboard: it has no event files")
        if job_id is None:
            return notebook, None
        job = s.get(Job, job_id) if job_id in jobs else None
        if job is None or job.org_id != notebook.org_id:
            raise NotFound(f"job {job_id} is not one of tensorboard {notebook.name}'s")
        return notebook, job

    def events(self, principal: Principal, notebook_id: str) -> list[EventSource]:
        """Each job a TensorBoard shows: its state and its event files kept in the store (path, size)."""
        with self.db.read() as s:
            notebook, _ = self._source(s, principal, notebook_id, None)
            jobs = {j.id: j for j in s.scalars(select(Job).where(Job.id.in_(list(notebook.spec.get("jobs") or []))))}
            found = [(job_id, jobs.get(job_id)) for job_id in notebook.spec.get("jobs") or []]
        answer: list[EventSource] = []
        for job_id, job in found:
            if job is None or job.org_id != notebook.org_id:
                answer.append(EventSource(job_id=job_id, state="DELETED", files=[]))
                continue
            kept = self.store.list(events_prefix(job.org_id, job.id))
            files = [EventFile(path=rel, size=size) for rel, size in kept]
            answer.append(EventSource(job_id=job_id, state=str(job.state), files=files))
        return answer

    def open_event(self, principal: Principal, notebook_id: str, job_id: str, path: str, offset: int) -> IO[bytes]:
        """One of a TensorBoard's jobs' event files, from byte ``offset`` on."""
        with self.db.read() as s:
            _, job = self._source(s, principal, notebook_id, job_id)
            assert job is not None
            prefix = events_prefix(job.org_id, job.id)
        if path not in {rel for rel, _ in self.store.list(prefix)}:
            raise NotFound(f"job {job_id} has no event file {path!r}")
        handle = self.store.open(f"{prefix}/{path}")
        if offset:
            handle.seek(offset)
        return handle

    # ---- the home

    def _home_notebook(
        self, s: Session, principal: Principal, notebook_id: str, what: str = "read the home of"
    ) -> Notebook:
        """The notebook whose home the caller may read or replace: its running job's launcher (a job token), or
        its user."""
        notebook = s.get(Notebook, notebook_id)
        if principal.job_id is not None:
            if notebook is None or notebook.job_id != principal.job_id:
                raise NotFound(f"notebook {notebook_id} not found")
            return notebook
        notebook = self.load(s, principal, notebook_id)
        self._check_owner(principal, notebook, what)
        return notebook

    def open_home(self, principal: Principal, notebook_id: str) -> IO[bytes] | None:
        """The home as last saved (a gzip'd tar), or None when it has none yet."""
        with self.db.read() as s:
            notebook = self._home_notebook(s, principal, notebook_id)
            key = home_key(notebook.org_id, notebook.id)
        if not self.store.exists(key):
            return None
        return self.store.open(key)

    def save_home(self, principal: Principal, notebook_id: str, tar: Path) -> int:
        """Replace the home with the gzip'd tar at ``tar`` (received whole first: a save cut short leaves the
        previous home), counted against the organisation's storage quota less the home it replaces: checked and
        reserved (the larger of the two homes, which the store holds one of until the copy is done) in one
        transaction under the organisation's lock, so two saves at once never pass the limit together."""
        if principal.job_id is None:
            raise Forbidden("a notebook's home is saved by the notebook itself (its job's token)")
        size = tar.stat().st_size
        with self.db.transaction() as s:
            notebook = self._home_notebook(s, principal, notebook_id)
            org_id, previous = notebook.org_id, notebook.home_size
            if self.quotas is not None:
                lock_org(s, org_id)
                self.quotas.check_storage(s, org_id, principal.org_name, max(0, size - previous))
            notebook.home_size = max(previous, size)
        try:
            self.store.put_file(tar, home_key(org_id, notebook_id))
        except BaseException:
            self._set_home_size(notebook_id, previous)  # the store still holds the home it would have replaced
            raise
        self._set_home_size(notebook_id, size)
        return size

    def _set_home_size(self, notebook_id: str, size: int) -> None:
        with self.db.transaction() as s:
            current = s.get(Notebook, notebook_id)
            if current is not None:
                current.home_size = size
