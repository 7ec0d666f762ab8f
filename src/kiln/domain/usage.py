"""Usage reports and prices, as the API shows them (kiln.usecases.usage computes them)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

GROUPS = ("org", "user", "job", "category", "gpu_type", "day")
RESOURCES = ("cpu", "memory_gib", "gpu")
CATEGORIES = ("train", "serve", "dev")


class UsageRow(BaseModel):
    key: str = Field(description="The group: an organisation, user or job id, a category, a GPU type or a day.")
    name: str = Field(description="The organisation's, user's or job's name (the key otherwise).")
    attempts: int = Field(description="Holds (attempts) that overlap the window.")
    cpu_seconds: float = Field(description="CPUs held times seconds, every gang member's.")
    memory_gib_seconds: float
    gpu_seconds: float
    cost: float = Field(description="Under the price versions in force while it was held.")


class UsageReport(BaseModel):
    by: str
    since: datetime
    until: datetime
    org: str | None = None
    rows: list[UsageRow]
    cpu_seconds: float
    memory_gib_seconds: float
    gpu_seconds: float
    cost: float


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


class PriceList(BaseModel):
    items: list[PriceVersion]
