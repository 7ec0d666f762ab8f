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


def sleeper(seconds: float, cpus: float = 2, **extra: object) -> dict[str, object]:
    return {
        "command": [sys.executable, "-c", f"import time; time.sleep({seconds})"],
        **PY,
        "resources": {"cpus": cpus},
        **extra,
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KilnServer, Tenant, Tenant]]:
    server = KilnServer(tmp_path_factory.mktemp("usage") / "home", cpus="8", rate_limit_per_second="0").start()
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
    held = _row(client.usage(by="job", since=since), job.id)
    assert 3.9 <= held.cpu_seconds <= 8.0, held  # the whole hold: before, during and after the restart


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
    as_json = json.loads(kiln("usage", "--by", "org", "--since", "1h", "-o", "json").stdout)
    as_csv = list(csv.DictReader(io.StringIO(kiln("usage", "--by", "org", "--since", "1h", "-o", "csv").stdout)))
    assert {r["key"]: round(r["cpu_seconds"], 3) for r in as_json["rows"]} == {
        r["key"]: round(float(r["cpu_seconds"]), 3) for r in as_csv
    }
    assert a.id in {r["key"] for r in as_json["rows"]}
    table = kiln("usage", "--by", "org", "--since", "1h")
    assert table.returncode == 0 and a.name in table.stdout and "total" in table.stdout, table.stdout
