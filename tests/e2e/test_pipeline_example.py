"""The pipelines issue's example as it is (examples/pipeline): prep -> train -> evaluate -> register -> deploy on
the bundled digits, through the CLI, on one real server. The service answers what the evaluating job's own
model predicted; a second run with nothing changed reuses every job step from the cache, starts no job, and leaves
the service as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kiln.sdk.client import Client
from tests.kilnserver import REPO, KilnServer
from tests.tenancy_helpers import Api, create_tenant

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "pipeline"


@pytest.mark.timeout(1500)
def test_the_example_pipeline_deploys_a_model_that_answers_and_reruns_from_the_cache(tmp_path: Path) -> None:
    server = KilnServer(tmp_path / "home", cpus="4", rate_limit_per_second="0").start()
    try:
        member = create_tenant(Api.admin(server), "flow", ("member",))["member"]
        client = Client(server.url, member.key_id, member.secret, timeout=120)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
        env.update(KILN_CONFIG=str(tmp_path / "cfg"), KILN_ENDPOINT=server.url, COLUMNS="200")
        env.update(KILN_ACCESS_KEY=member.key_id, KILN_SECRET_KEY=member.secret)

        def run_example() -> dict[str, Any]:
            done = subprocess.run(
                [sys.executable, "-m", "kiln", "pipelines", "run", "-f", "pipeline.yaml", "--follow", "-o", "json"],
                cwd=EXAMPLE,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            run_id, _, body = done.stdout.partition("\n")
            shown = json.loads(body)
            assert shown["id"] == run_id and shown["state"] == "SUCCEEDED", shown
            return {step["name"]: step for step in shown["steps"]}

        first = run_example()
        assert {name: step["state"] for name, step in first.items()} == dict.fromkeys(
            ("prep", "train", "evaluate", "register", "deploy"), "SUCCEEDED"
        )
        assert first["register"]["result"] == {"model": "digits-flow@1"}
        service = client.wait_service("digits-flow", timeout=300)
        assert service.state == "READY", (service.state, service.message)
        evaluated = client.download(first["evaluate"]["job_id"], tmp_path / "evaluate")
        expected = json.loads(next(p for p in evaluated if p.name == "expected.json").read_text())
        answer = client.predict("digits-flow", expected["inputs"])
        assert answer.outputs == expected["outputs"]  # the evaluating job's own predictions

        jobs = len(client.list_jobs(limit=500))
        second = run_example()
        assert {name: second[name]["state"] for name in ("prep", "train", "evaluate")} == dict.fromkeys(
            ("prep", "train", "evaluate"), "CACHED"
        )
        assert {name: second[name]["job_id"] for name in ("prep", "train", "evaluate")} == {
            name: first[name]["job_id"] for name in ("prep", "train", "evaluate")
        }
        assert second["register"]["result"] == {"model": "digits-flow@1"}  # the same files: the same version
        assert "already" in second["deploy"]["message"]
        assert len(client.list_jobs(limit=500)) == jobs  # no job started (the service's replica included)
    finally:
        server.stop()
