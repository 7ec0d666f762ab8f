"""Logged models, as MLflow 3's client records them: ``mlflow.<flavor>.log_model`` creates one (``POST
logged-models``), links it to its run, uploads the model's directory (``MLmodel`` and the flavor's files) to its
``artifact_location`` and finalizes it (``READY``, or ``UPLOAD_FAILED``). Kiln keeps each as a row
(``logged_models``) and its files under ``orgs/<org>/logged-models/<id>/artifacts``, counted against the
organisation's storage quota; ``kiln models register NAME --from-run RUN`` makes a model version of one
(kiln.usecases.models.model_from_run).

Tenancy: a logged model belongs to its organisation (its run's), and is 404 to any other. Who may: reading needs
what reading runs needs; creating and writing one what logging to its run needs (a job's token: its own job's run
only), or ``runs:write`` for one without a run. Artifact paths are MLflow's: ``<experiment id>/models/<model
id>/artifacts/<path in the model>``.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from kiln.db.tables import LoggedModel, Run, utcnow
from kiln.domain import tracking
from kiln.domain.ids import new_id
from kiln.errors import Forbidden, InvalidInput, NotFound
from kiln.storage.keys import logged_model_digests_prefix, logged_model_prefix
from kiln.storage.store import ObjectStore, safe_key
from kiln.usecases.access.identity import Principal
from kiln.usecases.access.quotas import QuotaService
from kiln.usecases.jobs.run_rows import millis
from kiln.usecases.tracking.run_artifacts import QUOTA_CHECK_BYTES, ArtifactEntry, entries_under, one_file
from kiln.usecases.tracking.tracking import TrackingService

PENDING, READY, FAILED = "LOGGED_MODEL_PENDING", "LOGGED_MODEL_READY", "LOGGED_MODEL_UPLOAD_FAILED"
STATUSES = (PENDING, READY, FAILED)
MAX_TAGS = 100
MAX_PARAMS = 1000
MAX_RESULTS = 1000
# One clause of a search filter: what MLflow's client sends (``name = 'model'``), joined by AND.
_CLAUSE = re.compile(
    r"\s*(?:attributes\.)?(?P<key>name|model_id|source_run_id|model_type|status|(?:tags|params)\.[\w.\-/ ]+?)"
    r"\s*(?P<op>=|!=)\s*'(?P<value>[^']*)'\s*",
    re.IGNORECASE,
)


@dataclass
class LoggedModelView:
    id: str
    experiment_id: str
    name: str
    run_id: str | None
    model_type: str | None
    status: str
    status_message: str | None
    created_ms: int
    updated_ms: int
    lifecycle_stage: str
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)


def _view(row: LoggedModel) -> LoggedModelView:
    return LoggedModelView(
        id=row.id,
        experiment_id=row.experiment_id,
        name=row.name,
        run_id=row.run_id,
        model_type=row.model_type,
        status=row.status,
        status_message=row.status_message,
        created_ms=millis(row.created_at) or 0,
        updated_ms=millis(row.updated_at) or 0,
        lifecycle_stage=row.lifecycle_stage,
        tags={str(k): str(v) for k, v in (row.tags or {}).items()},
        params={str(k): str(v) for k, v in (row.params or {}).items()},
    )


def _pairs(items: dict[str, str], most: int, what: str) -> dict[str, str]:
    if len(items) > most:
        raise InvalidInput(f"{what}: at most {most}", details={"field": what})
    return {tracking.check_key(k, what): str(v)[: tracking.MAX_TAG_VALUE] for k, v in items.items()}


def parse_filter(text: str | None) -> list[tuple[str, str, str]]:
    """(key, op, value) per clause of ``text``; InvalidInput naming what Kiln does not search by."""
    if not text or not text.strip():
        return []
    clauses = []
    for part in re.split(r"\s+and\s+", text.strip(), flags=re.IGNORECASE):
        match = _CLAUSE.fullmatch(part)
        if match is None:
            raise InvalidInput(
                f"filter: {part[:200]!r}: Kiln searches logged models by name, model_id, source_run_id, model_type,"
                " status, tags.<key> and params.<key>, each with = or != and a quoted value, joined by AND",
                details={"field": "filter"},
            )
        clauses.append((match["key"].lower() if "." not in match["key"] else match["key"], match["op"], match["value"]))
    return clauses


def _matches(view: LoggedModelView, clauses: list[tuple[str, str, str]]) -> bool:
    for key, op, value in clauses:
        if key.startswith(("tags.", "params.")):
            kind, _, name = key.partition(".")
            found: str | None = (view.tags if kind == "tags" else view.params).get(name)
        else:
            found = {
                "name": view.name,
                "model_id": view.id,
                "source_run_id": view.run_id,
                "model_type": view.model_type,
                "status": view.status,
            }[key]
        if (found == value) != (op == "="):
            return False
    return True


class LoggedModels:
    def __init__(self, tracking: TrackingService, store: ObjectStore, tmp_dir: Path, quotas: QuotaService) -> None:
        self.tracking = tracking
        self.db = tracking.db
        self.store = store
        self.tmp_dir = tmp_dir
        self.quotas = quotas

    # ---- who may

    def _row(self, s: Session, principal: Principal, model_id: str, allow_deleted: bool = True) -> LoggedModel:
        row = s.scalar(select(LoggedModel).where(LoggedModel.id == model_id, LoggedModel.org_id == principal.org_id))
        if row is None or (not allow_deleted and row.lifecycle_stage != tracking.ACTIVE):
            raise NotFound(f"logged model {model_id} not found")
        return row

    def _may_write(self, s: Session, principal: Principal, row: LoggedModel) -> None:
        run = s.get(Run, row.run_id) if row.run_id else None
        if run is not None:
            self.tracking._may_write(principal, run)
        elif principal.job_id is not None:
            raise Forbidden(f"{principal.describe()} writes to its own job's run's models only, not {row.id}")
        else:
            principal.require("runs:write")

    # ---- the model

    def create(
        self,
        principal: Principal,
        experiment_id: str,
        name: str | None,
        model_type: str | None,
        run_id: str | None,
        params: dict[str, str],
        tags: dict[str, str],
    ) -> LoggedModelView:
        params, tags = _pairs(params, MAX_PARAMS, "params"), _pairs(tags, MAX_TAGS, "tags")
        model_id = new_id("m")
        with self.db.transaction() as s:
            experiment = self.tracking._experiment(s, principal, experiment_id)
            if experiment.lifecycle_stage != tracking.ACTIVE:
                raise InvalidInput(f"experiment {experiment.name} is deleted; restore it first")
            if run_id:
                run = self.tracking._run(s, principal, run_id)
                self.tracking._may_log(principal, run.id, run.job_id, run.lifecycle_stage)
            elif principal.job_id is not None:
                raise Forbidden(f"{principal.describe()} logs models to its own job's run: name source_run_id")
            else:
                principal.require("runs:write")
            row = LoggedModel(
                id=model_id,
                org_id=principal.org_id,
                experiment_id=experiment.id,
                run_id=run_id or None,
                name=(name or model_id).strip()[:256],
                model_type=(model_type or None) and model_type[:256],
                status=PENDING,
                tags=tags,
                params=params,
                lifecycle_stage=tracking.ACTIVE,
                created_by=principal.user_id,
            )
            s.add(row)
            s.flush()
            return _view(row)

    def get(self, principal: Principal, model_id: str, allow_deleted: bool = False) -> LoggedModelView:
        self.tracking._may_read(principal)
        with self.db.read() as s:
            return _view(self._row(s, principal, model_id, allow_deleted))

    def _change(self, principal: Principal, model_id: str, **values: object) -> LoggedModelView:
        with self.db.transaction() as s:
            row = self._row(s, principal, model_id, allow_deleted=False)
            self._may_write(s, principal, row)
            for key, value in values.items():
                setattr(row, key, value)
            row.updated_at = utcnow()
            return _view(row)

    def finalize(self, principal: Principal, model_id: str, status: str) -> LoggedModelView:
        if status not in (READY, FAILED):
            raise InvalidInput(f"status: {READY} or {FAILED}, not {status!r}", details={"field": "status"})
        return self._change(principal, model_id, status=status)

    def set_tags(self, principal: Principal, model_id: str, tags: dict[str, str]) -> LoggedModelView:
        current = self.get(principal, model_id).tags
        return self._change(principal, model_id, tags=_pairs({**current, **tags}, MAX_TAGS, "tags"))

    def delete_tag(self, principal: Principal, model_id: str, key: str) -> None:
        current = self.get(principal, model_id).tags
        if key not in current:
            raise NotFound(f"logged model {model_id} has no tag {key!r}")
        self._change(principal, model_id, tags={k: v for k, v in current.items() if k != key})

    def log_params(self, principal: Principal, model_id: str, params: dict[str, str]) -> None:
        current = self.get(principal, model_id).params
        self._change(principal, model_id, params=_pairs({**current, **params}, MAX_PARAMS, "params"))

    def delete(self, principal: Principal, model_id: str) -> None:
        """Marked deleted (MLflow's lifecycle); its files stay until its run or organisation goes."""
        self._change(principal, model_id, lifecycle_stage=tracking.DELETED)

    def search(
        self,
        principal: Principal,
        experiment_ids: list[str],
        filter_text: str | None,
        max_results: int,
        page_token: str | None,
    ) -> tuple[list[LoggedModelView], str | None]:
        """The organisation's active logged models in ``experiment_ids`` that ``filter_text`` matches, newest first."""
        self.tracking._may_read(principal)
        clauses = parse_filter(filter_text)
        offset = int(page_token) if page_token and page_token.isdigit() else 0
        with self.db.read() as s:
            query = select(LoggedModel).where(
                LoggedModel.org_id == principal.org_id, LoggedModel.lifecycle_stage == tracking.ACTIVE
            )
            if experiment_ids:
                query = query.where(LoggedModel.experiment_id.in_(experiment_ids))
            rows = s.scalars(query.order_by(LoggedModel.created_at.desc(), LoggedModel.id.desc())).all()
            found = [v for v in map(_view, rows) if _matches(v, clauses)]
        page = found[offset : offset + max_results]
        more = offset + max_results < len(found)
        return page, str(offset + max_results) if more else None

    # ---- its files

    def _place(self, principal: Principal, path: str, *, write: bool = False) -> tuple[LoggedModel, str, str]:
        """(row, store prefix of its files, the path asked for inside them) of ``<exp>/models/<id>/artifacts/..``."""
        parts = path.strip("/").split("/")
        if len(parts) < 4 or parts[1] != "models" or parts[3] != "artifacts":
            raise InvalidInput(f"{path[:200]!r}: a logged model's path is <experiment id>/models/<model id>/artifacts")
        rel = "/".join(parts[4:])
        if rel:
            rel = safe_key(rel)
        if not write:
            self.tracking._may_read(principal)
        with self.db.read() as s:
            row = self._row(s, principal, parts[2])
            if row.experiment_id != parts[0]:
                raise NotFound(f"logged model {row.id} is not in experiment {parts[0]}")
            if write:
                self._may_write(s, principal, row)
            s.expunge(row)
        return row, logged_model_prefix(row.org_id, row.id), rel

    async def upload(self, principal: Principal, path: str, chunks: AsyncIterator[bytes]) -> int:
        row, _, rel = await run_in_threadpool(self._place, principal, path, write=True)
        if not rel:
            raise InvalidInput("name the file: <experiment id>/models/<model id>/artifacts/<path>")
        fd, name = tempfile.mkstemp(dir=self.tmp_dir, prefix="logged-model-")
        tmp = Path(name)
        digest = hashlib.sha256()  # hashed as it arrives: registering it later need not read it again
        try:
            size, next_check = 0, QUOTA_CHECK_BYTES
            with os.fdopen(fd, "wb") as fh:
                async for chunk in chunks:
                    size += len(chunk)
                    fh.write(chunk)
                    digest.update(chunk)
                    if size >= next_check:  # over the storage quota: stop reading now, not at the end
                        await run_in_threadpool(self._check_quota, principal, size)
                        next_check += QUOTA_CHECK_BYTES
            await run_in_threadpool(self._store, principal, row, rel, tmp, size, digest.hexdigest())
        finally:
            tmp.unlink(missing_ok=True)
        return size

    def _check_quota(self, principal: Principal, size: int) -> None:
        with self.quotas.db.transaction() as s:
            self.quotas.check_storage(s, principal.org_id, principal.org_name, size)

    def _store(self, principal: Principal, row: LoggedModel, rel: str, tmp: Path, size: int, sha256: str) -> None:
        key = f"{logged_model_prefix(row.org_id, row.id)}/{rel}"
        digest_key = f"{logged_model_digests_prefix(row.org_id, row.id)}/{rel}"
        listed = self.store.list(key)
        replaced = listed[0][1] if one_file(listed) else 0
        self._check_quota(principal, size - replaced)
        self.store.delete(digest_key)  # a file replaced is never read with the old one's digest
        self.store.put_file(tmp, key)
        self.store.put_objects([(digest_key, f"{sha256} {size}\n".encode())])
        with self.db.transaction() as s:
            s.execute(
                update(LoggedModel)
                .where(LoggedModel.id == row.id)
                .values(artifact_bytes=LoggedModel.artifact_bytes + size - replaced, updated_at=utcnow())
            )

    def listing(self, principal: Principal, path: str) -> list[ArtifactEntry]:
        _, prefix, rel = self._place(principal, path)
        return entries_under(self.store, f"{prefix}/{rel}".rstrip("/"))

    def read(self, principal: Principal, path: str) -> Iterator[bytes]:
        row, prefix, rel = self._place(principal, path)
        key = f"{prefix}/{rel}"
        if not rel or not one_file(self.store.list(key)):
            raise NotFound(f"logged model {row.id} has no file {rel!r}")
        return self.store.iter_bytes(key)
