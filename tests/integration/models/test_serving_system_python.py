"""A service honours its runtime.python: with the system's /usr/bin/python3 (Debian has no ``python`` beside it)
its replica used to fail at once with CommandNotFound (its command was ``python -m kiln.injob.serve``), and the
service never served. The predictor is the cheapest there is: a custom class that multiplies."""

from __future__ import annotations

import json
import sys

import pytest

from kiln.domain.serving import ServiceState
from tests.helpers import spec, wait_for
from tests.kilnserver import TEST_PYTHON_ROOTS

SYSTEM_PYTHON = "/usr/bin/python3"
PREDICTOR = """
import json, pathlib, sys

class Model:
    def load(self, path):
        path = pathlib.Path(path)
        self.scale = json.loads((path / "weights.json" if path.is_dir() else path).read_text())["scale"]

    def predict(self, batch):
        return [[x * self.scale, sys.executable] for x in batch]
"""
WEIGHTS = "import json, os; json.dump({'scale': 3}, open(os.environ['KILN_OUTPUT_DIR'] + '/weights.json', 'w'))"


@pytest.mark.timeout(300)
def test_a_service_on_the_system_python_serves(make_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = make_server(cpus="2", allowed_python_roots=json.dumps([*TEST_PYTHON_ROOTS, "/usr"]))
    code = tmp_path / "code"
    code.mkdir()
    (code / "predictor.py").write_text(PREDICTOR)
    with server.client() as client:
        job = client.submit(spec([sys.executable, "-c", WEIGHTS]))
        assert wait_for(client, job.id, timeout=120).state == "SUCCEEDED"
        client.register_model("scaler", job.id, "weights.json", framework="custom")
        client.serve(
            {
                "name": "sys",
                "model": "scaler@1",
                "predictor": {"type": "custom", "class": "predictor:Model"},
                "runtime": {"python": SYSTEM_PYTHON},
                "resources": {"cpus": 0.5},
                "replicas": 1,
                "request_timeout": 60,
            },
            code_dir=code,
        )
        ready = client.wait_service("sys", timeout=120)
        assert ready.state == ServiceState.READY, f"{ready.message}: {ready.replicas}"
        assert client.predict("sys", [2]).outputs == [[6, SYSTEM_PYTHON]]
        client.delete_service("sys")
