"""Who may do what: roles, their permissions, and the job-token scope. Pure data and functions.

Roles live per user inside one organisation; ``platform_admin`` is a flag on top that grants everything in every
organisation. A job token (a running job calling back) holds only ``jobs:read`` and ``jobs:report`` and only for
its own job.
"""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    ADMIN = "admin"  # organisation admin
    MEMBER = "member"
    VIEWER = "viewer"


READ = frozenset(
    {
        "jobs:read",
        "studies:read",
        "services:read",
        "notebooks:read",
        "models:read",
        "blobs:read",
        "runtimes:read",
        "orgs:read",
        "quota:read",
        "keys:read",
        "runs:read",
        "pipelines:read",
    }
)
MEMBER = READ | {
    "jobs:write",
    "studies:write",
    "services:write",
    "services:predict",
    "notebooks:write",
    "models:write",
    "jobs:report",
    "blobs:write",
    "keys:self",
    "runs:write",
    "pipelines:write",
}
ADMIN = MEMBER | {"users:read", "users:manage", "keys:manage", "audit:read", "usage:read"}
PLATFORM = ADMIN | {"orgs:manage", "quota:set", "runtimes:install", "prices:set", "servers:read"}
JOB_TOKEN = frozenset({"jobs:read", "jobs:report"})
SERVICE_TOKEN = frozenset({"services:predict"})  # an application calling one service, nothing else

ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    Role.VIEWER: READ,
    Role.MEMBER: MEMBER,
    Role.ADMIN: ADMIN,
}


def permissions(role: str, platform_admin: bool) -> frozenset[str]:
    if platform_admin:
        return PLATFORM
    return ROLE_PERMISSIONS.get(role, frozenset())
