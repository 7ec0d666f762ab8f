"""The console's Usage page and budget banner in Chromium, over a real server metering real jobs: the stacked bars
of cost per day (today's bar worth what the API says today cost, one segment per user, every day of the window
drawn), the totals, the row of each user, the top jobs linking to their pages, the CSV download, the window and
stack-by controls, the platform admin's organisation selector; a soft budget below the use warns a member on every
page and a hard one says new work is refused; a member opening /usage is shown the server's refusal. One server,
one browser, for the module."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest

from kiln.sdk.client import Client
from tests.helpers import wait_for
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Account, Api, Tenant, close_all, create_tenant

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = [pytest.mark.needs("chromium"), pytest.mark.timeout(300)]

WAIT_MS = 30_000


def sleeper(name: str, seconds: float) -> dict[str, Any]:
    return {
        "name": name,
        "command": [sys.executable, "-c", f"import time; time.sleep({seconds})"],
        "runtime": {"python": sys.executable},
        "resources": {"cpus": 2},
    }


@dataclass
class World:
    server: KilnServer
    platform: Api
    org: Tenant  # admin and member, each with one finished job
    jobs: dict[str, str]  # role → job id


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    server = KilnServer(tmp_path_factory.mktemp("console-usage") / "home", cpus="8", rate_limit_per_second="0").start()
    platform = Api.admin(server)
    org = create_tenant(platform, "metered-ui", ("admin", "member"))
    try:
        with server.client() as admin_client:
            admin_client.set_prices(cpu_hour=3.6)  # 0.001 a CPU-second: 2 CPUs for 2 s cost about 0.004
        clients = {role: Client(server.url, org[role].key_id, org[role].secret) for role in ("admin", "member")}
        # Two users' jobs at once (different lengths, so the top job is the member's): two segments in today's bar.
        jobs = {
            "member": clients["member"].submit(sleeper("long-sleeper", 2.5)).id,
            "admin": clients["admin"].submit(sleeper("short-sleeper", 1)).id,
        }
        for role, job_id in jobs.items():
            assert wait_for(clients[role], job_id, timeout=60).state == "SUCCEEDED"
            clients[role].close()
        yield World(server, platform, org, jobs)
    finally:
        close_all(org)
        platform.close()
        server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    from playwright.sync_api import expect, sync_playwright

    from tests.browser import launch

    expect.set_options(timeout=WAIT_MS)  # as tests/e2e/test_console.py: a loaded machine is slower than 5 s
    with sync_playwright() as playwright:
        chromium = launch(playwright)
        try:
            yield chromium
        finally:
            chromium.close()


def sign_in(browser: Browser, url: str, key_id: str, secret: str, role: str) -> Page:
    """A new browser context signed in with the key (its header naming ``role``): its page, on the overview."""
    from playwright.sync_api import expect

    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(url + "/")
    page.get_by_label("Access key id").fill(key_id)
    page.get_by_label("Secret key").fill(secret)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_test_id("role")).to_have_text(role)
    return page


def as_account(browser: Browser, world: World, account: Account) -> Page:
    from playwright.sync_api import expect

    page = sign_in(browser, world.server.url, account.key_id, account.secret, account.role)
    expect(page.get_by_test_id("whoami")).to_contain_text(account.user_name)
    return page


def today_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d")


def per_day(api: Api, **params: Any) -> tuple[str, dict[str, float], dict[str, Any]]:
    """The last day with use (today, unless the jobs ran across midnight UTC), its cost by user, the report."""
    since = datetime.now(UTC).strftime("%Y-%m-%dT00:00:00Z")
    report = api.ok("GET", "/usage", params={"by": "day", "split": "user", "since": since, **params})
    day = max(row["key"] for row in report["rows"])
    return day, {row["split"]: row["cost"] for row in report["rows"] if row["key"] == day}, report


def test_the_org_admin_sees_cost_per_day_totals_users_and_top_jobs(world: World, browser: Browser) -> None:
    from playwright.sync_api import expect

    from tests.browser import artifacts_dir

    admin, member = world.org["admin"], world.org["member"]
    day, by_user, _ = per_day(admin.api)
    assert set(by_user) == {admin.user_id, member.user_id}, by_user
    assert all(cost > 0 for cost in by_user.values()), by_user
    by_user_report = admin.api.ok("GET", "/usage", params={"by": "user"})  # the last 30 days: all of it
    jobs_report = admin.api.ok("GET", "/usage", params={"by": "job", "limit": 10})
    top = jobs_report["rows"][0]
    assert top["key"] == world.jobs["member"], jobs_report  # the longer job cost more

    page = as_account(browser, world, admin)
    expect(page.get_by_test_id("budget-banner")).to_have_count(0)  # no budgets: no banner
    page.get_by_test_id("nav-usage").click()
    expect(page).to_have_url(f"{world.server.url}/usage")
    chart = page.get_by_test_id("usage-chart")
    expect(chart).to_have_attribute("data-bars", "30")  # every day of the default window, days of 0 included
    bars = chart.get_by_test_id("stack-bar")
    expect(bars).to_have_count(30)
    bar = chart.locator(f'[data-testid=stack-bar][data-key="{day}"]')
    assert float(bar.get_attribute("data-value") or "nan") == pytest.approx(sum(by_user.values()), abs=1e-6)
    segments = bar.get_by_test_id("stack-segment")
    expect(segments).to_have_count(2)
    drawn = dict(segments.evaluate_all("rs => rs.map(r => [r.dataset.series, Number(r.dataset.value)])"))
    assert drawn == pytest.approx(by_user, abs=1e-6)
    tip = bar.locator("title").text_content() or ""
    assert tip.startswith(f"{day}: ") and admin.user_name in tip and member.user_name in tip, tip
    zero_days = bars.evaluate_all("bs => bs.filter(b => Number(b.dataset.value) === 0).length")
    assert zero_days >= 29 - (day != today_utc()), zero_days  # the others drawn, empty
    expect(chart.get_by_test_id("stack-legend")).to_contain_text(member.user_name)
    readout = chart.get_by_test_id("stack-readout")
    bar.hover()
    expect(readout).to_contain_text(f"{day}: ")
    expect(readout).to_contain_text(member.user_name)
    chart.get_by_role("img").focus()  # the keyboard: one stop, the arrow keys step through the days
    page.keyboard.press("End")
    expect(readout).to_have_text(re.compile(rf"^{bars.last.get_attribute('data-key')}: "))
    page.keyboard.press("Home")
    expect(readout).to_have_text(f"{bars.first.get_attribute('data-key')}: 0.00")

    cost_total = page.locator("[data-testid=usage-total][data-name=cost]")
    expect(cost_total).to_be_visible()
    assert float(cost_total.get_attribute("data-value") or "nan") == pytest.approx(by_user_report["cost"], abs=1e-5)
    cpu_held = page.locator("[data-testid=usage-total][data-name=cpu-held]")
    assert float(cpu_held.get_attribute("data-value") or "nan") == pytest.approx(
        by_user_report["cpu_seconds"] / 3600, rel=1e-3
    )

    row = page.locator(f'[data-testid=usage-user-row][data-user-id="{member.user_id}"]')
    expect(row).to_contain_text(member.user_name)
    member_row = next(r for r in by_user_report["rows"] if r["key"] == member.user_id)
    assert float(row.get_attribute("data-cost") or "nan") == pytest.approx(member_row["cost"], abs=1e-5)

    job_rows = page.get_by_test_id("usage-job-row")
    expect(job_rows).to_have_count(2)
    expect(job_rows.first).to_have_attribute("data-job-id", world.jobs["member"])
    expect(job_rows.first.get_by_test_id("usage-job-owner")).to_have_text(member.user_name)
    link = job_rows.first.get_by_role("link", name="long-sleeper")
    expect(link).to_have_attribute("href", f"/jobs/{world.jobs['member']}")

    csv_link = page.get_by_test_id("usage-csv")
    href = csv_link.get_attribute("href") or ""
    assert "format=csv" in href and "by=day" in href, href
    download = page.request.get(world.server.url + href)  # the page's cookie
    assert download.ok and download.text().splitlines()[0].startswith("key,name,split,split_name,"), download.text()
    assert day in download.text() and member.user_name in download.text()
    page.screenshot(path=str(artifacts_dir("console") / "usage.png"), full_page=True)

    page.get_by_label("Window").select_option("7")
    expect(chart).to_have_attribute("data-bars", "7")
    expect(page).to_have_url(f"{world.server.url}/usage?days=7")
    page.get_by_label("Stack by").select_option("category")
    category_bar = chart.locator(f'[data-testid=stack-bar][data-key="{day}"]')
    expect(category_bar.locator("[data-testid=stack-segment][data-series=train]")).to_have_count(1)
    expect(category_bar.get_by_test_id("stack-segment")).to_have_count(1)  # both jobs are train
    # One row now where there were two: the server rounds each row's cost to 6 decimals.
    assert float(category_bar.get_attribute("data-value") or "nan") == pytest.approx(sum(by_user.values()), abs=3e-6)

    link = page.locator(f'[data-testid=usage-job-row][data-job-id="{world.jobs["member"]}"] a')
    link.click()
    expect(page).to_have_url(f"{world.server.url}/jobs/{world.jobs['member']}")
    expect(page.get_by_test_id("job-detail")).to_have_attribute("data-job-id", world.jobs["member"])
    page.context.close()


def test_the_platform_admin_picks_an_organisation(world: World, browser: Browser) -> None:
    from playwright.sync_api import expect

    creds = world.server.credentials()
    page = sign_in(browser, world.server.url, creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"], "platform admin")
    day, by_user, _ = per_day(world.platform, org=world.org.name)
    page.goto(world.server.url + "/usage?days=7")
    select = page.get_by_label("Organisation")
    expect(select.locator("option", has_text=world.org.name)).to_have_count(1)
    expect(select).to_have_value("")  # all organisations first
    select.select_option(world.org.name)
    expect(page).to_have_url(f"{world.server.url}/usage?days=7&org={world.org.name}")
    bar = page.locator(f'[data-testid=usage-chart] [data-testid=stack-bar][data-key="{day}"]')
    expect(bar.get_by_test_id("stack-segment")).to_have_count(2)
    assert float(bar.get_attribute("data-value") or "nan") == pytest.approx(sum(by_user.values()), abs=1e-6)
    page.context.close()


def test_a_budget_past_its_limit_is_a_banner_and_a_member_is_refused_usage(world: World, browser: Browser) -> None:
    from playwright.sync_api import expect

    from tests.browser import artifacts_dir

    member = world.org["member"]
    budget = world.platform.ok("PUT", "/budgets", json_body={"org": world.org.name, "soft": 0.000001})
    try:
        assert budget["state"] == "soft", budget
        page = as_account(browser, world, member)
        line = page.get_by_test_id("budget-banner-line")
        expect(line).to_have_count(1)
        expect(line).to_have_attribute("data-state", "soft")
        expect(line).to_have_attribute("role", "status")
        expect(line).to_contain_text(f"of its 0.000001 soft budget for {budget['month']}.")
        used = re.search(rf"Organisation {world.org.name} has used ([\d.,]+) of its", line.inner_text())
        assert used and float(used[1].replace(",", "")) == pytest.approx(budget["used"], rel=0.05), line.inner_text()
        expect(page.get_by_test_id("nav-usage")).to_have_count(0)  # not a member's page
        page.screenshot(path=str(artifacts_dir("console") / "budget-soft-banner.png"))

        asked: list[str] = []
        page.on("request", lambda r: asked.append(r.url) if "/api/v1/usage" in r.url else None)
        page.goto(world.server.url + "/usage")
        refused = page.get_by_test_id("usage-refused")
        expect(refused).to_contain_text("needs usage:read")
        assert len(asked) == 1, asked  # one refusal asked for, not one per table
        expect(page.get_by_label("Window")).to_have_count(0)  # nothing to choose
        expect(refused.get_by_role("alert")).to_contain_text(f"role member in org {world.org.name}")
        expect(page.get_by_test_id("usage-chart")).to_have_count(0)
        expect(page.get_by_test_id("budget-banner-line")).to_have_count(1)  # on this page too
        budget_row = page.locator(f'[data-testid=budget-row][data-budget="{budget["id"]}"]')
        expect(budget_row).to_have_attribute("data-state", "soft")  # what applies to them, still shown

        world.platform.ok("PUT", "/budgets", json_body={"org": world.org.name, "soft": 0.000001, "hard": 0.000002})
        page.reload()
        expect(line).to_have_attribute("data-state", "hard")
        expect(line).to_have_attribute("role", "alert")
        expect(line).to_contain_text("of its 0.000002 hard budget")
        expect(line).to_contain_text("new work is refused until")
        page.screenshot(path=str(artifacts_dir("console") / "usage-refused-budget-spent.png"), full_page=True)
        page.context.close()
    finally:
        world.platform.ok("DELETE", f"/budgets/{budget['id']}")
