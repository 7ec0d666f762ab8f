"""Usage reports and prices, as the API shows them (kiln.usecases.usage.usage computes them)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

GROUPS = ("org", "user", "job", "category", "gpu_type", "day")
RESOURCES = ("cpu", "memory_gib", "gpu")
CATEGORIES = ("train", "serve", "dev")


class UsageRow(BaseModel):
    key: str = Field(description="The group: an organisation, user or job id, a category, a GPU type or a day.")
    name: str = Field(description="The organisation's, user's or job's name (the key otherwise).")
    split: str | None = Field(None, description="With split: the second group (a user of the day, say).")
    split_name: str | None = None
    attempts: int = Field(description="Holds (attempts) that began in the window (by day: that day).")
    cpu_seconds: float = Field(description="CPUs held times seconds, every gang member's.")
    memory_gib_seconds: float
    gpu_seconds: float
    cost: float = Field(description="Under the price versions in force while it was held.")
    used_cpu_seconds: float = Field(
        description="CPU time the processes used (as sampled by the job's system metrics): beside cpu_seconds "
        "held, what was held idle."
    )
    peak_memory_bytes: int = Field(description="The highest peak resident memory of a hold in the group.")
    user_id: str | None = Field(None, description="By job: the user whose job it is.")
    user_name: str | None = None
    org_id: str | None = Field(None, description="By job: the organisation whose job it is.")
    org_name: str | None = None


class UsageReport(BaseModel):
    by: str
    split: str | None = None
    since: datetime
    until: datetime
    org: str | None = None
    rows: list[UsageRow]
    cpu_seconds: float
    memory_gib_seconds: float
    gpu_seconds: float
    cost: float
    used_cpu_seconds: float
    currency: str | None = Field(None, description="What costs are in (KILN_CURRENCY, ISO 4217); None: not set.")


GpuType = Annotated[str, Field(min_length=1, max_length=64)]
Rate = Annotated[float, Field(ge=0, le=1e6, strict=True)]


class PriceSet(BaseModel):
    """A new price version from now on; rates not given are carried over from the current version."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    cpu_hour: float | None = Field(None, ge=0, le=1e6, strict=True, description="Per CPU-hour.")
    memory_gib_hour: float | None = Field(None, ge=0, le=1e6, strict=True, description="Per GiB-hour of memory held.")
    gpu_hour: dict[GpuType, Rate] = Field(
        default_factory=dict,
        max_length=32,
        description='Per GPU-hour, by GPU type ("*": any type the version names no rate of).',
    )
    category: str | None = Field(
        None, max_length=16, pattern=r"^(train|serve|dev)$", description="Only this category's rates."
    )


class PriceRead(BaseModel):
    category: str
    resource: str
    gpu_type: str
    rate: float


class PriceVersion(BaseModel):
    effective_from: datetime
    rates: list[PriceRead]
    currency: str | None = Field(None, description="What rates are in (KILN_CURRENCY, ISO 4217); None: not set.")


class PriceList(BaseModel):
    items: list[PriceVersion]


Amount = Annotated[float, Field(ge=0, le=1e12, strict=True)]


class BudgetSet(BaseModel):
    """A monthly budget (calendar months, UTC) on an organisation's cost, or one member's with ``user``; setting
    one that exists replaces it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    org: str | None = Field(None, max_length=128, description="The organisation (default: the caller's).")
    user: str | None = Field(None, max_length=128, description="A member (default: the whole organisation).")
    soft: Amount | None = Field(None, description="Past this, new work is warned of (events, a banner).")
    hard: Amount | None = Field(None, description="Past this, new work is refused (403 budget_exceeded).")
    stop_running: bool = Field(
        False, strict=True, description="Past the hard limit, stop the scope's running work too."
    )


class BudgetRead(BaseModel):
    id: str
    org_id: str
    org_name: str
    user_id: str | None
    user_name: str | None
    soft: float | None
    hard: float | None
    stop_running: bool
    month: str = Field(description="The month it counts (UTC), e.g. 2026-12.")
    used: float = Field(description="Cost so far this month, under the price table.")
    resets_at: datetime = Field(description="When the month ends and the count starts again.")
    state: Literal["ok", "soft", "hard"] = Field(description="ok, soft (past the soft limit) or hard (past the hard).")
    currency: str | None = Field(None, description="What limits and use are in (KILN_CURRENCY); None: not set.")


class BudgetList(BaseModel):
    items: list[BudgetRead]


def format_money(amount: float | None, currency: str | None = None) -> str:
    """A cost as the console shows it (console/src/format.ts ``money``): two decimals (1,234.50), or two
    significant digits below 0.01 (0.0015, 0.000001) so that a small cost or limit is not printed as 0.00; followed
    by the currency where the server names one."""
    if amount is None or not math.isfinite(amount):
        return "-"
    unit = f" {currency}" if currency else ""
    size = abs(amount)
    if size < 1e-9 or size >= 0.01:
        return f"{amount:,.2f}" + unit
    digits = 1 - math.floor(math.log10(size))
    return f"{amount:.{digits}f}".rstrip("0") + unit


def format_hours(seconds: float | None) -> str:
    """Resource-seconds as hours, as the console shows them (``hours``): 1,234 from 100 up, three significant
    digits below (12.3, 0.00167)."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    hours = seconds / 3600
    if abs(hours) >= 100:
        return f"{math.floor(hours + 0.5):,}"
    return _num(float(f"{hours:.3g}"))


def _num(n: float) -> str:
    """A number as the console's ``num`` prints it: an integer as such, exponent form below 1e-4 (1e-5), else up to
    six significant digits."""
    if n == int(n) and abs(n) < 1e15:
        return str(int(n))
    if abs(n) < 1e-4 or abs(n) >= 1e15:
        mantissa, _, exponent = f"{n:.2e}".partition("e")
        return mantissa.rstrip("0").rstrip(".") + "e" + str(int(exponent)).replace("+", "")
    return f"{float(f'{n:.6g}')!r}".removesuffix(".0")
