"""What the dataset mixins of ``kiln.Client`` share: the client's transport they use (``TransferBase``, declared
for type checking; the client supplies it), a plain client for presigned store URLs, and ``run_all`` for calls run
on a thread pool.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

import httpx

Progress = Callable[[int], None]
DEFAULT_WORKERS = 4


def run_all(pool: ThreadPoolExecutor, calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls on the pool; on the first failure cancel what has not started and raise it."""
    futures: list[Future[Any]] = [pool.submit(call) for call in calls]
    _done, pending = wait(futures, return_when=FIRST_EXCEPTION)
    for future in pending:
        future.cancel()
    for future in futures:
        if future.done() and not future.cancelled() and future.exception() is not None:
            wait(pending)
            raise future.exception()  # type: ignore[misc]
    return [f.result() for f in futures]


class TransferBase:
    """The transport of ``kiln.Client`` as the dataset mixins see it, and their client for the object store."""

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

        @staticmethod
        def _raise_for(response: httpx.Response) -> None: ...

    _store_client: httpx.Client | None = None

    def _store_http(self) -> httpx.Client:
        """A plain client for presigned store URLs: Kiln's signature headers never go to the store."""
        if self._store_client is None:
            limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
            self._store_client = httpx.Client(timeout=httpx.Timeout(120.0, connect=10.0), limits=limits)
        return self._store_client
