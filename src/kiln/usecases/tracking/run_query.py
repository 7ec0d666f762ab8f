"""Run search in SQL: MLflow's filter conditions and order-by keys (kiln.domain.run_search) as SQLAlchemy
expressions over runs, their params and tags, and each metric series' last value; lifecycle views; page tokens.
The queries these build select from ``Run`` outer-joined to ``Job`` (a job's run's status is its job's) and joined
to ``User`` (``user_id`` is the user's name)."""

from __future__ import annotations

import base64
from typing import Any

from sqlalchemy import Boolean, ColumnElement, case, exists, func, not_, or_, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler

from kiln.db.tables import Job, MetricSeries, Run, RunParam, RunTag, User
from kiln.domain import tracking
from kiln.domain.run_search import Condition, OrderKey
from kiln.domain.tracking import ACTIVE, DELETED
from kiln.errors import InvalidInput


def page_offset(token: str | None) -> int:
    if not token:
        return 0
    try:
        offset = int(base64.urlsafe_b64decode(token.encode() + b"==").decode())
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput("page_token: not a token this server gave", details={"field": "page_token"}) from None
    if offset < 0:
        raise InvalidInput("page_token: not a token this server gave", details={"field": "page_token"})
    return offset


def page_token(offset: int) -> str:
    return base64.urlsafe_b64encode(str(offset).encode()).decode().rstrip("=")


def status_expr() -> ColumnElement[Any]:
    """A run's status in SQL: a job's run's from its job's state (the query joins Job), another's as stored."""
    by_state = case(
        *[(Job.state == state, status) for status in tracking.RUN_STATUSES for state in tracking.job_states(status)],
        else_=Run.status,
    )
    return case((Run.job_id.is_(None), Run.status), else_=by_state)


ATTRIBUTES = {
    "run_id": lambda: Run.id,
    "run_name": lambda: Run.name,
    "user_id": lambda: User.name,
    "start_time": lambda: Run.start_time,
    "end_time": lambda: Run.end_time,
    "lifecycle_stage": lambda: Run.lifecycle_stage,
    "experiment_id": lambda: Run.experiment_id,
    "status": status_expr,
}


class CaseSensitiveLike(ColumnElement[bool]):
    """MLflow's ``LIKE``: ``%`` and ``_`` wildcards, letters' case significant, on every database. PostgreSQL's
    LIKE is that already; SQLite's ignores the case of ASCII letters, so there the pattern becomes a GLOB (which
    does not), with GLOB's own wildcards quoted."""

    type = Boolean()
    inherit_cache = False  # a pattern per query: nothing to gain from caching the compiled form

    def __init__(self, column: Any, pattern: str) -> None:
        self.column = column
        self.pattern = pattern


def like_as_glob(pattern: str) -> str:
    """A LIKE pattern as the GLOB pattern matching the same strings, case and all."""
    special = {"%": "*", "_": "?", "*": "[*]", "?": "[?]", "[": "[[]"}
    return "".join(special.get(ch, ch) for ch in pattern)


@compiles(CaseSensitiveLike)
def _like(element: CaseSensitiveLike, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.column.like(element.pattern), **kw)


@compiles(CaseSensitiveLike, "sqlite")
def _glob(element: CaseSensitiveLike, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.column.op("GLOB")(like_as_glob(element.pattern)), **kw)


def compare_op(column: Any, op: str, value: Any) -> ColumnElement[bool]:
    match op:
        case "=":
            return column == value  # type: ignore[no-any-return]
        case "!=":
            return column != value  # type: ignore[no-any-return]
        case "<":
            return column < value  # type: ignore[no-any-return]
        case "<=":
            return column <= value  # type: ignore[no-any-return]
        case ">":
            return column > value  # type: ignore[no-any-return]
        case ">=":
            return column >= value  # type: ignore[no-any-return]
        case "LIKE":
            return CaseSensitiveLike(column, value)
        case "ILIKE":
            return func.lower(column).like(func.lower(value))
        case "IN":
            return column.in_(list(value))  # type: ignore[no-any-return]
        case "NOT IN":
            return column.not_in(list(value))  # type: ignore[no-any-return]
    raise InvalidInput(f"filter: operator {op} is not supported here", details={"field": "filter"})


def condition(cond: Condition) -> ColumnElement[bool]:
    if cond.entity == "attribute":
        column = ATTRIBUTES.get(cond.key)
        if column is None:
            raise InvalidInput(f"filter: attributes.{cond.key} cannot be searched", details={"field": "filter"})
        return compare_op(column(), cond.op, cond.value)
    if cond.entity == "metric":
        found = exists().where(MetricSeries.job_id == Run.id, MetricSeries.name == cond.key)
        if cond.op in ("IS NULL", "IS NOT NULL"):
            return not_(found) if cond.op == "IS NULL" else found
        return found.where(compare_op(MetricSeries.last_value, cond.op, cond.value))
    table: Any = RunParam if cond.entity == "param" else RunTag
    found = exists().where(table.run_id == Run.id, table.key == cond.key)
    if cond.op in ("IS NULL", "IS NOT NULL"):
        return not_(found) if cond.op == "IS NULL" else found
    column = table.number if (cond.entity == "param" and cond.numeric) else table.value
    return found.where(compare_op(column, cond.op, cond.value))


def order(key: OrderKey) -> list[Any]:
    if key.entity == "attribute":
        column = ATTRIBUTES.get(key.key)
        if column is None:
            raise InvalidInput(f"order_by: attributes.{key.key} cannot be ordered by", details={"field": "order_by"})
        columns = [column()]
    elif key.entity == "metric":
        columns = [
            select(func.max(MetricSeries.last_value))
            .where(MetricSeries.job_id == Run.id, MetricSeries.name == key.key)
            .scalar_subquery()
        ]
    elif key.entity == "param":
        columns = [
            select(RunParam.number).where(RunParam.run_id == Run.id, RunParam.key == key.key).scalar_subquery(),
            select(RunParam.value).where(RunParam.run_id == Run.id, RunParam.key == key.key).scalar_subquery(),
        ]
    else:
        columns = [select(RunTag.value).where(RunTag.run_id == Run.id, RunTag.key == key.key).scalar_subquery()]
    return [(c.desc() if key.descending else c.asc()).nulls_last() for c in columns]


def stage_filter(column: Any, view: str) -> ColumnElement[bool]:
    view = (view or "ACTIVE_ONLY").upper()
    if view == "ACTIVE_ONLY":
        return column == ACTIVE  # type: ignore[no-any-return]
    if view == "DELETED_ONLY":
        return column == DELETED  # type: ignore[no-any-return]
    if view == "ALL":
        return or_(column == ACTIVE, column == DELETED)
    raise InvalidInput("view_type: ACTIVE_ONLY, DELETED_ONLY or ALL", details={"field": "view_type"})
