"""Usage and prices: who held what, for how long, and what it cost (org admins: their organisation; the platform
admin: any or all); the price table (the platform admin sets it)."""

from __future__ import annotations

import csv
import io
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response

from kiln.api.deps import Caller, Kiln
from kiln.api.params import Time
from kiln.api.responses import errors
from kiln.domain.usage import PriceList, PriceSet, PriceVersion, UsageReport

router = APIRouter(tags=["usage"], responses=errors(403))
Group = Literal["org", "user", "job", "category", "gpu_type", "day"]
CSV_COLUMNS = ("key", "name", "attempts", "cpu_seconds", "memory_gib_seconds", "gpu_seconds", "cost")


@router.get(
    "/usage",
    response_model=UsageReport,
    summary="Usage in a window, grouped: CPU, memory and GPU seconds held, and their cost (CSV with format=csv)",
    responses={200: {"content": {"text/csv": {}}}, **errors(404, 422)},
)
def get_usage(
    caller: Caller,
    kiln: Kiln,
    by: Group = "user",
    org: Annotated[str | None, Query(max_length=128, description="An organisation (the platform admin)")] = None,
    since: Annotated[Time, Query(description="From (default: 30 days ago; UTC if it gives no zone)")] = None,
    until: Annotated[Time, Query(description="Until (default: now; UTC if it gives no zone)")] = None,
    format: Literal["json", "csv"] = "json",
) -> UsageReport | Response:
    report = kiln.usage.report(caller, org=org, since=since, until=until, by=by)
    if format == "json":
        return report
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for row in report.rows:
        writer.writerow([getattr(row, column) for column in CSV_COLUMNS])
    return Response(out.getvalue(), media_type="text/csv")


@router.get("/prices", response_model=PriceList, summary="Every price version, oldest first")
def list_prices(caller: Caller, kiln: Kiln) -> PriceList:
    return PriceList(items=kiln.usage.prices(caller))


@router.post(
    "/prices",
    response_model=PriceVersion,
    status_code=201,
    summary="A new price version from now on (the platform admin): rates not given are carried over",
    responses=errors(400, 422),
)
def set_prices(body: PriceSet, caller: Caller, kiln: Kiln) -> PriceVersion:
    return kiln.usage.set_prices(caller, body)
