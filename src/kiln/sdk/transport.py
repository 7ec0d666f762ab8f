"""The transport of ``kiln.Client`` as its mixins (tenancy, datasets) see it: declarations for type checking
only, since ``Client`` defines them. Importing this costs nothing (no httpx at run time), so the CLI's start-up
does not pay for the HTTP stack until a command talks to a server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx


class ClientTransport:
    """The transport of ``kiln.Client`` as its mixins see it (declarations only: ``Client`` defines them)."""

    if TYPE_CHECKING:
        endpoint: str
        _http: httpx.Client

        def request(
            self,
            method: str,
            path: str,
            *,
            params: dict[str, Any] | None = None,
            json_body: Any = None,
            content: Any = None,
            unsigned: bool = False,
            content_sha256: str | None = None,
            extra_headers: dict[str, str] | None = None,
            idempotency_key: str | None = None,
            retry: bool | None = None,
        ) -> httpx.Response: ...

        def _prepare(
            self,
            method: str,
            path: str,
            params: dict[str, Any] | None,
            body: bytes | None,
            unsigned: bool,
            content_sha256: str | None = None,
        ) -> tuple[str, dict[str, str]]: ...

        def _raise_for(self, response: httpx.Response) -> None: ...
