"""What the scheduler thinks of a job."""

from __future__ import annotations

from fastapi import APIRouter

from kiln.api.deps import Caller, Kiln
from kiln.api.params import JobId
from kiln.api.responses import errors
from kiln.domain.schemas import WhyRead

router = APIRouter(prefix="/jobs", tags=["jobs"], responses=errors(403))


@router.get(
    "/{job_id}/why",
    response_model=WhyRead,
    summary="Why a job waits: queue position, the limit that holds it with the numbers, what is ahead",
    responses=errors(404, 422),
)
def why(job_id: JobId, caller: Caller, kiln: Kiln) -> WhyRead:
    return kiln.scheduling.why(caller, job_id)
