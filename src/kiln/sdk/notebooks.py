"""Notebooks: a mixin of ``kiln.Client``. A notebook is JupyterLab in a runtime on the platform's machines, reached
only through Kiln's authenticated proxy.

    nb = client.create_notebook({"name": "explore", "runtime": {"framework": "pytorch"}, "idle_timeout": "2h"})
    client.wait_notebook("explore")                 # until JupyterLab answers (RUNNING)
    client.notebook_request("explore", "GET", "api/contents")   # JupyterLab's REST API, signed, through Kiln
    client.stop_notebook("explore"); client.start_notebook("explore")   # its home is kept in between
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from kiln.domain.idempotency import new_key
from kiln.domain.notebooks import NotebookList, NotebookRead, NotebookSpec, NotebookState
from kiln.sdk.transport import ClientTransport

if TYPE_CHECKING:
    import httpx

GAVE_UP = (NotebookState.STOPPED, NotebookState.FAILED)  # a start that will not come up by itself


def _path(ref: str) -> str:
    return f"/notebooks/{quote(ref, safe='')}"


class NotebooksMixin(ClientTransport):
    """The notebook methods of ``kiln.Client``."""

    if TYPE_CHECKING:

        def signed_headers(self, method: str, url_path: str, query: str = "", body: bytes = b"") -> dict[str, str]: ...

        def _raise_for(self, response: httpx.Response) -> None: ...

    def create_notebook(
        self, spec: NotebookSpec | dict[str, Any], *, idempotency_key: str | None = None
    ) -> NotebookRead:
        """Create a notebook and start it (STARTING until JupyterLab answers: ``wait_notebook``)."""
        spec = spec if isinstance(spec, NotebookSpec) else NotebookSpec.model_validate(spec)
        key = new_key() if idempotency_key is None else idempotency_key
        body = spec.model_dump(mode="json", exclude_none=True)
        return NotebookRead.model_validate(
            self.request("POST", "/notebooks", json_body=body, idempotency_key=key).json()
        )

    def list_notebooks(self) -> list[NotebookRead]:
        return NotebookList.model_validate(self.request("GET", "/notebooks").json()).items

    def get_notebook(self, ref: str) -> NotebookRead:
        """A notebook by name or id."""
        return NotebookRead.model_validate(self.request("GET", _path(ref)).json())

    def start_notebook(self, ref: str) -> NotebookRead:
        return NotebookRead.model_validate(self.request("POST", _path(ref) + "/start").json())

    def stop_notebook(self, ref: str) -> NotebookRead:
        return NotebookRead.model_validate(self.request("POST", _path(ref) + "/stop").json())

    def delete_notebook(self, ref: str) -> None:
        self.request("DELETE", _path(ref))

    def wait_notebook(
        self, ref: str, state: NotebookState | str = NotebookState.RUNNING, timeout: float = 600.0
    ) -> NotebookRead:
        """Until the notebook is in ``state`` (RUNNING by default), or settled elsewhere (STOPPED, FAILED: returned,
        its message says why), or ``timeout`` (TimeoutError naming where it stands)."""
        wanted = NotebookState(state)
        deadline = time.monotonic() + timeout
        while True:
            notebook = self.get_notebook(ref)
            if notebook.state is wanted or (wanted is NotebookState.RUNNING and notebook.state in GAVE_UP):
                return notebook
            if time.monotonic() > deadline:
                raise TimeoutError(f"notebook {ref} is {notebook.state} after {timeout:g}s: {notebook.message}")
            time.sleep(0.5)

    def notebook_request(
        self, notebook_id: str, method: str, subpath: str, *, json_body: Any = None, content: bytes | None = None
    ) -> httpx.Response:
        """A request to the notebook's JupyterLab (``subpath`` below ``/notebooks/{id}/``, e.g. ``api/contents``),
        signed, through Kiln's proxy. A refusal of Kiln's (not signed in, another user's notebook, not running)
        raises its error; JupyterLab's own answers are returned as they are."""
        import json

        body = json.dumps(json_body).encode() if json_body is not None else (content or b"")
        path, _, query = f"/notebooks/{notebook_id}/{subpath}".partition("?")
        headers = self.signed_headers(method, path, query, body)
        if json_body is not None:
            headers["Content-Type"] = "application/json"
        response = self._http.request(method, path + (f"?{query}" if query else ""), content=body, headers=headers)
        if response.status_code >= 400 and response.headers.get("content-type", "").startswith("application/json"):
            try:
                code = response.json().get("code")
            except ValueError:
                code = None
            if isinstance(code, str):  # Kiln's own error body (JupyterLab's have no "code")
                self._raise_for(response)
        return response

    def notebook_websocket_headers(self, notebook_id: str, subpath: str) -> dict[str, str]:
        """The headers that authenticate a WebSocket to the notebook (a kernel's channels): its handshake, signed
        as a GET with no body. Open it with any WebSocket client at ``ws(s)://<endpoint>/notebooks/{id}/{subpath}``."""
        path, _, query = f"/notebooks/{notebook_id}/{subpath}".partition("?")
        return self.signed_headers("GET", path, query)
