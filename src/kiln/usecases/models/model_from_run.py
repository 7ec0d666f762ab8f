"""What a model version registered from a run (``kiln models register NAME --from-run RUN [--path model]``) is
made of: an MLflow model directory, the one MLflow's client logged under that name (a logged model of the run,
kiln.usecases.models.logged_models) or, failing that, the run's artifact directory of that path (MLflow 2's
``log_model``, or ``mlflow.log_artifacts`` of a saved model). Its ``MLmodel`` file names the flavor the serving
replica loads (``sklearn``, ``pytorch``, ``python_function``) and the signature requests are checked against.

Used by ``kiln.usecases.models.model_registry.ModelRegistry.register``, outside any transaction, as
kiln.usecases.models.model_sources is for a job's outputs; the files are then copied into the organisation's data blobs
like any version's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import Job, LoggedModel, MetricSeries, Run
from kiln.domain import tracking
from kiln.domain.models import ModelLineage
from kiln.domain.states import JobState
from kiln.errors import BadRequest, Conflict, NotFound
from kiln.storage.keys import logged_model_digests_prefix, logged_model_prefix, outputs_prefix, run_artifacts_prefix
from kiln.storage.store import ObjectStore
from kiln.usecases.access.identity import Principal
from kiln.usecases.models.logged_models import READY
from kiln.usecases.models.model_sources import MAX_METRICS, SourceFile, lineage

MLMODEL = "MLmodel"
MAX_MLMODEL_BYTES = 1024 * 1024
# The flavor a replica loads, first found first; and the registry's framework for each (python_function: custom).
FLAVORS = ("sklearn", "pytorch", "python_function")
FRAMEWORK_OF = {"sklearn": "sklearn", "pytorch": "torch", "python_function": "custom"}


@dataclass(frozen=True)
class RunSource:
    files: list[SourceFile]
    origin: ModelLineage
    flavor: str
    framework: str
    signature: dict[str, Any] | None = None

    @property
    def recorded(self) -> dict[str, Any]:
        """What the version's row records beside its files and lineage."""
        return {
            "run_id": self.origin.run_id,
            "logged_model_id": self.origin.logged_model_id,
            "flavor": self.flavor,
            "signature": self.signature,
        }


def read_mlmodel(text: str) -> tuple[str, dict[str, Any] | None]:
    """(flavor, signature) of an ``MLmodel`` file; BadRequest saying what is wrong with it."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BadRequest(f"{MLMODEL}: not YAML ({str(exc).splitlines()[0]})", details={"field": "path"}) from None
    flavors = doc.get("flavors") if isinstance(doc, dict) else None
    if not isinstance(flavors, dict) or not flavors:
        raise BadRequest(f"{MLMODEL}: it names no flavor (flavors:)", details={"field": "path"})
    flavor = next((f for f in FLAVORS if f in flavors), None)
    if flavor is None:
        raise BadRequest(
            f"{MLMODEL}: flavors {', '.join(sorted(flavors))}; Kiln serves {', '.join(FLAVORS)}",
            details={"field": "path"},
        )
    raw = doc.get("signature")
    signature: dict[str, Any] | None = None
    if isinstance(raw, dict):
        signature = {}
        for part in ("inputs", "outputs", "params"):
            value = raw.get(part)
            try:
                signature[part] = json.loads(value) if isinstance(value, str) else value
            except ValueError:
                raise BadRequest(f"{MLMODEL}: signature.{part} is not JSON", details={"field": "path"}) from None
    return flavor, signature


def _run_lineage(s: Session, run: Run) -> ModelLineage:
    """A run logged from outside Kiln: its name, status and the last value of each of its metrics."""
    metrics: dict[str, float] = {}
    rows = s.execute(
        select(MetricSeries.name, MetricSeries.last_value)
        .where(MetricSeries.job_id == run.id, MetricSeries.kind == "scalar")
        .order_by(MetricSeries.name)
    )
    for name, value in rows:
        if value is not None and math.isfinite(value) and len(metrics) < MAX_METRICS:
            metrics.setdefault(name, float(value))
    return ModelLineage(job_id="", job_name=run.name, job_state=run.status, metrics=metrics)


def upload_digests(store: ObjectStore, prefix: str) -> dict[tuple[str, int], str]:
    """(path, size) → SHA-256 of a logged model's files, as their uploads hashed them
    (kiln.usecases.models.logged_models):
    a file whose size is not the one hashed is read and hashed again when registered, as is one without."""
    out: dict[tuple[str, int], str] = {}
    for rel, _ in store.list(prefix):
        text = b"".join(store.iter_bytes(f"{prefix}/{rel}")).decode("ascii", errors="replace").split()
        if len(text) == 2 and len(text[0]) == 64 and text[1].isdigit():
            out[(rel, int(text[1]))] = text[0]
    return out


def run_source(
    db: Database, store: ObjectStore, principal: Principal, run_id: str, path: str, max_files: int
) -> RunSource:
    """The MLflow model ``path`` of run ``run_id`` (a logged model of that name, else an artifact directory)."""
    with db.read() as s:
        run = s.scalar(select(Run).where(Run.id == run_id, Run.org_id == principal.org_id))
        if run is None:  # another organisation's run answers as a missing one
            raise NotFound(f"run {run_id} not found", details={"field": "run_id"})
        logged = s.scalars(
            select(LoggedModel)
            .where(
                LoggedModel.run_id == run.id,
                LoggedModel.name == path,
                LoggedModel.lifecycle_stage == tracking.ACTIVE,
            )
            .order_by(LoggedModel.created_at.desc())
        ).first()
        job = s.get(Job, run.job_id) if run.job_id else None
        if logged is not None:
            if logged.status != READY:
                raise Conflict(
                    f"logged model {logged.id} ({path}) of run {run.id} is {logged.status}: its upload has not "
                    "finished (or failed); register it once log_model has returned",
                    details={"field": "path", "status": logged.status},
                )
            prefix = logged_model_prefix(run.org_id, logged.id)
        else:
            if job is not None and not JobState(job.state).terminal:
                raise Conflict(
                    f"run {run.id} is job {job.id}, {job.state}: its artifacts are final once it has ended",
                    details={"field": "run_id", "state": job.state},
                )
            base = outputs_prefix(run.org_id, job.id) if job is not None else run_artifacts_prefix(run.org_id, run.id)
            prefix = f"{base}/{path}"
        names = sorted(
            s.scalars(select(LoggedModel.name).where(LoggedModel.run_id == run.id, LoggedModel.org_id == run.org_id))
        )
        origin = lineage(s, job) if job is not None else _run_lineage(s, run)
    origin = origin.model_copy(update={"run_id": run.id, "logged_model_id": logged.id if logged else None})
    listed = store.list(prefix)
    known = upload_digests(store, logged_model_digests_prefix(run.org_id, logged.id)) if logged else {}
    files = [
        SourceFile(rel, f"{prefix}/{rel}", size, known.get((rel, size), ""), uploaded=logged is not None)
        for rel, size in listed
        if rel not in ("", ".")
    ]
    if not files:
        has = f"its logged models: {', '.join(names)}" if names else "it logged no model"
        raise NotFound(
            f"run {run.id} has no logged model named {path!r} and no artifact directory {path!r} ({has})",
            details={"field": "path"},
        )
    if len(files) > max_files:
        raise BadRequest(f"path: {path!r} holds {len(files)} files; a model version holds at most {max_files}")
    mlmodel = next((f for f in files if f.path == MLMODEL), None)
    if mlmodel is None:
        raise BadRequest(
            f"{path!r} of run {run.id} holds no {MLMODEL} file: not an MLflow model directory "
            "(register a job's plain files with --from-job)",
            details={"field": "path"},
        )
    if mlmodel.size > MAX_MLMODEL_BYTES:
        raise BadRequest(f"{MLMODEL}: {mlmodel.size} bytes; at most {MAX_MLMODEL_BYTES}", details={"field": "path"})
    text = b"".join(store.iter_bytes(mlmodel.key)).decode("utf-8", errors="replace")
    flavor, signature = read_mlmodel(text)
    return RunSource(files, origin, flavor, FRAMEWORK_OF[flavor], signature)
