"""One error tree for server and SDK.

Every error has a stable ``code`` (part of the API contract) and an HTTP status. The server maps them to JSON
bodies ``{"code": ..., "message": ..., "details": ...}`` in one handler; the SDK turns such bodies back into the
same classes, so callers catch ``kiln.errors.NotFound`` whichever side raised it.
"""

from __future__ import annotations

from typing import Any, ClassVar


class KilnError(Exception):
    """Base of all Kiln errors."""

    code: ClassVar[str] = "internal"
    status: ClassVar[int] = 500

    def __init__(self, message: str, *, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details is not None:
            body["details"] = self.details
        return body


class InvalidInput(KilnError):
    code = "invalid_input"
    status = 422


class BadRequest(KilnError):
    code = "bad_request"
    status = 400


class InvalidArchive(BadRequest):
    code = "invalid_archive"


class DigestMismatch(BadRequest):
    code = "digest_mismatch"


class Unauthenticated(KilnError):
    code = "unauthenticated"
    status = 401


class Forbidden(KilnError):
    code = "forbidden"
    status = 403


class NotFound(KilnError):
    code = "not_found"
    status = 404


class Conflict(KilnError):
    code = "conflict"
    status = 409


class IllegalTransition(Conflict):
    code = "illegal_transition"


class PayloadTooLarge(KilnError):
    code = "payload_too_large"
    status = 413


class RateLimited(KilnError):
    code = "rate_limited"
    status = 429


class Unavailable(KilnError):
    code = "unavailable"
    status = 503


class StoreUnavailable(Unavailable):
    """The object store (a local directory or an S3-compatible service) cannot be reached, or is full."""

    code = "store_unavailable"


class BackendError(KilnError):
    """A backend failed to act; ``retryable`` says whether trying again later may succeed."""

    code = "backend_error"
    status = 502

    def __init__(self, message: str, *, retryable: bool = False, details: Any = None) -> None:
        super().__init__(message, details=details)
        self.retryable = retryable


class RuntimeUnavailable(KilnError):
    code = "runtime_unavailable"
    status = 422


def _all_subclasses(cls: type[KilnError]) -> list[type[KilnError]]:
    out: list[type[KilnError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


ERRORS_BY_CODE: dict[str, type[KilnError]] = {KilnError.code: KilnError}
ERRORS_BY_CODE.update({c.code: c for c in _all_subclasses(KilnError)})


def error_from_body(status: int, body: Any) -> KilnError:
    """Rebuild the error a server sent (used by the SDK)."""
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        cls = ERRORS_BY_CODE.get(body["code"], KilnError)
        return cls(str(body.get("message", "")), details=body.get("details"))
    by_status = {
        cls.status: cls
        for cls in (
            InvalidInput,
            BadRequest,
            Unauthenticated,
            Forbidden,
            NotFound,
            Conflict,
            PayloadTooLarge,
            Unavailable,
        )
    }
    fallback = by_status.get(status, KilnError)
    return fallback(f"HTTP {status}: {str(body)[:500]}" if body else f"HTTP {status}")
