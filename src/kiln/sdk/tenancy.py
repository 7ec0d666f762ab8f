"""Organisations, users, access keys, quotas, the audit log and the servers; and the two calls a running job makes
with its token (uploading an artifact, appending log lines). A mixin of ``kiln.Client``, kept apart to keep
client.py small.

Organisations, users and keys are named by id or by name wherever the API takes one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from kiln.domain.quantities import parse_memory
from kiln.domain.schemas import (
    ArtifactRead,
    AuditRead,
    KeyCreated,
    KeyRead,
    OrgRead,
    QuotaReport,
    UserRead,
)
from kiln.domain.servers import ServerList
from kiln.sdk.transport import ClientTransport

if TYPE_CHECKING:
    pass

QUOTA_FIELDS = ("gpus", "cpus", "memory", "count", "storage")
QUOTA_CATEGORIES = ("train", "serve", "dev", "total")
ROLES = ("admin", "member", "viewer")


def _segment(value: str) -> str:
    """One path segment (an id or a name), percent-encoded."""
    if not value:
        raise ValueError("an empty id or name")
    return quote(value, safe="")


def _iso(value: datetime | str | None) -> str | None:
    """ISO-8601 in UTC; a naive datetime is taken as local time. Strings pass as given."""
    if value is None or isinstance(value, str):
        return value
    return value.astimezone(UTC).isoformat()


def quota_value(field: str, value: Any) -> int | float | None:
    """A quota field's value for the API: None (unlimited) stays None; memory and storage accept e.g. ``128G``."""
    if field not in QUOTA_FIELDS:
        raise TypeError(f"unknown quota field {field!r} (one of {', '.join(QUOTA_FIELDS)})")
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{field}: not a number: {value!r}")
    if field in ("memory", "storage"):
        return parse_memory(value)
    if isinstance(value, str):
        try:
            value = float(value) if field == "cpus" else int(value)
        except ValueError:
            raise ValueError(f"{field}: not a number: {value!r}") from None
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{field}: not a number: {value!r}")
    if value < 0:
        raise ValueError(f"{field} must not be negative")
    if field != "cpus":
        if value != int(value):
            raise ValueError(f"{field} must be a whole number, got {value!r}")
        return int(value)
    return value


class TenancyMixin(ClientTransport):
    """The tenancy methods of ``kiln.Client`` (which supplies ``request``)."""

    # -- organisations (creating one: platform admins) ----------------------------------------------------

    def create_org(self, name: str) -> OrgRead:
        return OrgRead.model_validate(self.request("POST", "/orgs", json_body={"name": name}).json())

    def list_orgs(self) -> list[OrgRead]:
        return [OrgRead.model_validate(o) for o in self.request("GET", "/orgs").json()["items"]]

    def get_org(self, org: str) -> OrgRead:
        return OrgRead.model_validate(self.request("GET", f"/orgs/{_segment(org)}").json())

    def update_org(self, org: str, *, share_weight: float | None = None, max_priority: str | None = None) -> OrgRead:
        """Scheduling settings of ``org`` (platform admins): its fair-share weight and the highest priority
        class (low, normal, high) its members may submit at. Arguments left None are unchanged."""
        body = {k: v for k, v in {"share_weight": share_weight, "max_priority": max_priority}.items() if v is not None}
        return OrgRead.model_validate(self.request("PATCH", f"/orgs/{_segment(org)}", json_body=body).json())

    # -- users ----------------------------------------------------------------------------------------

    def create_user(self, name: str, org: str | None = None, role: str = "member") -> UserRead:
        """A user in ``org`` (default: the caller's organisation) with ``role`` admin, member or viewer."""
        body: dict[str, Any] = {"name": name, "role": role}
        if org is not None:
            body["org"] = org
        return UserRead.model_validate(self.request("POST", "/users", json_body=body).json())

    def list_users(self, org: str | None = None) -> list[UserRead]:
        data = self.request("GET", "/users", params={"org": org}).json()
        return [UserRead.model_validate(u) for u in data["items"]]

    def get_user(self, user: str) -> UserRead:
        return UserRead.model_validate(self.request("GET", f"/users/{_segment(user)}").json())

    def disable_user(self, user: str) -> UserRead:
        """A disabled user's keys stop working until the user is enabled again."""
        return UserRead.model_validate(self.request("POST", f"/users/{_segment(user)}/disable").json())

    def enable_user(self, user: str) -> UserRead:
        return UserRead.model_validate(self.request("POST", f"/users/{_segment(user)}/enable").json())

    # -- access keys ----------------------------------------------------------------------------------

    def create_key(
        self,
        user: str | None = None,
        expires_in: float | timedelta | None = None,
        expires_at: datetime | str | None = None,
        description: str = "",
    ) -> KeyCreated:
        """A new access key for ``user`` (default: the caller). Its ``secret_key`` is returned now and never again."""
        if expires_in is not None and expires_at is not None:
            raise ValueError("give expires_in or expires_at, not both")
        body: dict[str, Any] = {"description": description}
        if user is not None:
            body["user"] = user
        if isinstance(expires_in, timedelta):
            expires_in = expires_in.total_seconds()
        if expires_in is not None:
            body["expires_in"] = expires_in
        if expires_at is not None:
            body["expires_at"] = _iso(expires_at)
        return KeyCreated.model_validate(self.request("POST", "/keys", json_body=body).json())

    def list_keys(self, user: str | None = None) -> list[KeyRead]:
        data = self.request("GET", "/keys", params={"user": user}).json()
        return [KeyRead.model_validate(k) for k in data["items"]]

    def disable_key(self, key: str) -> KeyRead:
        return KeyRead.model_validate(self.request("POST", f"/keys/{_segment(key)}/disable").json())

    def delete_key(self, key: str) -> None:
        self.request("DELETE", f"/keys/{_segment(key)}")

    # -- quotas ---------------------------------------------------------------------------------------

    def quota(self, org: str | None = None) -> QuotaReport:
        """Limits and current use of ``org`` (default: the caller's organisation), per category."""
        path = "/quota" if org is None else f"/orgs/{_segment(org)}/quota"
        return QuotaReport.model_validate(self.request("GET", path).json())

    def set_quota(self, org: str, category: str = "train", **fields: Any) -> QuotaReport:
        """Change the given limits of ``org`` in ``category`` (platform admins): ``gpus``, ``cpus``, ``memory``,
        ``count``, ``storage``. Fields left out stay as they are; ``None`` makes one unlimited.

        ``set_quota("acme", gpus=8, memory="512G")``; ``set_quota("acme", gpus=None)`` lifts the GPU limit.
        """
        if category not in QUOTA_CATEGORIES:
            raise ValueError(f"unknown quota category {category!r} (one of {', '.join(QUOTA_CATEGORIES)})")
        body: dict[str, Any] = {"category": category}
        body.update({field: quota_value(field, value) for field, value in fields.items()})
        return QuotaReport.model_validate(self.request("PUT", f"/orgs/{_segment(org)}/quota", json_body=body).json())

    # -- audit ----------------------------------------------------------------------------------------

    def audit(
        self,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        user: str | None = None,
        action: str | None = None,
        org: str | None = None,
        outcome: str | None = None,
        limit: int = 100,
    ) -> list[AuditRead]:
        """Audit events matching every filter given (times: datetimes, naive ones local, or ISO-8601 text)."""
        params = {
            "since": _iso(since),
            "until": _iso(until),
            "user": user,
            "action": action,
            "org": org,
            "outcome": outcome,
            "limit": limit,
        }
        return [AuditRead.model_validate(a) for a in self.request("GET", "/audit", params=params).json()["items"]]

    def servers(self) -> ServerList:
        """The servers sharing the database, live or not, and the open jobs and task leases each holds (platform
        admins): ``items`` (one ``ServerRead`` each, the live ones first) and ``now`` (the server's clock)."""
        return ServerList.model_validate(self.request("GET", "/admin/servers").json())

    # -- what a running job reports (with its KILN_JOB_TOKEN) -------------------------------------------

    def upload_artifact(self, job_id: str, path: str, data: bytes | Path) -> ArtifactRead:
        """Store ``data`` (bytes, or a file's contents) as the job's artifact ``path`` (e.g. ``model/weights.pt``)."""
        if not path.strip("/"):
            raise ValueError("an empty artifact path")
        target = f"/jobs/{_segment(job_id)}/artifacts/{quote(path.strip('/'), safe='/')}"
        headers = {"Content-Type": "application/octet-stream"}
        if isinstance(data, bytes | bytearray | memoryview):
            response = self.request("PUT", target, content=bytes(data), extra_headers=headers)
        else:
            file = Path(data)
            digest = hashlib.sha256()
            with open(file, "rb") as fh:
                while chunk := fh.read(1024 * 1024):
                    digest.update(chunk)
            headers["Content-Length"] = str(file.stat().st_size)
            response = self.request(
                "PUT", target, content=_read_chunks(file), content_sha256=digest.hexdigest(), extra_headers=headers
            )
        return ArtifactRead.model_validate(response.json())

    def append_logs(self, job_id: str, lines: list[str]) -> int:
        """Append lines to the job's log; returns how many the server stored."""
        text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
        response = self.request(
            "POST",
            f"/jobs/{_segment(job_id)}/logs",
            content=text.encode(),
            extra_headers={"Content-Type": "text/plain; charset=utf-8"},
        )
        return int(response.json()["lines"])


def _read_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        while chunk := fh.read(1024 * 1024):
            yield chunk
