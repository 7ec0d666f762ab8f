"""Job use cases: submit, read, list, cancel. They only record intent; the reconciler acts on it."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Select, Text, and_, bindparam, cast, or_, select
from sqlalchemy.orm import Session

from kiln.backends.base import Inventory
from kiln.db.session import Database
from kiln.db.tables import Blob, Job, JobEvent, Organization, User, utcnow
from kiln.domain.catalog import Catalog
from kiln.domain.ids import new_id
from kiln.domain.job_requests import JobDryRun, JobRerun
from kiln.domain.notebooks import NOTEBOOK_LABEL
from kiln.domain.schemas import EventRead, JobRead, JobSubmit
from kiln.domain.spec import PRIORITIES, InputSpec, JobSpec
from kiln.domain.states import JobState, Reason
from kiln.domain.stored_spec import StoredSpec
from kiln.errors import Conflict, Forbidden, InvalidInput, NotFound
from kiln.usecases.access.idempotency import Idempotency, IdempotentRequest, Remember
from kiln.usecases.access.identity import Principal
from kiln.usecases.access.quotas import QuotaService
from kiln.usecases.jobs.lifecycle import create_job, record, transition
from kiln.usecases.jobs.run_rows import experiment_id_for, record_job_run
from kiln.usecases.jobs.scheduler_inputs import never_fits, node_of

# The quota category of training jobs; serving and dev environments will use "serve" and "dev".
CATEGORY = "train"
DEFAULT_KEY_RETENTION = 24 * 3600.0  # seconds an Idempotency-Key is kept where no platform gives its setting


# What a JobRead holds beside the job's own columns: the names of its organisation and user, read in the same
# query as the job (a join), never one query per job.
NAME_FIELDS = ("org_name", "user_name")
# The columns a JobRead is made of: list queries select these alone, not whole rows (no handle, no lease).
# The spec as the database stores it (JSON text, not decoded): a list of a hundred jobs decoded and validated a
# hundred specs, most of which ``_spec_of`` has already.
READ_COLUMNS = [
    *(
        cast(Job.spec, Text).label("spec") if name == "spec" else getattr(Job, name)
        for name in JobRead.model_fields
        if name not in ("cancel_requested", *NAME_FIELDS)
    ),
    Job.cancel_requested,
    Organization.name.label("org_name"),
    User.name.label("user_name"),
]
# Job id → its spec, validated: a job's spec never changes once it is submitted, and job ids are never reused.
_SPECS: dict[str, JobSpec] = {}
SPECS_CACHED = 4096


def _spec_of(job_id: str, stored: str | dict[str, Any]) -> JobSpec:
    """The job's spec as a JobRead holds it, from its stored JSON (text or decoded), validated once per job."""
    spec = _SPECS.get(job_id)
    if spec is None:
        spec = JobSpec.model_validate(json.loads(stored) if isinstance(stored, str) else stored)
        if len(_SPECS) >= SPECS_CACHED:
            _SPECS.clear()
        _SPECS[job_id] = spec
    return spec


def _with_names(query: Select[Any]) -> Select[Any]:
    """``query`` over jobs, joined to the organisation and user whose names READ_COLUMNS select."""
    return query.outerjoin(Organization, Organization.id == Job.org_id).outerjoin(User, User.id == Job.user_id)


@functools.cache
def _list_statement(filters: frozenset[str]) -> Select[Any]:
    """The list query for one combination of filters, built once: building a statement costs more than
    running it on a hot route. Parameters are bound by name."""
    query = _with_names(select(*READ_COLUMNS).select_from(Job))
    query = query.order_by(Job.created_at.desc(), Job.id.desc()).limit(bindparam("limit"))
    if "org_id" in filters:
        query = query.where(Job.org_id == bindparam("org_id"))
    if "job_id" in filters:
        query = query.where(Job.id == bindparam("job_id"))
    if "states" in filters:
        query = query.where(Job.state.in_(bindparam("states", expanding=True)))
    if "before" in filters:
        # Keyset paging on the sort key (created_at, id), not on id alone: ids made in the same instant by other
        # processes do not follow created_at, and paging on id skipped and repeated jobs. The job named must be
        # one the caller sees (else the page is empty, as for an id that does not exist).
        ref = select(Job.created_at).where(Job.id == bindparam("before"))
        if "org_id" in filters:
            ref = ref.where(Job.org_id == bindparam("org_id"))
        when = ref.scalar_subquery()
        query = query.where(or_(Job.created_at < when, and_(Job.created_at == when, Job.id < bindparam("before"))))
    return query


def _list_params(principal: Principal, states: list[JobState] | None, limit: int, before: str | None) -> dict[str, Any]:
    """The bound parameters of the list query: everything the result depends on, the caller's visibility
    (organisation, or all for a platform admin; the one job of a job token) included."""
    params: dict[str, Any] = {"limit": limit}
    if not principal.platform_admin:
        params["org_id"] = principal.org_id
    if principal.job_id is not None:
        params["job_id"] = principal.job_id
    if states:
        params["states"] = [str(x) for x in states]
    if before:
        params["before"] = before
    return params


class ListCache:
    """Serialised job lists (the response bytes) by query and caller visibility, each valid while the version of
    the jobs table it was read under is the current one (see JobService.list_jobs_json)."""

    ENTRIES = 1024  # all callers and queries together; beyond it, the stale ones go, then all

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._entries: dict[tuple[Any, ...], tuple[int, bytes]] = {}  # key -> (jobs version, JSON)

    @staticmethod
    def key(params: dict[str, Any]) -> tuple[Any, ...]:
        return tuple((k, tuple(sorted(set(v))) if isinstance(v, list) else v) for k, v in sorted(params.items()))

    def get(self, key: tuple[Any, ...], version: int) -> bytes | None:
        hit = self._entries.get(key)
        return hit[1] if hit is not None and hit[0] == version else None

    def put(self, key: tuple[Any, ...], version: int, body: bytes, current: int) -> None:
        entries = self._entries
        if len(entries) >= self.ENTRIES:
            for stale in [k for k, (v, _) in list(entries.items()) if v != current]:
                entries.pop(stale, None)
            if len(entries) >= self.ENTRIES:
                entries.clear()
        entries[key] = (version, body)


class RowJson:
    """Each listed job's JSON (a JobRead's, as ``JobList`` writes its items), kept with the row it was made of and
    made again only when the row differs: a list polled while a few of its jobs move serialises those few. Keyed
    by the whole row, every column a JobRead is made of, so no write can leave a stale one."""

    ENTRIES = 10_000  # beyond it, all go

    def __init__(self) -> None:
        self._made: dict[str, tuple[tuple[Any, ...], bytes]] = {}

    def json(self, row: Any) -> bytes:
        key = tuple(row)
        made = self._made.get(row.id)
        if made is not None and made[0] == key:
            return made[1]
        body = to_read(row).model_dump_json().encode()
        if len(self._made) >= self.ENTRIES:
            self._made.clear()
        self._made[row.id] = (key, body)
        return body


_ROWS = RowJson()


def _totals(spec: JobSpec) -> tuple[float, int, int | None]:
    """What the job holds over its whole gang: (cpus, gpus, memory)."""
    gang = spec.gang_size
    memory = spec.resources.memory * gang if spec.resources.memory is not None else None
    return spec.resources.cpus * gang, spec.resources.gpus * gang, memory


def to_read(job: Job | Any, names: tuple[str | None, str | None] | None = None) -> JobRead:
    """A JobRead from a row of READ_COLUMNS, or from a Job row and ``names`` (its organisation's and user's, as
    :func:`job_names` reads them); one validation pass (the spec was valid at submit)."""
    fields = {name: getattr(job, name) for name in JobRead.model_fields if name not in NAME_FIELDS}
    fields["spec"] = _spec_of(job.id, fields["spec"])
    if names is None:
        fields.update({name: getattr(job, name, None) for name in NAME_FIELDS})
    else:
        fields["org_name"], fields["user_name"] = names
    return JobRead.model_validate(fields)


def job_names(s: Session, job: Job) -> tuple[str | None, str | None]:
    """The names of a job's organisation and user, in one query."""
    user_name = select(User.name).where(User.id == job.user_id).scalar_subquery()
    row = s.execute(select(Organization.name, user_name).where(Organization.id == job.org_id)).first()
    return (row[0], row[1]) if row is not None else (None, None)


def read_job(s: Session, job: Job) -> JobRead:
    """The JobRead of a Job row, with the names of its organisation and user."""
    return to_read(job, job_names(s, job))


def event_read(event: JobEvent) -> EventRead:
    return EventRead(
        id=event.id,
        job_id=event.job_id,
        time=event.time,
        from_state=JobState(event.from_state) if event.from_state else None,
        to_state=JobState(event.to_state) if event.to_state else None,
        reason=event.reason,
        message=event.message,
    )


class BudgetGate(Protocol):
    """Monthly cost limits (kiln.usecases.budgets.BudgetService) as a submit and a new job meet them."""

    def check(self, s: Session, principal: Principal) -> None:
        """Raise BudgetExceeded where a hard limit of the caller's scope is spent."""

    def warnings(self, s: Session, org_id: str, user_id: str) -> list[str]:
        """What a new job of this scope is warned of (soft limits passed)."""


def request_cancel(s: Session, job: Job, message: str) -> bool:
    """Cancel ``job`` in the caller's transaction: at once where no attempt runs (QUEUED, RESTARTING), else by
    asking the reconciler to stop its attempt. False where it has ended already (nothing to do)."""
    state = JobState(job.state)
    if state.terminal:
        return False
    if state in (JobState.QUEUED, JobState.RESTARTING):
        transition(s, job, JobState.CANCELLED, Reason.CANCELLED, message)
    elif not job.cancel_requested:
        job.cancel_requested = True
        job.updated_at = utcnow()
        # Said on the job while its attempt stops (the grace), and what its end will say (scheduler.outcome).
        job.message = message.replace("cancelled", "cancel requested", 1)
        record(s, job, Reason.CANCEL_REQUESTED, job.message)
    return True


class JobService:
    def __init__(
        self,
        db: Database,
        catalog: Catalog,
        nodes: Callable[[], list[Inventory]],
        wake: Callable[..., None],
        validate: Callable[[JobSpec], None] | None = None,
        quotas: QuotaService | None = None,
        network_host_orgs: tuple[str, ...] = (),
        idempotency: Idempotency | None = None,
        *,
        backend_name: str = "local",
        resolve_dataset: Callable[[str, str], tuple[str, int]] | None = None,
        pin_model: Callable[[str, int, InputSpec], InputSpec] | None = None,
        pin_job: Callable[[str, int, InputSpec], InputSpec] | None = None,
        budgets: BudgetGate | None = None,
        place_now: Callable[[Session, Job], Callable[[], None] | None] | None = None,
    ) -> None:
        self.validate = validate
        # (the submit's transaction, its new job: added, not written) → placed now: what to call after the commit;
        # or None: queued (kiln.scheduler.submit_placement).
        self.place_now = place_now
        # The Idempotency-Keys of creates (submit, rerun): the platform's, shared with the other creates.
        self.idempotency = idempotency or Idempotency(db, DEFAULT_KEY_RETENTION)
        self.network_host_orgs = network_host_orgs  # organisations (names or ids) allowed network: host
        self.quotas = quotas
        self.budgets = budgets  # monthly cost limits: a spent hard one refuses new work, a soft one warns
        self.db = db
        self.catalog = catalog
        self.nodes = nodes
        self.backend_name = backend_name  # the server's backend: its reconciler places the job
        # (org id, NAME or NAME@VERSION) → (name, version) of a ready dataset version, or NotFound.
        self.resolve_dataset = resolve_dataset
        # (org id, index, a model input) → the input pinned to a version number (kiln.usecases.inputs.inputs), or a 422.
        self.pin_model = pin_model
        self.pin_job = pin_job  # (org id, index, a job input) → the input, its job's outputs read (or a 422)
        self.wake = wake

    def load(self, s: Session, principal: Principal, job_id: str, *, lock: bool = False) -> Job:
        if principal.job_id is not None and principal.job_id != job_id:
            raise NotFound(f"job {job_id} not found")  # a job token reaches its own job only
        query = select(Job).where(Job.id == job_id)
        if not principal.platform_admin:
            query = query.where(Job.org_id == principal.org_id)
        if lock and self.db.dialect == "postgresql":
            query = query.with_for_update()
        job = s.scalar(query)
        if job is None:
            # Same answer whether the job does not exist or belongs to someone else.
            raise NotFound(f"job {job_id} not found")
        return job

    def submit(self, principal: Principal, body: JobSubmit, idempotency: IdempotentRequest | None = None) -> JobRead:
        """A new QUEUED job. With ``idempotency`` (the request's Idempotency-Key), a repeat of the same request
        answers the job the first one created, as it is now (the same job: same id), and creates none."""
        principal.require("jobs:write")

        def make(remember: Remember) -> JobRead:
            spec = self._checked_spec(principal, body.spec)
            return self._create(principal, spec, body.code_sha256, f"submitted by {principal.user_name}", remember)

        return self.idempotency.create(principal, idempotency, "job", make, self._read_by_id)

    @staticmethod
    def _read_by_id(s: Session, job_id: str) -> JobRead | None:
        """The job an Idempotency-Key names (its row proves the caller created it), or None if it was deleted."""
        job = s.get(Job, job_id)
        return None if job is None else read_job(s, job)

    def dry_run(self, principal: Principal, body: JobSubmit) -> JobDryRun:
        """Every check ``submit`` makes, creating nothing: the spec as the job would get it, and whether the code
        bundle is stored already (a client packs its code, asks this, and uploads only what is missing)."""
        spec = self._checked_spec(principal, body.spec)
        with self.db.read() as s:
            self.check_admission(s, principal, spec)
            stored = None if not body.code_sha256 else s.get(Blob, (principal.org_id, body.code_sha256)) is not None
        return JobDryRun(spec=spec, name=spec.display_name, code_sha256=body.code_sha256, code_stored=stored)

    def rerun(
        self, principal: Principal, job_id: str, body: JobRerun, idempotency: IdempotentRequest | None = None
    ) -> JobRead:
        """A new job with the spec (inputs at the versions it pinned) and code of ``job_id``, whatever its state;
        every check of a submit applies again. ``idempotency``: as for ``submit``."""
        principal.require("jobs:write")

        def make(remember: Remember) -> JobRead:
            return self._rerun(principal, job_id, body, remember)

        return self.idempotency.create(principal, idempotency, "job", make, self._read_by_id)

    def _rerun(self, principal: Principal, job_id: str, body: JobRerun, remember: Remember) -> JobRead:
        with self.db.read() as s:
            job = self.load(s, principal, job_id)
            if job.org_id != principal.org_id:  # a platform admin reading another organisation's job
                raise Conflict(
                    f"job {job_id} belongs to another organisation, whose code and quota a rerun needs; "
                    "rerun it with a key of that organisation"
                )
            spec, code = StoredSpec(job.spec).model, job.code_sha256
        if body.name is not None:
            spec = spec.model_copy(update={"name": body.name})
        spec = self._checked_spec(principal, spec)
        return self._create(principal, spec, code, f"rerun of {job_id} by {principal.user_name}", remember)

    def _checked_spec(self, principal: Principal, spec: JobSpec, *, kiln_labels: bool = False) -> JobSpec:
        """The checks of a submit that need no transaction; the spec with its inputs pinned. ``kiln_labels``: the
        spec is Kiln's own (a notebook's start), which alone may carry Kiln's labels."""
        principal.require("jobs:write")
        if not kiln_labels and NOTEBOOK_LABEL in spec.labels:
            raise InvalidInput(
                f"labels: {NOTEBOOK_LABEL} is Kiln's own (it marks a notebook's job); name the label otherwise, or "
                "start the notebook with `kiln notebooks start`",
                details={"field": f"spec.labels.{NOTEBOOK_LABEL}"},
            )
        self.catalog.check(spec.runtime)
        if spec.network == "host" and not {principal.org_id, principal.org_name} & set(self.network_host_orgs):
            raise Forbidden(
                f"network: host (the machine's own network) is not allowed for organisation {principal.org_name}; "
                "use network: isolated (the default) or none, or ask the operator to add the organisation to "
                "KILN_NETWORK_HOST_ORGS",
                details={"field": "spec.network"},
            )
        if self.validate is not None:
            self.validate(spec)
        if spec.inputs:
            spec = self._pin_inputs(principal, spec)
        impossible = never_fits(spec, [node_of(n) for n in self.nodes()])
        if impossible:
            raise InvalidInput(f"resources: the job {impossible}", details={"field": "spec.resources"})
        return spec

    def check_admission(self, s: Session, principal: Principal, spec: JobSpec, category: str = CATEGORY) -> None:
        """The organisation's side: a quota the job can ever fit, and the priority it may use."""
        if self.quotas is not None:
            cpus, gpus, memory = _totals(spec)
            self.quotas.check_submit(principal, category, gpus, cpus, memory, session=s)
        if self.budgets is not None:
            self.budgets.check(s, principal)
        if spec.priority != "normal" and not principal.platform_admin:
            self._check_priority(s, principal, spec.priority)

    def _create(
        self, principal: Principal, spec: JobSpec, code_sha256: str | None, note: str, remember: Remember
    ) -> JobRead:
        now = utcnow()
        # One transaction: the checks that read, the job, its event and the request's Idempotency-Key.
        with self.db.transaction() as s:
            self.check_admission(s, principal, spec)
            if code_sha256 and s.get(Blob, (principal.org_id, code_sha256)) is None:
                raise InvalidInput(
                    f"code_sha256: no uploaded bundle {code_sha256}; upload it with PUT /api/v1/blobs/{{sha256}}"
                )
            job = self.new_job(s, principal.org_id, principal.user_id, spec, code_sha256, note, now=now, flush=False)
            remember(s, job.id, flush=False)
            # Placed now (STARTING) or queued, before anything is written: one flush writes the job as it leaves
            # here with its events, its run and the key (a key another request holds is an IntegrityError there).
            placed = self.place_now(s, job) if self.place_now is not None else None
            s.flush()  # fills the defaults the read shows
            read = to_read(job, (principal.org_name, principal.user_name))  # the caller's own, just created
        if placed is not None:
            placed()  # STARTING, under this server's lease: the reconciler starts it; no queue pass is needed
        else:
            self.wake()
        return read

    def new_job(
        self,
        s: Session,
        org_id: str,
        user_id: str,
        spec: JobSpec,
        code_sha256: str | None,
        note: str,
        *,
        now: datetime | None = None,
        category: str = CATEGORY,
        flush: bool = True,
    ) -> Job:
        """A new QUEUED job row and its first event in the caller's transaction ``s``, for a spec that passed
        the submit checks (a submit, a rerun, a tuning study's trial). The caller wakes the reconciler. ``flush``:
        the rows are written before this returns (False: the caller's next flush writes them)."""
        cpus, gpus, memory = _totals(spec)
        # What it reads first, so that the rows below are written by one flush, not by these queries' autoflushes.
        experiment_id = experiment_id_for(s, org_id, spec.experiment)
        warnings = self.budgets.warnings(s, org_id, user_id) if self.budgets is not None else []
        job = Job(
            id=new_id("job"),
            org_id=org_id,
            user_id=user_id,
            name=spec.display_name,
            spec=spec.model_dump(mode="json"),
            code_sha256=code_sha256,
            cpus=cpus,
            memory=memory,
            gpus=gpus,
            category=category,
            priority=spec.priority_value,
            workers=spec.gang_size,
            backend=self.backend_name,
            # The columns' defaults, set here: a submit places the job before its row is written (flush=False).
            attempt=0,
            restarts=0,
            cancel_requested=False,
        )
        create_job(s, job, note, now=now)
        for warning in warnings:
            record(s, job, Reason.BUDGET_WARNING, warning)
        record_job_run(s, job, spec, experiment_id)  # every job is a run (kiln.usecases.tracking.tracking)
        if flush:
            s.flush()
        return job

    def check_submit(
        self,
        principal: Principal,
        spec: JobSpec,
        code_sha256: str | None,
        *,
        category: str = CATEGORY,
        kiln_labels: bool = False,
    ) -> JobSpec:
        """Every check a submit of ``spec`` makes (its inputs pinned in what is returned), creating nothing: a
        tuning study checks its trial spec so, a service its replica's (quota category ``serve``), a notebook its
        start's (``kiln_labels``: Kiln's own spec)."""
        spec = self._checked_spec(principal, spec, kiln_labels=kiln_labels)
        with self.db.read() as s:
            self.check_admission(s, principal, spec, category)
            if code_sha256 and s.get(Blob, (principal.org_id, code_sha256)) is None:
                raise InvalidInput(
                    f"code_sha256: no uploaded bundle {code_sha256}; upload it with PUT /api/v1/blobs/{{sha256}}"
                )
        return spec

    def _pin_inputs(self, principal: Principal, spec: JobSpec) -> JobSpec:
        """Each input's version as it is now (the latest, where none is given), written into the job's spec so
        that every attempt reads the same data."""
        if self.resolve_dataset is None:
            raise InvalidInput("inputs: this server keeps no datasets", details={"field": "spec.inputs"})
        pinned = []
        for index, item in enumerate(spec.inputs):
            if item.job is not None:  # an ended job's outputs
                if self.pin_job is None:
                    raise InvalidInput("inputs: this server reads no job outputs", details={"field": "spec.inputs"})
                pinned.append(self.pin_job(principal.org_id, index, item))
                continue
            if item.model is not None:  # a registered model's version
                if self.pin_model is None:
                    raise InvalidInput("inputs: this server keeps no models", details={"field": "spec.inputs"})
                pinned.append(self.pin_model(principal.org_id, index, item))
                continue
            try:
                name, version = self.resolve_dataset(principal.org_id, item.ref)
            except NotFound as exc:
                # With details the dataset exists but not that version, and the message says which ones do.
                why = exc.message
                if not exc.details:
                    why = (
                        f"no dataset {item.label!r} in organisation {principal.org_name} "
                        "(upload it with `kiln data put PATH NAME`)"
                    )
                raise InvalidInput(
                    f"inputs[{index}].dataset: {why}", details={"field": f"spec.inputs[{index}].dataset"}
                ) from None
            pinned.append(item.model_copy(update={"dataset": f"{name}@{version}"}))
        return spec.model_copy(update={"inputs": pinned})

    @staticmethod
    def _check_priority(s: Session, principal: Principal, priority: str) -> None:
        """``high`` needs the organisation's grant (``kiln orgs update ORG --max-priority high``)."""
        allowed = s.scalar(select(Organization.max_priority).where(Organization.id == principal.org_id)) or "normal"
        if PRIORITIES[priority] > PRIORITIES.get(allowed, 1):
            raise Forbidden(
                f"priority: {priority} is above what organisation {principal.org_name} may use ({allowed}); "
                "a platform admin can raise it with `kiln orgs update ORG --max-priority high`",
                details={"field": "spec.priority"},
            )

    def get(self, principal: Principal, job_id: str) -> JobRead:
        principal.require("jobs:read")
        with self.db.read() as s:
            return read_job(s, self.load(s, principal, job_id))

    def is_terminal(self, principal: Principal, job_id: str) -> bool:
        principal.require("jobs:read")
        with self.db.read() as s:
            return JobState(self.load(s, principal, job_id).state).terminal

    def list_jobs(
        self, principal: Principal, *, states: list[JobState] | None = None, limit: int = 50, before: str | None = None
    ) -> list[JobRead]:
        principal.require("jobs:read")
        params = _list_params(principal, states, limit, before)
        with self.db.read() as s:
            rows = s.connection().execute(_list_statement(frozenset(params)), params)
            return [to_read(row) for row in rows]

    # The list as the API sends it (JobList JSON), and a cache of those bytes. Where this process is the only one
    # using the database (Database.exclusive: the default SQLite file of $KILN_HOME) it is the only writer of the
    # jobs table, and the database counts every write to it (Database.versions, from an engine event: ORM flushes
    # and the reconciler's Core updates alike), so a cached list is served while that count has not moved since
    # the list was read. Elsewhere (PostgreSQL, a shared SQLite file) other processes write too: no cache.

    @functools.cached_property
    def _list_cache(self) -> ListCache:
        return ListCache(enabled=self.db.exclusive)

    def cached_list_json(
        self, principal: Principal, *, states: list[JobState] | None = None, limit: int = 50, before: str | None = None
    ) -> bytes | None:
        """The JSON of ``list_jobs`` if it is cached and still current, else None. Never touches the database."""
        principal.require("jobs:read")
        cache = self._list_cache
        if not cache.enabled:
            return None
        return cache.get(cache.key(_list_params(principal, states, limit, before)), self.db.versions.version("jobs"))

    def list_jobs_json(
        self, principal: Principal, *, states: list[JobState] | None = None, limit: int = 50, before: str | None = None
    ) -> bytes:
        """The JSON of ``{"items": list_jobs(...)}``, read from the database (and cached where that is safe)."""
        principal.require("jobs:read")
        params = _list_params(principal, states, limit, before)
        version = self.db.versions.version("jobs")  # before the read: any write after this retires what is read
        with self.db.read() as s:
            rows = s.connection().execute(_list_statement(frozenset(params)), params)
            body = b'{"items":[' + b",".join(_ROWS.json(row) for row in rows) + b"]}"
        cache = self._list_cache
        if cache.enabled:
            cache.put(cache.key(params), version, body, self.db.versions.version("jobs"))
        return body

    def events(self, principal: Principal, job_id: str) -> list[EventRead]:
        principal.require("jobs:read")
        with self.db.read() as s:
            self.load(s, principal, job_id)
            rows = s.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id))
            return [event_read(e) for e in rows]

    def cancel(self, principal: Principal, job_id: str) -> JobRead:
        principal.require("jobs:write")
        with self.db.transaction() as s:
            job = self.load(s, principal, job_id, lock=True)
            state = JobState(job.state)
            if state.terminal and state is not JobState.CANCELLED:
                raise Conflict(f"job {job_id} already ended ({state}); nothing to cancel")
            request_cancel(s, job, f"cancelled by {principal.user_name}")
            read = read_job(s, job)
        self.wake(job_id)  # its attempt must be stopped: observe it at once
        return read
