"""The web console in a real browser: Debian's Chromium, headless, driven by Playwright, against a real server
serving the console `make console` built. One server (and a second one, with another server key) and one browser
for the module; every test signs in through the page in a fresh browser context.

What only a browser can show: signing in from the keyboard, a job submitted from the form whose log lines arrive
live and whose loss chart draws every point, cancelling it, why a job waits, a viewer who is shown no way to change
anything (and whose forced request the server refuses), another organisation's user seeing nothing of the first's,
CSRF from inside the page, a cookie of one server useless on another, each page's screenshot, a narrow window."""

from __future__ import annotations

import json
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
import pytest

from kiln.domain.quantities import parse_memory
from kiln.domain.usage import format_hours, format_money
from kiln.sdk.client import Client
from tests.browser import artifacts_dir, launch
from tests.console_modules import run_module
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Account, Api, Tenant, close_all, create_tenant, job_spec

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page
try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # the "chromium" component fails (or, opted out, skips) every test here, saying what to install
    pass

pytestmark = pytest.mark.needs("chromium")

WAIT_MS = 30_000  # the longest any page may take to show what a step waits for (a loaded 2-CPU machine)
JOB_ID = re.compile(r"^job-")
HOLD = "sleep 600"  # a job that runs until cancelled
ALPHA_HOLD_MEMORY = "256Mi"  # what alpha's running job holds besides 0.1 CPU: the Machines card shows both
STEPS = 50
# Prints its loss every step, then a tick every 0.3 s until cancelled: the log keeps growing while it is followed.
TRAIN = (
    "python -c 'import time\n"
    f'for i in range({STEPS}): print(f"step={{i}} loss={{1 / (i + 1):.4f}}", flush=True)\n'
    "n = 0\n"
    "while True:\n"
    '    print(f"tick {n}", flush=True); n += 1; time.sleep(0.3)\''
)
# What a viewer must not be offered anywhere (each is a control that changes something).
WRITE_CONTROLS = ", ".join(
    f"[data-testid={t}]"
    for t in (
        "new-job",
        "cancel-job",
        "rerun-job",
        "submit-job",
        "stop-study",
        "scale-service",
        "predict-send",
        "key-create-submit",
        "user-create-submit",
    )
)


@dataclass
class World:
    server: KilnServer
    other: KilnServer  # the same software with another server key
    browser: Browser
    alpha: Tenant  # admin, member, viewer; a running job, a dataset, a model and a service
    bravo: Tenant  # member, with one job of its own
    quota: Tenant  # member, quota count 1: one job running, one waiting
    alpha_running: str
    alpha_dataset: str
    alpha_service: str
    bravo_job: str
    quota_running: str
    quota_waiting: str
    alpha_finished: str  # SUCCEEDED, with an artifact and no checkpoint


def _start_other(server: KilnServer, failures: list[BaseException]) -> None:
    try:
        server.start()
    except BaseException as exc:  # reported by the fixture
        failures.append(exc)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("console-e2e")
    server = KilnServer(root / "home", cpus="8")
    other = KilnServer(root / "other-home")
    failures: list[BaseException] = []
    starting = threading.Thread(target=_start_other, args=(other, failures))
    starting.start()  # the two servers start side by side
    tenants: list[Tenant] = []
    admin: Api | None = None
    try:
        server.start()
        starting.join()
        if failures:
            raise failures[0]
        index = httpx.get(server.url + "/", timeout=10)
        if index.status_code != 200 or "<html" not in index.text.lower():
            pytest.fail(f"the console is not built (GET / → {index.status_code}): run `make console`", pytrace=False)
        admin = Api.admin(server)
        alpha = create_tenant(admin, "console-alpha")
        bravo = create_tenant(admin, "console-bravo", ("member",))
        quota = create_tenant(admin, "console-quota", ("member",))
        tenants += [alpha, bravo, quota]
        admin.ok("PUT", f"/orgs/{quota.id}/quota", json_body={"category": "train", "count": 1})
        member = alpha["member"].api
        running = member.submit(HOLD, name="alpha-hold", resources={"cpus": 0.1, "memory": ALPHA_HOLD_MEMORY})
        model_job = member.submit('echo weights > "$KILN_OUTPUT_DIR/model.joblib"', name="alpha-model-job")
        bravo_job = bravo["member"].api.submit("true", name="bravo-only-job", resources={"cpus": 0.1})
        quota_running = quota["member"].api.submit(HOLD, name="quota-hold", resources={"cpus": 0.1})
        dataset = "alpha-dataset"
        client = Client(server.url, alpha["member"].key_id, alpha["member"].secret)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "data.csv").write_text("x,y\n1,2\n")
            client.put_dataset(Path(tmp), dataset, state_dir=Path(tmp) / ".state")
        client.close()
        assert member.wait(model_job["id"], timeout=60)["state"] == "SUCCEEDED"
        member.ok("POST", "/models/alpha-model/versions", json_body={"job_id": model_job["id"], "path": "model.joblib"})
        service = "alpha-service"
        predictor = {"type": "sklearn", "input_schema": {"shape": [6]}}
        spec = {"name": service, "model": "alpha-model@1", "predictor": predictor, "replicas": 0}
        member.ok("POST", "/services", json_body={"spec": {**spec, "runtime": {"python": sys.executable}}})
        quota["member"].api.wait(quota_running["id"], "RUNNING", timeout=60)
        waiting = quota["member"].api.submit("true", name="quota-waiting", resources={"cpus": 0.1})
        quota["member"].api.wait_message(waiting["id"], "quota:")
        member.wait(running["id"], "RUNNING", timeout=60)
        expect.set_options(timeout=WAIT_MS)
        with sync_playwright() as playwright:
            browser = launch(playwright)
            try:
                yield World(
                    server,
                    other,
                    browser,
                    alpha,
                    bravo,
                    quota,
                    running["id"],
                    dataset,
                    service,
                    bravo_job["id"],
                    quota_running["id"],
                    waiting["id"],
                    model_job["id"],
                )
            finally:
                browser.close()
    finally:
        starting.join()
        close_all(*tenants)
        if admin is not None:
            admin.close()
        other.stop()
        server.stop()


@pytest.fixture
def context(world: World) -> Iterator[BrowserContext]:
    """A fresh browser profile (no cookie) at 1280 x 800."""
    context = world.browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(WAIT_MS)
    yield context
    context.close()


def sign_in(context: BrowserContext, url: str, account: Account, path: str = "/") -> Page:
    """Open ``path`` (the console sends a signed-out browser to its sign-in page), sign in with ``account``'s key
    pair and land back on ``path``, signed in."""
    page = context.new_page()
    page.goto(url + path)
    page.get_by_label("Access key id").fill(account.key_id)
    page.get_by_label("Secret key").fill(account.secret)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_test_id("whoami")).to_contain_text(account.user_name)
    return page


def fetch(page: Page, method: str, path: str, body: Any = None, csrf: str | None = "session") -> dict[str, Any]:
    """A request from inside the page, with its cookie, as the console's own code would send it; ``csrf``:
    "session" sends the session's token as X-Kiln-CSRF, None sends none, another string sends that."""
    return page.evaluate(  # type: ignore[no-any-return]
        """async ([method, path, body, csrf]) => {
            const headers = {"Content-Type": "application/json"};
            if (csrf === "session") {
                headers["X-Kiln-CSRF"] = (await (await fetch("/api/v1/session")).json()).csrf_token;
            } else if (csrf !== null) {
                headers["X-Kiln-CSRF"] = csrf;
            }
            const init = {method, headers, credentials: "same-origin"};
            if (body !== null) init.body = JSON.stringify(body);
            const response = await fetch(path, init);
            const text = await response.text();
            let code = null;
            try { code = JSON.parse(text).code ?? null; } catch (e) { /* not JSON */ }
            return {status: response.status, code, text};
        }""",
        [method, path, body, csrf],
    )


def test_signing_in_from_the_keyboard(world: World, context: BrowserContext) -> None:
    member = world.alpha["member"]
    page = context.new_page()
    page.goto(world.server.url + "/jobs")
    expect(page).to_have_url(f"{world.server.url}/signin?next=%2Fjobs")
    focused = "document.activeElement && document.activeElement.dataset.testid"
    page.keyboard.press("Tab")
    assert page.evaluate(focused) == "signin-key"
    page.keyboard.type(member.key_id)
    page.keyboard.press("Tab")
    assert page.evaluate(focused) == "signin-secret"
    page.keyboard.type("not-the-secret")
    page.keyboard.press("Enter")
    expect(page.get_by_test_id("signin-error")).to_be_visible()
    page.keyboard.press("Control+A")
    page.keyboard.type(member.secret)
    page.keyboard.press("Enter")
    expect(page.get_by_test_id("whoami")).to_contain_text(member.user_name)
    expect(page).to_have_url(f"{world.server.url}/jobs")  # back where it was sent from
    expect(page.get_by_role("heading", name="Jobs")).to_be_visible()


def test_a_job_from_the_form_streams_its_log_charts_its_loss_and_is_cancelled(
    world: World, context: BrowserContext
) -> None:
    member = world.alpha["member"]
    page = sign_in(context, world.server.url, member, "/jobs")
    page.get_by_test_id("new-job").click()
    page.get_by_label("Name", exact=True).fill("console-train")
    page.get_by_label("Command").fill(TRAIN)
    page.get_by_label("CPUs").fill("0.25")
    page.get_by_label("Memory").fill("1.5G")  # what `kiln run --memory 1.5G` asks for: 1.5 GiB, not 1.5·10⁹ bytes
    page.get_by_role("button", name="Submit", exact=True).click()
    detail = page.get_by_test_id("job-detail")
    expect(detail).to_have_attribute("data-job-id", JOB_ID)
    job_id = detail.get_attribute("data-job-id")
    assert job_id and member.api.job(job_id)["name"] == "console-train"
    assert member.api.job(job_id)["spec"]["resources"]["memory"] == parse_memory("1.5G") == 3 * 2**29

    # The log, followed: every step's line, then ticks that keep arriving without a reload.
    page.get_by_test_id("tab-logs").click()
    expect(page.get_by_test_id("log-line").filter(has_text=f"step={STEPS - 1} loss=")).to_have_count(1)
    expect(page.get_by_test_id("log-status")).to_have_attribute("data-status", "following")
    seen = page.get_by_test_id("log-line").filter(has_text="tick ").last
    expect(seen).to_be_visible()
    later = int(seen.inner_text().split("tick ")[1]) + 3  # printed about 0.9 s after the newest line shown
    expect(page.get_by_test_id("log-line").filter(has_text=f"tick {later}")).to_have_count(1)
    expect(detail).to_have_attribute("data-state", "RUNNING")

    # The loss chart: uPlot drew the series with every one of the job's points.
    page.get_by_test_id("tab-metrics").click()
    chart = page.locator('[data-testid=metric-chart][data-metric="loss"]')
    expect(chart).to_have_attribute("data-points", str(STEPS))
    expect(chart).to_have_attribute("data-ready", "true")
    assert chart.get_attribute("data-count") == str(STEPS)
    expect(chart.locator("canvas")).to_have_count(1)

    page.get_by_role("button", name="Cancel job").click()
    expect(detail).to_have_attribute("data-state", "CANCELLED")
    assert member.api.job(job_id)["state"] == "CANCELLED"


def test_a_waiting_job_says_why_on_its_page_and_in_the_queue(world: World, context: BrowserContext) -> None:
    member = world.quota["member"]
    page = sign_in(context, world.server.url, member, f"/jobs/{world.quota_waiting}")
    reason = page.get_by_test_id("why-reason")
    expect(reason).to_have_attribute("data-kind", "quota")
    expect(reason).to_contain_text("count 1 of 1")
    page.get_by_test_id("nav-overview").click()
    row = page.locator(f'[data-testid=queue-row][data-job-id="{world.quota_waiting}"]')
    expect(row.get_by_test_id("queue-reason")).to_contain_text("quota")


def test_a_viewer_is_offered_no_change_and_a_forced_one_is_refused(world: World, context: BrowserContext) -> None:
    viewer = world.alpha["viewer"]
    page = sign_in(context, world.server.url, viewer, "/jobs")
    expect(page.get_by_text("read-only")).to_be_visible()
    expect(page.locator(f'[data-testid=job-row][data-job-id="{world.alpha_running}"]')).to_be_visible()
    assert page.locator(WRITE_CONTROLS).count() == 0
    for path, loaded in (
        (f"/jobs/{world.alpha_running}", '[data-testid=job-detail][data-state="RUNNING"] [data-testid=job-details]'),
        (f"/services/{world.alpha_service}", "[data-testid=service-detail]"),
        ("/jobs/new", "text=This user may read but not submit jobs."),
        ("/admin", "[data-testid=key-row]"),
    ):
        page.goto(world.server.url + path)
        expect(page.locator(loaded).first).to_be_visible()
        assert page.locator(WRITE_CONTROLS).count() == 0, path
    # Their keys, organisation and quotas are the viewer's "Account", not an "Admin" they are not.
    expect(page.get_by_test_id("nav-account")).to_be_visible()
    expect(page.get_by_role("heading", name="Account")).to_be_visible()
    assert page.get_by_test_id("nav-admin").count() == 0

    # The server refuses what the page does not offer: the cookie and the CSRF token are good, the role is not.
    cancel = fetch(page, "POST", f"/api/v1/jobs/{world.alpha_running}/cancel", {})
    assert cancel["status"] == 403 and cancel["code"] != "csrf", cancel
    submit = fetch(page, "POST", "/api/v1/jobs", {"spec": job_spec("true")})
    assert submit["status"] == 403 and submit["code"] != "csrf", submit
    assert world.alpha["member"].api.job(world.alpha_running)["state"] == "RUNNING"


def test_the_prediction_form_starts_with_an_instance_of_the_models_shape(world: World, context: BrowserContext) -> None:
    """The service's input schema says one instance is 6 numbers: the form starts with those (it offered 4 numbers
    whatever the model; console/src/predictExample.ts, checked against the replica's checks in
    tests/e2e/test_predict_example.py)."""
    page = sign_in(context, world.server.url, world.alpha["member"], f"/services/{world.alpha_service}")
    body = page.get_by_test_id("predict-body")
    expect(body).to_have_value('{"inputs":[[0,0,0,0,0,0]]}')


def test_another_organisation_sees_nothing_of_the_first(world: World, context: BrowserContext) -> None:
    page = sign_in(context, world.server.url, world.bravo["member"], "/jobs")
    expect(page.get_by_test_id("job-count")).to_contain_text("(all)")
    rows = page.get_by_test_id("job-row")
    assert [rows.nth(i).get_attribute("data-job-id") for i in range(rows.count())] == [world.bravo_job]
    page.get_by_test_id("nav-datasets").click()
    expect(page.get_by_role("heading", name="Datasets")).to_be_visible()
    expect(page.locator("main .empty")).to_contain_text("No datasets")
    expect(page.get_by_test_id("dataset-row")).to_have_count(0)
    expect(page.get_by_text(world.alpha_dataset)).to_have_count(0)
    page.get_by_test_id("nav-services").click()
    expect(page.get_by_role("heading", name="Services")).to_be_visible()
    expect(page.locator("main .empty")).to_contain_text("No services")
    expect(page.get_by_test_id("service-row")).to_have_count(0)
    expect(page.get_by_text(world.alpha_service)).to_have_count(0)
    # A deep link to the first organisation's job finds nothing.
    page.goto(f"{world.server.url}/jobs/{world.alpha_running}")
    expect(page.get_by_test_id("error")).to_contain_text("not found", ignore_case=True)
    expect(page.get_by_test_id("job-detail")).to_have_count(0)


def test_changes_need_the_csrf_token_and_a_cookie_works_only_on_its_server(
    world: World, context: BrowserContext
) -> None:
    page = sign_in(context, world.server.url, world.alpha["member"])
    spec = {"spec": job_spec("true", name="csrf-check")}
    for token in (None, "forged"):
        refused = fetch(page, "POST", "/api/v1/jobs", spec, csrf=token)
        assert (refused["status"], refused["code"]) == (403, "csrf"), refused
    accepted = fetch(page, "POST", "/api/v1/jobs", spec)
    assert accepted["status"] == 201, accepted

    # The same browser, the same cookie (cookies are per host, not per port), another server key: signed out.
    assert [c["name"] for c in context.cookies(world.other.url)] == ["kiln_session"]
    page.goto(world.other.url + "/jobs")
    expect(page.get_by_test_id("signin-form")).to_be_visible()
    session = fetch(page, "GET", "/api/v1/session", csrf=None)
    # Refused for its MAC ("signature"), not for a missing cookie: the browser did send it.
    assert session["status"] == 401 and json.loads(session["text"])["details"]["reason"] == "signature", session


def test_every_page_renders_and_is_kept_as_a_screenshot(world: World, context: BrowserContext) -> None:
    admin = world.alpha["admin"]
    page = sign_in(context, world.server.url, admin)
    shots = artifacts_dir("console")
    loaded = {
        "overview": ("/", "[data-testid=quota-table]"),
        "jobs": ("/jobs", f'[data-testid=job-row][data-job-id="{world.alpha_running}"]'),
        "job-detail": (f"/jobs/{world.alpha_running}", "[data-testid=event-row]"),
        "studies": ("/studies", "h1:text('Studies')"),
        "models": ("/models", "[data-testid=model-row]"),
        "services": ("/services", "[data-testid=service-row]"),
        "datasets": ("/datasets", "[data-testid=dataset-row]"),
        "admin": ("/admin", "[data-testid=key-row]"),
    }
    for name, (path, marker) in loaded.items():
        page.goto(world.server.url + path)
        expect(page.locator(marker).first).to_be_visible()
        expect(page.locator("main [aria-busy=true]")).to_have_count(0)
        expect(page.get_by_test_id("error")).to_have_count(0)
        target = shots / f"{name}.png"
        page.screenshot(path=str(target), full_page=True)
        assert target.stat().st_size > 1000, target


def test_the_jobs_page_fits_a_narrow_window(world: World) -> None:
    context = world.browser.new_context(viewport={"width": 480, "height": 800})
    context.set_default_timeout(WAIT_MS)
    try:
        page = sign_in(context, world.server.url, world.alpha["member"], "/jobs")
        expect(page.locator(f'[data-testid=job-row][data-job-id="{world.alpha_running}"]')).to_be_visible()
        assert page.evaluate("window.innerWidth") == 480
        scroll, client = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert scroll <= client, f"the jobs page is {scroll} px wide in a {client} px window"
        page.screenshot(path=str(artifacts_dir("console") / "jobs-480px.png"), full_page=True)
    finally:
        context.close()


def _js_number(x: float) -> str:
    """A number as JavaScript's String() writes it (8, 0.2), for comparing the page's attributes with the API's."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _meter_readings(page: Page, nodes: list[dict[str, Any]]) -> list[tuple[str, str | None, str | None, str]]:
    readings = []
    for node in nodes:
        card = page.locator(f'[data-testid=node][data-node="{node["name"]}"]')
        for label in ("CPUs", "memory"):
            bar = card.get_by_role("meter", name=f"{node['name']} {label}")
            readings.append(
                (label, bar.get_attribute("aria-valuenow"), bar.get_attribute("aria-valuemax"), card.inner_text())
            )
    return readings


def test_the_machines_card_shows_what_nodes_says_and_a_quota_without_limit_says_so(
    world: World, context: BrowserContext
) -> None:
    """The meters read GET /nodes' allocated_cpus and allocated_memory (they read fields /nodes never sent, and
    showed 0 in use while jobs held CPUs); a quota cell with no limit reads "1 used, no limit", not "1 (no limit)"."""
    page = sign_in(context, world.server.url, world.alpha["member"], "/")
    expect(page.get_by_test_id("node").first).to_be_visible()
    # Jobs of other tests may start or end meanwhile; the page reads /nodes every 5 s: the two agree within 20 s.
    deadline = time.monotonic() + 20
    while True:
        nodes = json.loads(fetch(page, "GET", "/api/v1/nodes", csrf=None)["text"])["items"]
        expected = [
            (label, _js_number(node[f"allocated_{field}"]), _js_number(node[field]))
            for node in nodes
            for label, field in (("CPUs", "cpus"), ("memory", "memory"))
        ]
        shown = _meter_readings(page, nodes)
        if [r[:3] for r in shown] == expected or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert [r[:3] for r in shown] == expected, (shown, nodes)
    held = next(node for node in nodes if node["allocated_cpus"] >= 0.1)  # alpha's and quota's running jobs
    assert held["allocated_memory"] >= parse_memory(ALPHA_HOLD_MEMORY), held
    card = page.locator(f'[data-testid=node][data-node="{held["name"]}"]')
    cpus = f"{round(held['allocated_cpus'], 2):g} / {held['cpus']:g}"
    expect(card.get_by_test_id("meter").first).to_have_text(cpus)

    report = json.loads(fetch(page, "GET", "/api/v1/quota", csrf=None)["text"])
    table = page.get_by_test_id("quota-table")
    expect(table.get_by_test_id("quota-row")).to_have_count(len(report["categories"]))
    assert "no limit" in table.inner_text() and "(no limit)" not in table.inner_text()
    for category in report["categories"]:
        if category["limits"]["count"] is None and category["used"]["count"] is not None:
            jobs_cell = table.locator(f'[data-testid=quota-row][data-category="{category["category"]}"] td').nth(3)
            expect(jobs_cell).to_have_text(f"{category['used']['count']} used, no limit")


# parseBytes (console/src/format.ts) beside the server's parse_memory: the same text is the same size, or refused by
# both. Units either case, with or without i and B; Python's whitespace and Unicode digits; what neither reads.
SIZE_TEXTS = [
    *["2G", "2g", "2GB", "2gb", "2Gi", "2GiB", "2gib", "2 G", "2 Gi", "2\tGi", "1.5G", "1.5Gi", "512M", "512Mi"],
    *["512m", "100k", "100K", "100KB", "100kib", "3T", "3Ti", "7.3Mi", "0.1M", "1073741824", "0", "0.5", "1.7"],
    *["1B", "1b", "2.999999999999999999G", "123456789012345678901234567890", "2P", "2PiB", "1e3", "+2G", "-2G"],
    *[".5G", "5.G", "G", "2GBi", "2Gi B", "2 G B"],
    " 2G ",
    "\t2G\n",
    "2G\x1c",
    "2G\x85",
    "2\u00a0G",
    "2G\ufeff",
    "\u0662G",  # ARABIC-INDIC DIGIT TWO
    "\uff11.\uff15Gi",  # FULLWIDTH 1.5
    "2\u212a",  # KELVIN SIGN: a k to Python's case-insensitive match, and to JavaScript's
    "1" * 400 + "G",  # out of range
    "",
    "   ",
    "\u3000",
]
PARSE_SIZES = """(format, texts) => texts.map((t) => {
  const n = format.parseBytes(t);
  return n === null ? "empty" : Number.isNaN(n) ? "refused" : n;
})"""


@pytest.mark.needs("node")
def test_the_console_reads_a_size_as_the_server_does() -> None:
    """One grammar for sizes: console/src/format.ts's parseBytes, run by Node.js (transpiled by the console's own
    TypeScript), gives what kiln.domain.quantities.parse_memory gives for every text of the table (2G was 2·10⁹
    bytes in the console, 2·1024³ on the server); the form's submitted memory is checked in the form test."""

    def server_reads(text: str) -> int | str:
        if not text.strip():
            return "empty"  # the form's "not given"
        try:
            return parse_memory(text)
        except (ValueError, OverflowError):
            return "refused"

    console_reads = run_module("format.ts", PARSE_SIZES, SIZE_TEXTS)
    differ = [
        (text, server, read)
        for text, server, read in zip(SIZE_TEXTS, map(server_reads, SIZE_TEXTS), console_reads, strict=True)
        if server != read
    ]
    assert not differ, f"(text, server, console): {differ}"


# money() and hours() (console/src/format.ts) beside the CLI's format_money and format_hours (kiln.domain.usage).
AMOUNTS = [0.0, 0.0015, 0.001, 0.0058, 0.000001, 0.00999, 0.01, 0.126, 1.5, 12.345678, 1234.5, 98765.4321, -0.004, -3.2]
SECONDS = [0, 0.01, 6, 36, 360, 3600, 5000, 3600 * 12.34, 3600 * 99.9, 3600 * 1234.4, 3600 * 123456.7]
FORMAT_NUMBERS = """(format, [amounts, seconds]) => [
  amounts.map((n) => format.money(n)),
  seconds.map((s) => format.hours(s)),
]"""


@pytest.mark.needs("node")
def test_the_cli_prints_costs_and_hours_as_the_console_does() -> None:
    """A budget of 0.001 read "HARD 0.00" in the CLI and 0.001 in the console: one rule now, checked by running the
    console's own format.ts under Node.js over a table of amounts."""
    money, hours = run_module("format.ts", FORMAT_NUMBERS, [AMOUNTS, SECONDS])
    assert [format_money(a) for a in AMOUNTS] == money
    assert [format_hours(s) for s in SECONDS] == hours


def test_a_studys_objective_chart_draws_and_counts_every_trial_with_a_value(
    world: World, context: BrowserContext
) -> None:
    """Finished trials at their value, pruned ones greyed at the last value they reported, and a caption that counts
    what is drawn (it said "6 points" for 3 dots: the best-so-far line's points counted, the pruned trials left
    out). A study that prunes takes a minute of trial jobs here, so the page gets the API's answers made with the
    server's own response models (kiln.domain.studies), through the browser's request routing."""
    study, trials = _study_with_pruned_trials()
    page = sign_in(context, world.server.url, world.alpha["member"], "/jobs")

    def answer(body: dict[str, Any]) -> Any:
        return lambda route: route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

    page.route(f"**/api/v1/studies/{study['id']}", answer(study))
    page.route(f"**/api/v1/studies/{study['id']}/trials", answer({"items": trials}))
    page.goto(f"{world.server.url}/studies/{study['id']}")
    chart = page.get_by_test_id("objective-chart")
    expect(chart).to_have_attribute("data-ready", "true")
    finished = [t for t in trials if t["value"] is not None]
    pruned = [t for t in trials if t["state"] == "PRUNED"]
    assert len(finished) == 3 and len(pruned) == 2
    expect(chart).to_have_attribute("data-points", "5")
    expect(chart.locator("figcaption")).to_have_text("val_acc 5 trials, 2 pruned")
    expect(chart.locator(".u-legend")).to_contain_text("pruned")
    chart.screenshot(path=str(artifacts_dir("console") / "study-objective.png"))
    # The trials table says why the pruner stopped a trial: its value, the cutoff, how many others, the step.
    reasons = page.get_by_test_id("prune-reason")
    expect(reasons).to_have_count(1)
    expect(page.locator("[data-testid=trial-row][data-trial='1'] [data-testid=prune-reason]")).to_have_text(
        "best 0.32 < median 0.81 of 1 at step 2"
    )


def _study_with_pruned_trials() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A study's and its trials' answers as the server writes them: 3 succeeded, 2 pruned, 1 failed."""
    from kiln.domain.studies import PruneReport, StudyRead, StudySpec, TrialCounts, TrialRead

    now = datetime.now(UTC)
    spec = StudySpec.model_validate(
        {
            "trial": {"command": "python train.py --lr {lr}"},
            "parameters": {"lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True}},
            "objective": {"metric": "val_acc", "direction": "maximize"},
            "algorithm": "random",
            "early_stopping": {"type": "median", "startup_trials": 1},
            "max_trials": 6,
            "parallelism": 2,
        }
    )
    rows = [  # number, state, value, last value, pruned at
        (0, "SUCCEEDED", 0.81, 0.81, None),
        (1, "PRUNED", None, 0.32, 2),
        (2, "SUCCEEDED", 0.93, 0.93, None),
        (3, "PRUNED", None, 0.41, 3),
        (4, "SUCCEEDED", 0.87, 0.87, None),
        (5, "FAILED", None, None, None),
    ]
    trials = [
        TrialRead(
            study_id="study-console-chart",
            number=number,
            state=state,
            params={"lr": 0.01 * (number + 1)},
            value=value,
            last_step=None if last is None else (pruned_at or 5),
            last_value=last,
            pruned_step=pruned_at,
            # Why the pruner stopped trial 1 (trial 3's report predates them): as the server records it.
            pruning=PruneReport(rule="median", rung=2, step=2, value=0.32, cutoff=0.81, compared=1, needed=1)
            if number == 1
            else None,
            created_at=now,
            finished_at=now,
            duration_seconds=3.0,
        )
        for number, state, value, last, pruned_at in rows
    ]
    study = StudyRead(
        id="study-console-chart",
        name="console-chart",
        org_id="org-x",
        user_id="user-x",
        state="SUCCEEDED",
        spec=spec,
        planned_trials=6,
        trials=TrialCounts(total=6, succeeded=3, pruned=2, failed=1),
        best=trials[2],
        created_at=now,
        updated_at=now,
        finished_at=now,
    )
    return study.model_dump(mode="json"), [t.model_dump(mode="json") for t in trials]


def test_an_ended_job_without_checkpoints_says_so_in_one_sentence(world: World, context: BrowserContext) -> None:
    page = sign_in(context, world.server.url, world.alpha["member"], f"/jobs/{world.alpha_finished}")
    # It holds nothing now, and says where it ran rather than "Placed on —".
    expect(page.get_by_test_id("job-ran-on")).to_contain_text("CPU")
    expect(page.get_by_test_id("job-ran-on")).to_contain_text("released when it ended")
    page.get_by_test_id("tab-artifacts").click()
    expect(page.get_by_test_id("artifact-row")).to_have_count(1)
    expect(page.get_by_test_id("files-checkpoints").locator(".empty")).to_have_text("No checkpoints.")


def test_the_audit_tab_and_a_jobs_page_name_people(world: World, context: BrowserContext) -> None:
    """Where people read who did something, the console shows the user's name (the id is the cell's title): the audit
    tab showed user ids, and a job's page the submitter's id unless it was the reader's own job."""
    admin, member = world.alpha["admin"], world.alpha["member"]
    page = sign_in(context, world.server.url, admin, "/admin?tab=audit")
    page.get_by_label("Action").fill("submit_job")
    page.get_by_test_id("audit-apply").click()
    records = json.loads(fetch(page, "GET", "/api/v1/audit?action=submit_job&limit=100", csrf=None)["text"])["items"]
    submitted = [r for r in records if r["user_id"] == member.user_id]
    assert submitted and all(r["user_name"] == member.user_name for r in submitted), records
    users = page.get_by_test_id("audit-row-user")
    expect(users.filter(has_text=member.user_name).first).to_have_attribute("title", member.user_id)
    assert member.user_id not in page.locator("table").inner_text()

    page.goto(f"{world.server.url}/jobs/{world.alpha_running}")
    details = page.get_by_test_id("job-details")
    expect(details).to_contain_text(member.user_name)
    assert member.user_id not in details.inner_text()


def test_a_job_page_asks_for_its_session_job_and_metric_summary_once_each_at_the_start(
    world: World, context: BrowserContext
) -> None:
    """public/early.js sends the session check, the job and (on the Metrics tab) its summary while the bundle loads;
    the app takes those answers instead of asking again one after the other. What it got signed out (401s) is not
    reused once signed in: sign_in starts on this page signed out."""
    job_id = world.alpha_finished
    page = sign_in(context, world.server.url, world.alpha["member"], f"/jobs/{job_id}?tab=metrics")
    expect(page.get_by_test_id("job-detail")).to_have_attribute("data-job-id", job_id)
    asked: list[str] = []
    page.on("request", lambda r: asked.append(urlsplit(r.url).path) if "/api/v1/" in r.url else None)
    page.reload()
    expect(page.get_by_test_id("job-detail")).to_have_attribute("data-job-id", job_id)
    expect(page.get_by_test_id("charts").locator("[aria-busy=true]")).to_have_count(0)  # the summary is in
    for path in ("/api/v1/session", f"/api/v1/jobs/{job_id}", f"/api/v1/jobs/{job_id}/metrics/summary"):
        assert asked.count(path) == 1, (path, asked)


def test_an_mlflow_run_link_opens_that_run_in_the_console_after_signing_in(
    world: World, context: BrowserContext
) -> None:
    """MLflow's client prints ``<endpoint>/mlflow/#/experiments/E/runs/R`` for every run: the fragment never reaches
    the server, which answers the console there (no credential needed: the page holds no data); the console takes
    a signed-out reader through sign-in to the runs of that experiment with that run picked."""
    run = world.alpha_finished
    link = f"{world.server.url}/mlflow/#/experiments/0/runs/{run}"
    answer = httpx.get(link, timeout=10)  # what MLflow's link gets without the browser: the page, not a 401
    assert answer.status_code == 200 and "<html" in answer.text.lower(), (answer.status_code, answer.text[:200])
    page = sign_in(context, world.server.url, world.alpha["member"], f"/mlflow/#/experiments/0/runs/{run}")
    expect(page).to_have_url(re.compile(rf"/runs\?(.*&)?compare={run}"))
    expect(page).to_have_url(re.compile(r"[?&]experiment=Default(&|$)"))
    expect(page.get_by_test_id("runs-experiment")).to_have_value("Default")
    expect(page.locator(f'[data-testid=run-row][data-run="{run}"] input[type=checkbox]')).to_be_checked()
    page.goto(f"{world.server.url}/mlflow")  # MLflow's UI root: the runs page
    expect(page).to_have_url(re.compile(r"/runs(\?|$)"))


# Whether a chart's canvas holds a pixel of the palette's first colour (#2563eb): what uPlot drew of the first line.
FIRST_COLOUR_DRAWN = """(figure) => {
    const canvas = figure.querySelector("canvas");
    const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    const near = (a, b) => Math.abs(a - b) < 12;
    for (let i = 0; i < data.length; i += 4) {
        if (near(data[i], 37) && near(data[i + 1], 99) && near(data[i + 2], 235)) return true;
    }
    return false;
}"""


def test_the_runs_table_shows_what_differs_rounded_and_a_one_point_metric_as_a_point(
    world: World, context: BrowserContext
) -> None:
    """The default columns were the first params alphabetically, floats printed whole, a one-point metric an empty
    chart: now the objective, the param that differs, numbers to 4 digits (all of them on hover), a dot."""
    account = world.alpha["member"]
    mlflow = httpx.Client(base_url=f"{world.server.url}/mlflow/api/2.0/mlflow", auth=(account.key_id, account.secret))
    experiment = mlflow.post("/experiments/create", json={"name": "console-columns"}).json()["experiment_id"]
    lrs = ["0.00012009732465102296", "0.01", "0.1"]
    for i, lr in enumerate(lrs):
        run = mlflow.post("/runs/create", json={"experiment_id": experiment, "run_name": f"cc-{i}"}).json()["run"]
        params = [{"key": "lr", "value": lr}, {"key": "width", "value": "64"}]
        params += [{"key": "base_url", "value": "/notebooks/x/"}] if i == 0 else []  # one run's: says nothing
        metrics = [{"key": "val_acc", "value": 0.5 + i / 7, "timestamp": 1, "step": 0}]
        tags = [{"key": "kiln.objective", "value": "val_acc"}]  # as a study's trial's run is tagged
        body = {"run_id": run["info"]["run_id"], "params": params, "metrics": metrics, "tags": tags}
        assert mlflow.post("/runs/log-batch", json=body).status_code == 200
    mlflow.close()
    page = sign_in(context, world.server.url, account, "/runs?experiment=console-columns")
    expect(page.get_by_test_id("run-row")).to_have_count(3)
    headers = page.locator("[data-testid^=sort-]").evaluate_all("bs => bs.map(b => b.dataset.testid)")
    assert headers == ["sort-metrics.val_acc", "sort-params.lr"], headers
    cell = page.locator("[data-testid=run-row] td[title='0.00012009732465102296']")
    expect(cell).to_have_text("0.0001201")
    expect(page.get_by_test_id("runs-experiment")).to_contain_text("console-columns (3 runs)")
    page.get_by_label("compare cc-0").check()
    page.get_by_label("compare cc-1").check()
    chart = page.locator("[data-testid=compare-chart-val_acc][data-ready=true]")
    expect(chart).to_have_attribute("data-points", "2")
    assert chart.evaluate(FIRST_COLOUR_DRAWN), "a one-point line drew nothing"
