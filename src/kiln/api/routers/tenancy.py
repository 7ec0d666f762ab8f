"""Organisations, users, access keys, quotas and the audit trail."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Response

from kiln.api.deps import Caller, Kiln
from kiln.domain.schemas import (
    AuditList,
    KeyCreate,
    KeyCreated,
    KeyList,
    KeyRead,
    OrgCreate,
    OrgList,
    OrgRead,
    OrgUpdate,
    QuotaReport,
    QuotaSet,
    UserCreate,
    UserList,
    UserRead,
)

orgs = APIRouter(prefix="/orgs", tags=["organisations"])
users = APIRouter(prefix="/users", tags=["users"])
keys = APIRouter(prefix="/keys", tags=["access keys"])
quota = APIRouter(prefix="/quota", tags=["quotas"])
audit = APIRouter(prefix="/audit", tags=["audit"])
routers = (orgs, users, keys, quota, audit)


@orgs.post("", response_model=OrgRead, status_code=201, summary="Create an organisation (platform admin)")
def create_org(body: OrgCreate, caller: Caller, kiln: Kiln) -> OrgRead:
    return kiln.accounts.create_org(caller, body.name)


@orgs.get("", response_model=OrgList, summary="Organisations the caller can see")
def list_orgs(caller: Caller, kiln: Kiln) -> OrgList:
    return OrgList(items=kiln.accounts.list_orgs(caller))


@orgs.get("/{org}", response_model=OrgRead)
def get_org(org: str, caller: Caller, kiln: Kiln) -> OrgRead:
    return kiln.accounts.get_org(caller, org)


@orgs.patch("/{org}", response_model=OrgRead, summary="Scheduling settings of an organisation (platform admin)")
def update_org(org: str, body: OrgUpdate, caller: Caller, kiln: Kiln) -> OrgRead:
    return kiln.accounts.update_org(caller, org, body)


@orgs.get("/{org}/quota", response_model=QuotaReport, summary="Limits and usage of an organisation")
def get_org_quota(org: str, caller: Caller, kiln: Kiln) -> QuotaReport:
    return kiln.quotas.report(caller, org)


@orgs.put("/{org}/quota", response_model=QuotaReport, summary="Set limits (platform admin); null = unlimited")
def set_org_quota(org: str, body: QuotaSet, caller: Caller, kiln: Kiln) -> QuotaReport:
    return kiln.quotas.set(caller, org, body)


@quota.get("", response_model=QuotaReport, summary="Limits and usage of the caller's organisation")
def my_quota(caller: Caller, kiln: Kiln) -> QuotaReport:
    return kiln.quotas.report(caller)


@users.post("", response_model=UserRead, status_code=201, summary="Create a user (org admin: own org)")
def create_user(body: UserCreate, caller: Caller, kiln: Kiln) -> UserRead:
    return kiln.accounts.create_user(caller, body)


@users.get("", response_model=UserList)
def list_users(caller: Caller, kiln: Kiln, org: Annotated[str | None, Query()] = None) -> UserList:
    return UserList(items=kiln.accounts.list_users(caller, org))


@users.get("/{user}", response_model=UserRead)
def get_user(user: str, caller: Caller, kiln: Kiln) -> UserRead:
    return kiln.accounts.get_user(caller, user)


@users.post("/{user}/disable", response_model=UserRead, summary="Disable a user: all their keys stop working")
def disable_user(user: str, caller: Caller, kiln: Kiln) -> UserRead:
    return kiln.accounts.set_user_disabled(caller, user, True)


@users.post("/{user}/enable", response_model=UserRead)
def enable_user(user: str, caller: Caller, kiln: Kiln) -> UserRead:
    return kiln.accounts.set_user_disabled(caller, user, False)


@keys.post("", response_model=KeyCreated, status_code=201, summary="Create an access key; the secret is shown once")
def create_key(body: KeyCreate, caller: Caller, kiln: Kiln) -> KeyCreated:
    return kiln.accounts.create_key(caller, body)


@keys.get("", response_model=KeyList, summary="Access keys (never their secrets)")
def list_keys(caller: Caller, kiln: Kiln, user: Annotated[str | None, Query()] = None) -> KeyList:
    return KeyList(items=kiln.accounts.list_keys(caller, user))


@keys.post("/{key}/disable", response_model=KeyRead)
def disable_key(key: str, caller: Caller, kiln: Kiln) -> KeyRead:
    return kiln.accounts.disable_key(caller, key)


@keys.delete("/{key}", status_code=204, response_class=Response)
def delete_key(key: str, caller: Caller, kiln: Kiln) -> Response:
    kiln.accounts.delete_key(caller, key)
    return Response(status_code=204)


@audit.get("", response_model=AuditList, summary="Mutating requests and failed authentications")
def list_audit(
    caller: Caller,
    kiln: Kiln,
    since: Annotated[datetime | None, Query()] = None,
    until: Annotated[datetime | None, Query()] = None,
    user: Annotated[str | None, Query(description="User id or name")] = None,
    action: Annotated[str | None, Query(description="Substring of the action")] = None,
    org: Annotated[str | None, Query(description="Organisation id or name (platform admin)")] = None,
    outcome: Annotated[str | None, Query(description="success, failed, denied or unauthenticated")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> AuditList:
    items = kiln.audit.query(
        caller, since=since, until=until, user=user, action=action, org=org, outcome=outcome, limit=limit
    )
    return AuditList(items=items)
