"""The API's documentation page, served whole by the server: Swagger UI from the ``swagger-ui-bundle-v2`` package
and Kiln's own page and signing script from ``kiln/api/static`` (no CDN: many clusters have no way out).

- ``/api/v1/docs``: the page. "Try it out" signs each request in the browser (``kiln-signing.js``, WebCrypto)
  with an access key typed into the page.
- ``/api/v1/openapi.json`` (FastAPI's) and ``/openapi.json`` (the same document, where tools look first).
- ``/docs/assets/<file>``: the page's scripts, styles and icons. Outside ``/api/v1`` because a browser fetches
  them without a signature; ``/docs`` leads to the page.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from swagger_ui_bundle import swagger_ui_path

DOCS_PATH = "/api/v1/docs"
OPENAPI_PATH = "/api/v1/openapi.json"
ASSETS_PATH = "/docs/assets"
STATIC_DIR = Path(__file__).resolve().parent / "static"
_VENDOR = Path(str(swagger_ui_path))
# What the page may load, and from where: nothing else is served from either directory.
ASSETS: dict[str, Path] = {
    **{name: _VENDOR / name for name in ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png")},
    # Browsers' developer tools ask for the source maps the bundle names.
    **{name: _VENDOR / name for name in ("swagger-ui-bundle.js.map", "swagger-ui.css.map")},
    **{name: STATIC_DIR / name for name in ("kiln-signing.js", "kiln-docs.js", "kiln-docs.css")},
}
# Only this server's own scripts (the page has no inline script), and requests only to this server: the typed-in
# secret can go nowhere else. Swagger UI sets inline styles and draws icons from data: URLs.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
ASSET_HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}

router = APIRouter(include_in_schema=False)


@cache
def _page() -> str:
    return (STATIC_DIR / "docs.html").read_text(encoding="utf-8")


@router.get(DOCS_PATH)
def api_docs() -> HTMLResponse:
    return HTMLResponse(_page(), headers=PAGE_HEADERS)


@router.get("/docs")
def api_docs_redirect() -> RedirectResponse:
    return RedirectResponse(DOCS_PATH)


@router.get("/openapi.json")
def openapi_document(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get(ASSETS_PATH + "/{name}")
def api_docs_asset(name: str) -> Response:
    path = ASSETS.get(name)
    if path is None:
        return JSONResponse({"code": "not_found", "message": f"no docs asset {name!r}"}, status_code=404)
    return FileResponse(path, headers=ASSET_HEADERS)
