"""The statements and rows of the metrics writer (``metrics_store``) that are per series and per chunk: the series'
running totals and the M4 chunk summaries."""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, cast

from sqlalchemy import BigInteger, Float, Integer, Table, Text, bindparam, case, func, or_, update
from sqlalchemy import cast as sql_cast

from kiln.db.tables import MetricSeries

SERIES = cast(Table, MetricSeries.__table__)
CHUNK = 128  # points per M4 chunk summary (metric_chunks)


def _series_update() -> Any:
    """Advance a series' running totals by a batch of its points and return its new count (the batch's points
    take the ``seq`` numbers below it): one statement, built once, with bound parameters."""
    c = SERIES.c
    low = sql_cast(bindparam("p_low", type_=Float), Float)  # typed: a NULL parameter is fine on PostgreSQL
    high = sql_cast(bindparam("p_high", type_=Float), Float)
    return (
        update(SERIES)
        .where(c.id == bindparam("p_sid", type_=Integer))
        .values(
            count=c.count + bindparam("p_n", type_=BigInteger),
            first_step=func.coalesce(c.first_step, sql_cast(bindparam("p_first_step", type_=BigInteger), BigInteger)),
            last_step=func.coalesce(sql_cast(bindparam("p_last_step", type_=BigInteger), BigInteger), c.last_step),
            last_time=bindparam("p_time", type_=Float),
            last_value=bindparam("p_value", type_=Float),
            last_text=bindparam("p_text", type_=Text),
            min_value=case(
                (low.is_(None), c.min_value),
                (or_(c.min_value.is_(None), low < c.min_value), low),
                else_=c.min_value,
            ),
            max_value=case(
                (high.is_(None), c.max_value),
                (or_(c.max_value.is_(None), high > c.max_value), high),
                else_=c.max_value,
            ),
        )
        .returning(c.count)
    )


_SERIES_UPDATE = _series_update()


def _chunk_rows(
    out: list[dict[str, Any]],
    sid: int,
    seq: int,
    xs: list[float],
    ts: list[float],
    vs: list[float],
    seqs: list[int] | None,
) -> None:
    """The M4 summaries of the summarised points of one series in one batch (finite values with an x), one per
    chunk (``seq // CHUNK``) they fall in. ``seqs`` are their seq numbers; None when they are the contiguous
    ``seq, seq + 1, ...``. Per chunk: the first point by x (the earliest of equal ones), the last by x (the
    latest), the lowest and the highest value (the earliest of equal ones), as a point-by-point scan would."""
    n = len(vs)
    i = 0
    while i < n:
        chunk = (seq + i if seqs is None else seqs[i]) // CHUNK
        end = (chunk + 1) * CHUNK
        j = min(n, end - seq) if seqs is None else bisect_left(seqs, end, i)
        x, t, v = xs[i:j], ts[i:j], vs[i:j]
        first = x.index(min(x))
        high_x = max(x)
        last = len(x) - 1 - x[::-1].index(high_x) if x[-1] != high_x else len(x) - 1
        low = v.index(min(v))
        high = v.index(max(v))
        out.append(
            {
                "series_id": sid,
                "chunk": chunk,
                "count": j - i,
                "first_x": x[first],
                "first_t": t[first],
                "first_v": v[first],
                "last_x": x[last],
                "last_t": t[last],
                "last_v": v[last],
                "min_x": x[low],
                "min_t": t[low],
                "min_v": v[low],
                "max_x": x[high],
                "max_t": t[high],
                "max_v": v[high],
            }
        )
        i = j
