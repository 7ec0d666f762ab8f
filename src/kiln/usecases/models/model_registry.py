"""The model registry: an organisation's models, their immutable numbered versions and movable aliases.

A version is registered from a finished job's outputs: its files are copied into the organisation's
content-addressed data blobs, the ones datasets use (``kiln.usecases.models.model_sources``), so identical bytes are
stored once whoever holds them; its lineage keeps the job, its spec, its final metrics and the tuning study and
trial it ran for. A version is read by number, by alias or as the latest; jobs read one as an input
(``inputs: [{model: NAME@VERSION|ALIAS}]``, pinned to the number at submit: ``kiln.usecases.inputs.inputs``), and the
serving control plane resolves ``NAME@REF`` with :meth:`ModelRegistry.resolve`.

Removing a version (or a model) deletes the blobs nothing else of the organisation references (no model file,
no dataset file); it is refused (409) while a service serves the model version or a job that has not ended
reads it. Version numbers are never given twice while the model exists.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, or_, select
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import (
    DataBlob,
    Job,
    Model,
    ModelAlias,
    ModelFile,
    ModelVersion,
    Run,
    utcnow,
)
from kiln.domain import models as refs
from kiln.domain.ids import new_id
from kiln.domain.models import (
    AliasRead,
    ModelFileRead,
    ModelLineage,
    ModelRead,
    ModelRegister,
    ModelRemoved,
    ModelSummary,
    ModelVersionRead,
)
from kiln.domain.states import JobState
from kiln.errors import BadRequest, Conflict, NotFound
from kiln.settings import Settings
from kiln.storage.store import ObjectStore
from kiln.usecases.access.idempotency import Idempotency, IdempotentRequest, Remember
from kiln.usecases.access.identity import Principal
from kiln.usecases.access.quotas import QuotaService, lock_org
from kiln.usecases.data.dataset_names import data_key
from kiln.usecases.data.datasets import DatasetFile as ResolvedFile
from kiln.usecases.data.datasets import describe_versions
from kiln.usecases.data.input_access import require_input_read
from kiln.usecases.models.model_from_run import run_source
from kiln.usecases.models.model_removal import chunks, drop_orphans, refuse_pinned, refuse_served
from kiln.usecases.models.model_sources import BlobCopier, SourceFile, held, identical_version, lineage, pick_outputs
from kiln.usecases.notifications import notification_outbox

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedModel:
    """A version resolved to its files, for the executor (``key``: the store key of each file's blob)."""

    name: str
    version: int
    files: list[ResolvedFile]


def _ref_error(exc: refs.ModelRefError) -> BadRequest:
    return BadRequest(str(exc))


def _subject(model: Model, principal: Principal) -> notification_outbox.Subject:
    path = f"/models/{model.name}"
    return notification_outbox.Subject("model", model.org_id, model.id, model.name, principal.user_id, path)


def check_name(name: str) -> str:
    try:
        return refs.check_name(name)
    except refs.ModelRefError as exc:
        raise _ref_error(exc) from None


def parse_version(text: str) -> int | str | None:
    """A version as a URL writes it: a number, an alias or ``latest``; BadRequest otherwise."""
    try:
        return refs.parse_version(text)
    except refs.ModelRefError as exc:
        raise _ref_error(exc) from None


class ModelRegistry:
    """Registered models of every organisation: register, read, alias, resolve and remove."""

    def __init__(
        self,
        db: Database,
        store: ObjectStore,
        settings: Settings,
        quotas: QuotaService | None,
        ingest_metrics: Callable[[], object] | None = None,
        idempotency: Idempotency | None = None,
    ) -> None:
        self.db = db
        # The Idempotency-Keys of creates (a registration): the platform's, shared with the other creates.
        self.idempotency = idempotency or Idempotency(db, settings.idempotency_retention_seconds)
        # Stores the metrics jobs have spooled so far: a version registered the moment its job ended gets the
        # job's final values in its lineage, not the ones of the ingester's previous pass.
        self.ingest_metrics = ingest_metrics
        self.store = store
        self.settings = settings
        self.quotas = quotas
        self.tmp_dir = settings.home / "tmp"
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

    # -- lookups ------------------------------------------------------------------------------------------------

    @staticmethod
    def _model(s: Session, org_id: str, name: str) -> Model:
        model = s.scalar(select(Model).where(Model.org_id == org_id, Model.name == name))
        if model is None:
            raise NotFound(f"model {name!r} not found")
        return model

    @staticmethod
    def _aliases(s: Session, model_id: str) -> dict[str, int]:
        rows = s.execute(
            select(ModelAlias.alias, ModelAlias.version)
            .where(ModelAlias.model_id == model_id)
            .order_by(ModelAlias.alias)
        )
        return {alias: version for alias, version in rows}

    @staticmethod
    def _numbers(s: Session, model_id: str) -> list[int]:
        return list(
            s.scalars(
                select(ModelVersion.version).where(ModelVersion.model_id == model_id).order_by(ModelVersion.version)
            )
        )

    def _version(self, s: Session, model: Model, ref: int | str | None) -> ModelVersion:
        """The version ``ref`` names (a number, an alias, None for the latest); NotFound saying what there is."""
        number = ref
        if isinstance(ref, str):
            aliases = self._aliases(s, model.id)
            if ref not in aliases:
                known = ", ".join(f"{a} → {v}" for a, v in aliases.items()) or "none"
                raise NotFound(
                    f"model {model.name} has no alias {ref!r} (its aliases: {known})",
                    details={"model": model.name, "alias": ref},
                )
            number = aliases[ref]
        query = select(ModelVersion).where(ModelVersion.model_id == model.id)
        if number is None:
            row = s.scalar(query.order_by(ModelVersion.version.desc()).limit(1))
        else:
            row = s.scalar(query.where(ModelVersion.version == number))
        if row is None:
            numbers = self._numbers(s, model.id)
            details = {"model": model.name, "version": number, "latest": numbers[-1] if numbers else None}
            if not numbers:
                raise NotFound(f"model {model.name} has no version (none is registered)", details=details)
            raise NotFound(
                f"model {model.name} has no version {number}; it has {describe_versions(numbers)} "
                f"(latest {numbers[-1]})",
                details=details,
            )
        return row

    def _version_read(
        self, s: Session, name: str, v: ModelVersion, aliases: dict[str, int], files: bool = True
    ) -> ModelVersionRead:
        items = []
        if files:
            rows = s.execute(
                select(ModelFile.path, ModelFile.size, ModelFile.sha256)
                .where(ModelFile.version_id == v.id)
                .order_by(ModelFile.path)
            )
            items = [ModelFileRead(path=p, size=n, sha256=h) for p, n, h in rows]
        return ModelVersionRead(
            name=name,
            version=v.version,
            framework=v.framework,  # type: ignore[arg-type]
            description=v.description,
            source_path=v.source_path,
            file_count=v.file_count,
            size=v.size,
            files=items,
            aliases=sorted(a for a, n in aliases.items() if n == v.version),
            lineage=ModelLineage(
                job_id=v.job_id,
                job_name=v.job_name,
                job_state=v.job_state,
                spec=v.job_spec,
                metrics=v.metrics,
                study_id=v.study_id,
                trial=v.trial_number,
                run_id=v.run_id,
                logged_model_id=v.logged_model_id,
            ),
            flavor=v.flavor,
            signature=v.signature,
            created_by=v.created_by,
            created_at=v.created_at,
        )

    def _summary(self, s: Session, model: Model) -> ModelSummary:
        count, top, size = s.execute(
            select(func.count(), func.max(ModelVersion.version), func.coalesce(func.sum(ModelVersion.size), 0)).where(
                ModelVersion.model_id == model.id
            )
        ).one()
        return ModelSummary(
            name=model.name,
            latest_version=top,
            versions=count,
            aliases=self._aliases(s, model.id),
            size=int(size or 0),
            created_at=model.created_at,
            updated_at=model.updated_at,
        )

    # -- reads --------------------------------------------------------------------------------------------------

    def list_models(self, principal: Principal) -> list[ModelSummary]:
        principal.require("models:read")
        with self.db.read() as s:
            models = s.scalars(select(Model).where(Model.org_id == principal.org_id).order_by(Model.name)).all()
            return [self._summary(s, m) for m in models]

    def get_model(self, principal: Principal, name: str) -> ModelRead:
        """The model, its aliases and its versions (newest first, each with its files)."""
        principal.require("models:read")
        check_name(name)
        with self.db.read() as s:
            model = self._model(s, principal.org_id, name)
            summary = self._summary(s, model)
            rows = s.scalars(
                select(ModelVersion).where(ModelVersion.model_id == model.id).order_by(ModelVersion.version.desc())
            ).all()
            items = [self._version_read(s, name, v, summary.aliases) for v in rows]
        return ModelRead(**summary.model_dump(), items=items)

    def versions(self, principal: Principal, name: str) -> list[ModelVersionRead]:
        """Every version, oldest first (files left out: ``version`` lists them)."""
        principal.require("models:read")
        check_name(name)
        with self.db.read() as s:
            model = self._model(s, principal.org_id, name)
            aliases = self._aliases(s, model.id)
            rows = s.scalars(
                select(ModelVersion).where(ModelVersion.model_id == model.id).order_by(ModelVersion.version)
            ).all()
            return [self._version_read(s, name, v, aliases, files=False) for v in rows]

    def version(self, principal: Principal, name: str, ref: str) -> ModelVersionRead:
        """One version by number, alias or ``latest``."""
        if principal.job_id is None:
            principal.require("models:read")
        check_name(name)
        wanted = parse_version(ref)
        with self.db.read() as s:
            model = self._model(s, principal.org_id, name)
            v = self._version(s, model, wanted)
            require_input_read(s, principal, "models:read", "model", name, v.version)
            return self._version_read(s, name, v, self._aliases(s, model.id))

    def file(self, principal: Principal, name: str, ref: str, path: str) -> tuple[str, ModelFileRead]:
        """(store key of its blob, entry) of one file of a version (by number, alias or ``latest``)."""
        if principal.job_id is None:
            principal.require("models:read")
        check_name(name)
        wanted = parse_version(ref)
        with self.db.read() as s:
            v = self._version(s, self._model(s, principal.org_id, name), wanted)
            require_input_read(s, principal, "models:read", "model", name, v.version)
            row = s.get(ModelFile, (v.id, path))
            if row is None:
                raise NotFound(f"model {name}@{v.version} has no file {path!r}")
            return data_key(principal.org_id, row.sha256), ModelFileRead(
                path=row.path, size=row.size, sha256=row.sha256
            )

    def presigned_get(self, key: str, path: str) -> str | None:
        """A short-lived URL reading the blob straight from the store, when the store gives one (S3)."""
        if not (self.store.is_s3 and self.settings.storage_presign):
            return None
        return self.store.presign_get(key, self.settings.storage_presign_seconds, path.rsplit("/", 1)[-1])

    def resolve(self, org_id: str, ref: str) -> tuple[str, int]:
        """``NAME@VERSION``, ``NAME@ALIAS``, ``NAME@latest`` or ``NAME`` of organisation ``org_id`` → (name,
        version number). For the serving control plane and the submit-time pinner; BadRequest for a malformed
        reference, NotFound (saying which versions or aliases there are) for a missing model, version or alias."""
        try:
            parsed = refs.parse_ref(ref)
        except refs.ModelRefError as exc:
            raise _ref_error(exc) from None
        with self.db.read() as s:
            model = self._model(s, org_id, parsed.name)
            return model.name, self._version(s, model, parsed.ref).version

    def files(self, org_id: str, ref: str) -> ResolvedModel:
        """The files of the version ``ref`` names, with their blobs' store keys (what a job's input stages)."""
        name, number = self.resolve(org_id, ref)
        with self.db.read() as s:
            model = self._model(s, org_id, name)
            v = self._version(s, model, number)
            rows = s.execute(
                select(ModelFile.path, ModelFile.size, ModelFile.sha256)
                .where(ModelFile.version_id == v.id)
                .order_by(ModelFile.path)
            )
            files = [ResolvedFile(p, n, h, data_key(org_id, h)) for p, n, h in rows]
        return ResolvedModel(name=name, version=number, files=files)

    def versions_of_run(self, principal: Principal, run_id: str) -> list[ModelVersionRead]:
        """The versions registered from run ``run_id`` (``--from-run``, or ``--from-job`` of the job that is the
        run), oldest first, files left out: the other half of a version's lineage."""
        principal.require("models:read")
        with self.db.read() as s:
            # Another organisation's run is answered as one that does not exist (not as one with no versions).
            if s.scalar(select(Run.id).where(Run.id == run_id, Run.org_id == principal.org_id)) is None:
                raise NotFound(f"run {run_id} not found")
            rows = s.execute(
                select(ModelVersion, Model)
                .join(Model, Model.id == ModelVersion.model_id)
                .where(
                    Model.org_id == principal.org_id, or_(ModelVersion.run_id == run_id, ModelVersion.job_id == run_id)
                )
                .order_by(ModelVersion.created_at, ModelVersion.id)
            ).all()
            return [self._version_read(s, m.name, v, self._aliases(s, m.id), files=False) for v, m in rows]

    # -- registering --------------------------------------------------------------------------------------------

    def register(
        self, principal: Principal, name: str, body: ModelRegister, idempotency: IdempotentRequest | None = None
    ) -> ModelVersionRead:
        """A new version of ``name`` (the model is created on first use) from the output file or directory
        ``body.path`` of the ended job ``body.job_id``. With ``idempotency`` (the request's Idempotency-Key), a
        repeat of the same request answers the version the first one registered, as it is now (the same version),
        and registers none. A version already registered from the same job with the same framework and the same
        files is answered instead of an identical new one, with ``already_registered`` set."""
        principal.require("models:write")
        check_name(name)
        return self.idempotency.create(
            principal,
            idempotency,
            "model version",
            lambda remember: self._register(principal, name, body, remember),
            self._version_by_id,
        )

    def _version_by_id(self, s: Session, version_id: str) -> ModelVersionRead | None:
        row = s.execute(
            select(ModelVersion, Model)
            .join(Model, Model.id == ModelVersion.model_id)
            .where(ModelVersion.id == version_id)
        ).first()
        if row is None:
            return None
        version, model = row
        return self._version_read(s, model.name, version, self._aliases(s, model.id))

    def _register(self, principal: Principal, name: str, body: ModelRegister, remember: Remember) -> ModelVersionRead:
        org = principal.org_id
        if self.ingest_metrics is not None:
            self.ingest_metrics()
        recorded: dict[str, Any] = {}
        if body.run_id is not None:  # an MLflow model directory the run logged (kiln.usecases.models.model_from_run)
            source = run_source(self.db, self.store, principal, body.run_id, body.path, self.settings.dataset_max_files)
            sources, origin, recorded = source.files, source.origin, source.recorded
            guessed = source.framework
        else:
            with self.db.read() as s:
                job = s.scalar(select(Job).where(Job.id == body.job_id, Job.org_id == org))
                if job is None:  # the same answer for another organisation's job as for a missing one
                    raise NotFound(f"job {body.job_id} not found", details={"field": "job_id"})
                if not JobState(job.state).terminal:
                    raise Conflict(
                        f"job {job.id} is {job.state}: its outputs are final once it has ended; register them then",
                        details={"field": "job_id", "state": job.state},
                    )
                origin = lineage(s, job)
                s.expunge(job)
            sources = pick_outputs(self.store, job, body.path, self.settings.dataset_max_files)
            guessed = refs.guess_framework([s.path for s in sources])
        copier = BlobCopier(self.store, self.tmp_dir, org)
        files = copier.hashed(sources)
        framework = body.framework or guessed
        try:
            for _ in range(3):  # again only if a blob it found held was removed before it was recorded
                with self.db.read() as s:
                    present = held(s, org, [f.sha256 for f in files])
                    self._check_quota(s, principal, self._adding(files, present | set(copier.copied)))
                copier.copy(files, present)
                version = self._record(
                    principal, name, body, framework, files, origin, copier.copied, remember, recorded
                )
                if version is not None:
                    return version
            raise Conflict(f"model {name}: the data of its files kept being removed meanwhile; register it again")
        except BaseException:
            with self.db.read() as s:
                copier.forget(s)
            raise

    @staticmethod
    def _adding(files: list[SourceFile], present: set[str]) -> int:
        return sum({f.sha256: f.size for f in files if f.sha256 not in present}.values())

    def _check_quota(self, s: Session, principal: Principal, adding: int) -> None:
        if self.quotas is not None and adding:
            self.quotas.check_storage(s, principal.org_id, principal.org_name, adding)

    def _record(
        self,
        principal: Principal,
        name: str,
        body: ModelRegister,
        framework: str,
        files: list[SourceFile],
        origin: ModelLineage,
        copied: dict[str, int],
        remember: Remember,
        recorded: dict[str, Any],
    ) -> ModelVersionRead | None:
        """The version, in one transaction under the organisation's lock; None when a blob counted on as held
        is gone (a dataset or version removed meanwhile): the caller copies it and tries again."""
        org = principal.org_id
        shas = {f.sha256: f.size for f in files}
        now = utcnow()
        with self.db.transaction() as s:
            lock_org(s, org)
            present = held(s, org, shas)
            if set(shas) - present - set(copied):
                return None
            new = {sha: size for sha, size in shas.items() if sha not in present}
            self._check_quota(s, principal, sum(new.values()))
            for sha, size in new.items():
                s.add(DataBlob(org_id=org, sha256=sha, size=size))
            model = s.scalar(select(Model).where(Model.org_id == org, Model.name == name))
            same = None if model is None else identical_version(s, model.id, origin, framework, files)
            if same is not None and model is not None:  # under the org's lock: two at once make one version
                remember(s, same.id)
                read = self._version_read(s, name, same, self._aliases(s, model.id))
                return read.model_copy(update={"already_registered": True})
            if model is None:
                model = Model(id=new_id("mdl"), org_id=org, name=name, latest_version=0, created_by=principal.user_id)
                s.add(model)
                s.flush()
            model.latest_version += 1
            model.updated_at = now
            version = ModelVersion(
                id=new_id("mdv"),
                model_id=model.id,
                version=model.latest_version,
                framework=framework,
                description=body.description,
                source_path=body.path,
                file_count=len(files),
                size=sum(f.size for f in files),
                job_id=origin.job_id,
                job_name=origin.job_name,
                job_state=origin.job_state,
                job_spec=origin.spec,
                metrics=origin.metrics,
                study_id=origin.study_id,
                trial_number=origin.trial,
                created_by=principal.user_id,
                created_at=now,
                **recorded,
            )
            s.add(version)
            s.flush()
            s.add_all(
                ModelFile(version_id=version.id, path=f.path, org_id=org, size=f.size, sha256=f.sha256) for f in files
            )
            s.flush()
            remember(s, version.id)
            notification_outbox.recorded(
                s, "model.version_registered", _subject(model, principal), details={"version": version.version}
            )
            return self._version_read(s, name, version, self._aliases(s, model.id))

    # -- aliases ------------------------------------------------------------------------------------------------

    def set_alias(self, principal: Principal, name: str, alias: str, version: int) -> AliasRead:
        """Point ``alias`` at ``version`` (created, or moved from the version it named)."""
        principal.require("models:write")
        check_name(name)
        try:
            refs.check_alias(alias)
        except refs.ModelRefError as exc:
            raise _ref_error(exc) from None
        with self.db.transaction() as s:
            model = self._model(s, principal.org_id, name)
            self._version(s, model, version)
            row = s.get(ModelAlias, (model.id, alias))
            if row is None:
                s.add(ModelAlias(model_id=model.id, alias=alias, version=version, updated_by=principal.user_id))
            else:
                row.version, row.updated_by, row.updated_at = version, principal.user_id, utcnow()
            model.updated_at = utcnow()
            details = {"alias": alias, "version": version}
            notification_outbox.recorded(s, "model.alias_set", _subject(model, principal), details=details)
        return AliasRead(name=name, alias=alias, version=version)

    def delete_alias(self, principal: Principal, name: str, alias: str) -> AliasRead:
        principal.require("models:write")
        check_name(name)
        with self.db.transaction() as s:
            model = self._model(s, principal.org_id, name)
            row = s.get(ModelAlias, (model.id, alias))
            if row is None:
                raise NotFound(f"model {name} has no alias {alias!r}")
            gone = AliasRead(name=name, alias=alias, version=row.version)
            s.delete(row)
            model.updated_at = utcnow()
        return gone

    # -- removal ------------------------------------------------------------------------------------------------

    def remove(self, principal: Principal, name: str, version: int | None) -> ModelRemoved:
        """Remove one version (``version``) or the whole model with its aliases, and the blobs nothing else
        references. 409 while a service serves it or a job that has not ended reads it."""
        principal.require("models:write")
        check_name(name)
        org = principal.org_id
        with self.db.transaction() as s:
            lock_org(s, org)
            model = self._model(s, org, name)
            if version is not None:
                doomed = [self._version(s, model, version)]
            else:
                doomed = list(s.scalars(select(ModelVersion).where(ModelVersion.model_id == model.id)))
            numbers = sorted(v.version for v in doomed)
            refuse_served(s, org, name, None if version is None else set(numbers))
            refuse_pinned(s, org, name, set(numbers), self._numbers(s, model.id))
            aliases = self._aliases(s, model.id)
            dropped = sorted(a for a, n in aliases.items() if version is None or n == version)
            ids = [v.id for v in doomed]
            shas: set[str] = set()
            for chunk in chunks(ids):
                shas.update(s.scalars(select(ModelFile.sha256).where(ModelFile.version_id.in_(chunk))))
                s.execute(delete(ModelFile).where(ModelFile.version_id.in_(chunk)))
                s.execute(delete(ModelVersion).where(ModelVersion.id.in_(chunk)))
            if dropped:
                s.execute(delete(ModelAlias).where(ModelAlias.model_id == model.id, ModelAlias.alias.in_(dropped)))
            if version is None:
                s.execute(delete(Model).where(Model.id == model.id))
            else:
                model.updated_at = utcnow()
            orphans, freed = drop_orphans(s, org, shas)
        # The rows are gone whatever happens next; the bytes follow, best effort (an object left behind by a
        # failing store is unreferenced and no longer counted against the quota).
        for sha in orphans:
            try:
                self.store.delete(data_key(org, sha))
            except Exception as exc:
                log.warning("model %s: could not delete blob %s: %s", name, sha, exc)
        return ModelRemoved(name=name, versions=numbers, aliases=dropped, blobs_deleted=len(orphans), bytes_freed=freed)
