"""The console's Notifications page in Chromium (issue 47): a webhook subscribed from the page shows its signing
secret once; a test event the receiver refuses with a body of HTML is logged with its code and that body as text
(never markup); "send again" delivers it; pause, resume and delete. Its own server (not test_console's ``world``:
that one's operator allows no loopback webhook target) and a real receiver on loopback."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from kiln.sdk.client import Client
from tests.browser import launch
from tests.e2e.test_console import WAIT_MS, sign_in
from tests.kilnserver import KilnServer
from tests.notify_receiver import WebhookReceiver
from tests.tenancy_helpers import Account, Api, close_all, create_tenant

if TYPE_CHECKING:
    from playwright.sync_api import Browser
try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:
    pass

pytestmark = pytest.mark.needs("chromium")
HTML = b'<b id="injected">refused</b><img src=x onerror="document.body.dataset.pwned=1">'


@pytest.fixture(scope="module")
def receiver() -> Iterator[WebhookReceiver]:
    r = WebhookReceiver().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KilnServer, Account, Browser]]:
    server = KilnServer(tmp_path_factory.mktemp("console-notify") / "home", webhook_allow="127.0.0.1/32").start()
    admin = Api.admin(server)
    tenant = create_tenant(admin, "console-notify", ("member",))
    expect.set_options(timeout=WAIT_MS)
    try:
        with sync_playwright() as playwright:
            browser = launch(playwright)
            try:
                yield server, tenant["member"], browser
            finally:
                browser.close()
    finally:
        close_all(tenant)
        admin.close()
        server.stop()


def test_subscribe_see_the_secret_once_read_the_log_send_again_pause_and_delete(
    setup: tuple[KilnServer, Account, Browser], receiver: WebhookReceiver
) -> None:
    server, member, browser = setup
    receiver.script("/console", 400)
    receiver.answers["/console"] = HTML
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(WAIT_MS)
    page = sign_in(context, server.url, member, "/notifications")
    page.get_by_test_id("nav-notifications").click()
    form = page.get_by_test_id("create-subscription")
    form.get_by_label("Name", exact=True).fill("console-hook")
    form.get_by_label("Events").fill("job.failed, test")
    form.get_by_label("Webhook URL or e-mail").fill(receiver.url("/console"))
    page.get_by_test_id("subscribe").click()
    expect(page.get_by_test_id("subscription-secret")).to_contain_text("whsec_")
    row = page.get_by_test_id("subscription-row")
    expect(row).to_have_attribute("data-state", "active")

    row.get_by_test_id("send-test").click()
    row.get_by_test_id("show-deliveries").click()
    log = page.get_by_test_id("delivery-log")
    delivery = log.get_by_test_id("delivery-row")
    expect(delivery).to_have_attribute("data-status", "failed")  # a 4xx: not tried again
    expect(delivery.get_by_test_id("response-code")).to_have_text("400")
    expect(delivery.get_by_test_id("delivery-error")).to_contain_text('<b id="injected">refused</b>')
    assert page.locator("#injected").count() == 0 and page.evaluate("document.body.dataset.pwned") is None

    delivery.get_by_test_id("resend").click()
    expect(delivery).to_have_attribute("data-status", "delivered")
    expect(delivery.get_by_test_id("response-code")).to_have_text("200")
    assert [r.status for r in receiver.at("/console")] == [400, 200]

    page.reload()
    expect(page.get_by_test_id("subscription-secret")).to_have_count(0)  # shown once
    row.get_by_test_id("pause").click()
    expect(row).to_have_attribute("data-state", "paused")
    expect(row.get_by_test_id("paused-reason")).to_contain_text("paused by console-notify-member")
    row.get_by_test_id("resume").click()
    expect(row).to_have_attribute("data-state", "active")
    row.get_by_test_id("delete-subscription").click()
    expect(row).to_have_count(0)
    expect(page.get_by_test_id("notification-banner")).to_have_count(0)

    # A subscription whose receiver refuses 5 deliveries is paused: every page says so, until it is resumed.
    receiver.script("/dead", *[410] * 5)
    client = Client(server.url, member.key_id, member.secret)
    dead = client.subscribe("dead-hook", ["test"], url=receiver.url("/dead"))
    for _ in range(5):
        client.test_subscription(dead.id)
    deadline = time.monotonic() + 60
    while client.subscription(dead.id).state != "paused":  # the banner reads the subscriptions once per page
        assert time.monotonic() < deadline, client.deliveries(dead.id)
        time.sleep(0.1)
    page.goto(server.url + "/jobs")
    expect(page.get_by_test_id("notification-banner")).to_contain_text("dead-hook")
    client.close()
    context.close()
