"""One error tree for server and SDK.

Every error has a stable ``code`` (part of the API contract) and an HTTP status. The server maps them to JSON
bodies ``{"code": ..., "message": ..., "details": ...}`` in one handler; the SDK turns such bodies back into the
same classes, so callers catch ``kiln.errors.NotFound`` whichever side raised it.

The registry of codes cannot miss a class: every subclass registers itself as it is defined
(``KilnError.__init_subclass__``), and one with a code of its own must be defined here, in the module the SDK
imports, or its definition fails. A server-side refinement that only carries more for the server's own use
(``AuthFailure``: whose key was tried, for the audit log) declares ``refines_code=True``: it is sent with its
parent's code and rebuilt as the parent, which ``except`` clauses on both sides catch alike.
"""

from __future__ import annotations

from typing import Any, ClassVar

# code -> class, filled as each class is defined (KilnError.__init_subclass__).
ERRORS_BY_CODE: dict[str, type[KilnError]] = {}


class KilnError(Exception):
    """Base of all Kiln errors."""

    code: ClassVar[str] = "internal"
    status: ClassVar[int] = 500

    def __init_subclass__(cls, *, refines_code: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if refines_code:
            if "code" in cls.__dict__:
                raise TypeError(f"{cls.__qualname__}: refines_code=True sends its parent's code; it declares none")
            return
        if "code" not in cls.__dict__:
            raise TypeError(
                f"{cls.__qualname__} declares no code of its own: the SDK would rebuild it as its parent "
                "(declare a code, or refines_code=True for a server-side refinement)"
            )
        if cls.__module__ != __name__:
            raise TypeError(
                f"{cls.__module__}.{cls.__qualname__} (code {cls.code!r}) is defined outside kiln.errors: the SDK "
                "imports only kiln.errors, so it could not rebuild it; define it there (and import it here)"
            )
        existing = ERRORS_BY_CODE.get(cls.code)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise TypeError(f"code {cls.code!r} of {cls.__qualname__} is already {existing.__qualname__}'s")
        ERRORS_BY_CODE[cls.code] = cls

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


class ArchiveLinkEscapes(InvalidArchive):
    """A code bundle's link that leaves it once resolved through the bundle's other links: well-formed, refused."""

    code = "archive_link_escapes"
    status = 422


class DigestMismatch(BadRequest):
    code = "digest_mismatch"


class Unauthenticated(KilnError):
    code = "unauthenticated"
    status = 401


class Forbidden(KilnError):
    code = "forbidden"
    status = 403


class BudgetExceeded(Forbidden):
    """New work refused: a hard monthly budget of the organisation (or the member) is spent."""

    code = "budget_exceeded"


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


class DatabaseUnavailable(Unavailable):
    """The server cannot reach its database now (refused, timed out, the connection lost: PostgreSQL stopped,
    restarting or cut off). Nothing was half-written: the request's transaction rolled back, and the same request
    sent again (a create with its ``Idempotency-Key``) once the database is back does what it would have done
    (``details.retry_after``: seconds to wait)."""

    code = "database_unavailable"


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


class NoReplica(KilnError):
    """A service has no replica ready to answer (``details.retry_after``: seconds to wait)."""

    code = "no_replica"
    status = 503


class NotebookUnavailable(KilnError):
    """A notebook's JupyterLab did not answer Kiln's proxy (it is stopping, or it died)."""

    code = "notebook_unavailable"
    status = 502


class PredictFailed(KilnError):
    """A replica took the prediction and failed it, or could not be reached."""

    code = "predict_error"
    status = 502


class CsrfRefused(Forbidden):
    """A change authenticated by the console's session cookie without its CSRF token."""

    code = "csrf"


class BackendUnavailable(KilnError):
    """The backend that ``KILN_BACKEND`` (or a request) names is not registered, or cannot be loaded."""

    code = "backend_unavailable"
    status = 503


ERRORS_BY_CODE[KilnError.code] = KilnError

# An answer without a code Kiln knows (a proxy's, or a newer server's code): the class its status means.
_BY_STATUS: dict[int, type[KilnError]] = {
    cls.status: cls
    for cls in (
        InvalidInput,
        BadRequest,
        Unauthenticated,
        Forbidden,
        NotFound,
        Conflict,
        PayloadTooLarge,
        RateLimited,
        Unavailable,
    )
}


def error_from_body(status: int, body: Any) -> KilnError:
    """Rebuild the error a server sent (used by the SDK): the class of its code, with its message and details."""
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        cls = ERRORS_BY_CODE.get(body["code"]) or _BY_STATUS.get(status, KilnError)
        return cls(str(body.get("message", "")), details=body.get("details"))
    fallback = _BY_STATUS.get(status, KilnError)
    return fallback(f"HTTP {status}: {str(body)[:500]}" if body else f"HTTP {status}")
