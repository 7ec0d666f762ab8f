"""A predict changes nothing: the signature middleware audits it only when it is refused (403, 404), where every
other POST is audited whatever its outcome. One audit row per answered predict was one SQLite write transaction
per request, and at serving rates those writes held every worker thread, behind which a predict's own lookups
waited (issue 26: a p99 32 times the p50 at 16 clients)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from starlette.testclient import TestClient

from kiln.api.auth import SignatureMiddleware
from kiln.api.errors import install_error_handlers
from kiln.errors import NotFound
from kiln.usecases.access.audit import AuditEntry
from kiln.usecases.access.identity import Principal

CALLER = Principal(
    user_id="usr-1",
    user_name="ann",
    org_id="org-1",
    org_name="alpha",
    key_id="AKTEST",
    role="member",
    platform_admin=False,
)


class Identity:
    """Every request is the member above, checked without the database."""

    def authenticate_nonblocking(self, **request: Any) -> Principal:
        return CALLER

    def refresh_due(self, key_id: str) -> bool:
        return False


class Limiter:
    def acquire(self, key_id: str) -> float:
        return 0.0


class Audit:
    def __init__(self) -> None:
        self.entries: list[AuditEntry] = []

    def record(self, entry: AuditEntry) -> None:
        self.entries.append(entry)


class Platform:
    def __init__(self) -> None:
        self.identity = Identity()
        self.rate_limiter = Limiter()
        self.audit = Audit()


def app() -> FastAPI:
    application = FastAPI()
    install_error_handlers(application)

    @application.post("/api/v1/services/{service}/predict")
    async def predict(service: str, request: Request) -> dict[str, Any]:
        if service == "missing":
            raise NotFound(f"no service {service}")
        return {"outputs": [len(await request.body())], "model": "m@1"}

    @application.post("/api/v1/jobs", status_code=201)
    async def submit_job() -> dict[str, str]:
        return {"id": "job-1"}

    application.add_middleware(SignatureMiddleware)
    application.state.platform = Platform()
    return application


def signed(client: TestClient, path: str) -> int:
    return client.post(path, json={"inputs": [[1.0]]}, headers={"Authorization": "KILN-HMAC-SHA256 ..."}).status_code


def test_an_answered_predict_is_not_audited_a_refused_one_is() -> None:
    application = app()
    audit = application.state.platform.audit
    with TestClient(application) as client:
        for _ in range(3):
            assert signed(client, "/api/v1/services/digits/predict") == 200
        assert audit.entries == []
        assert signed(client, "/api/v1/services/missing/predict") == 404
    assert [(e.action, e.outcome, e.status, e.key_id) for e in audit.entries] == [("predict", "denied", 404, "AKTEST")]


def test_another_post_is_still_audited_when_it_succeeds() -> None:
    application = app()
    audit = application.state.platform.audit
    with TestClient(application) as client:
        assert signed(client, "/api/v1/jobs") == 201
    assert [(e.action, e.outcome, e.resource) for e in audit.entries] == [("submit_job", "success", "id=job-1")]
