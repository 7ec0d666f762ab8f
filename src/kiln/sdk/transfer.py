"""What the dataset mixins of ``kiln.Client`` share: the client's transport (``ClientTransport``) with a plain
client for presigned store URLs (``TransferBase``), and ``run_all`` for calls run on a thread pool.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

import httpx

from kiln.sdk.transport import ClientTransport

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


class TransferBase(ClientTransport):
    """The dataset mixins' base: the client's transport, and their own client for the object store."""

    _store_client: httpx.Client | None = None

    def _store_http(self) -> httpx.Client:
        """A plain client for presigned store URLs: Kiln's signature headers never go to the store."""
        if self._store_client is None:
            limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
            self._store_client = httpx.Client(timeout=httpx.Timeout(120.0, connect=10.0), limits=limits)
        return self._store_client
