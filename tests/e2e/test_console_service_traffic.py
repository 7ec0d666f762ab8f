"""The console's service page in Chromium shows each model version's figures side by side (issue 48): the stable
version, a 50 % canary and a shadow, each with its share and the predicts it answered; the rollback button ends the
canary. Its own server and models (the custom predictor of tests/integration/models/test_canary_rollout.py: no
runtime to build)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from kiln.domain.serving import ReplicaState, ServiceState
from kiln.sdk.client import Client
from tests.browser import launch
from tests.e2e.test_console import WAIT_MS, sign_in
from tests.helpers import spec, wait_for
from tests.integration.models.test_canary_rollout import PREDICTOR, SETTLE, _weights
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Account, Api, close_all, create_tenant

if TYPE_CHECKING:
    from playwright.sync_api import Browser
try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:
    pass

pytestmark = pytest.mark.needs("chromium")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KilnServer, Account, Client, Browser]]:
    root = tmp_path_factory.mktemp("console-traffic")
    server = KilnServer(root / "home", rate_limit_per_second="0", cpus="4").start()
    admin = Api.admin(server)
    tenant = create_tenant(admin, "console-traffic", ("member",))
    member = tenant["member"]
    client = Client(server.url, member.key_id, member.secret)
    code = root / "code"
    code.mkdir()
    (code / "predictor.py").write_text(PREDICTOR)
    expect.set_options(timeout=WAIT_MS)
    try:
        for weights in ({"scale": 3}, {"scale": 5}, {"scale": 7}):  # scaler@1, @2, @3
            job = client.submit(spec(_weights(**weights)))
            assert wait_for(client, job.id, timeout=120).state == "SUCCEEDED"
            client.register_model("scaler", job.id, "weights.json", framework="custom")
        service = {
            "name": "traffic",
            "model": "scaler@1",
            "predictor": {"type": "custom", "class": "predictor:Model"},
            "runtime": {"python": sys.executable},
            "resources": {"cpus": 0.5},
            "replicas": 1,
        }
        client.serve(service, code_dir=code)
        assert client.wait_service("traffic", timeout=SETTLE).state == ServiceState.READY
        with sync_playwright() as playwright:
            browser = launch(playwright)
            try:
                yield server, member, client, browser
            finally:
                browser.close()
    finally:
        client.close()
        close_all(tenant)
        admin.close()
        server.stop()


def _until_ready(client: Client, role: str) -> None:
    deadline = time.monotonic() + SETTLE
    while not any(getattr(r, role) and r.state == ReplicaState.READY for r in client.get_service("traffic").replicas):
        assert time.monotonic() < deadline, client.get_service("traffic").replicas
        time.sleep(0.2)


def test_the_service_page_shows_each_versions_figures_and_rolls_the_canary_back(
    setup: tuple[KilnServer, Account, Client, Browser],
) -> None:
    server, member, client, browser = setup
    client.update_service("traffic", model="scaler@2", canary=50)
    client.update_service("traffic", shadow="scaler@3")
    _until_ready(client, "canary")
    _until_ready(client, "shadow")
    answered: dict[str, int] = {}
    for i in range(40):
        model = client.predict("traffic", [i]).model
        answered[model] = answered.get(model, 0) + 1
    assert set(answered) == {"scaler@1", "scaler@2"}, answered  # the shadow answers no client

    context = browser.new_context()
    try:
        page = sign_in(context, server.url, member, "/services/traffic")
        section = page.get_by_test_id("service-traffic")
        rows = section.get_by_test_id("version-row")
        expect(rows).to_have_count(3)
        stable, canary = section.locator("[data-role=stable]"), section.locator("[data-role=canary]")
        expect(stable).to_contain_text("scaler@1")
        expect(stable).to_contain_text("50 %")
        expect(stable.locator("td").nth(3)).to_have_text(str(answered["scaler@1"]))
        expect(canary).to_contain_text("scaler@2")
        expect(canary.locator("td").nth(3)).to_have_text(str(answered["scaler@2"]))
        expect(section.locator("[data-role=shadow]")).to_contain_text("a copy of each")
        expect(section).to_contain_text("answers compared, never returned")
        section.get_by_test_id("canary-rollback").click()
        expect(section.locator("[data-role=canary]")).to_have_count(0)
        expect(section.get_by_test_id("canary-rollback")).to_have_count(0)
        expect(section.get_by_test_id("rollout-events")).to_contain_text("scaler@2 rolled back at 50 % by hand")
    finally:
        context.close()
    assert client.get_service("traffic").canary is None
