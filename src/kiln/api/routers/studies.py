"""Tuning studies: start one, read, list, its trials (best first), its best trial, stop it, its events."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response
from starlette.concurrency import run_in_threadpool

from kiln.api.deps import Caller, Kiln
from kiln.api.idempotency import Idempotent, mark_replayed, replayable
from kiln.api.params import JobId, StudyId
from kiln.api.responses import errors, links, with_links
from kiln.domain import limits
from kiln.domain.studies import (
    StudyEventList,
    StudyList,
    StudyRead,
    StudyState,
    StudySubmit,
    TrialList,
    TrialRead,
    TrialVerdict,
)

router = APIRouter(prefix="/studies", tags=["studies"], responses=errors(403))
# A trial's own view of its study, by its job: what ``kiln.should_prune()`` asks from inside the trial.
job_router = APIRouter(prefix="/jobs", tags=["studies"], responses=errors(403))
VERDICT_POLL_SECONDS = 0.01
MAX_VERDICT_WAIT = 10.0
_WAITING: set[str] = set()  # jobs with a verdict request waiting (this server; the event loop's thread only)
STUDY = {"study_id": "$response.body#/id"}


@router.post(
    "",
    response_model=StudyRead,
    status_code=201,
    summary="Start a tuning study: its trials are jobs, run with parameters Optuna's sampler picks",
    responses=replayable(
        with_links(
            (400, 422),
            links(201, "The study, running", get_study=STUDY, study_trials=STUDY, study_events=STUDY, stop_study=STUDY),
        )
    ),
)
def create_study(
    body: StudySubmit, caller: Caller, kiln: Kiln, idempotency: Idempotent, response: Response
) -> StudyRead:
    study = kiln.studies.create(caller, body, idempotency)
    mark_replayed(response, idempotency)
    return study


@router.get("", response_model=StudyList, summary="List studies, newest first", responses=errors(422))
def list_studies(
    caller: Caller,
    kiln: Kiln,
    state: Annotated[list[StudyState] | None, Query(max_length=8, description="Only these states")] = None,
    limit: Annotated[int, Query(ge=1, le=limits.MAX_PAGE_SIZE)] = 50,
    before: Annotated[
        str | None, Query(max_length=limits.MAX_ID_LENGTH, description="Only studies older than this id (paging)")
    ] = None,
) -> StudyList:
    return StudyList(items=kiln.studies.list_studies(caller, states=state, limit=limit, before=before))


@router.get("/{study_id}", response_model=StudyRead, responses=errors(404, 422))
def get_study(study_id: StudyId, caller: Caller, kiln: Kiln) -> StudyRead:
    return kiln.studies.get(caller, study_id)


@router.get(
    "/{study_id}/trials",
    response_model=TrialList,
    summary="The study's trials: by objective (succeeded best first, then pruned, running, failed) or by number",
    responses=errors(404, 422),
)
def study_trials(
    study_id: StudyId,
    caller: Caller,
    kiln: Kiln,
    order: Annotated[Literal["objective", "number"], Query(description="Sort order")] = "objective",
) -> TrialList:
    return TrialList(items=kiln.studies.trials(caller, study_id, order))


@router.get(
    "/{study_id}/best",
    response_model=TrialRead,
    summary="The best succeeded trial: its parameters, value and job",
    responses=errors(404, 422),
)
def best_trial(study_id: StudyId, caller: Caller, kiln: Kiln) -> TrialRead:
    return kiln.studies.best(caller, study_id)


@router.post(
    "/{study_id}/stop",
    response_model=StudyRead,
    summary="Stop the study and cancel its running trials (idempotent)",
    responses=errors(404, 409, 422),
)
def stop_study(study_id: StudyId, caller: Caller, kiln: Kiln) -> StudyRead:
    return kiln.studies.stop(caller, study_id)


@router.get(
    "/{study_id}/events",
    response_model=StudyEventList,
    summary="State changes and what happened to each trial",
    responses=errors(404, 422),
)
def study_events(study_id: StudyId, caller: Caller, kiln: Kiln) -> StudyEventList:
    return StudyEventList(items=kiln.studies.events(caller, study_id))


@job_router.get(
    "/{job_id}/trial",
    response_model=TrialVerdict,
    summary="The pruner's verdict on the trial this job runs (its job token may ask); with judged=STEP, waits "
    "until the pruner has judged that step or the trial ended, at most wait seconds",
    responses=errors(404, 422),
)
async def trial_verdict(
    job_id: JobId,
    caller: Caller,
    kiln: Kiln,
    judged: Annotated[
        int | None, Query(ge=0, le=limits.MAX_INT64, description="Wait until the pruner has judged this step")
    ] = None,
    wait: Annotated[float, Query(ge=0, le=MAX_VERDICT_WAIT, description="Seconds to wait at most")] = 5.0,
) -> TrialVerdict:
    verdict = await run_in_threadpool(kiln.studies.verdict, caller, job_id)
    # One waiting request per job at a time (a trial asks after each report): more, from a job's own token, would
    # only be more reads of the database every poll; they are answered at once.
    if judged is None or wait <= 0 or job_id in _WAITING:
        return verdict
    _WAITING.add(job_id)
    try:
        kiln.metrics_ingester.wake(job_id)  # the point the trial just wrote: read it (and judge it) now
        deadline = time.monotonic() + wait
        while (
            verdict.state == "RUNNING"
            and (verdict.judged_step is None or verdict.judged_step < judged)
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(VERDICT_POLL_SECONDS)
            verdict = await run_in_threadpool(kiln.studies.verdict, caller, job_id)
    finally:
        _WAITING.discard(job_id)
    return verdict
