"""The web console: its built bundle served at ``/`` (docs/console.md).

``make console`` builds ``console/`` (Vite) into ``kiln/api/console_dist`` (package data, so a wheel built after it
ships the console; ``KILN_CONSOLE_DIR`` names another directory). The server answers from it only what no route
answers, as the router's fallback instead of a catch-all route, so that every route (and every 405) is as before:

- ``/assets/<file>``: the bundle's content-hashed files, cached for a year (a new build has new names);
- another file at the bundle's top (a favicon): served, revalidated on each use;
- any other ``GET`` outside ``/api``: ``index.html``, for the console's client-side routes (``/jobs/job-...``).

Without an ``index.html`` there the server runs API only, says so once at start, and ``/`` answers 404 with the
hint to build it.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from kiln.settings import Settings

PACKAGE_DIST = Path(__file__).resolve().parent / "console_dist"
NOT_BUILT = "console not built: run `make console`"
NOT_BUILT_HINT = f"{NOT_BUILT} (the server runs API only: /api/v1, its documentation at /api/v1/docs)"
ASSETS = "assets/"
# Vite names every file under assets/ by a hash of its content: a year, and never revalidated.
ASSET_HEADERS = {"Cache-Control": "public, max-age=31536000, immutable", "X-Content-Type-Options": "nosniff"}
# The page (and any top-level file) is revalidated each time, so a new build is seen at the next load. The
# console's own scripts and styles only, requests only to this server, no framing.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
PAGE_HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


# MLflow's UI lives at the tracking URI's root; its client prints ``<uri>/#/experiments/E/runs/R`` for each run.
MLFLOW_UI_PATHS = ("/mlflow", "/mlflow/")


def console_dir(settings: Settings) -> Path:
    """Where the built console is: KILN_CONSOLE_DIR, else the package's console_dist."""
    return settings.console_dir or PACKAGE_DIST


def console_built(directory: Path) -> bool:
    return (directory / "index.html").is_file()


def _is_api(path: str) -> bool:
    return path == "/api" or path.startswith("/api/")


def _file_in(root: Path, relative: str) -> Path | None:
    """``root/relative`` if it is a file inside ``root`` (no ``..`` or link leads out), else None."""
    if not relative or "\x00" in relative:
        return None
    base = root.resolve()
    try:
        candidate = (base / relative).resolve()
    except (OSError, RuntimeError):  # a link loop
        return None
    if not candidate.is_relative_to(base) or not candidate.is_file():
        return None
    return candidate


class ConsoleFallback:
    """The router's ``default``: what answers a request no route matched. Serves the console for ``GET`` and
    ``HEAD`` outside ``/api``; everything else goes to ``not_found`` (the API's JSON 404)."""

    def __init__(self, directory: Path, not_found: ASGIApp) -> None:
        self.directory = directory
        self.not_found = not_found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD") or _is_api(path):
            await self.not_found(scope, receive, send)
            return
        response = self.response(path)
        if response is None:
            await self.not_found(scope, receive, send)
            return
        await response(scope, receive, send)

    async def page(self, request: Request) -> Response:
        """The console's page itself, whatever the path (a route for addresses another app owns the rest of)."""
        return self.response("/") or JSONResponse({"code": "not_found", "message": NOT_BUILT_HINT}, status_code=404)

    def response(self, path: str) -> Response | None:
        """The console's answer for ``path``; None for a 404 of the API's kind."""
        root = self.directory
        if not console_built(root):
            return JSONResponse({"code": "not_found", "message": NOT_BUILT_HINT}, status_code=404)
        relative = path.lstrip("/")
        if relative.startswith(ASSETS):  # a missing asset is a 404, not the page (a script that is HTML fails oddly)
            asset = _file_in(root, relative)
            return FileResponse(asset, headers=ASSET_HEADERS) if asset is not None else None
        page = _file_in(root, relative) if relative and relative != "index.html" else None
        return FileResponse(page or root / "index.html", headers=PAGE_HEADERS)
