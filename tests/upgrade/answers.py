"""The API's answers about each object, from an old release's server and from the head server after the upgrade:
what the old one said must still be said (fields the head added are new, not lost)."""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import quote

from kiln.sdk.client import Client

# Fields that change by being read or by time passing, not by an upgrade: a key's last use (the test's own reads
# use the keys again), a budget's use (the job left running costs more every second: it must not go down).
VOLATILE = frozenset({"last_used_at"})
GROWING = frozenset({"used"})


def ask(client: Client, path: str) -> dict[str, Any]:
    """GET ``path`` as populate.py's ``answer`` did: its JSON, or its bytes (a job's log)."""
    response = client.request("GET", quote(path.removeprefix("admin:"), safe="/:@"))
    if response.headers.get("content-type", "").startswith("application/json"):
        return {"json": response.json()}
    return {"bytes": base64.b64encode(response.content).decode()}


def differences(old: Any, new: Any, where: str = "") -> list[str]:
    """Where ``new`` does not say what ``old`` said: a field gone or changed, a list of another length. Fields
    only ``new`` has are not differences."""
    if isinstance(old, dict) and isinstance(new, dict):
        found: list[str] = []
        for key, value in old.items():
            if key in VOLATILE:
                continue
            if key not in new:
                found.append(f"{where}.{key}: gone (was {value!r:.120})")
            elif key in GROWING and isinstance(value, int | float) and isinstance(new[key], int | float):
                if new[key] < value:
                    found.append(f"{where}.{key}: {value!r} before, less after ({new[key]!r})")
            else:
                found += differences(value, new[key], f"{where}.{key}")
        return found
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{where}: {len(old)} items before, {len(new)} after"]
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True)) for d in differences(a, b, f"{where}[{i}]")]
    if old != new:
        return [f"{where}: {old!r:.200} before, {new!r:.200} after"]
    return []


def audit_kept(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The audit log grows with the head server's own events: every old entry must still be there, as it was."""
    by_id = {item["id"]: item for item in new["json"]["items"]}
    found: list[str] = []
    for item in old["json"]["items"]:
        if item["id"] not in by_id:
            found.append(f"audit entry {item['id']} ({item.get('action')}): gone")
        else:
            found += differences(item, by_id[item["id"]], f"audit[{item['id']}]")
    return found


def series_kept(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """A running job's metrics (or their summary): each series it had, with the points it had first."""
    if "series" not in old.get("json", {}):
        return differences(old, new)
    now = {(s["name"], s["worker"]): s for s in new["json"]["series"]}
    found: list[str] = []
    for series in old["json"]["series"]:
        key = (series["name"], series["worker"])
        if key not in now:
            found.append(f"series {key}: gone")
        elif now[key]["count"] < series["count"]:
            found.append(f"series {key}: {series['count']} points before, {now[key]['count']} after")
        elif "points" in series and now[key]["points"][: len(series["points"])] != series["points"]:
            found.append(f"series {key}: its first {len(series['points'])} points differ")
    return found
