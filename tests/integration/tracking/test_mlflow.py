"""The official MLflow client (``mlflow-skinny``) against a real Kiln server at ``<endpoint>/mlflow``: experiments,
runs, params, metrics, tags, history and search with MLflow's filter and order-by syntax; the same calls from inside
a Kiln job with no configuration (Kiln sets MLflow's environment); and tenancy: another organisation's key sees
none of it, a viewer cannot log.

MLflow's client reads its credentials from the environment at each request, so each block below sets the
environment of the identity it acts as."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import mlflow
import pytest
from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from kiln.sdk.client import Client
from tests.helpers import wait_for
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, Tenant, close_all, create_tenant

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    srv = KilnServer(tmp_path_factory.mktemp("mlflow") / "home", rate_limit_per_second="0").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tenants(server: KilnServer) -> Iterator[tuple[Tenant, Tenant]]:
    admin = Api.admin(server)
    labs, other = create_tenant(admin, "labs", ("member", "viewer")), create_tenant(admin, "other", ("member",))
    yield labs, other
    close_all(labs, other)
    admin.close()


@contextlib.contextmanager
def acting_as(server: KilnServer, tenant: Tenant, role: str) -> Iterator[MlflowClient]:
    account = tenant.accounts[role]
    saved = {
        k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
    }
    os.environ.update(
        MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",  # an error is the test's to see, not the client's to retry for minutes
        MLFLOW_TRACKING_URI=f"{server.url}/mlflow",
        MLFLOW_TRACKING_USERNAME=account.key_id,
        MLFLOW_TRACKING_PASSWORD=account.secret,
    )
    mlflow.set_tracking_uri(f"{server.url}/mlflow")
    try:
        yield MlflowClient(f"{server.url}/mlflow")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_the_mlflow_client_logs_reads_and_searches(
    server: KilnServer, tenants: tuple[Tenant, Tenant], tmp_path: Path
) -> None:
    labs, other = tenants
    with acting_as(server, labs, "member") as client:
        experiment = mlflow.set_experiment("mnist-sweep")
        runs = {}
        for lr, batch in ((0.01, 64), (0.1, 32), (0.001, 64)):
            with mlflow.start_run(run_name=f"lr-{lr}") as run:
                mlflow.log_params({"lr": lr, "batch": batch, "optimizer": "adam"})
                for step in range(1000 if lr == 0.01 else 10):
                    mlflow.log_metric("loss", 1.0 / (step + 1) + lr, step=step)
                mlflow.log_metric("val_acc", 0.9 - lr)
                mlflow.set_tag("team", "vision")
                if lr == 0.01:
                    mlflow.log_text("a confusion matrix\n", "eval/confusion.txt")
                    mlflow.log_dict({"classes": 10}, "config.json")
                runs[lr] = run.info.run_id
        got = client.get_run(runs[0.01])
        assert got.info.status == "FINISHED" and got.info.end_time and got.info.run_name == "lr-0.01"
        assert got.data.params == {"lr": "0.01", "batch": "64", "optimizer": "adam"}
        assert got.data.tags["team"] == "vision"
        assert got.data.metrics["loss"] == pytest.approx(1.0 / 1000 + 0.01)
        history = client.get_metric_history(runs[0.01], "loss")
        assert [m.step for m in history] == list(range(1000))
        assert history[0].value == pytest.approx(1.01) and history[-1].value == pytest.approx(0.001 + 0.01)

        found = mlflow.search_runs(
            [experiment.experiment_id],
            filter_string="params.batch = '64'",
            order_by=["metrics.val_acc DESC"],
            output_format="list",
        )
        assert [r.info.run_id for r in found] == [runs[0.001], runs[0.01]]  # best val_acc first
        numeric = client.search_runs([experiment.experiment_id], "params.lr < 0.05 and metrics.val_acc > 0.895")
        assert [r.info.run_id for r in numeric] == [runs[0.001]]
        by_tag = client.search_runs([experiment.experiment_id], "tags.team = 'vision'", order_by=["params.lr ASC"])
        assert [r.info.run_id for r in by_tag] == [runs[0.001], runs[0.01], runs[0.1]]  # numerically, not as text
        ids = [experiment.experiment_id]
        assert not client.search_runs(ids, "params.optimizer LIKE 'Ad%'")  # LIKE minds the case (SQLite too)
        assert len(client.search_runs(ids, "params.optimizer ILIKE 'Ad%'")) == 3
        assert len(client.search_runs(ids, "params.optimizer LIKE 'a_a%'")) == 3
        assert not client.search_runs(ids, "params.optimizer LIKE 'a*'")  # GLOB's wildcards are plain characters
        with pytest.raises(MlflowException, match=r"INVALID_PARAMETER_VALUE|metrics"):
            client.search_runs([experiment.experiment_id], "metrics.val_acc > 'high'")
        with pytest.raises(MlflowException, match=r"logged once|INVALID_PARAMETER_VALUE"):
            client.log_param(runs[0.01], "lr", "0.5")  # a param is written once
        listed = {(f.path, f.is_dir) for f in client.list_artifacts(runs[0.01])}
        assert listed == {("config.json", False), ("eval", True)}
        assert [f.path for f in client.list_artifacts(runs[0.01], "eval")] == ["eval/confusion.txt"]
        fetched = client.download_artifacts(runs[0.01], "eval/confusion.txt", str(tmp_path))
        assert Path(fetched).read_text() == "a confusion matrix\n"
        assert json.loads(Path(client.download_artifacts(runs[0.01], "config.json", str(tmp_path))).read_text()) == {
            "classes": 10
        }

    with acting_as(server, other, "member") as stranger:  # another organisation: none of it exists
        with pytest.raises(MlflowException, match="RESOURCE_DOES_NOT_EXIST"):
            stranger.get_run(runs[0.01])
        assert stranger.get_experiment_by_name("mnist-sweep") is None
        with pytest.raises(MlflowException, match="RESOURCE_DOES_NOT_EXIST"):
            stranger.log_metric(runs[0.01], "loss", 0.0)
        with pytest.raises(MlflowException, match="RESOURCE_DOES_NOT_EXIST"):
            stranger.get_metric_history(runs[0.01], "loss")
        with pytest.raises(Exception, match=r"404|RESOURCE_DOES_NOT_EXIST"):
            stranger.download_artifacts(runs[0.01], "eval/confusion.txt", str(tmp_path / "stolen"))
        assert not stranger.search_runs([experiment.experiment_id])  # their experiment id: nothing of it

    with acting_as(server, labs, "viewer") as viewer:  # reads, never logs
        assert viewer.get_run(runs[0.01]).data.params["lr"] == "0.01"
        with pytest.raises(MlflowException, match="PERMISSION_DENIED"):
            viewer.log_metric(runs[0.01], "loss", 0.0)
        with pytest.raises(MlflowException, match="PERMISSION_DENIED"):
            viewer.create_experiment("not-mine")


def test_a_job_logs_with_mlflow_unconfigured_and_its_params_are_searchable(
    server: KilnServer, tenants: tuple[Tenant, Tenant], tmp_path: Path
) -> None:
    labs, _ = tenants
    member = labs.accounts["member"]
    kiln = Client(server.url, member.key_id, member.secret)
    code = (
        "import mlflow, os\n"
        "assert os.environ['MLFLOW_TRACKING_URI'].endswith('/mlflow')\n"
        "with mlflow.start_run() as run:\n"
        "    assert run.info.run_id == os.environ['KILN_JOB_ID'], run.info.run_id\n"
        "    mlflow.log_param('depth', 12)\n"
        "    for step in range(5):\n"
        "        mlflow.log_metric('acc', 0.5 + step / 10, step=step)\n"
        "    mlflow.log_text('from the job', 'report.txt')\n"
        "print('done')\n"
    )
    job = kiln.submit(
        {
            "command": ["python", "-c", code],
            "runtime": {"python": sys.executable},
            "params": {"lr": 0.02, "arch": "resnet"},
            "experiment": "jobs-sweep",
            "labels": {"git.commit": "4b825dc6", "git.dirty": "true"},  # what `kiln run` sets from a git checkout
        }
    )
    done = wait_for(kiln, job.id, timeout=120)
    assert done.state == "SUCCEEDED", (done.message, [ln.text for ln in kiln.stream_logs(job.id, follow=False)][-20:])
    with acting_as(server, labs, "member") as client:
        experiment = client.get_experiment_by_name("jobs-sweep")
        assert experiment is not None
        [run] = client.search_runs([experiment.experiment_id], "params.arch = 'resnet' and params.lr >= 0.02")
        assert run.info.run_id == job.id and run.info.status == "FINISHED"
        assert run.data.params == {"lr": "0.02", "arch": "resnet", "depth": "12"}  # the spec's and the job's own
        assert run.data.metrics["acc"] == pytest.approx(0.9)
        assert (
            run.data.tags["mlflow.source.git.commit"] == "4b825dc6" and run.data.tags["kiln.source.git.dirty"] == "true"
        )
        assert run.data.tags["kiln.job_id"] == job.id
        assert [m.value for m in client.get_metric_history(job.id, "acc")] == pytest.approx([0.5, 0.6, 0.7, 0.8, 0.9])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and run.info.end_time is None:
            run = client.get_run(job.id)
        assert run.info.end_time is not None
        ended = client.search_runs([experiment.experiment_id], f"attributes.end_time >= {run.info.end_time}")
        assert [r.info.run_id for r in ended] == [job.id]  # a job's run is searched by its end like any run
        assert not client.search_runs([experiment.experiment_id], f"attributes.end_time > {run.info.end_time}")
        got = client.download_artifacts(job.id, "report.txt", str(tmp_path))
        assert Path(got).read_text() == "from the job"
    assert "report.txt" in {a.path for a in kiln.artifacts(job.id)}  # the job's outputs: one place for both
    kiln.close()


def test_kiln_runs_lists_filters_sorts_and_compares_a_thousand_runs(
    server: KilnServer, tenants: tuple[Tenant, Tenant], tmp_path: Path
) -> None:
    labs, _ = tenants
    member = labs.accounts["member"]
    expected: dict[str, tuple[float, float]] = {}
    with acting_as(server, labs, "member") as client:
        experiment_id = client.create_experiment("thousand")
        for i in range(1000):
            run = client.create_run(experiment_id, run_name=f"r{i:04d}")
            lr, acc = i / 1000, ((i * 7919) % 1000) / 1000
            client.log_batch(
                run.info.run_id,
                params=[Param("lr", str(lr)), Param("seed", str(i % 3))],
                metrics=[Metric("val_acc", acc, 0, 0), Metric("loss", 1 - acc, 0, 0)],
            )
            expected[run.info.run_id] = (lr, acc)
        first, second = list(expected)[:2]
        for step in range(20):
            client.log_metric(first, "curve", step / 20, step=step)
            client.log_metric(second, "curve", 1 - step / 20, step=step)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "MLFLOW_"))}
    env.update(
        KILN_CONFIG=str(tmp_path / "cfg"),
        KILN_ENDPOINT=server.url,
        KILN_ACCESS_KEY=member.key_id,
        KILN_SECRET_KEY=member.secret,
        COLUMNS="200",
    )

    def kiln(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "kiln", *args], env=env, capture_output=True, text=True, timeout=120
        )

    listed = kiln(
        "runs", "list", "-e", "thousand", "--filter", "params.lr < 0.1 and metrics.val_acc > 0.5",
        "--sort", "-metrics.val_acc", "--columns", "params.lr,metrics.val_acc", "--limit", "1000", "-o", "json",
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    want = sorted(
        (run_id for run_id, (lr, acc) in expected.items() if lr < 0.1 and acc > 0.5),
        key=lambda r: expected[r][1],
        reverse=True,
    )
    assert [r["id"] for r in rows] == want and len(want) > 10
    table = kiln("runs", "list", "-e", "thousand", "--sort", "params.lr", "--columns", "params.lr,metrics.loss")
    assert table.returncode == 0, table.stderr
    lines = [ln for ln in table.stdout.splitlines() if ln.strip().startswith("run-")]
    assert len(lines) == 100 and lines[0].split()[1] == "0.0" and lines[1].split()[1] == "0.001"  # numeric order
    compared = kiln("runs", "compare", first, second, "--plot", "curve")
    assert compared.returncode == 0, compared.stderr
    assert "params.lr" in compared.stdout and "params.seed" in compared.stdout  # they differ
    curve = next(ln for ln in compared.stdout.splitlines() if ln.strip().startswith("curve"))
    up, down = curve.split()[-2:]
    assert up[0] == down[-1] == "▁" and up[-1] == down[0] == "█"  # one scale: the rising and the falling line
    bad = kiln("runs", "list", "-e", "thousand", "--filter", "metrics.val_acc > 'x'")
    assert bad.returncode != 0 and "val_acc" in bad.stderr


@pytest.mark.needs("chromium")
@pytest.mark.timeout(300)
def test_the_consoles_runs_table_sorts_by_a_metric_column_on_the_server(
    server: KilnServer, tenants: tuple[Tenant, Tenant]
) -> None:
    from playwright.sync_api import expect, sync_playwright

    from tests.browser import launch

    labs, _ = tenants
    member = labs.accounts["member"]
    names = {}
    with acting_as(server, labs, "member") as client:
        experiment_id = client.create_experiment("browse")
        for name, acc, lr in (("alpha", 0.7, "0.1"), ("beta", 0.9, "0.01"), ("gamma", 0.8, "0.05")):
            run = client.create_run(experiment_id, run_name=name)
            client.log_batch(run.info.run_id, params=[Param("lr", lr)], metrics=[Metric("val_acc", acc, 0, 0)])
            names[run.info.run_id] = name
    ids = {name: run_id for run_id, name in names.items()}
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_context().new_page()
            page.set_default_timeout(30_000)
            page.goto(server.url + "/runs?experiment=browse")
            page.get_by_label("Access key id").fill(member.key_id)
            page.get_by_label("Secret key").fill(member.secret)
            page.get_by_role("button", name="Sign in").click()
            rows = page.get_by_test_id("run-row")
            expect(rows).to_have_count(3)
            # Its rows come from one search, sent by public/early.js while the bundle loads (the experiment by its
            # name), asking the server for the columns a person would see and only those of each run; a sort asks
            # for the same columns again.
            searches: list[dict[str, list[str]]] = []

            def searched(request: Any) -> None:
                if "/runs/search" in request.url:
                    searches.append(parse_qs(urlsplit(request.url).query))

            page.on("request", searched)
            page.reload()
            expect(rows).to_have_count(3)
            assert len(searches) == 1, searches
            assert searches[0]["experiment_names"] == ["browse"] and searches[0]["default_columns"] == ["true"]
            assert "columns" not in searches[0]
            columns = page.locator("[data-testid^=sort-]").evaluate_all("bs => bs.map(b => b.dataset.testid)")
            assert columns == ["sort-params.lr", "sort-metrics.val_acc"], columns

            def order() -> list[str]:
                return [names[r] for r in rows.evaluate_all("rs => rs.map(r => r.dataset.run)")]

            page.get_by_test_id("sort-metrics.val_acc").click()  # descending first, sorted by the server
            expect(page).to_have_url(re.compile(r"sort=-metrics\.val_acc"))
            expect(rows.first).to_contain_text("beta")
            assert order() == ["beta", "gamma", "alpha"]
            assert searches[-1]["columns"] == ["params.lr", "metrics.val_acc"] and "default_columns" not in searches[-1]
            assert searches[-1]["order_by"] == ["metrics.val_acc DESC"]
            page.get_by_test_id("sort-metrics.val_acc").click()
            expect(rows.first).to_contain_text("alpha")
            assert order() == ["alpha", "gamma", "beta"]
            page.get_by_test_id("runs-filter").fill("params.lr < 0.06")  # numerically
            page.get_by_role("button", name="Filter").click()
            expect(rows).to_have_count(2)
            assert order() == ["gamma", "beta"]
            asked: list[str] = []
            page.on("request", lambda r: asked.append(r.url) if "/metrics" in r.url else None)
            page.get_by_label("compare gamma").check()
            with page.expect_response(lambda r: "/api/v1/runs/metrics?" in r.url) as answered:
                page.get_by_label("compare beta").check()
            compare = page.get_by_test_id("runs-compare")
            expect(compare).to_contain_text("params.lr")
            expect(compare).to_contain_text("0.8")
            chart = page.get_by_test_id("compare-chart-val_acc")  # one line per ticked run, one point each
            expect(chart).to_have_attribute("data-points", "2")
            # The overlaid chart's data came in one downsampled request for both runs, none from get-history; the
            # runs compared are in the page's URL, so the same view opens from it directly.
            sent = parse_qs(urlsplit(answered.value.url).query)
            assert answered.value.ok
            assert sorted(sent["run"]) == sorted([ids["gamma"], ids["beta"]]) and sent["name"] == ["val_acc"]
            assert int(sent["downsample"][0]) >= 200
            assert not [u for u in asked if "get-history" in u], asked
            expect(page).to_have_url(re.compile(r"compare=run-"))
            page.goto(page.url)
            expect(page.get_by_test_id("compare-chart-val_acc")).to_have_attribute("data-points", "2")
            page.wait_for_function("performance.getEntriesByName('kiln:compare-chart').length === 1")
            page.get_by_test_id("runs-columns").fill("metrics.val_acc")  # the columns chosen: only that one
            page.get_by_role("button", name="Columns").click()
            expect(page).to_have_url(re.compile(r"columns=metrics\.val_acc"))
            expect(page.get_by_test_id("sort-params.lr")).to_have_count(0)
            expect(page.get_by_test_id("sort-metrics.val_acc")).to_have_count(1)
        finally:
            browser.close()


PNG_JOB = """
import json, os, struct, zlib
out = os.environ["KILN_OUTPUT_DIR"]
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
rows = b"".join(b"\\x00" + bytes([255, 0, 0, 0, 0, 255, 0, 255, 0]) for _ in range(2))  # 3x2 pixels, RGB
png = b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 3, 2, 8, 2, 0, 0, 0))
png += chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
open(os.path.join(out, "confusion.png"), "wb").write(png)
open(os.path.join(out, "scores.csv"), "w").write("epoch,acc\\n" + "".join(f"{i},{i / 100}\\n" for i in range(50)))
json.dump({"layers": [64, 32], "dropout": 0.1}, open(os.path.join(out, "config.json"), "w"))
open(os.path.join(out, "model.bin"), "wb").write(b"\\x00" * 64)
"""


@pytest.mark.needs("chromium")
@pytest.mark.timeout(300)
def test_the_console_previews_a_jobs_image_csv_and_json_artifacts(
    server: KilnServer, tenants: tuple[Tenant, Tenant]
) -> None:
    from playwright.sync_api import expect, sync_playwright

    from tests.browser import launch

    labs, _ = tenants
    member = labs.accounts["member"]
    kiln = Client(server.url, member.key_id, member.secret)
    job = kiln.submit({"command": ["python", "-c", PNG_JOB], "runtime": {"python": sys.executable}})
    assert wait_for(kiln, job.id, timeout=120).state == "SUCCEEDED"
    kiln.close()
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_context().new_page()
            page.set_default_timeout(30_000)
            page.goto(f"{server.url}/jobs/{job.id}?tab=artifacts")
            page.get_by_label("Access key id").fill(member.key_id)
            page.get_by_label("Secret key").fill(member.secret)
            page.get_by_role("button", name="Sign in").click()
            rows = page.get_by_test_id("artifact-row")
            expect(rows).to_have_count(4)
            expect(rows.filter(has_text="model.bin").get_by_test_id("artifact-preview")).to_have_count(0)  # binary

            rows.filter(has_text="scores.csv").get_by_test_id("artifact-preview").click()
            table = page.get_by_test_id("preview-table")
            expect(table.locator("th").first).to_have_text("epoch")
            expect(table.locator("tbody tr")).to_have_count(20)  # the first rows only
            rows.filter(has_text="config.json").get_by_test_id("artifact-preview").click()
            expect(page.get_by_test_id("preview-text")).to_contain_text('"dropout": 0.1')
            rows.filter(has_text="confusion.png").get_by_test_id("artifact-preview").click()
            image = page.get_by_test_id("preview-image")
            expect(image).to_be_visible()
            assert image.evaluate("img => img.complete && img.naturalWidth") == 3  # decoded: a real PNG
        finally:
            browser.close()


def test_kiln_experiments_lists_shows_renames_and_deletes_and_runs_list_fits_80_columns(
    server: KilnServer, tenants: tuple[Tenant, Tenant], tmp_path: Path
) -> None:
    """There was no ``kiln experiments``; ``kiln runs list`` was ~200 columns wide with ids folded over two lines."""
    labs, other = tenants
    with acting_as(server, labs, "member") as client:
        experiment_id = client.create_experiment("wide-table")
        for i in range(3):
            run = client.create_run(experiment_id, run_name=f"wide-{i}")
            params = [Param(f"knob_{k:02d}", str(i * 100 + k)) for k in range(12)]
            client.log_batch(run.info.run_id, params=params, metrics=[Metric("loss", 1 / (i + 3), 0, 0)])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "MLFLOW_"))}
    env.update(KILN_CONFIG=str(tmp_path / "cfg"), KILN_ENDPOINT=server.url, COLUMNS="80")

    def kiln(*args: str, account: str = "member", tenant: Tenant = labs) -> subprocess.CompletedProcess[str]:
        keys = {"KILN_ACCESS_KEY": tenant.accounts[account].key_id, "KILN_SECRET_KEY": tenant.accounts[account].secret}
        return subprocess.run(
            [sys.executable, "-m", "kiln", *args], env=env | keys, capture_output=True, text=True, timeout=120
        )

    listed = kiln("experiments", "list")
    assert listed.returncode == 0, listed.stderr
    row = next(ln.split() for ln in listed.stdout.splitlines() if ln.startswith("wide-table "))
    assert row[1] == "3" and row[-1] == experiment_id, listed.stdout
    table = kiln("runs", "list", "-e", "wide-table")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines and all(len(ln) <= 80 for ln in lines), table.stdout
    assert len([ln for ln in lines if re.match(r"run-\w{16}\s", ln)]) == 3, table.stdout  # each id whole
    assert "left out to fit 80 columns" in table.stderr and "--columns" in table.stderr
    assert "0.3333" in table.stdout and "0.333333" not in table.stdout  # rounded for reading
    shown = kiln("experiments", "show", "wide-table", "-o", "json")
    assert json.loads(shown.stdout)["run_count"] == 3
    assert kiln("experiments", "list", tenant=other).stdout.count("wide-table") == 0
    assert kiln("experiments", "rename", "wide-table", "narrow-table").returncode == 0
    assert kiln("experiments", "delete", "narrow-table").returncode == 2  # asks first; not a terminal: --yes
    assert kiln("experiments", "delete", "narrow-table", "--yes", account="viewer").returncode != 0
    assert kiln("experiments", "delete", "narrow-table", "--yes").returncode == 0
    names = [e["name"] for e in json.loads(kiln("experiments", "list", "-o", "json").stdout)]
    assert "narrow-table" not in names and "wide-table" not in names and "Default" in names
    deleted = json.loads(kiln("experiments", "list", "--deleted", "-o", "json").stdout)
    assert [e["name"] for e in deleted] == ["narrow-table"]


def test_the_consoles_search_names_its_experiment_and_gets_only_its_columns_over_the_protocol(
    server: KilnServer, tenants: tuple[Tenant, Tenant]
) -> None:
    """runs/search's own parameters for a table (the console's Runs page): experiment_names, columns and
    default_columns, as a GET's query and a POST's body; MLflow's client, asking none of them, gets every param."""
    labs, other = tenants
    with acting_as(server, labs, "member") as client:
        experiment_id = client.create_experiment("console-table")
        for i in range(3):
            run = client.create_run(experiment_id, run_name=f"console-{i}")
            params = [Param("lr", str(0.1 / (i + 1)))] + [Param(f"same_{k:02d}", "x") for k in range(20)]
            client.log_batch(run.info.run_id, params=params, metrics=[Metric("loss", 1 / (i + 3), 0, 0)])
        assert all(len(r.data.params) == 21 for r in client.search_runs([experiment_id]))
    account = labs.accounts["member"]
    with httpx.Client(base_url=f"{server.url}/mlflow/api/2.0/mlflow", auth=(account.key_id, account.secret)) as http:
        chosen = http.get("/runs/search", params={"experiment_names": "console-table", "default_columns": "true"})
        assert chosen.status_code == 200, chosen.text
        assert chosen.json()["columns"] == ["params.lr", "metrics.loss"]
        for run in chosen.json()["runs"]:
            assert [p["key"] for p in run["data"]["params"]] == ["lr"]
            assert [m["key"] for m in run["data"]["metrics"]] == ["loss"]
        body = {"experiment_ids": [experiment_id], "columns": ["params.same_03"], "order_by": ["metrics.loss ASC"]}
        asked = http.post("/runs/search", json=body).json()
        assert "columns" not in asked
        assert [r["info"]["run_name"] for r in asked["runs"]] == ["console-2", "console-1", "console-0"]
        assert all(r["data"]["params"] == [{"key": "same_03", "value": "x"}] for r in asked["runs"])
        assert all("metrics" not in r["data"] or not r["data"]["metrics"] for r in asked["runs"])
        for bad in ({"default_columns": "1"}, {"columns": "lr"}, {"experiment_names": "no-such-experiment"}):
            answer = http.get("/runs/search", params={"experiment_names": "console-table", **bad})
            assert answer.status_code in (400, 404), (bad, answer.text)
            assert answer.json()["error_code"] in ("INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST"), answer.text
    theirs = other.accounts["member"]
    with httpx.Client(base_url=f"{server.url}/mlflow/api/2.0/mlflow", auth=(theirs.key_id, theirs.secret)) as http:
        assert http.get("/runs/search", params={"experiment_names": "console-table"}).status_code == 404  # not theirs
