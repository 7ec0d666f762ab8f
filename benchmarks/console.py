"""The web console in Chromium: time to the first chart on a 1,000,000-point series and on a job with 50 metrics,
against loading a static page of the same size; ten runs of 1,000,000 points each compared on the Runs page; and
the jobs list of 10,000 jobs scrolled without loading them all.

    .venv/bin/python benchmarks/console.py [--points 1000000] [--metrics 50] [--compare-runs 10] [--jobs 10000]
                                           [--runs 5] [--json PATH]

One fresh ``kiln server`` (``tests.kilnserver.KilnServer``, rate limit off for the bulk writes) and one headless
Chromium (Debian's /usr/bin/chromium through Playwright, ``tests/browser.py``); the console must be built (`make
console`). Set-up, not timed: a member's finished jobs get their metrics through ``POST /api/v1/jobs/{id}/metrics``
(ndjson, 100,000 lines a request): "long" one series of ``--points`` steps, "wide" ``--metrics`` series of 1,000
steps, and ``--compare-runs`` - 1 more jobs one ``--points`` series each (the runs compared, with "long");
``--jobs`` finished jobs of another organisation are written straight into the database (``tests/helpers.py
seed_jobs``) and its user gets a key.

1. charts     each run, in a new browser profile (nothing cached, signed in through ``POST /api/v1/session``):
              ``/jobs/{id}?tab=metrics`` of "long" and of "wide", and the static page. Chart ready = the console's
              ``kiln:first-chart`` performance mark, set when uPlot has drawn its first chart (from the navigation's
              start: the document; the bundle, with the session check, the job and the summary that
              ``public/early.js`` asks for at once while it loads; then the downsampled series); for "wide" also
              when every chart in view has drawn. Baseline: a static HTML page as large as the "long" page's whole
              load (its document, assets and API answers, decoded bytes), served from this process, to its first
              contentful paint and its load event. Medians of ``--runs``; target ≤ 0.5 s for "long", ≤ 1 s for
              "wide".
2. compare    each run, in a new browser profile: ``/runs?compare=ID,...`` (the Runs page keeps the runs compared in
              its URL), from the navigation's start to the console's ``kiln:compare-chart`` mark (uPlot has drawn the
              overlaid chart of the runs' ``loss``: document, bundle, session, the experiment, the runs table, then
              one ``GET /api/v1/runs/metrics`` of every run, each series downsampled by the server to the chart's
              width). Baseline: a static page as large as that load. Medians of ``--runs``; target ≤ 1 s.
3. jobs list  the seeded user's ``/jobs``: time to the first rows, then ``--screens`` mouse-wheel events of 2,000 px
              (Chromium moves the list about 1,450 px for each), each waited for until its rows are drawn. Counted
              from the page's requests: ``GET /api/v1/jobs`` requests and the rows they returned, distinct jobs
              fetched, and the most rows in the DOM at once. Target: fewer jobs fetched than exist.

It prints the figures and a PASS/FAIL table, and asserts nothing (the machine is small and shared).
"""

from __future__ import annotations

import argparse
import http.server
import json
import math
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from playwright.sync_api import Browser, BrowserContext, sync_playwright  # noqa: E402
from report import finish, parse_args, print_table  # noqa: E402
from tests.browser import launch  # noqa: E402
from tests.helpers import seed_jobs  # noqa: E402
from tests.kilnserver import KilnServer  # noqa: E402
from tests.tenancy_helpers import Account, Api, create_key, create_tenant  # noqa: E402

from kiln.db.session import Database  # noqa: E402
from kiln.domain.ids import new_id  # noqa: E402
from kiln.domain.spec import JobSpec  # noqa: E402

TARGET_CHART_S = 1.0
TARGET_LONG_S = 0.5  # the long series' chart: its page's requests no longer wait for one another
TARGET_COMPARE_S = 1.0
BATCH = 100_000  # ndjson lines per POST (about 5 MB; the route takes up to 8 MiB)
WAIT_MS = 120_000
LIST_USER = "usr-console-bench"

TIMING = """() => {
    const nav = performance.getEntriesByType("navigation")[0];
    const res = performance.getEntriesByType("resource");
    const mark = performance.getEntriesByName("kiln:first-chart")[0];
    const fcp = performance.getEntriesByName("first-contentful-paint")[0];
    const url = (r) => new URL(r.name);
    const isSeries = (r) => url(r).pathname.endsWith("/metrics") && url(r).pathname.startsWith("/api/v1/jobs/");
    const series = res.filter(isSeries);
    // When each step on the way to the first chart had its answer (the first of its kind), from the navigation.
    const steps = {
        bundle: (r) => url(r).pathname.startsWith("/assets/") && url(r).pathname.endsWith(".js"),
        session: (r) => url(r).pathname === "/api/v1/session",
        job: (r) => /^[/]api[/]v1[/]jobs[/][^/]+$/.test(url(r).pathname),
        summary: (r) => url(r).pathname.endsWith("/metrics/summary"),
        series: isSeries,
    };
    const path = {document: nav.responseEnd / 1000};
    for (const [name, test] of Object.entries(steps)) {
        const hit = res.find(test);
        if (hit) path[name] = hit.responseEnd / 1000;
    }
    return {
        first_chart: mark ? mark.startTime / 1000 : null,
        fcp: fcp ? fcp.startTime / 1000 : null,
        load: nav.loadEventEnd / 1000,
        decoded_bytes: nav.decodedBodySize + res.reduce((n, r) => n + r.decodedBodySize, 0),
        transfer_bytes: nav.transferSize + res.reduce((n, r) => n + r.transferSize, 0),
        requests: res.length + 1,
        series_requests: series.length,
        series_s: series.map((r) => (r.responseEnd - r.requestStart) / 1000),
        path,
    };
}"""
# The Runs page's compare view, opened from its URL: when each answer on the way to the overlaid chart came.
COMPARE_TIMING = """() => {
    const nav = performance.getEntriesByType("navigation")[0];
    const res = performance.getEntriesByType("resource");
    const mark = performance.getEntriesByName("kiln:compare-chart")[0];
    const url = (r) => new URL(r.name);
    const isCompare = (r) => url(r).pathname === "/api/v1/runs/metrics";
    const steps = {
        bundle: (r) => url(r).pathname.startsWith("/assets/") && url(r).pathname.endsWith(".js"),
        session: (r) => url(r).pathname === "/api/v1/session",
        experiment: (r) => url(r).pathname.endsWith("/experiments/get-by-name"),
        runs: (r) => url(r).pathname.endsWith("/runs/search"),
        compare: isCompare,
    };
    const path = {document: nav.responseEnd / 1000};
    for (const [name, test] of Object.entries(steps)) {
        const hit = res.find(test);
        if (hit) path[name] = hit.responseEnd / 1000;
    }
    const compare = res.filter(isCompare);
    return {
        compare_chart: mark ? mark.startTime / 1000 : null,
        decoded_bytes: nav.decodedBodySize + res.reduce((n, r) => n + r.decodedBodySize, 0),
        transfer_bytes: nav.transferSize + res.reduce((n, r) => n + r.transferSize, 0),
        requests: res.length + 1,
        compare_requests: compare.length,
        compare_s: compare.map((r) => (r.responseEnd - r.requestStart) / 1000),
        compare_bytes: compare.reduce((n, r) => n + r.decodedBodySize, 0),
        history_requests: res.filter((r) => url(r).pathname.endsWith("/metrics/get-history")).length,
        path,
    };
}"""
# Every chart slot in the window holds a drawn chart: when, how many, of how many slots.
IN_VIEW_READY = """() => {
    const slots = [...document.querySelectorAll(".chart-slot")];
    const inView = slots.filter((s) => {
        const r = s.getBoundingClientRect();
        return r.bottom > 0 && r.top < innerHeight;
    });
    const drawn = (s) => s.querySelector("[data-testid=metric-chart][data-ready=true]");
    if (!inView.length || !inView.every(drawn)) return false;
    return {t: performance.now() / 1000, charts: inView.length, slots: slots.length};
}"""
# The rows drawn cover the list's window at its scroll position.
ROWS_COVER = """() => {
    const box = document.querySelector("[data-testid=job-scroll]");
    const rows = [...box.querySelectorAll("[data-testid=job-row]")].map((r) => parseFloat(r.style.top));
    const covered = rows.some((top) => top <= box.scrollTop + 1 && top + 44 > box.scrollTop);
    return covered ? {rows: rows.length, scrollTop: box.scrollTop, max: box.scrollHeight - box.clientHeight} : false;
}"""


def post_series(api: Api, job_id: str, lines: list[str]) -> int:
    """Send ndjson lines in batches; the points stored."""
    stored = 0
    for i in range(0, len(lines), BATCH):
        body = "".join(lines[i : i + BATCH]).encode()
        answer = api.ok("POST", f"/jobs/{job_id}/metrics", content=body, content_type="application/x-ndjson")
        stored += answer["points"]
    return stored


def setup_metrics(api: Api, points: int, metrics: int) -> dict[str, Any]:
    """Two finished jobs of the member: "long" (one series of ``points``) and "wide" (``metrics`` series)."""
    long_job = api.submit("true", name="bench-long", resources={"cpus": 0.1})
    wide_job = api.submit("true", name="bench-wide", resources={"cpus": 0.1})
    for job in (long_job, wide_job):
        api.wait(job["id"], timeout=120)
    t0 = 1.7e9
    started = time.perf_counter()
    long_lines = [
        json.dumps({"t": t0 + i * 0.01, "s": i, "m": {"loss": 2.0 * math.exp(-i / 200_000) + 0.05 * math.sin(i / 500)}})
        + "\n"
        for i in range(points)
    ]
    stored = post_series(api, long_job["id"], long_lines)
    long_s = time.perf_counter() - started
    wide_lines = [
        json.dumps({"t": t0 + s, "s": s, "m": {f"metric_{k:02d}": math.cos(s / 50 + k) + k for k in range(metrics)}})
        + "\n"
        for s in range(1000)
    ]
    wide_stored = post_series(api, wide_job["id"], wide_lines)
    print(
        f"metrics: {stored:,} points of one series in {long_s:.1f}s ({stored / long_s:,.0f} points/s through the API);"
        f" {wide_stored:,} points in {metrics} series",
        flush=True,
    )
    return {
        "long": long_job["id"],
        "wide": wide_job["id"],
        "long_points": stored,
        "wide_points": wide_stored,
        "ingest_points_per_s": stored / long_s,
    }


def run_lines(points: int, k: int) -> list[str]:
    """Run ``k``'s loss: the long series' curve, falling a little slower for each k (f-strings, not json.dumps:
    ten runs of a million lines)."""
    rate = 200_000 * (1 + 0.1 * k)
    loss = (2.0 * math.exp(-i / rate) + 0.05 * math.sin(i / 500 + k) for i in range(points))
    return [f'{{"t": {1.7e9 + i * 0.01!r}, "s": {i}, "m": {{"loss": {v!r}}}}}\n' for i, v in enumerate(loss)]


def setup_compare(api: Api, points: int, n: int, long_id: str) -> list[str]:
    """``n`` finished jobs (runs) of the member with a ``points`` series each: "long" and ``n - 1`` more."""
    jobs = [api.submit("true", name=f"bench-run-{k:02d}", resources={"cpus": 0.1}) for k in range(1, n)]
    for job in jobs:
        api.wait(job["id"], timeout=120)
    started = time.perf_counter()
    stored = sum(post_series(api, job["id"], run_lines(points, k)) for k, job in enumerate(jobs, start=1))
    print(
        f'compare: {n} runs of {points:,} points ("long" and {n - 1} more: {stored:,} points stored in '
        f"{time.perf_counter() - started:.1f}s)",
        flush=True,
    )
    return [long_id, *(job["id"] for job in jobs)]


def seed_list(home: Path, n: int) -> None:
    """``n`` finished jobs of a new organisation's user, written straight into the (stopped) server's database."""
    db = Database(f"sqlite:///{home / 'kiln.db'}")
    spec = JobSpec.model_validate(
        {"command": "true", "runtime": {"python": sys.executable}, "resources": {"cpus": 0.1}}
    )
    template = spec.model_dump(mode="json")
    end = datetime.now(UTC)
    jobs: dict[str, dict[str, Any]] = {}
    for i in range(n):
        created = end - timedelta(seconds=n - i)
        jobs[new_id("job")] = {
            "name": f"seeded-{i:05d}",
            "spec": template,
            "state": "SUCCEEDED",
            "reason": "Succeeded",
            "exit_code": 0,
            "attempt": 1,
            "cpus": 0.1,
            "created_at": created,
            "updated_at": created,
            "started_at": created,
            "running_at": created,
            "finished_at": created + timedelta(seconds=0.5),
        }
    started = time.perf_counter()
    seed_jobs(db, "org-console-bench", LIST_USER, jobs)
    db.dispose()
    print(f"jobs list: {n:,} jobs seeded in {time.perf_counter() - started:.1f}s", flush=True)


def signed_in(browser: Browser, url: str, key_id: str, secret: str) -> BrowserContext:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(WAIT_MS)
    answer = context.request.post(url + "/api/v1/session", data={"key_id": key_id, "secret": secret})
    assert answer.status == 200, answer.text()
    return context


def static_server(size: int, root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A page of ``size`` bytes (text in a <pre>), served from a thread of this process."""
    # the same empty icon as the console's page: the browser then asks for no /favicon.ico
    head = '<!doctype html><html><head><title>static</title><link rel="icon" href="data:,"></head><body><pre>'
    tail = "</pre></body></html>"
    filler = "static page of the same size as the console's chart page, line after line of plain text.\n"
    body = (filler * (size // len(filler) + 1))[: max(0, size - len(head) - len(tail))]
    (root / "static.html").write_text(head + body + tail)
    handler = partial(QuietHandler, directory=str(root))
    httpd = QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/static.html"


class QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # a browser closing its connection before the answer is written (a new page, the context closed) is normal;
        # anything else is printed as the standard library would
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def chart_run(browser: Browser, url: str, account: Account, job_id: str, wide: bool) -> dict[str, Any]:
    context = signed_in(browser, url, account.key_id, account.secret)
    try:
        page = context.new_page()
        page.goto(f"{url}/jobs/{job_id}?tab=metrics")
        page.wait_for_selector("[data-testid=metric-chart][data-ready=true]")
        in_view = page.wait_for_function(IN_VIEW_READY, polling="raf").json_value() if wide else None
        timing: dict[str, Any] = page.evaluate(TIMING)
        points = page.locator("[data-testid=metric-chart]").first
        timing["drawn_points"] = int(points.get_attribute("data-points") or 0)
        timing["series_count"] = int(points.get_attribute("data-count") or 0)
        if in_view:
            timing.update(in_view_ready=in_view["t"], charts_in_view=in_view["charts"], chart_slots=in_view["slots"])
        return timing
    finally:
        context.close()


def static_run(browser: Browser, static_url: str) -> dict[str, Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        page.goto(static_url, wait_until="load")
        page.wait_for_function("performance.getEntriesByName('first-contentful-paint').length > 0")
        return page.evaluate(TIMING)  # type: ignore[no-any-return]
    finally:
        context.close()


def section_charts(browser: Browser, url: str, account: Account, ids: dict[str, Any], runs: int) -> dict[str, Any]:
    first = chart_run(browser, url, account, ids["long"], wide=False)  # a warm-up, and the size of the load
    size = first["decoded_bytes"]
    with tempfile.TemporaryDirectory() as tmp:
        httpd, static_url = static_server(size, Path(tmp))
        try:
            long_runs, wide_runs, static_runs = [], [], []
            for _ in range(runs):  # interleaved, so a busy moment of the machine touches all three
                static_runs.append(static_run(browser, static_url))
                long_runs.append(chart_run(browser, url, account, ids["long"], wide=False))
                wide_runs.append(chart_run(browser, url, account, ids["wide"], wide=True))
        finally:
            httpd.shutdown()
    return {"page_decoded_bytes": size, "long": long_runs, "wide": wide_runs, "static": static_runs}


def compare_run(browser: Browser, url: str, account: Account, run_ids: list[str]) -> dict[str, Any]:
    """The Runs page opened on its compare view of ``run_ids`` (the view's state is in its URL)."""
    context = signed_in(browser, url, account.key_id, account.secret)
    try:
        page = context.new_page()
        page.goto(f"{url}/runs?compare={','.join(run_ids)}")
        page.wait_for_selector("[data-testid=compare-chart-loss][data-ready=true]")
        page.wait_for_function("performance.getEntriesByName('kiln:compare-chart').length > 0")
        timing: dict[str, Any] = page.evaluate(COMPARE_TIMING)
        chart = page.get_by_test_id("compare-chart-loss")
        timing["drawn_points"] = int(chart.get_attribute("data-points") or 0)
        timing["series_count"] = int(chart.get_attribute("data-count") or 0)
        timing["downsample"] = int(page.get_by_test_id("runs-compare").get_attribute("data-downsample") or 0)
        return timing
    finally:
        context.close()


def section_compare(browser: Browser, url: str, account: Account, run_ids: list[str], runs: int) -> dict[str, Any]:
    first = compare_run(browser, url, account, run_ids)  # a warm-up, and the size of the load
    size = first["decoded_bytes"]
    with tempfile.TemporaryDirectory() as tmp:
        httpd, static_url = static_server(size, Path(tmp))
        try:
            compare_runs, static_runs = [], []
            for _ in range(runs):
                static_runs.append(static_run(browser, static_url))
                compare_runs.append(compare_run(browser, url, account, run_ids))
        finally:
            httpd.shutdown()
    return {"page_decoded_bytes": size, "compare": compare_runs, "static": static_runs}


def section_jobs_list(browser: Browser, url: str, key_id: str, secret: str, screens: int) -> dict[str, Any]:
    context = signed_in(browser, url, key_id, secret)
    requests: list[dict[str, Any]] = []

    def on_response(response: Any) -> None:
        parts = urlsplit(response.url)
        if parts.path == "/api/v1/jobs" and response.request.method == "GET":
            items = response.json()["items"] if response.ok else []
            requests.append({"query": parse_qs(parts.query), "ids": [j["id"] for j in items]})

    try:
        page = context.new_page()
        page.on("response", on_response)
        page.goto(url + "/jobs")
        page.wait_for_selector("[data-testid=job-row]")
        first_rows = page.evaluate("performance.now() / 1000")
        page.hover("[data-testid=job-scroll]")
        steps, most_rows, reached = [], 0, 0.0
        for _ in range(screens):
            t0 = time.perf_counter()
            page.mouse.wheel(0, 2000)
            drawn = page.wait_for_function(ROWS_COVER, polling="raf").json_value()
            steps.append(time.perf_counter() - t0)
            most_rows = max(most_rows, drawn["rows"])
            reached = drawn["scrollTop"]
        footer = page.get_by_test_id("job-count").inner_text()
        fetched = {i for r in requests for i in r["ids"]}
        return {
            "first_rows_s": first_rows,
            "requests": len(requests),
            "rows_returned": sum(len(r["ids"]) for r in requests),
            "distinct_fetched": len(fetched),
            "most_rows_in_dom": most_rows,
            "scrolled_px": reached,
            "rows_scrolled": int(reached // 44),
            "step_s": steps,
            "footer": footer,
        }
    finally:
        context.close()


def med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs if r.get(key) is not None)


def row(metric: str, value: float, baseline: float | None, target: str, ok: bool | None, unit: str) -> dict[str, Any]:
    ratio = value / baseline if baseline else None
    return {
        "metric": metric,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "ratio": ratio,
        "target": target,
        "pass": ok,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--metrics", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--screens", type=int, default=40, help="scroll steps of 2,000 px in the jobs list")
    parser.add_argument(
        "--compare-runs", type=int, default=10, help="runs of --points each compared on the Runs page (at least 2)"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parse_args(parser, {"points": 2000, "metrics": 2, "jobs": 500, "runs": 1, "screens": 1, "compare_runs": 2})
    if not 2 <= args.compare_runs <= 50:
        parser.error("--compare-runs: 2 to 50 (the Runs page compares two runs or more, the server at most 50)")
    started = time.monotonic()
    results: dict[str, Any] = {"args": vars(args) | {"json": str(args.json)}}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        server = KilnServer(home, rate_limit_per_second="0").start()
        admin = Api.admin(server)
        try:
            tenant = create_tenant(admin, "console-bench", ("member",))
            member = tenant["member"]
            ids = setup_metrics(member.api, args.points, args.metrics)
            ids["compare"] = setup_compare(member.api, args.points, args.compare_runs, ids["long"])
            server.stop()  # a running server keeps its SQLite database to itself: seed the jobs list in between
            seed_list(home, args.jobs)
            server.start()
            key_id, secret, _ = create_key(admin, server.url, LIST_USER, "bench-list")
            results["setup"] = ids
            with sync_playwright() as playwright:
                browser = launch(playwright)
                print(f"Chromium {browser.version}; {args.runs} runs, each in a new browser profile", flush=True)
                try:
                    charts = section_charts(browser, server.url, member, ids, args.runs)
                    compared = section_compare(browser, server.url, member, ids["compare"], args.runs)
                    listing = section_jobs_list(browser, server.url, key_id, secret, args.screens)
                finally:
                    browser.close()
        finally:
            admin.close()
            server.stop()
    results["charts"], results["compare"], results["jobs_list"] = charts, compared, listing
    report(results, args)
    finish(results, results["table"], started, args.json)


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    charts, listing = results["charts"], results["jobs_list"]
    long, wide, static = charts["long"], charts["wide"], charts["static"]
    size = charts["page_decoded_bytes"]
    series_p50 = statistics.median(s for r in long for s in r["series_s"])
    print(
        f"\nchart page load: {size / 1024:.0f} KiB decoded, {med(long, 'transfer_bytes') / 1024:.0f} KiB sent, "
        f"{med(long, 'requests'):.0f} requests; the {results['setup']['long_points']:,}-point series drawn as "
        f"{long[0]['drawn_points']:,} points (downsampled on the server: p50 {series_p50:.3f}s a request)"
    )
    print(
        f"  wide: {wide[0]['charts_in_view']} charts in view of {wide[0]['chart_slots']}, "
        f"{med(wide, 'series_requests'):.0f} series requests on load (the others load as they scroll into view)"
    )
    for name, runs in (("long", long), ("wide", wide)):
        print(f"  {name}: first chart " + ", ".join(f"{r['first_chart']:.3f}" for r in runs) + " s")
        steps = [key for key in runs[0]["path"] if all(key in r["path"] for r in runs)]
        path = ", ".join(f"{key} {statistics.median(r['path'][key] for r in runs):.3f}" for key in steps)
        print(f"    answers by (p50 s from the navigation): {path}; drawn {med(runs, 'first_chart'):.3f}")
    fcps, loads = (", ".join(f"{r[key]:.3f}" for r in static) for key in ("fcp", "load"))
    print(f"  static: first paint {fcps} s; load {loads} s")
    compared = results["compare"]
    cmp_runs, cmp_static = compared["compare"], compared["static"]
    first = cmp_runs[0]
    print(
        f"\ncompare of {args.compare_runs} runs of {results['setup']['long_points']:,} points (/runs?compare=...): "
        f"{compared['page_decoded_bytes'] / 1024:.0f} KiB decoded, {med(cmp_runs, 'requests'):.0f} requests, "
        f"{med(cmp_runs, 'compare_requests'):.0f} GET /runs/metrics (p50 "
        f"{statistics.median(x for r in cmp_runs for x in r['compare_s']):.3f}s, "
        f"{first['compare_bytes'] / 1024:.0f} KiB), {first['history_requests']} get-history; "
        f"{first['series_count']:,} points drawn as {first['drawn_points']:,} (downsample {first['downsample']})"
    )
    print("  overlaid chart " + ", ".join(f"{r['compare_chart']:.3f}" for r in cmp_runs) + " s")
    steps = [key for key in first["path"] if all(key in r["path"] for r in cmp_runs)]
    path = ", ".join(f"{key} {statistics.median(r['path'][key] for r in cmp_runs):.3f}" for key in steps)
    print(f"    answers by (p50 s from the navigation): {path}; drawn {med(cmp_runs, 'compare_chart'):.3f}")
    fcps, loads = (", ".join(f"{r[key]:.3f}" for r in cmp_static) for key in ("fcp", "load"))
    print(f"  static (same size): first paint {fcps} s; load {loads} s")
    steps = listing["step_s"]
    print(
        f"\njobs list of {args.jobs:,}: first rows {listing['first_rows_s']:.3f}s; scrolled "
        f"{listing['rows_scrolled']:,} rows in {len(steps)} steps (each drawn in p50 "
        f"{statistics.median(steps) * 1000:.0f} ms, max {max(steps) * 1000:.0f} ms); {listing['requests']} GET /jobs "
        f"returned {listing['rows_returned']:,} rows, {listing['distinct_fetched']:,} distinct jobs; at most "
        f"{listing['most_rows_in_dom']} rows in the DOM; footer: {listing['footer']!r}"
    )
    static_fcp, static_load = med(static, "fcp"), med(static, "load")
    rows = [
        row("static page, same size: first paint", static_fcp, None, "(baseline)", None, "ms"),
        row("static page, same size: load event", static_load, None, "(baseline)", None, "ms"),
        row(
            f"chart ready, {results['setup']['long_points']:,}-point series",
            med(long, "first_chart"),
            static_load,
            f"<= {TARGET_LONG_S:g} s",
            med(long, "first_chart") <= TARGET_LONG_S,
            "ms",
        ),
        row(
            f"first chart ready, job with {args.metrics} metrics",
            med(wide, "first_chart"),
            static_load,
            f"<= {TARGET_CHART_S:g} s",
            med(wide, "first_chart") <= TARGET_CHART_S,
            "ms",
        ),
        row(
            f"all charts in view ready, {args.metrics} metrics",
            med(wide, "in_view_ready"),
            static_load,
            "(info)",
            None,
            "ms",
        ),
        row(
            f"{args.compare_runs} runs compared: static page, same size: load",
            med(cmp_static, "load"),
            None,
            "(baseline)",
            None,
            "ms",
        ),
        row(
            f"{args.compare_runs} runs x {results['setup']['long_points']:,} points: overlaid chart ready",
            med(cmp_runs, "compare_chart"),
            med(cmp_static, "load"),
            f"<= {TARGET_COMPARE_S:g} s",
            med(cmp_runs, "compare_chart") <= TARGET_COMPARE_S,
            "ms",
        ),
        row("jobs list: first rows", listing["first_rows_s"], None, "(info)", None, "ms"),
        row(
            f"jobs list: jobs fetched of {args.jobs:,} after scrolling",
            listing["distinct_fetched"],
            None,
            f"< {args.jobs:,}",
            listing["distinct_fetched"] < args.jobs,
            "jobs",
        ),
        row("jobs list: most rows in the DOM", listing["most_rows_in_dom"], None, "(info)", None, "rows"),
    ]
    results["table"] = rows
    print_table(rows, metric_width=52, digits={"jobs": 0, "rows": 0, "ms": 0})


if __name__ == "__main__":
    main()
