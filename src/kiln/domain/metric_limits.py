"""A job's metrics budget: ``metrics.limits`` of its spec, resolved against the operator's defaults and ceilings.

Why under ``metrics`` and not ``resources``: ``resources`` is what one worker is allocated and what a backend
enforces on the job's processes (memory, pids, log bytes: past them the job fails). These limits are enforced by
the server on what it ingests, for the whole job (all workers and attempts), and the job goes on running past them:
they sit beside the rest of what says how the job's metrics are collected.

Each limit is None in a spec for the operator's default (``KILN_METRICS_*_DEFAULT``); a spec may lower it, or raise
it up to the operator's ceiling (``KILN_METRICS_MAX_*``), and a value above the ceiling is refused at submit (422
naming the field). docs/metrics.md says what happens past each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kiln.domain import limits
from kiln.domain.quantities import parse_memory
from kiln.errors import InvalidInput

OnLimit = Literal["drop", "sample"]


@dataclass(frozen=True)
class MetricLimits:
    """A job's budget as the ingester applies it (or the operator's defaults, or its ceilings)."""

    series: int = 10_000
    points: int = 10_000_000
    line: int = 64 * limits.KiB
    spool: int = 4 * limits.GiB
    on_limit: OnLimit = "drop"
    sample_every: int = 100

    def capped(self, ceilings: MetricLimits) -> MetricLimits:
        """Each number at most the ceiling's (a spec submitted before the operator lowered a ceiling)."""
        return replace(
            self,
            series=min(self.series, ceilings.series),
            points=min(self.points, ceilings.points),
            line=min(self.line, ceilings.line),
            spool=min(self.spool, ceilings.spool),
        )


DEFAULTS = MetricLimits()
CEILINGS = MetricLimits(series=1_000_000, points=1_000_000_000, line=limits.MiB, spool=64 * limits.GiB)
NUMBERS = ("series", "points", "line", "spool")


def _quantity(value: Any) -> Any:
    """Bytes as a number, or a quantity such as 64K or 2G."""
    if isinstance(value, str):
        if len(value) > limits.MAX_QUANTITY_LENGTH:
            raise ValueError(f"not a byte quantity: longer than {limits.MAX_QUANTITY_LENGTH} characters")
        try:
            return parse_memory(value)
        except (ValueError, OverflowError):
            raise ValueError(f"not a byte quantity: {value!r} (e.g. 65536, 64K, 2G)") from None
    return value


class MetricLimitsSpec(BaseModel):
    """The job's metrics budget (``metrics.limits``): what the server ingests of the job at most, over all its
    workers and attempts. Past a limit the job goes on running; one event (MetricsLimitExceeded) says which limit
    and the figures. Each unset limit is the operator's default (KILN_METRICS_*_DEFAULT); a limit may be raised
    up to the operator's ceiling (KILN_METRICS_MAX_*)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    series: int | None = Field(
        None,
        ge=1,
        le=limits.MAX_JOB_METRIC_SERIES,
        strict=True,
        description="Most metric series (a name of a worker) of the job; past it new series are dropped, the existing "
        "ones keep receiving points. Default: KILN_METRICS_SERIES_DEFAULT (10,000).",
    )
    points: int | None = Field(
        None,
        ge=1,
        le=limits.MAX_JOB_METRIC_POINTS,
        strict=True,
        description="Most points stored for the job, all attempts together; past it points are dropped (on_limit: "
        "drop) or sampled (on_limit: sample). Default: KILN_METRICS_POINTS_DEFAULT (10,000,000).",
    )
    line: int | None = Field(
        None,
        ge=limits.MIN_METRIC_LINE_BYTES,
        le=limits.MAX_METRIC_LINE_BYTES,
        description="Longest spool line in bytes (e.g. 64K); a longer line is skipped and counted as malformed. "
        "Default: KILN_METRICS_LINE_DEFAULT (64 KiB).",
    )
    spool: int | None = Field(
        None,
        ge=1,
        le=limits.MAX_METRIC_SPOOL_BYTES,
        description="Most bytes of spool files read for the job (e.g. 1G); past it its spool files are no longer "
        "read (HTTP appends go on within the other limits). Default: KILN_METRICS_SPOOL_DEFAULT (4 GiB).",
    )
    on_limit: OnLimit = Field(
        "drop",
        description="Past the points limit: drop every further point, or sample: keep every sample_every-th point "
        "of each series (its latest value stays current, at a fraction of the cost).",
    )
    sample_every: int = Field(
        100, ge=2, le=1_000_000, strict=True, description="on_limit: sample keeps one point in this many."
    )

    @field_validator("line", "spool", mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> Any:
        return _quantity(value)


def check_ceilings(spec: MetricLimitsSpec | None, ceilings: MetricLimits) -> None:
    """InvalidInput (422) naming the first field of ``spec`` above the operator's ceiling."""
    if spec is None:
        return
    for name in NUMBERS:
        value = getattr(spec, name)
        ceiling = getattr(ceilings, name)
        if value is not None and value > ceiling:
            setting = f"KILN_METRICS_MAX_{name.upper()}"
            raise InvalidInput(
                f"metrics.limits.{name}: {value} is above this server's ceiling of {ceiling} ({setting})",
                details={"field": f"spec.metrics.limits.{name}"},
            )


def resolve(raw: Mapping[str, Any] | None, defaults: MetricLimits, ceilings: MetricLimits) -> MetricLimits:
    """A stored spec's ``metrics.limits`` (the JSON: valid at submit, read without a model) over ``defaults``,
    capped by ``ceilings``. A value of the wrong type (never stored by a submit) is the default."""
    values: dict[str, Any] = {}
    raw = raw if isinstance(raw, Mapping) else {}
    for f in fields(MetricLimits):
        value = raw.get(f.name)
        if f.name == "on_limit":
            if value in ("drop", "sample"):
                values[f.name] = value
        elif isinstance(value, int) and not isinstance(value, bool) and value > 0:
            values[f.name] = value
    return replace(defaults, **values).capped(ceilings)
