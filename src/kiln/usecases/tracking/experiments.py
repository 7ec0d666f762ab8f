"""Experiments as a list people read (``GET /api/v1/experiments``, ``kiln experiments``, the console's experiment
picker): each with how many runs it holds and when its newest started, in one grouped read. Creating, renaming,
deleting and restoring them is the MLflow protocol's (kiln.usecases.tracking.tracking), which the SDK and CLI call
too."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kiln.db.tables import Experiment, Run
from kiln.domain.schemas import ExperimentRead
from kiln.domain.tracking import ACTIVE
from kiln.usecases.tracking import run_query


def _at(millis: int | None) -> datetime | None:
    return None if millis is None else datetime.fromtimestamp(millis / 1000, UTC)


def experiment_summaries(s: Session, org_id: str, view: str, name: str | None = None) -> list[ExperimentRead]:
    """The organisation's experiments (``view``: MLflow's ACTIVE_ONLY, DELETED_ONLY or ALL), oldest first, with
    their active runs counted; only the one called ``name`` where given."""
    counts = (
        select(Run.experiment_id, func.count().label("runs"), func.max(Run.start_time).label("last"))
        .where(Run.org_id == org_id, Run.lifecycle_stage == ACTIVE)
        .group_by(Run.experiment_id)
        .subquery()
    )
    query = (
        select(Experiment, counts.c.runs, counts.c.last)
        .outerjoin(counts, counts.c.experiment_id == Experiment.id)
        .where(Experiment.org_id == org_id, run_query.stage_filter(Experiment.lifecycle_stage, view))
        .order_by(Experiment.created_at, Experiment.id)
    )
    if name is not None:
        query = query.where(Experiment.name == name)
    return [
        ExperimentRead(
            id=experiment.id,
            name=experiment.name,
            lifecycle_stage=experiment.lifecycle_stage,
            created_at=experiment.created_at.replace(tzinfo=experiment.created_at.tzinfo or UTC),
            updated_at=experiment.updated_at.replace(tzinfo=experiment.updated_at.tzinfo or UTC),
            tags={str(k): str(v) for k, v in (experiment.tags or {}).items()},
            run_count=runs or 0,
            last_run_at=_at(last),
        )
        for experiment, runs, last in s.execute(query)
    ]
