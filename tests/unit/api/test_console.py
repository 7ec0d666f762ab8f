"""What the console's fallback (kiln.api.console) answers for each path, read from a bundle written here: the
page for client-side routes, hashed assets cached for a year, nothing outside the bundle, and the API's own 404
for /api paths. tests/integration/console/test_console_session.py asks a real server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.responses import FileResponse, JSONResponse

from kiln.api.console import NOT_BUILT, ConsoleFallback
from kiln.settings import Settings


async def _not_found(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    raise AssertionError("the fallback answers these itself")


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    dist = tmp_path / "dist"
    (dist / "assets").mkdir(parents=True)
    (dist / "index.html").write_text("<!doctype html><title>Kiln</title>")
    (dist / "assets" / "index-3f9a.js").write_text("console.log('kiln')")
    (dist / "favicon.svg").write_text("<svg/>")
    (tmp_path / "secret.txt").write_text("outside the bundle")
    return dist


def _path(response: object) -> Path:
    assert isinstance(response, FileResponse), response
    return Path(response.path)


def test_client_side_routes_get_the_page_and_files_are_served_as_themselves(bundle: Path) -> None:
    console = ConsoleFallback(bundle, _not_found)
    for path in ("/", "/jobs", "/jobs/job-0123/logs", "/index.html", "/studies/x.y"):
        response = console.response(path)
        assert _path(response) == bundle / "index.html", path
        assert isinstance(response, FileResponse)
        assert response.headers["cache-control"] == "no-cache"
        assert "script-src 'self'" in response.headers["content-security-policy"]
    favicon = console.response("/favicon.svg")
    assert _path(favicon) == bundle / "favicon.svg"
    asset = console.response("/assets/index-3f9a.js")
    assert _path(asset) == bundle / "assets" / "index-3f9a.js"
    assert isinstance(asset, FileResponse)
    assert asset.headers["cache-control"] == "public, max-age=31536000, immutable"


def test_a_missing_asset_is_a_404_and_nothing_outside_the_bundle_is_served(bundle: Path) -> None:
    console = ConsoleFallback(bundle, _not_found)
    assert console.response("/assets/index-0000.js") is None
    assert console.response("/assets/../../secret.txt") is None
    assert console.response("/assets/") is None
    (bundle / "assets" / "escape.js").symlink_to(bundle.parent / "secret.txt")
    assert console.response("/assets/escape.js") is None
    for path in ("/../secret.txt", "/%2e%2e/secret.txt", "/a\x00b"):  # not a file of the bundle: the page
        assert _path(console.response(path)) == bundle / "index.html", path


def test_without_a_built_bundle_every_page_is_a_404_that_says_how_to_build_it(tmp_path: Path) -> None:
    response = ConsoleFallback(tmp_path / "empty", _not_found).response("/")
    assert isinstance(response, JSONResponse) and response.status_code == 404
    body = json.loads(bytes(response.body))
    assert body["code"] == "not_found" and NOT_BUILT in body["message"] and "make console" in body["message"]


@pytest.mark.anyio
async def test_api_paths_and_other_methods_go_to_the_api_404(bundle: Path) -> None:
    seen: list[str] = []

    async def not_found(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        seen.append(f"{scope['method']} {scope['path']}")

    console = ConsoleFallback(bundle, not_found)
    for method, path in (("GET", "/api/v1/nothing"), ("GET", "/api"), ("POST", "/jobs"), ("DELETE", "/")):
        await console({"type": "http", "method": method, "path": path, "headers": []}, _no_body, _no_send)
    assert seen == ["GET /api/v1/nothing", "GET /api", "POST /jobs", "DELETE /"]


async def _no_body():  # type: ignore[no-untyped-def]
    raise AssertionError("nothing is read")


async def _no_send(message) -> None:  # type: ignore[no-untyped-def]
    raise AssertionError("nothing is sent")


def test_the_console_directory_is_a_setting(tmp_path: Path) -> None:
    from kiln.api.console import PACKAGE_DIST, console_dir

    assert console_dir(Settings(home=tmp_path)) == PACKAGE_DIST
    assert console_dir(Settings(home=tmp_path, console_dir=tmp_path / "dist")) == tmp_path / "dist"
    assert PACKAGE_DIST.parent.name == "api" and PACKAGE_DIST.name == "console_dist"
