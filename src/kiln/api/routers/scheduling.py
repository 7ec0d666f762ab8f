"""What the scheduler thinks of a job."""

from __future__ import annotations

from fastapi import APIRouter

from kiln.api.deps import Caller, Kiln
from kiln.domain.schemas import WhyRead

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.get(
    "/{job_id}/why",
    response_model=WhyRead,
    summary="Why a job waits: queue position, the limit that holds it with the numbers, what is ahead",
)
def why(job_id: str, caller: Caller, kiln: Kiln) -> WhyRead:
    return kiln.scheduling.why(caller, job_id)
