"""Quota arithmetic: limits per organisation and category, usage, and the two questions admission asks —
could this job ever fit (else 403 at submit), and does it fit now (else it waits, saying why)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.domain.quantities import format_memory

CATEGORIES = ("train", "serve", "dev")
TOTAL = "total"
FIELDS = ("gpus", "cpus", "memory", "count")


@dataclass(frozen=True)
class Limits:
    """None means unlimited."""

    gpus: int | None = None
    cpus: float | None = None
    memory: int | None = None
    count: int | None = None
    storage: int | None = None


@dataclass
class Usage:
    gpus: int = 0
    cpus: float = 0.0
    memory: int = 0
    count: int = 0

    def add(self, gpus: int, cpus: float, memory: int | None) -> None:
        self.gpus += gpus
        self.cpus += cpus
        self.memory += memory or 0
        self.count += 1


@dataclass
class OrgUsage:
    """Active usage of one organisation: per category and in total."""

    by_category: dict[str, Usage] = field(default_factory=dict)
    total: Usage = field(default_factory=Usage)

    def add(self, category: str, gpus: int, cpus: float, memory: int | None) -> None:
        self.by_category.setdefault(category, Usage()).add(gpus, cpus, memory)
        self.total.add(gpus, cpus, memory)

    def of(self, category: str) -> Usage:
        return self.total if category == TOTAL else self.by_category.get(category, Usage())


def _show(name: str, value: float) -> str:
    return format_memory(int(value)) if name == "memory" else f"{value:g}"


def _asks(gpus: int, cpus: float, memory: int | None) -> dict[str, float]:
    return {"gpus": gpus, "cpus": cpus, "memory": memory or 0, "count": 1}


def never_fits(
    org: str, category: str, limits: dict[str, Limits], gpus: int, cpus: float, memory: int | None
) -> str | None:
    """Why a job asking this much can never run under the organisation's limits, or None."""
    asks = _asks(gpus, cpus, memory)
    for scope in (category, TOTAL):
        limit = limits.get(scope)
        if limit is None:
            continue
        for name in FIELDS:
            cap = getattr(limit, name)
            if cap is not None and asks[name] > cap:
                return (
                    f"quota: the job asks {name} {_show(name, asks[name])} but the limit is "
                    f"{_show(name, cap)} (org {org}, category {scope})"
                )
    return None


def blocked_by(
    org: str,
    category: str,
    limits: dict[str, Limits],
    usage: OrgUsage,
    gpus: int,
    cpus: float,
    memory: int | None,
) -> str | None:
    """Why the job must wait for quota now (e.g. ``quota: gpus 4 of 4 in use (org acme, category train)``)."""
    asks = _asks(gpus, cpus, memory)
    for scope in (category, TOTAL):
        limit = limits.get(scope)
        if limit is None:
            continue
        used = usage.of(scope)
        for name in FIELDS:
            cap = getattr(limit, name)
            if cap is not None and getattr(used, name) + asks[name] > cap + 1e-9:
                return (
                    f"quota: {name} {_show(name, getattr(used, name))} of {_show(name, cap)} in use "
                    f"(org {org}, category {scope})"
                )
    return None
