"""The console's footer names the server's release and commit (from /readyz), in Chromium over a real server."""

from __future__ import annotations

from typing import Any

import pytest

from kiln.version import full_version
from tests.browser import launch

pytestmark = [pytest.mark.needs("chromium"), pytest.mark.timeout(300)]


def test_the_footer_shows_the_servers_version(make_server: Any) -> None:
    from playwright.sync_api import expect, sync_playwright

    server = make_server()
    creds = server.credentials()
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            page.goto(server.url + "/")
            page.get_by_label("Access key id").fill(creds["KILN_ACCESS_KEY"])
            page.get_by_label("Secret key").fill(creds["KILN_SECRET_KEY"])
            page.get_by_role("button", name="Sign in").click()
            expect(page.get_by_test_id("footer")).to_have_text(f"Kiln {full_version()}")
        finally:
            browser.close()
