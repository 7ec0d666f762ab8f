"""The console's Pipelines pages in Chromium, over a real server running real pipelines: the runs table (refreshed
while a run runs) and the schedules, a run's DAG (one node per step in its state, a job step's node linking to its
job, one edge per dependency), Resume on a failed run, Cancel on a running one. One server and one signed-in
browser for the module."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from kiln.sdk.client import Client
from tests.helpers import wait_for
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Account, Api, Tenant, close_all, create_tenant

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.needs("chromium"), pytest.mark.timeout(300)]

WAIT_MS = 30_000


def _step(run: Any, name: str) -> Any:
    return next(s for s in run.steps if s.name == name)


def job(code: str, **extra: Any) -> dict[str, Any]:
    return {"command": [sys.executable, "-c", code], "runtime": {"python": sys.executable}, **extra}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    srv = KilnServer(tmp_path_factory.mktemp("console-pipelines") / "home", rate_limit_per_second="0").start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def tenant(server: KilnServer) -> Iterator[Tenant]:
    admin = Api.admin(server)
    labs = create_tenant(admin, "labs", ("member",))
    yield labs
    close_all(labs)
    admin.close()


@pytest.fixture(scope="module")
def member(tenant: Tenant) -> Account:
    return tenant.accounts["member"]


@pytest.fixture(scope="module")
def client(server: KilnServer, member: Account) -> Iterator[Client]:
    kiln = Client(server.url, member.key_id, member.secret)
    yield kiln
    kiln.close()


@pytest.fixture(scope="module")
def page(server: KilnServer, member: Account) -> Iterator[Page]:
    from playwright.sync_api import expect, sync_playwright

    from tests.browser import launch

    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_context().new_page()
            page.set_default_timeout(WAIT_MS)
            page.goto(server.url + "/")
            page.get_by_label("Access key id").fill(member.key_id)
            page.get_by_label("Secret key").fill(member.secret)
            page.get_by_role("button", name="Sign in").click()
            expect(page.get_by_test_id("whoami")).to_contain_text(member.user_name)
            yield page
        finally:
            browser.close()


def test_the_pipelines_page_lists_a_run_and_draws_its_dag(client: Client, page: Page, server: KilnServer) -> None:
    from playwright.sync_api import expect

    from tests.browser import artifacts_dir

    spec = {
        "name": "fan-out",
        "steps": {
            "a": job("print('a')"),
            "b": {**job("print('b')"), "depends_on": ["a"]},
            "c": {**job("print('c')"), "depends_on": ["a"]},
            "d": {**job("print('d')"), "depends_on": ["b", "c"], "when": "steps.a.metrics.x > 1"},
        },
    }
    schedule = client.schedule_pipeline(spec, cron="0 3 1 1 *")  # next on 1 January: it starts no run here
    run = client.run_pipeline(spec)
    page.get_by_test_id("nav-pipelines").click()
    row = page.locator(f'[data-testid="pipeline-run-row"][data-run="{run.id}"]')
    # Shown while it runs (most likely) and refreshed until it ends, without reloading the page.
    expect(row).to_have_attribute("data-state", "SUCCEEDED", timeout=120_000)
    done = client.wait_pipeline(run.id, timeout=30)
    states = {s.name: s.state for s in done.steps}
    assert states == {"a": "SUCCEEDED", "b": "SUCCEEDED", "c": "SUCCEEDED", "d": "SKIPPED"}, done
    expect(row).to_contain_text("fan-out")
    expect(row.get_by_test_id("pipeline-run-steps")).to_have_text("4/4")
    schedule_row = page.locator(f'[data-testid="schedule-row"][data-schedule="{schedule.id}"]')
    expect(schedule_row).to_contain_text("0 3 1 1 *")
    expect(schedule_row).to_contain_text("fan-out")

    row.get_by_role("link", name=run.id).click()
    expect(page).to_have_url(f"{server.url}/pipelines/{run.id}")
    dag = page.get_by_test_id("pipeline-dag")
    nodes = dag.get_by_test_id("dag-node")
    expect(nodes).to_have_count(4)
    drawn = nodes.evaluate_all("ns => ns.map(n => [n.dataset.step, n.dataset.state])")
    assert dict(drawn) == states
    jobs = {s.name: s.job_id for s in done.steps}
    for name in ("a", "b", "c"):
        link = dag.locator(f'[data-testid="dag-node"][data-step="{name}"] a')
        expect(link).to_have_attribute("href", f"/jobs/{jobs[name]}")
    expect(dag.locator('[data-testid="dag-node"][data-step="d"] a')).to_have_count(0)  # skipped: no job
    skipped_tip = dag.locator('[data-testid="dag-node"][data-step="d"] title')
    assert "when is false" in skipped_tip.text_content()
    edges = dag.get_by_test_id("dag-edge")
    expect(edges).to_have_count(sum(len(s.depends_on) for s in done.steps))  # 4
    assert sorted(edges.evaluate_all("es => es.map(e => e.dataset.from + '>' + e.dataset.to)")) == [
        "a>b",
        "a>c",
        "b>d",
        "c>d",
    ]
    # Layered: a, then b and c side by side, then d.
    xs = {
        name: dag.locator(f'[data-testid="dag-node"][data-step="{name}"] rect').first.get_attribute("x")
        for name in states
    }
    assert float(xs["a"]) < float(xs["b"]) == float(xs["c"]) < float(xs["d"])
    expect(page.get_by_test_id("cancel-pipeline")).to_have_count(0)
    expect(page.get_by_test_id("resume-pipeline")).to_have_count(0)
    page.screenshot(path=artifacts_dir("console-pipelines") / "run.png", full_page=True)  # for a person to look at

    dag.locator('[data-testid="dag-node"][data-step="b"] a').click()  # to its job, in place
    expect(page).to_have_url(f"{server.url}/jobs/{jobs['b']}")
    client.unschedule_pipeline(schedule.id)


def test_a_failed_run_offers_resume(client: Client, page: Page, server: KilnServer) -> None:
    from playwright.sync_api import expect

    spec = {
        "name": "breaks",
        "steps": {
            "ok": job("print('fine')"),
            "bad": {**job("import sys; sys.exit(3)"), "depends_on": ["ok"]},
            "after": {**job("print('never')"), "depends_on": ["bad"]},
        },
    }
    run = client.wait_pipeline(client.run_pipeline(spec).id, timeout=120)
    assert run.state == "FAILED", run
    first_job = _step(run, "bad").job_id
    page.goto(f"{server.url}/pipelines/{run.id}")
    node = page.locator('[data-testid="dag-node"][data-step="bad"]')
    expect(node).to_have_attribute("data-state", "FAILED")
    expect(page.locator('[data-testid="dag-node"][data-step="after"]')).to_have_attribute("data-state", "SKIPPED")
    expect(page.get_by_test_id("cancel-pipeline")).to_have_count(0)
    page.get_by_test_id("resume-pipeline").click()  # the failed step runs again (and fails again: exit 3)

    deadline = time.monotonic() + 60
    while (bad := _step(client.get_pipeline_run(run.id), "bad")).job_id in (None, first_job):
        assert time.monotonic() < deadline, "the resumed run started no new job for the failed step"
        time.sleep(0.2)
    again = client.wait_pipeline(run.id, timeout=60)
    assert again.state == "FAILED" and _step(again, "bad").job_id == bad.job_id, again
    # The page followed the resumed run to its end: the node links to the step's new job, Resume is back.
    expect(page.get_by_test_id("pipeline-run")).to_have_attribute("data-state", "FAILED", timeout=60_000)
    expect(node.locator("a")).to_have_attribute("href", f"/jobs/{bad.job_id}")
    expect(node).to_have_attribute("data-state", "FAILED")
    expect(page.get_by_test_id("resume-pipeline")).to_be_visible()


def test_a_running_run_is_cancelled_from_its_page(client: Client, page: Page, server: KilnServer) -> None:
    from playwright.sync_api import expect

    spec = {
        "name": "slow",
        "steps": {
            "quick": job("print('quick')"),
            "sleepy": {**job("import time; time.sleep(60)"), "depends_on": ["quick"]},
            "last": {**job("print('last')"), "depends_on": ["sleepy"]},
        },
    }
    run = client.run_pipeline(spec)
    page.goto(f"{server.url}/pipelines/{run.id}")
    sleepy = page.locator('[data-testid="dag-node"][data-step="sleepy"]')
    expect(sleepy).to_have_attribute("data-state", "RUNNING", timeout=60_000)  # refreshed as the run moves
    expect(page.get_by_test_id("resume-pipeline")).to_have_count(0)
    page.get_by_test_id("cancel-pipeline").click()
    expect(page.get_by_test_id("pipeline-run")).to_have_attribute("data-state", "CANCELLED")
    expect(sleepy).to_have_attribute("data-state", "CANCELLED")
    expect(page.locator('[data-testid="dag-node"][data-step="last"]')).to_have_attribute("data-state", "CANCELLED")
    expect(page.locator('[data-testid="dag-node"][data-step="quick"]')).to_have_attribute("data-state", "SUCCEEDED")
    expect(page.get_by_test_id("cancel-pipeline")).to_have_count(0)
    expect(page.get_by_test_id("resume-pipeline")).to_be_visible()
    cancelled = client.wait_pipeline(run.id, timeout=60)
    assert cancelled.state == "CANCELLED"
    sleepy_job = _step(cancelled, "sleepy").job_id
    assert sleepy_job and wait_for(client, sleepy_job, timeout=30).state == "CANCELLED"  # its job too, not left running
