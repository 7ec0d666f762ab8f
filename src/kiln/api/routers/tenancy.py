"""Organisations, users, access keys, quotas and the audit trail."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Response

from kiln.api.deps import Caller, Kiln
from kiln.api.params import KeyId, OrgQuery, OrgRef, Time, UserQuery, UserRef
from kiln.api.responses import errors, links
from kiln.domain import limits
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
from kiln.errors import InvalidInput

orgs = APIRouter(prefix="/orgs", tags=["organisations"], responses=errors(403))
users = APIRouter(prefix="/users", tags=["users"], responses=errors(403))
keys = APIRouter(prefix="/keys", tags=["access keys"], responses=errors(403))
quota = APIRouter(prefix="/quota", tags=["quotas"], responses=errors(403))
audit = APIRouter(prefix="/audit", tags=["audit"], responses=errors(403))
routers = (orgs, users, keys, quota, audit)
ORG = {"org": "$response.body#/id"}
USER = {"user": "$response.body#/id"}
KEY = {"key": "$response.body#/id"}


@orgs.post(
    "",
    response_model=OrgRead,
    status_code=201,
    summary="Create an organisation (platform admin)",
    responses={
        **errors(400, 409, 422),
        **links(201, "The organisation", get_org=ORG, update_org=ORG, get_org_quota=ORG, set_org_quota=ORG),
    },
)
def create_org(body: OrgCreate, caller: Caller, kiln: Kiln) -> OrgRead:
    return kiln.accounts.create_org(caller, body.name)


@orgs.get("", response_model=OrgList, summary="Organisations the caller can see")
def list_orgs(caller: Caller, kiln: Kiln) -> OrgList:
    return OrgList(items=kiln.accounts.list_orgs(caller))


@orgs.get("/{org}", response_model=OrgRead, responses=errors(404, 422))
def get_org(org: OrgRef, caller: Caller, kiln: Kiln) -> OrgRead:
    return kiln.accounts.get_org(caller, org)


@orgs.patch(
    "/{org}",
    response_model=OrgRead,
    summary="Scheduling settings of an organisation (platform admin)",
    responses=errors(400, 404, 422),
)
def update_org(org: OrgRef, body: OrgUpdate, caller: Caller, kiln: Kiln) -> OrgRead:
    return kiln.accounts.update_org(caller, org, body)


@orgs.get(
    "/{org}/quota",
    response_model=QuotaReport,
    summary="Limits and usage of an organisation",
    responses=errors(404, 422),
)
def get_org_quota(org: OrgRef, caller: Caller, kiln: Kiln) -> QuotaReport:
    return kiln.quotas.report(caller, org)


@orgs.put(
    "/{org}/quota",
    response_model=QuotaReport,
    summary="Set limits (platform admin); null = unlimited",
    responses=errors(400, 404, 422),
)
def set_org_quota(org: OrgRef, body: QuotaSet, caller: Caller, kiln: Kiln) -> QuotaReport:
    return kiln.quotas.set(caller, org, body)


@quota.get("", response_model=QuotaReport, summary="Limits and usage of the caller's organisation")
def my_quota(caller: Caller, kiln: Kiln) -> QuotaReport:
    return kiln.quotas.report(caller)


@users.post(
    "",
    response_model=UserRead,
    status_code=201,
    summary="Create a user (org admin: own org)",
    responses={
        **errors(400, 404, 409, 422),
        **links(201, "The user", get_user=USER, disable_user=USER, enable_user=USER),
    },
)
def create_user(body: UserCreate, caller: Caller, kiln: Kiln) -> UserRead:
    return kiln.accounts.create_user(caller, body)


@users.get("", response_model=UserList, responses=errors(404, 422))
def list_users(caller: Caller, kiln: Kiln, org: OrgQuery = None) -> UserList:
    return UserList(items=kiln.accounts.list_users(caller, org))


@users.get("/{user}", response_model=UserRead, responses=errors(404, 422))
def get_user(user: UserRef, caller: Caller, kiln: Kiln) -> UserRead:
    return kiln.accounts.get_user(caller, user)


@users.post(
    "/{user}/disable",
    response_model=UserRead,
    summary="Disable a user: all their keys stop working",
    responses=errors(404, 409, 422),
)
def disable_user(user: UserRef, caller: Caller, kiln: Kiln) -> UserRead:
    return kiln.accounts.set_user_disabled(caller, user, True)


@users.post("/{user}/enable", response_model=UserRead, responses=errors(404, 409, 422))
def enable_user(user: UserRef, caller: Caller, kiln: Kiln) -> UserRead:
    return kiln.accounts.set_user_disabled(caller, user, False)


@keys.post(
    "",
    response_model=KeyCreated,
    status_code=201,
    summary="Create an access key; the secret is shown once",
    responses={**errors(400, 404, 422), **links(201, "The key, with its secret", disable_key=KEY, delete_key=KEY)},
)
def create_key(body: KeyCreate, caller: Caller, kiln: Kiln) -> KeyCreated:
    return kiln.accounts.create_key(caller, body)


@keys.get("", response_model=KeyList, summary="Access keys (never their secrets)", responses=errors(404, 422))
def list_keys(caller: Caller, kiln: Kiln, user: UserQuery = None) -> KeyList:
    return KeyList(items=kiln.accounts.list_keys(caller, user))


@keys.post("/{key}/disable", response_model=KeyRead, responses=errors(404, 409, 422))
def disable_key(key: KeyId, caller: Caller, kiln: Kiln) -> KeyRead:
    return kiln.accounts.disable_key(caller, key)


@keys.delete("/{key}", status_code=204, response_class=Response, responses=errors(404, 409, 422))
def delete_key(key: KeyId, caller: Caller, kiln: Kiln) -> Response:
    kiln.accounts.delete_key(caller, key)
    return Response(status_code=204)


def _utc(value: datetime | None, name: str) -> datetime | None:
    """A time from the query in UTC: one without a zone is taken as UTC; one that has no UTC equivalent (year 9999
    at a negative offset) is a 422."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        message = "out of range in UTC"
        raise InvalidInput(
            f"invalid request: query.{name}: {message}", details=[{"field": f"query.{name}", "message": message}]
        ) from None


@audit.get(
    "",
    response_model=AuditList,
    summary="Mutating requests and failed authentications",
    responses=errors(404, 422),
)
def list_audit(
    caller: Caller,
    kiln: Kiln,
    since: Annotated[Time, Query(description="From this time on (UTC if it gives no zone)")] = None,
    until: Annotated[Time, Query(description="Up to this time (UTC if it gives no zone)")] = None,
    user: UserQuery = None,
    action: Annotated[str | None, Query(max_length=96, description="Substring of the action")] = None,
    org: OrgQuery = None,
    outcome: Annotated[
        str | None, Query(max_length=32, description="success, failed, denied or unauthenticated")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=limits.MAX_AUDIT_PAGE_SIZE)] = 100,
) -> AuditList:
    items = kiln.audit.query(
        caller,
        since=_utc(since, "since"),
        until=_utc(until, "until"),
        user=user,
        action=action,
        org=org,
        outcome=outcome,
        limit=limit,
    )
    return AuditList(items=items)
