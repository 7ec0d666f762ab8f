"""Quota arithmetic: limits per organisation and category, usage, and the two questions admission asks —
could this job ever fit (else 403 at submit), and does it fit now (else it waits, saying why).

Integers throughout (CPUs in millicores, memory in bytes), so usage adds up exactly: 100 jobs of 0.1 CPU use
exactly 10 CPUs of a limit of 10. Messages show CPUs as users write them (``quota: cpus 0.1 of 10 in use``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.domain.quantities import format_cpus, format_memory

CATEGORIES = ("train", "serve", "dev")
TOTAL = "total"
# The limits checked, as messages name them → the attribute of Limits and Usage that holds them.
FIELDS = {"gpus": "gpus", "cpus": "millicores", "memory": "memory", "count": "count"}


@dataclass(frozen=True)
class Limits:
    """None means unlimited."""

    gpus: int | None = None
    millicores: int | None = None  # CPUs * 1000
    memory: int | None = None  # bytes
    count: int | None = None
    storage: int | None = None  # bytes


@dataclass
class Usage:
    gpus: int = 0
    millicores: int = 0
    memory: int = 0
    count: int = 0

    def add(self, gpus: int, millicores: int, memory: int | None) -> None:
        self.gpus += gpus
        self.millicores += millicores
        self.memory += memory or 0
        self.count += 1


@dataclass
class OrgUsage:
    """Active usage of one organisation: per category and in total."""

    by_category: dict[str, Usage] = field(default_factory=dict)
    total: Usage = field(default_factory=Usage)

    def add(self, category: str, gpus: int, millicores: int, memory: int | None) -> None:
        self.by_category.setdefault(category, Usage()).add(gpus, millicores, memory)
        self.total.add(gpus, millicores, memory)

    def of(self, category: str) -> Usage:
        return self.total if category == TOTAL else self.by_category.get(category, Usage())


def _show(name: str, value: int) -> str:
    if name == "memory":
        return format_memory(value)
    return format_cpus(value) if name == "cpus" else str(value)


def _asks(gpus: int, millicores: int, memory: int | None) -> dict[str, int]:
    return {"gpus": gpus, "cpus": millicores, "memory": memory or 0, "count": 1}


def never_fits(
    org: str, category: str, limits: dict[str, Limits], gpus: int, millicores: int, memory: int | None
) -> str | None:
    """Why a job asking this much (over its whole gang) can never run under the organisation's limits, or None."""
    asks = _asks(gpus, millicores, memory)
    for scope in (category, TOTAL):
        limit = limits.get(scope)
        if limit is None:
            continue
        for name, attr in FIELDS.items():
            cap = getattr(limit, attr)
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
    millicores: int,
    memory: int | None,
) -> str | None:
    """Why the job must wait for quota now (e.g. ``quota: gpus 4 of 4 in use (org acme, category train)``)."""
    asks = _asks(gpus, millicores, memory)
    for scope in (category, TOTAL):
        limit = limits.get(scope)
        if limit is None:
            continue
        used = usage.of(scope)
        for name, attr in FIELDS.items():
            cap = getattr(limit, attr)
            if cap is not None and getattr(used, attr) + asks[name] > cap:
                return (
                    f"quota: {name} {_show(name, getattr(used, attr))} of {_show(name, cap)} in use "
                    f"(org {org}, category {scope})"
                )
    return None
