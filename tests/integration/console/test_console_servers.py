"""The console's Admin page has a Servers tab for the platform admin (issue 44): the server it runs on, live, with
its process id and version, and a job it holds; in Chromium over a real server."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from kiln.version import full_version
from tests.browser import launch
from tests.helpers import spec, wait_for

pytestmark = [pytest.mark.needs("chromium"), pytest.mark.timeout(300)]


def test_the_admin_page_lists_the_servers_and_what_each_holds(make_server: Any) -> None:
    from playwright.sync_api import expect, sync_playwright

    server = make_server(instance_id="console-a")
    creds = server.credentials()
    client = server.client()
    held = client.submit(spec([sys.executable, "-c", "import time; time.sleep(120)"]))
    wait_for(client, held.id, "RUNNING")
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            page.goto(server.url + "/")
            page.get_by_label("Access key id").fill(creds["KILN_ACCESS_KEY"])
            page.get_by_label("Secret key").fill(creds["KILN_SECRET_KEY"])
            page.get_by_role("button", name="Sign in").click()
            page.get_by_test_id("nav-admin").click()
            page.get_by_role("tab", name="Servers").click()
            row = page.locator('[data-testid="server-row"][data-server="console-a"]')
            expect(row).to_have_attribute("data-live", "true")
            expect(row).to_contain_text(str(server.proc.pid))
            expect(row).to_contain_text(full_version())
            expect(row.get_by_test_id("server-jobs")).to_have_attribute("data-count", "1")
            expect(row.get_by_role("link", name=held.id)).to_be_visible()
        finally:
            browser.close()
    client.cancel(held.id)
