"""Tuning studies: start one, read, list, its trials (best first), its best trial, stop it, its events."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from kiln.api.deps import Caller, Kiln
from kiln.api.params import StudyId
from kiln.api.responses import errors, links, with_links
from kiln.domain import limits
from kiln.domain.studies import StudyEventList, StudyList, StudyRead, StudyState, StudySubmit, TrialList, TrialRead

router = APIRouter(prefix="/studies", tags=["studies"], responses=errors(403))
STUDY = {"study_id": "$response.body#/id"}


@router.post(
    "",
    response_model=StudyRead,
    status_code=201,
    summary="Start a tuning study: its trials are jobs, run with parameters Optuna's sampler picks",
    responses=with_links(
        (400, 422),
        links(201, "The study, running", get_study=STUDY, study_trials=STUDY, study_events=STUDY, stop_study=STUDY),
    ),
)
def create_study(body: StudySubmit, caller: Caller, kiln: Kiln) -> StudyRead:
    return kiln.studies.create(caller, body)


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
