"""Usage and prices: who held what, for how long, and what it cost (org admins: their organisation; the platform
admin: any or all); the price table (the platform admin sets it)."""

from __future__ import annotations

import csv
import io
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Response

from kiln.api.deps import Caller, Kiln
from kiln.api.params import Time
from kiln.api.responses import errors
from kiln.domain import limits
from kiln.domain.usage import BudgetList, BudgetRead, BudgetSet, PriceList, PriceSet, PriceVersion, UsageReport

router = APIRouter(tags=["usage"], responses=errors(403))
BudgetId = Annotated[str, Path(max_length=limits.MAX_ID_LENGTH, description="A budget id, e.g. bud-01jd5y3c2k7q4m9x2a")]
Group = Literal["org", "user", "job", "category", "gpu_type", "day"]
CSV_COLUMNS = (
    "key",
    "name",
    "attempts",
    "cpu_seconds",
    "memory_gib_seconds",
    "gpu_seconds",
    "cost",
    "used_cpu_seconds",
    "peak_memory_bytes",
)


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
    split: Annotated[Group | None, Query(description="A second group: per day by user is by=day&split=user")] = None,
    limit: Annotated[int | None, Query(ge=1, le=100_000, description="The first rows only (top by cost)")] = None,
    org: Annotated[str | None, Query(max_length=128, description="An organisation (the platform admin)")] = None,
    since: Annotated[Time, Query(description="From (default: 30 days ago; UTC if it gives no zone)")] = None,
    until: Annotated[Time, Query(description="Until (default: now; UTC if it gives no zone)")] = None,
    format: Literal["json", "csv"] = "json",
) -> UsageReport | Response:
    report = kiln.usage.report(caller, org=org, since=since, until=until, by=by, split=split, limit=limit)
    if format == "json":
        return report
    out = io.StringIO()
    writer = csv.writer(out)
    columns = CSV_COLUMNS if split is None else (*CSV_COLUMNS[:2], "split", "split_name", *CSV_COLUMNS[2:])
    if by == "job":  # whose each job is
        columns = (*columns, "user_id", "user_name", "org_id", "org_name")
    writer.writerow(columns)
    for row in report.rows:
        writer.writerow([getattr(row, column) for column in columns])
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


@router.get(
    "/budgets",
    response_model=BudgetList,
    summary="The budgets the caller may see, with this month's use",
    responses=errors(404, 422),
)
def list_budgets(
    caller: Caller,
    kiln: Kiln,
    org: Annotated[str | None, Query(max_length=128, description="One organisation's (the platform admin)")] = None,
) -> BudgetList:
    return BudgetList(items=kiln.budgets.list_budgets(caller, org))


@router.put(
    "/budgets",
    response_model=BudgetRead,
    summary="Set (create or replace) a monthly budget: an organisation's (the platform admin) or a member's",
    responses=errors(400, 404, 422),
)
def set_budget(body: BudgetSet, caller: Caller, kiln: Kiln) -> BudgetRead:
    return kiln.budgets.set(caller, body)


@router.delete("/budgets/{budget_id}", status_code=204, summary="Remove a budget", responses=errors(404, 422))
def delete_budget(budget_id: BudgetId, caller: Caller, kiln: Kiln) -> Response:
    kiln.budgets.remove(caller, budget_id)
    return Response(status_code=204)
