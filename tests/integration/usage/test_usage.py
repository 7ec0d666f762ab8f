"""Usage metering on a real server with real jobs: what an attempt holds from placement to release, priced by a
versioned table (a price change mid-job splits the cost at the change), every gang member counted, nothing lost
across a server killed mid-job, a running job's use visible as it runs, JSON and CSV alike, and another
organisation seeing none of it."""

from __future__ import annotations

import csv
import io
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from kiln.errors import Forbidden, NotFound
from kiln.sdk.client import Client
from tests.helpers import wait_for
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, Tenant, create_tenant

PY = {"runtime": {"python": sys.executable}}
METRICS_TOKEN = "usage-scraper"


def sleeper(seconds: float, cpus: float = 2, **extra: object) -> dict[str, object]:
    return {
        "command": [sys.executable, "-c", f"import time; time.sleep({seconds})"],
        **PY,
        "resources": {"cpus": cpus},
        **extra,
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KilnServer, Tenant, Tenant]]:
    home = tmp_path_factory.mktemp("usage") / "home"
    server = KilnServer(home, cpus="8", rate_limit_per_second="0", metrics_token=METRICS_TOKEN, currency="EUR").start()
    admin = Api.admin(server)
    a = create_tenant(admin, "metered-a", ("admin", "member"))
    b = create_tenant(admin, "metered-b", ("admin",))
    try:
        yield server, a, b
    finally:
        server.stop()


def _client(server: KilnServer, tenant: Tenant, role: str) -> Client:
    return Client(server.url, tenant[role].key_id, tenant[role].secret)


def _row(report: object, key: str) -> object:
    return next(r for r in report.rows if r.key == key)  # type: ignore[attr-defined]


def test_a_job_is_metered_priced_split_at_a_price_change_and_seen_by_its_org_only(world) -> None:  # type: ignore[no-untyped-def]
    server, a, b = world
    platform = server.client()
    platform.set_prices(cpu_hour=3.6)  # 0.001 a CPU-second
    member, org_admin = _client(server, a, "member"), _client(server, a, "admin")
    since = datetime.now(UTC) - timedelta(seconds=5)

    job = member.submit(sleeper(3))
    deadline = time.monotonic() + 30
    while member.get_job(job.id).state != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1)
    so_far = _row(org_admin.usage(by="job", since=since), job.id)
    assert so_far.cpu_seconds > 1.0  # a running job's use, as it runs  # type: ignore[attr-defined]
    assert wait_for(member, job.id, timeout=60).state == "SUCCEEDED"
    report = org_admin.usage(by="job", since=since)
    held = _row(report, job.id)
    assert 5.8 <= held.cpu_seconds <= 9.0, held  # 2 CPUs for about 3 s (and the start and the stop)
    assert held.cost == pytest.approx(held.cpu_seconds * 0.001, abs=2e-6)
    by_user = _row(org_admin.usage(by="user", since=since), a["member"].user_id)
    assert by_user.name == a["member"].user_name and by_user.cpu_seconds == pytest.approx(held.cpu_seconds)

    # A price change while a job holds its CPUs: the hold before it at the old rate, after it at the new.
    second = member.submit(sleeper(4))
    while member.get_job(second.id).state != "RUNNING" and time.monotonic() < deadline + 30:
        time.sleep(0.05)
    time.sleep(1.5)
    change = platform.set_prices(cpu_hour=36.0).effective_from  # ten times the rate
    assert wait_for(member, second.id, timeout=60).state == "SUCCEEDED"
    before = _row(org_admin.usage(by="job", since=since, until=change), second.id)
    after = _row(org_admin.usage(by="job", since=change), second.id)
    whole = _row(org_admin.usage(by="job", since=since), second.id)
    assert before.cpu_seconds > 2.0 and after.cpu_seconds > 2.0
    assert before.cost == pytest.approx(before.cpu_seconds * 0.001, abs=2e-6)
    assert after.cost == pytest.approx(after.cpu_seconds * 0.01, abs=2e-6)
    assert whole.cost == pytest.approx(before.cost + after.cost, abs=2e-6)

    # JSON and CSV say the same; another organisation (its admin) sees none of it; a member sees no report.
    report = org_admin.usage(by="job", since=since)
    rows = list(csv.DictReader(io.StringIO(org_admin.usage_csv(by="job", since=since))))
    assert {r["key"]: (float(r["cpu_seconds"]), float(r["cost"])) for r in rows} == {
        r.key: (pytest.approx(r.cpu_seconds), pytest.approx(r.cost)) for r in report.rows
    }
    stranger = _client(server, b, "admin")
    assert stranger.usage(by="job", since=since).rows == []
    with pytest.raises(NotFound):
        stranger.usage(org=a.name, since=since)
    with pytest.raises(Forbidden):
        member.usage(since=since)
    every = platform.usage(by="org", since=since)  # the platform admin: every organisation
    assert _row(every, a.id).name == a.name


def test_every_gang_member_counts(world) -> None:  # type: ignore[no-untyped-def]
    server, a, _ = world
    member, org_admin = _client(server, a, "member"), _client(server, a, "admin")
    since = datetime.now(UTC) - timedelta(seconds=5)
    job = member.submit(sleeper(2, cpus=1, distributed={"framework": "pytorch", "workers": 2}))
    assert wait_for(member, job.id, timeout=60).state == "SUCCEEDED"
    held = _row(org_admin.usage(by="job", since=since), job.id)
    assert 3.8 <= held.cpu_seconds <= 7.0, held  # 2 workers x 1 CPU x about 2 s


def test_a_server_killed_mid_job_loses_no_usage(make_server) -> None:  # type: ignore[no-untyped-def]
    server = make_server(cpus="4")
    client = server.client()
    since = datetime.now(UTC) - timedelta(seconds=5)
    submitted = time.monotonic()
    job = client.submit(sleeper(4, cpus=1))
    deadline = time.monotonic() + 30
    while client.get_job(job.id).state != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1)
    server.kill()
    time.sleep(1)
    server.start()
    client = server.client()
    assert wait_for(client, job.id, timeout=60).state == "SUCCEEDED"
    seen_ended = time.monotonic() - submitted
    held = _row(client.usage(by="job", since=since), job.id)
    # The whole hold: before, during and after the restart (until the restarted server saw it end).
    assert 3.9 <= held.cpu_seconds <= seen_ended, (held, seen_ended)


def test_the_cli_reports_usage_and_sets_prices(world, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import os
    import subprocess

    server, a, _ = world
    creds = server.credentials()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update(KILN_CONFIG=str(tmp_path / "cfg"), KILN_ENDPOINT=server.url, COLUMNS="200")
    env.update(KILN_ACCESS_KEY=creds["KILN_ACCESS_KEY"], KILN_SECRET_KEY=creds["KILN_SECRET_KEY"])

    def kiln(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "kiln", *args], env=env, capture_output=True, text=True, timeout=120
        )

    member = _client(server, a, "member")
    assert wait_for(member, member.submit(sleeper(1, cpus=1)).id, timeout=60).state == "SUCCEEDED"
    priced = kiln("prices", "set", "--cpu-hour", "7.2", "--gpu-hour", "H200=3.5", "--category", "train")
    assert priced.returncode == 0 and "H200" in priced.stderr, priced.stderr
    listed = json.loads(kiln("prices", "list", "-o", "json").stdout)
    assert {"category": "train", "resource": "gpu", "gpu_type": "H200", "rate": 3.5} in listed[-1]["rates"]
    assert listed[-1]["currency"] == "EUR"  # KILN_CURRENCY, beside every cost
    assert "PER HOUR (EUR)" in kiln("prices", "list").stdout
    as_json = json.loads(kiln("usage", "--by", "org", "--since", "1h", "-o", "json").stdout)
    as_csv = list(csv.DictReader(io.StringIO(kiln("usage", "--by", "org", "--since", "1h", "-o", "csv").stdout)))
    assert {r["key"]: round(r["cpu_seconds"], 3) for r in as_json["rows"]} == {
        r["key"]: round(float(r["cpu_seconds"]), 3) for r in as_csv
    }
    assert a.id in {r["key"] for r in as_json["rows"]} and as_json["currency"] == "EUR"
    table = kiln("usage", "--by", "org", "--since", "1h")
    assert table.returncode == 0 and a.name in table.stdout and "total" in table.stdout, table.stdout
    assert "COST (EUR)" in table.stdout, table.stdout
    jobs = kiln("usage", "--by", "job", "--since", "1h", "--org", a.name)
    assert "OWNER" in jobs.stdout and f"{a['member'].user_name}@{a.name}" in jobs.stdout, jobs.stdout


def test_used_cpu_and_peak_memory_beside_what_was_held(world) -> None:  # type: ignore[no-untyped-def]
    server, a, _ = world
    member, org_admin = _client(server, a, "member"), _client(server, a, "admin")
    since = datetime.now(UTC) - timedelta(seconds=5)
    # Holds 2 CPUs, uses 3 s of CPU on one and keeps 64 MiB resident: half or more of what it holds is idle. The
    # loop counts CPU time, not wall time: on a loaded machine it runs longer, and uses as much.
    busy = (
        "import time\nheld = bytearray(64 * 1024 * 1024)\nfor i in range(0, len(held), 4096): held[i] = 1\n"
        "while time.process_time() < 3: pass\n"
    )
    spec = {**sleeper(0), "command": [sys.executable, "-c", busy], "metrics": {"system_interval": 0.5}}
    job = member.submit(spec)
    assert wait_for(member, job.id, timeout=60).state == "SUCCEEDED"

    def row() -> object:
        return _row(org_admin.usage(by="job", since=since), job.id)

    deadline = time.monotonic() + 30  # the last samples may be ingested after the job ended
    while row().used_cpu_seconds < 2.0 and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.2)
    held = row()
    assert 2.0 <= held.used_cpu_seconds <= 3.6, held  # one busy CPU for 3 s, as sampled  # type: ignore[attr-defined]
    assert held.cpu_seconds >= 5.8 > held.used_cpu_seconds  # type: ignore[attr-defined]
    assert 64 * 1024 * 1024 < held.peak_memory_bytes < 512 * 1024 * 1024, held  # type: ignore[attr-defined]
    as_csv = {r["key"]: r for r in csv.DictReader(io.StringIO(org_admin.usage_csv(by="job", since=since)))}
    assert float(as_csv[job.id]["used_cpu_seconds"]) == pytest.approx(held.used_cpu_seconds, rel=0.2)  # type: ignore[attr-defined]
    # Whose the job is, beside it (the platform admin's top jobs span organisations).
    owner = (held.user_id, held.user_name, held.org_id, held.org_name)  # type: ignore[attr-defined]
    assert owner == (a["member"].user_id, a["member"].user_name, a.id, a.name), owner
    assert (as_csv[job.id]["user_name"], as_csv[job.id]["org_name"]) == (a["member"].user_name, a.name)
    assert _row(server.client().usage(by="job", org=a.name, since=since), job.id).org_name == a.name


def test_a_report_by_day_split_by_user(world) -> None:  # type: ignore[no-untyped-def]
    server, a, _ = world
    member, org_admin = _client(server, a, "member"), _client(server, a, "admin")
    assert wait_for(member, member.submit(sleeper(1, cpus=1)).id, timeout=60).state == "SUCCEEDED"
    since = datetime.now(UTC) - timedelta(days=3)
    by_day = org_admin.usage(by="day", split="user", since=since)
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    mine = [r for r in by_day.rows if r.key == today and r.split == a["member"].user_id]
    assert len(mine) == 1 and mine[0].split_name == a["member"].user_name
    by_user = _row(org_admin.usage(by="user", since=since), a["member"].user_id)
    # The days of a user add up to the user's whole window (holds that span midnight split between days).
    days = [r for r in by_day.rows if r.split == a["member"].user_id]
    assert sum(r.cpu_seconds for r in days) == pytest.approx(by_user.cpu_seconds, rel=1e-6)  # type: ignore[attr-defined]
    assert by_day.cost == pytest.approx(org_admin.usage(by="user", since=since).cost, abs=1e-5)
    top = org_admin.usage(by="job", since=since, limit=1)
    assert len(top.rows) == 1 and top.cost >= top.rows[0].cost
    rows = list(csv.DictReader(io.StringIO(org_admin.usage_csv(by="day", split="user", since=since))))
    assert {(r["key"], r["split"]) for r in rows} == {(r.key, r.split) for r in by_day.rows}


def test_budgets_warn_refuse_and_stop_running_work_audited(world) -> None:  # type: ignore[no-untyped-def]
    from kiln.errors import BudgetExceeded, InvalidInput

    server, a, b = world
    platform = server.client()
    platform.set_prices(cpu_hour=3.6)
    member, org_admin = _client(server, a, "member"), _client(server, a, "admin")
    assert wait_for(member, member.submit(sleeper(1, cpus=1)).id, timeout=60).state == "SUCCEEDED"

    # Who sets what: the organisation's budget is the platform admin's; its admin sets its members'.
    with pytest.raises(Forbidden):
        org_admin.set_budget(soft=1.0)
    with pytest.raises(Forbidden):
        member.set_budget(user=a["member"].user_name, soft=1.0)
    with pytest.raises(InvalidInput, match="soft"):
        platform.set_budget(org=a.name, soft=5.0, hard=1.0)
    with pytest.raises(NotFound):  # another organisation's admin cannot reach this one's members
        _client(server, b, "admin").set_budget(user=a["member"].user_name, hard=1.0)

    # A soft limit already passed: the new job runs, with a warning event; the audit says so once a month.
    soft = platform.set_budget(org=a.name, soft=0.000001)
    assert soft.state == "soft" and soft.used > 0 and soft.month == datetime.now(UTC).strftime("%Y-%m")
    assert soft.currency == "EUR"
    warned = member.submit(sleeper(0.2, cpus=1))
    warnings = [e for e in member.events(warned.id) if e.reason == "BudgetWarning"]
    assert len(warnings) == 1 and soft.id in warnings[0].message and "soft limit" in warnings[0].message
    member.submit(sleeper(0.2, cpus=1))
    audited = [e for e in platform.audit(limit=200) if e.action == "budget.soft_limit" and soft.id in e.resource]
    assert len(audited) == 1 and audited[0].org_id == a.id
    assert [x.id for x in member.budgets()] == [soft.id]  # a member sees what applies to them (the banner)
    assert _client(server, b, "admin").budgets() == []  # another organisation sees none of it

    # A member's hard limit: that member's new work is refused, naming the budget, its use and the reset.
    hard = org_admin.set_budget(user=a["member"].user_name, hard=0.000001)
    with pytest.raises(BudgetExceeded) as refused:
        member.submit(sleeper(1, cpus=1))
    message = str(refused.value)
    assert hard.id in message and "hard limit" in message and "resets" in message and " EUR" in message, message
    assert refused.value.details["budget"] == hard.id and refused.value.details["used"] > 0  # type: ignore[index]
    with pytest.raises(BudgetExceeded):
        member.dry_run(sleeper(1, cpus=1))
    org_admin.submit(sleeper(0.1, cpus=1))  # the organisation's admin is not over that member's budget
    denied = [e for e in platform.audit(limit=200) if e.outcome == "denied" and "budget_exceeded" in e.detail]
    assert denied and hard.id in denied[0].detail and denied[0].user_id == a["member"].user_id

    # stop_running: the member's running work is stopped as well (the task acts at once when it is set).
    org_admin.remove_budget(hard.id)
    running = member.submit(sleeper(60, cpus=1))
    wait_for(member, running.id, "RUNNING", timeout=60)
    org_admin.set_budget(user=a["member"].user_name, hard=0.000001, stop_running=True)
    assert wait_for(member, running.id, timeout=60).state == "CANCELLED"
    asked = [e.message for e in member.events(running.id) if e.reason == "CancelRequested"]
    assert asked and "budget" in asked[0] and "stops running work" in asked[0], asked
    for budget in platform.budgets(org=a.name):
        platform.remove_budget(budget.id)
    assert wait_for(member, member.submit(sleeper(0.1, cpus=1)).id, timeout=60).state == "SUCCEEDED"


def test_prometheus_counts_usage_per_organisation(world) -> None:  # type: ignore[no-untyped-def]
    import httpx

    server, a, _ = world
    member = _client(server, a, "member")
    wait_for(member, member.submit(sleeper(1, cpus=1)).id, timeout=60)

    def counted() -> float:
        headers = {"Authorization": f"Bearer {METRICS_TOKEN}"}
        text = httpx.get(f"{server.url}/metrics", headers=headers, timeout=30).text
        line = next(x for x in text.splitlines() if x.startswith(f'kiln_usage_cpu_seconds_total{{org="{a.name}"}}'))
        return float(line.split()[-1])

    first = counted()
    assert first > 0.9
    running = member.submit(sleeper(3, cpus=2))
    wait_for(member, running.id, timeout=60)
    assert counted() >= first + 5.5  # the second job's 2 CPUs for about 3 s, counted since the last scrape
