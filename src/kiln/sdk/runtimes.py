"""The runtime catalog: list it, install a runtime ahead of its first job, and follow that build (its state and its
log). A mixin of ``kiln.Client``.

    detail = client.install_runtime("pytorch")            # returns at once; the server builds in the background
    for line in client.runtime_log_lines(detail.name, follow=True):
        print(line)                                        # '<time> <O|E|K> <text>', as the build writes them
    detail = client.wait_runtime(detail.name)              # .build.state: succeeded or failed
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from urllib.parse import quote

from kiln.domain.runtime_builds import RuntimeDetail
from kiln.domain.schemas import RuntimeRead
from kiln.errors import KilnError
from kiln.sdk.transport import ClientTransport


def _name(name: str) -> str:
    if not name:
        raise ValueError("an empty runtime name")
    return quote(name, safe="")


def building(detail: RuntimeDetail, build_id: str | None = None) -> bool:
    """Whether ``detail`` says a build is still on: build ``build_id`` (default: the latest one started through
    the API) running, or, with no such build running, a job's first use building the runtime."""
    build = detail.build
    if build is not None and (build_id is None or build.id == build_id) and build.state == "running":
        return True
    return detail.status == "installing" and (build is None or build.state != "running") and build_id is None


class RuntimesMixin(ClientTransport):
    """Runtime catalog calls of ``kiln.Client``."""

    def runtimes(self) -> list[RuntimeRead]:
        """Every catalog runtime and its status on the server."""
        return [RuntimeRead.model_validate(r) for r in self.request("GET", "/runtimes").json()["items"]]

    def runtime(self, name: str) -> RuntimeDetail:
        """One runtime (``pytorch-2.13``, or a framework's default: ``pytorch``) with its latest build."""
        return RuntimeDetail.model_validate(self.request("GET", f"/runtimes/{_name(name)}").json())

    def install_runtime(self, framework: str, version: str | None = None) -> RuntimeDetail:
        """Start building a runtime on the server (platform admins); returns at once. ``build`` is the build that
        is now on (none when the runtime was installed already)."""
        r = self.request("POST", f"/runtimes/{_name(framework)}/install", params={"version": version})
        return RuntimeDetail.model_validate(r.json())

    def read_runtime_log(self, name: str, offset: int = 0) -> tuple[bytes, int, bool]:
        """(whole log lines of the runtime's latest build from ``offset``, next offset, build ended and all read)."""
        r = self.request("GET", f"/runtimes/{_name(name)}/log", params={"offset": offset})
        return r.content, int(r.headers["X-Kiln-Next-Offset"]), r.headers.get("X-Kiln-Build-Ended") == "true"

    def runtime_log_lines(
        self, name: str, *, follow: bool = False, offset: int = 0, poll: float = 1.0
    ) -> Iterator[str]:
        """The build log's lines (``<time> <O|E|K> <text>``); with ``follow``, as they are written until the
        build ends."""
        while True:
            data, next_offset, ended = self.read_runtime_log(name, offset)
            if data:
                yield from data.decode(errors="replace").split("\n")[:-1]
                offset = next_offset
                continue
            if ended or not follow:
                return
            time.sleep(poll)

    def wait_runtime(
        self,
        name: str,
        *,
        build_id: str | None = None,
        timeout: float | None = None,
        poll: float = 1.0,
        progress: Callable[[RuntimeDetail], None] | None = None,
    ) -> RuntimeDetail:
        """Poll until the build is over (``build_id``, default: whatever is building the runtime) and return the
        runtime; ``progress`` sees every poll. KilnError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            detail = self.runtime(name)
            if progress is not None:
                progress(detail)
            if not building(detail, build_id):
                return detail
            if deadline is not None and time.monotonic() > deadline:
                raise KilnError(f"runtime {detail.name} still building after {timeout:g}s")
            time.sleep(poll)
