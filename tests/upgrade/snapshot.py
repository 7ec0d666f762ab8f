"""Every row of a Kiln database, read through reflection (no ORM: the old schema is not head's), and the
differences between two such readings over what their schemas share."""

from __future__ import annotations

import datetime
import decimal
import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

# Alembic's own bookkeeping: the one table an upgrade is meant to change.
IGNORED = frozenset({"alembic_version"})


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]  # each value as text (plain()), in column order

    def project(self, columns: tuple[str, ...]) -> Counter[tuple[str, ...]]:
        """The rows over ``columns`` only, as a multiset."""
        index = [self.columns.index(c) for c in columns]
        return Counter(tuple(row[i] for i in index) for row in self.rows)


Snapshot = dict[str, Table]


def plain(value: Any) -> str:
    """A value as text that is the same whichever driver read it: JSON with sorted keys, datetimes in ISO form
    (naive ones as UTC: SQLite keeps no zone), floats by repr."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.UTC).replace(tzinfo=None)
        return value.isoformat()
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    if isinstance(value, decimal.Decimal):
        return repr(float(value))
    return repr(value)


def snapshot(url: str) -> Snapshot:
    engine = sa.create_engine(url)
    try:
        meta = sa.MetaData()
        meta.reflect(engine)
        result: Snapshot = {}
        with engine.connect() as conn:
            for name, table in meta.tables.items():
                if name in IGNORED:
                    continue
                columns = tuple(sorted(table.columns.keys()))
                rows = conn.execute(sa.select(*(table.c[c] for c in columns))).all()
                result[name] = Table(columns, tuple(tuple(plain(v) for v in row) for row in rows))
        return result
    finally:
        engine.dispose()


def digest(table: Table, columns: tuple[str, ...]) -> str:
    """A digest of a table's content over ``columns``, whatever the order its rows are read in."""
    rows = sorted(table.project(columns).elements())
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def lost(before: Snapshot, after: Snapshot) -> list[str]:
    """What ``after`` no longer holds of ``before``: a table gone, rows gone or added, or a value changed in a
    column both schemas have (rows compared as multisets over those columns)."""
    problems: list[str] = []
    for name, old in sorted(before.items()):
        new = after.get(name)
        if new is None:
            problems.append(f"{name}: table gone ({len(old.rows)} rows)")
            continue
        if len(new.rows) != len(old.rows):
            problems.append(f"{name}: {len(old.rows)} rows before, {len(new.rows)} after")
        shared = tuple(c for c in old.columns if c in new.columns)
        if digest(old, shared) != digest(new, shared):
            was, now = old.project(shared), new.project(shared)
            gone, added = list((was - now).elements()), list((now - was).elements())
            problems.append(
                f"{name}: content over {shared} differs: {len(gone)} row(s) only before, e.g. {gone[:2]}; "
                f"{len(added)} only after, e.g. {added[:2]}"
            )
    return problems


def empty(snap: Snapshot) -> set[str]:
    return {name for name, table in snap.items() if not table.rows}
