"""Notifications end to end: a real server, a real HTTP receiver and a real SMTP server (aiosmtpd) on loopback,
the operator's allow-list (KILN_WEBHOOK_ALLOW) opening 127.0.0.1 for them.

One server is shared by the module's tests (each subscribes with a name pattern of its own jobs, so they do not see
each other's events); the crash and the two-server tests start their own."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, text
from standardwebhooks.webhooks import Webhook

from kiln.errors import InvalidInput
from kiln.sdk.client import Client
from tests.helpers import spec, wait_for
from tests.kilnserver import KilnServer
from tests.notify_receiver import SmtpReceiver, WebhookReceiver
from tests.tenancy_helpers import Api, close_all, create_tenant

FAIL = spec("exit 3", resources={"cpus": 0.01, "memory": "64M"}, max_restarts=0)


@pytest.fixture(scope="module")
def receiver() -> Iterator[WebhookReceiver]:
    r = WebhookReceiver().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def smtp() -> Iterator[SmtpReceiver]:
    s = SmtpReceiver().start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smtp: SmtpReceiver) -> Iterator[KilnServer]:
    home = tmp_path_factory.mktemp("notify") / "home"
    s = KilnServer(
        home,
        webhook_allow="127.0.0.1/32",
        webhook_retry_base_seconds="0.2",
        smtp_host="127.0.0.1",
        smtp_port=str(smtp.port),
        smtp_from="kiln@test.invalid",
    ).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server: KilnServer) -> Iterator[Client]:
    c = server.client()
    yield c
    c.close()


def _wait_delivery(  # type: ignore[type-arg]
    client: Client, sub_id: str, status: str, timeout: float = 60, count: int = 1
) -> list:
    """The subscription's deliveries once there are at least ``count`` and every one has ``status``."""
    deadline = time.monotonic() + timeout
    while True:
        items = client.deliveries(sub_id)
        if len(items) >= count and all(d.status == status for d in items):
            return items
        assert time.monotonic() < deadline, f"deliveries of {sub_id}: {items}"
        time.sleep(0.05)


def test_a_failed_job_is_posted_signed_verifiable_with_standardwebhooks(
    client: Client, receiver: WebhookReceiver
) -> None:
    sub = client.subscribe("fails", ["job.failed"], url=receiver.url("/signed"), name_pattern="signed-*")
    assert sub.secret and sub.secret.startswith("whsec_")
    assert client.subscription(sub.id).secret is None  # shown once
    job = client.submit({**FAIL, "name": "signed-1"})
    wait_for(client, job.id, "FAILED")
    (got,) = receiver.wait("/signed")
    payload = Webhook(sub.secret).verify(got.body, got.headers)
    assert payload["type"] == "job.failed" and payload["subject"]["id"] == job.id
    assert payload["subject"]["state"] == "FAILED" and payload["url"].endswith(f"/jobs/{job.id}")
    assert got.headers["webhook-id"] == payload["id"]
    (delivery,) = _wait_delivery(client, sub.id, "delivered")
    assert (delivery.attempts, delivery.response_code, delivery.event_id) == (1, 200, payload["id"])
    # A test event and "send again": the same subscription, signed alike; the resend keeps the event's id.
    client.test_subscription(sub.id)
    receiver.wait("/signed", 2)
    client.resend_delivery(sub.id, delivery.id)
    third = receiver.wait("/signed", 3)[-1]
    assert Webhook(sub.secret).verify(third.body, third.headers)["id"] == payload["id"]


def test_retried_after_two_500s_then_delivered_once(client: Client, receiver: WebhookReceiver) -> None:
    receiver.script("/flaky", 500, 500)
    sub = client.subscribe("flaky", ["job.*"], url=receiver.url("/flaky"), name_pattern="flaky-*")
    job = client.submit({**FAIL, "name": "flaky-1"})
    wait_for(client, job.id, "FAILED")
    (delivery,) = _wait_delivery(client, sub.id, "delivered")
    got = receiver.at("/flaky")
    assert [r.status for r in got] == [500, 500, 200]
    assert len({r.headers["webhook-id"] for r in got}) == 1
    assert (delivery.attempts, delivery.response_code) == (3, 200)


def test_a_400_is_not_retried(client: Client, receiver: WebhookReceiver) -> None:
    receiver.script("/refuses", 400)
    sub = client.subscribe("refuses", ["job.failed"], url=receiver.url("/refuses"), name_pattern="refuses-*")
    job = client.submit({**FAIL, "name": "refuses-1"})
    wait_for(client, job.id, "FAILED")
    (delivery,) = _wait_delivery(client, sub.id, "failed")  # final: never tried again
    assert (delivery.attempts, delivery.response_code) == (1, 400)
    assert [r.status for r in receiver.at("/refuses")] == [400]
    assert "HTTP 400" in (delivery.error or "")


def _own_address() -> str:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    pytest.fail("this machine has no IPv4 address besides loopback")


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.2:9/x",  # loopback outside the allow-list (127.0.0.1/32)
        "http://[::1]:9/x",
        "http://169.254.169.254/latest/meta-data/",  # link-local: a cloud's metadata service
        "http://[fe80::1]:9/x",
        "http://0.0.0.0:9/x",
        "own",
        "ftp://127.0.0.1/x",
    ],
)
def test_ssrf_targets_are_refused_at_subscription(client: Client, url: str) -> None:
    target = f"http://{_own_address()}:9/x" if url == "own" else url
    with pytest.raises(InvalidInput):
        client.subscribe("ssrf", ["job.*"], url=target)


def test_another_organisations_events_never_reach_a_subscription(
    server: KilnServer, client: Client, receiver: WebhookReceiver
) -> None:
    admin = Api.admin(server)
    a = create_tenant(admin, "notify-alpha", ("member",))
    b = create_tenant(admin, "notify-bravo", ("admin", "member"))
    try:
        a_client = Client(server.url, a["member"].key_id, a["member"].secret)
        clients = {
            name: Client(server.url, acct.key_id, acct.secret)
            for name, acct in (("b-member", b["member"]), ("b-admin", b["admin"]))
        }
        mine = a_client.subscribe("mine", ["*"], url=receiver.url("/alpha"))
        theirs = [c.subscribe(f"{n}", ["*"], url=receiver.url(f"/{n}")) for n, c in clients.items()]
        job = a_client.submit({**FAIL, "name": "tenancy-alpha"})
        wait_for(a_client, job.id, "FAILED")
        receiver.wait("/alpha")  # fanned out in one transaction: B's would exist by now
        _wait_delivery(a_client, mine.id, "delivered")
        for (name, c), sub in zip(clients.items(), theirs, strict=True):
            assert c.deliveries(sub.id) == [] and receiver.at(f"/{name}") == []
            with pytest.raises(Exception, match="not found"):  # nor can B read A's subscription
                c.deliveries(mine.id)
        for c in (a_client, *clients.values()):
            c.close()
    finally:
        close_all(a, b)
        admin.close()


def _kiln(server: KilnServer, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    creds = server.credentials()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update(KILN_CONFIG=str(tmp_path / "cfg"), KILN_ENDPOINT=server.url, COLUMNS="250")
    env.update(KILN_ACCESS_KEY=creds["KILN_ACCESS_KEY"], KILN_SECRET_KEY=creds["KILN_SECRET_KEY"])
    return subprocess.run([sys.executable, "-m", "kiln", *args], env=env, capture_output=True, text=True, timeout=120)


def test_kiln_run_notify_fail_mails_through_the_smtp_server(
    server: KilnServer, client: Client, smtp: SmtpReceiver, tmp_path: Path
) -> None:
    ran = _kiln(
        server, tmp_path, "run", "--no-code", "--name", "mailed-1", "--python", sys.executable, "--cpus", "0.01",
        "--notify", "fail", "--mail-user", "owner@test.invalid", "--", "exit 3",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    job = next(j for j in client.list_jobs() if j.name == "mailed-1")
    assert job.spec.notify is not None and job.spec.notify.on == ["fail"]
    wait_for(client, job.id, "FAILED")
    message = smtp.wait("owner@test.invalid")
    assert "job.failed" in str(message["Subject"]) and "mailed-1" in str(message["Subject"])
    assert job.id in message.get_payload()


def test_kiln_notify_add_list_test_deliveries_rm(server: KilnServer, receiver: WebhookReceiver, tmp_path: Path) -> None:
    added = _kiln(server, tmp_path, "notify", "add", "cli-hook", "--url", receiver.url("/cli"), "-o", "json")
    assert added.returncode == 0, added.stderr
    sub = json.loads(added.stdout)
    assert sub["secret"].startswith("whsec_")
    listed = _kiln(server, tmp_path, "notify", "list")
    assert sub["id"] in listed.stdout and "cli-hook" in listed.stdout
    assert _kiln(server, tmp_path, "notify", "test", sub["id"]).returncode == 0
    (got,) = receiver.wait("/cli")
    assert Webhook(sub["secret"]).verify(got.body, got.headers)["type"] == "test"
    deadline = time.monotonic() + 30
    while "delivered" not in (shown := _kiln(server, tmp_path, "notify", "deliveries", sub["id"])).stdout:
        assert time.monotonic() < deadline, shown.stdout + shown.stderr
    assert "200" in shown.stdout
    assert _kiln(server, tmp_path, "notify", "rm", sub["id"]).returncode == 0
    assert sub["id"] not in _kiln(server, tmp_path, "notify", "list").stdout


def _outbox(database_url: str, job_id: str) -> list[tuple[str, bool]]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, body, fanned FROM notification_events")).all()
    finally:
        engine.dispose()
    return [(r[0], bool(r[2])) for r in rows if job_id in (r[1] if isinstance(r[1], str) else json.dumps(r[1]))]


def test_a_server_killed_between_the_event_and_its_delivery_delivers_after_restart_once(
    tmp_path: Path, receiver: WebhookReceiver
) -> None:
    home, url = tmp_path / "home", f"sqlite:///{tmp_path / 'kiln.db'}"
    # This server records events and sends none (KILN_NOTIFICATIONS_SEND=false): the kill lands, for sure,
    # after the event's commit and before any delivery.
    first = KilnServer(home, url, webhook_allow="127.0.0.1/32", notifications_send="false").start()
    try:
        c = first.client()
        sub = c.subscribe("crash", ["job.failed"], url=receiver.url("/crash"))
        job = c.submit({**FAIL, "name": "crash-1"})
        wait_for(c, job.id, "FAILED")
        c.close()
        assert [fanned for _, fanned in _outbox(url, job.id)] == [False]
        first.kill()
        second = KilnServer(home, url, webhook_allow="127.0.0.1/32")
        second.port, second.env["KILN_PORT"] = first.port, str(first.port)
        second.start()
        c = second.client()
        _wait_delivery(c, sub.id, "delivered")  # final: no attempt follows
        got = receiver.at("/crash")
        assert len(got) == 1 and json.loads(got[0].body)["subject"]["id"] == job.id
        c.close()
        second.stop()
    finally:
        first.stop()


def test_two_servers_on_postgresql_deliver_each_event_once(
    postgres_url: str, tmp_path: Path, receiver: WebhookReceiver
) -> None:
    shared = {  # one secret box (the subscription's signing secret) and one store for both
        "server_key": Fernet.generate_key().decode(),
        "storage_url": str(tmp_path / "store"),
        "webhook_allow": "127.0.0.1/32",
    }
    servers = [KilnServer(tmp_path / "home0", postgres_url, instance_id="notify-0", **shared).start()]
    try:
        servers.append(KilnServer(tmp_path / "home1", postgres_url, instance_id="notify-1", **shared).start())
        creds = servers[0].credentials()
        clients = [Client(s.url, creds["KILN_ACCESS_KEY"], creds["KILN_SECRET_KEY"]) for s in servers]
        sub = clients[0].subscribe("pair", ["job.failed"], url=receiver.url("/pair"))
        jobs = [clients[i % 2].submit({**FAIL, "name": f"pair-{i}"}) for i in range(12)]
        for i, job in enumerate(jobs):
            wait_for(clients[i % 2], job.id, "FAILED")
        # the events the other server recorded are fanned out at the lease holder's next look: wait for all 12
        deliveries = _wait_delivery(clients[1], sub.id, "delivered", count=len(jobs))
        assert len(deliveries) == len(jobs)
        got = receiver.at("/pair")
        ids = [r.headers["webhook-id"] for r in got]
        assert len(ids) == len(set(ids)) == len(jobs), ids
        assert sorted(json.loads(r.body)["subject"]["id"] for r in got) == sorted(j.id for j in jobs)
        for c in clients:
            c.close()
    finally:
        for s in servers:
            s.stop()


# -- events beyond a job's end: one test per family, each through a subscription narrowed to its own subjects ----


def _bodies(receiver: WebhookReceiver, path: str, until: str) -> list[dict]:  # type: ignore[type-arg]
    """The webhooks posted to ``path`` up to the first of type ``until`` (which must come)."""
    deadline = time.monotonic() + 120
    while True:
        bodies = [json.loads(r.body) for r in receiver.at(path)]
        if any(b["type"] == until for b in bodies):
            return bodies
        assert time.monotonic() < deadline, f"{path}: no {until} in {[b['type'] for b in bodies]}"
        time.sleep(0.05)


def test_a_model_version_registered_and_aliased(client: Client, receiver: WebhookReceiver) -> None:
    client.subscribe("models", ["model.*"], url=receiver.url("/models"), name_pattern="notified-model")
    job = client.submit(spec("echo weights > $KILN_OUTPUT_DIR/model.txt", name="model-maker"))
    wait_for(client, job.id, "SUCCEEDED")
    version = client.register_model("notified-model", job.id, "model.txt", framework="custom")
    client.set_alias("notified-model", "prod", version.version)
    bodies = _bodies(receiver, "/models", "model.alias_set")
    assert [b["type"] for b in bodies] == ["model.version_registered", "model.alias_set"]
    assert bodies[0]["subject"]["details"] == {"version": version.version}
    assert bodies[1]["subject"]["details"] == {"alias": "prod", "version": version.version}
    assert bodies[1]["url"].endswith("/models/notified-model")


def test_a_study_tells_each_new_best_trial_then_its_end(client: Client, receiver: WebhookReceiver) -> None:
    client.subscribe("studies", ["study.*"], url=receiver.url("/studies"), name_pattern="notified-study")
    study = client.submit_study(
        {
            "name": "notified-study",
            "trial": spec("echo step=0 score={x}", resources={"cpus": 0.01, "memory": "64M"}),
            "parameters": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
            "objective": {"metric": "score", "direction": "maximize"},
            "max_trials": 3,
            "seed": 7,
        }
    )
    bodies = _bodies(receiver, "/studies", "study.succeeded")
    assert bodies[-1]["type"] == "study.succeeded" and bodies[-1]["subject"]["id"] == study.id
    best = [b["subject"]["details"]["value"] for b in bodies if b["type"] == "study.best_trial"]
    assert best and best == sorted(best)  # each one better than the one before (maximize)
    assert best[-1] == client.get_study(study.id).best.value  # type: ignore[union-attr]


def test_a_pipeline_run_that_fails_is_told(client: Client, receiver: WebhookReceiver) -> None:
    client.subscribe("pipelines", ["pipeline_run.*"], url=receiver.url("/pipes"), name_pattern="notified-pipe")
    step = {"command": [sys.executable, "-c", "raise SystemExit(3)"], "runtime": {"python": sys.executable}}
    run = client.run_pipeline({"name": "notified-pipe", "steps": {"only": {**step, "cache": False}}})
    (body,) = _bodies(receiver, "/pipes", "pipeline_run.failed")
    assert body["subject"]["id"] == run.id and "only" in body["subject"]["message"]


def test_a_budget_past_its_soft_then_its_hard_limit(server: KilnServer, receiver: WebhookReceiver) -> None:
    admin = Api.admin(server)
    tenant = create_tenant(admin, "notify-budget", ("admin", "member"))
    org_admin = Client(server.url, tenant["admin"].key_id, tenant["admin"].secret)
    member = Client(server.url, tenant["member"].key_id, tenant["member"].secret)
    try:
        member.subscribe("budgets", ["budget.*"], url=receiver.url("/budgets"))
        budget = org_admin.set_budget(user="notify-budget-member", soft=0.0)
        member.submit({**FAIL, "name": "over-soft"})  # warned of: past its soft limit
        soft = _bodies(receiver, "/budgets", "budget.soft_limit")
        assert soft[0]["subject"]["id"] == budget.id and "soft limit" in soft[0]["subject"]["message"]
        org_admin.set_budget(user="notify-budget-member", soft=0.0, hard=0.0)  # told by the usage pass
        hard = _bodies(receiver, "/budgets", "budget.hard_limit")
        spent = next(b for b in hard if b["type"] == "budget.hard_limit")
        assert spent["subject"]["id"] == budget.id and "hard limit" in spent["subject"]["message"]
    finally:
        for c in (org_admin, member):
            c.close()
        close_all(tenant)
        admin.close()


def test_a_subscription_paused_after_failing_is_told_to_its_owner(client: Client, receiver: WebhookReceiver) -> None:
    receiver.script("/broken", *[410] * 5)
    broken = client.subscribe("broken", ["test"], url=receiver.url("/broken"))
    client.subscribe("watcher", ["subscription.paused"], url=receiver.url("/watcher"))
    for _ in range(5):  # each refused (a 4xx): 5 failures in a row pause it
        client.test_subscription(broken.id)
    (body,) = _bodies(receiver, "/watcher", "subscription.paused")
    assert body["subject"]["id"] == broken.id and "5 failed deliveries" in body["subject"]["message"]
    assert client.subscription(broken.id).state == "paused"


def test_a_service_whose_model_does_not_load_is_told_unhealthy(client: Client, receiver: WebhookReceiver) -> None:
    client.subscribe("services", ["service.*"], url=receiver.url("/services"), name_pattern="notified-svc")
    job = client.submit(spec("echo no-model > $KILN_OUTPUT_DIR/model.joblib", name="svc-model"))
    wait_for(client, job.id, "SUCCEEDED")
    client.register_model("notified-svc-model", job.id, "model.joblib", framework="sklearn")
    service = {
        "name": "notified-svc",
        "model": "notified-svc-model@1",
        "predictor": {"type": "sklearn"},  # joblib.load fails on these bytes: the replica fails, the service DEGRADED
        "runtime": {"python": sys.executable},
        "resources": {"cpus": 0.01, "memory": "512M"},
        "replicas": 1,
    }
    client.serve(service)
    try:
        body = _bodies(receiver, "/services", "service.unhealthy")[0]
        assert (body["type"], body["subject"]["name"], body["subject"]["state"]) == (
            "service.unhealthy",
            "notified-svc",
            "DEGRADED",
        )
        assert body["url"].endswith("/services/notified-svc")
    finally:
        client.delete_service("notified-svc")
