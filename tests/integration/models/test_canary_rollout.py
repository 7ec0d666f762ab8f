"""A canary's rollout policy, and a shadow, at work in a real server (issue 48), under a steady client:

- a canary whose predictor raises on one input in five (20 %) is rolled back by the policy on its own once it has
  ``min_requests`` predicts: the service event says why, a ``service.canary_rolled_back`` webhook is posted, and
  every predict after it is the stable version's;
- a healthy canary with steps 10 → 50 → 100 advances and is promoted (``service.canary_advanced`` then
  ``service.canary_promoted``), and no predict fails on the way;
- a shadow version (the one failing 1 input in 5, and multiplying by another scale) gets a copy of the predicts:
  its answers are compared (none agrees, its numbers off by the scales' difference) and its errors counted, while
  the client only ever gets the stable version's answers.

The predictor is a custom class that multiplies by the model version's scale, on this interpreter (no runtime to
build); a version's weights may name ``fail_every``: it raises on the inputs divisible by it.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln.domain.serving import ReplicaState, ServiceRead, ServiceState
from kiln.errors import KilnError
from kiln.sdk.client import Client
from tests.helpers import spec, wait_for
from tests.kilnserver import KilnServer
from tests.notify_receiver import WebhookReceiver

SETTLE = 120.0  # seconds a replica may take to start on a loaded two-CPU machine

PREDICTOR = """
import json, pathlib

class Model:
    def load(self, path):
        path = pathlib.Path(path)
        weights = json.loads((path / "weights.json" if path.is_dir() else path).read_text())
        self.scale, self.fail_every = weights["scale"], weights.get("fail_every")

    def predict(self, batch):
        if self.fail_every and any(x % self.fail_every == 0 for x in batch):
            raise ValueError("this version fails on these inputs")
        return [x * self.scale for x in batch]
"""


def _weights(**weights: Any) -> list[str]:
    write = f"import json, os; json.dump({weights!r}, open(os.environ['KILN_OUTPUT_DIR'] + '/weights.json', 'w'))"
    return ["python", "-c", write]


@pytest.fixture(scope="module")
def receiver() -> Iterator[WebhookReceiver]:
    r = WebhookReceiver().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Client, Path]]:
    root = tmp_path_factory.mktemp("rollout")
    server = KilnServer(
        root / "home",
        rate_limit_per_second="0",
        cpus="4",
        webhook_allow="127.0.0.1/32",
        webhook_retry_base_seconds="0.2",
    ).start()
    code = root / "code"
    code.mkdir()
    (code / "predictor.py").write_text(PREDICTOR)
    client = server.client()
    try:
        # scaler@1 (stable, scale 3), @2 (scale 5, raises on multiples of 5), @3 (scale 7, healthy)
        for weights in ({"scale": 3}, {"scale": 5, "fail_every": 5}, {"scale": 7}):
            job = client.submit(spec(_weights(**weights)))
            assert wait_for(client, job.id, timeout=120).state == "SUCCEEDED"
            client.register_model("scaler", job.id, "weights.json", framework="custom")
        yield client, code
    finally:
        client.close()
        server.stop()


def _deploy(client: Client, code: Path, name: str) -> None:
    service = {
        "name": name,
        "model": "scaler@1",
        "predictor": {"type": "custom", "class": "predictor:Model"},
        "runtime": {"python": sys.executable},
        "resources": {"cpus": 0.5},
        "request_timeout": 30,
        "replicas": 1,
    }
    client.serve(service, code_dir=code)
    ready = client.wait_service(name, timeout=SETTLE)
    assert ready.state == ServiceState.READY, f"{ready.message}: {ready.replicas}"


def _canary_ready(client: Client, name: str) -> None:
    deadline = time.monotonic() + SETTLE
    while True:
        now = client.get_service(name)
        if any(r.canary and r.state == ReplicaState.READY for r in now.replicas):
            return
        assert time.monotonic() < deadline, f"no canary replica ready: {now.replicas}"
        time.sleep(0.2)


def _steady(client: Client, name: str, done: Any, timeout: float = 120.0) -> tuple[ServiceRead, dict[str, int]]:
    """Predicts one after another (input i answered i * scale) until ``done(service read)``: the read then, and
    how many predicts each model answered (``error``: failed)."""
    answered: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    i = 0
    while True:
        i += 1
        try:
            answer = client.predict(name, [i])
            scale = {"scaler@1": 3, "scaler@2": 5, "scaler@3": 7}[answer.model]
            assert answer.outputs == [i * scale], (answer.model, answer.outputs)
            answered[answer.model] = answered.get(answer.model, 0) + 1
        except KilnError:
            answered["error"] = answered.get("error", 0) + 1
        if i % 10 == 0:
            now = client.get_service(name)
            if done(now):
                return now, answered
        assert time.monotonic() < deadline, f"{answered}: {client.get_service(name)}"


def test_a_canary_that_fails_one_predict_in_five_is_rolled_back_on_its_own(
    world: tuple[Client, Path], receiver: WebhookReceiver
) -> None:
    client, code = world
    client.subscribe("canaries", ["service.canary_*"], url=receiver.url("/rolled"), name_pattern="guarded")
    _deploy(client, code, "guarded")
    policy = {"max_error_rate": 0.05, "min_requests": 20, "steps": [50, 100], "step_wait": 3600}
    started = client.update_service("guarded", model="scaler@2", canary=50, rollout=policy)
    assert started.canary is not None and started.canary.policy is not None
    assert started.canary.policy.max_error_rate == 0.05
    _canary_ready(client, "guarded")
    after, answered = _steady(client, "guarded", lambda s: s.canary is None)
    assert answered.get("scaler@2", 0) > 0 and answered.get("error", 0) > 0, answered  # it did fail, then ...
    (event,) = after.rollout_events
    assert (event.move, event.by, event.version, event.weight) == ("rolled_back", "policy", 2, 50)
    assert "error rate" in event.message and "above the 5.0% allowed" in event.message, event.message
    assert after.model_version == 1
    (posted,) = receiver.wait("/rolled")
    body = json.loads(posted.body)
    assert (body["type"], body["subject"]["name"]) == ("service.canary_rolled_back", "guarded")
    assert body["subject"]["details"] == {"version": 2, "weight": 50, "by": "policy"}
    # ... and once rolled back, every predict is the stable version's.
    _, since = _steady(client, "guarded", lambda s: True)
    assert since == {"scaler@1": 10}, since


def test_a_healthy_canary_advances_step_by_step_and_is_promoted(
    world: tuple[Client, Path], receiver: WebhookReceiver
) -> None:
    client, code = world
    client.subscribe("promotions", ["service.canary_*"], url=receiver.url("/promoted"), name_pattern="stepped")
    _deploy(client, code, "stepped")
    policy = {"max_error_rate": 0.05, "max_p99_ms": 5000, "min_requests": 10, "steps": [10, 50, 100], "step_wait": 1}
    client.update_service("stepped", model="scaler@3", canary=10, rollout=policy)
    _canary_ready(client, "stepped")
    after, answered = _steady(client, "stepped", lambda s: s.canary is None)
    assert "error" not in answered and answered.get("scaler@3", 0) > 0, answered
    moves = [(e.move, e.by, e.weight) for e in after.rollout_events]
    assert moves == [("advanced", "policy", 50), ("promoted", "policy", 100)], after.rollout_events
    assert (after.model_version, after.spec.model) == (3, "scaler@3")
    posted = [json.loads(p.body)["type"] for p in receiver.wait("/promoted", 2)]
    assert posted == ["service.canary_advanced", "service.canary_promoted"]


def test_a_shadow_gets_copies_whose_answers_are_compared_and_never_returned(world: tuple[Client, Path]) -> None:
    client, code = world
    _deploy(client, code, "shadowed")
    started = client.update_service("shadowed", shadow="scaler@2")
    assert started.shadow is not None and started.shadow.model_version == 2
    deadline = time.monotonic() + SETTLE
    while not any(r.shadow and r.state == ReplicaState.READY for r in client.get_service("shadowed").replicas):
        assert time.monotonic() < deadline, client.get_service("shadowed").replicas
        time.sleep(0.2)
    after, answered = _steady(client, "shadowed", lambda s: s.shadow is not None and s.shadow.compared >= 20)
    assert set(answered) == {"scaler@1"}, answered  # every answer the stable version's, none failed
    shadow = after.shadow
    assert shadow is not None and shadow.copied >= shadow.compared + shadow.errors - 1, shadow
    assert shadow.errors > 0, shadow  # its failures (1 input in 5) are its own figure, never the client's
    assert shadow.agreement_rate == 0.0 and shadow.mean_abs_diff is not None and shadow.mean_abs_diff > 0, shadow
    assert shadow.latency_ms_p50 is not None
    roles = {v.model_version: v.role for v in after.versions}
    assert roles == {1: "stable", 2: "shadow"}, after.versions
    ended = client.update_service("shadowed", shadow="")
    assert ended.shadow is None
