"""A real two-worker PyTorch DistributedDataParallel job (gloo, CPU) on the `pytorch` catalog runtime: the
ranks start from different weights and different data, and must end with equal parameters."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from kiln.cli.logs import member_tag
from tests.kilnserver import REPO

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "torch-ddp"


def _install_pytorch(client) -> None:  # type: ignore[no-untyped-def]
    client.install_runtime("pytorch")
    deadline = time.monotonic() + 900
    while True:
        status = {r.name: r.status for r in client.runtimes()}
        if status["pytorch-2.13"] == "installed":
            return
        assert status["pytorch-2.13"] in ("installing", "not-installed"), status
        assert time.monotonic() < deadline, "pytorch runtime did not install in time"
        time.sleep(2)


# What it waits for, at most: the runtime's build 900 s and the job 600 s (1500 s), and two minutes for the rest.
@pytest.mark.timeout(1620)
def test_ddp_ranks_end_with_equal_parameters(make_server, tmp_path: Path) -> None:
    client = make_server(cpus="2").client()
    _install_pytorch(client)
    spec = yaml.safe_load((EXAMPLE / "kiln.yaml").read_text())
    spec["env"]["STEPS"] = "100"
    job = client.run(spec, code_dir=EXAMPLE)
    done = client.wait(job.id, timeout=600)
    assert done.state == "SUCCEEDED", (
        done.message,
        [str(line) for line in client.stream_logs(job.id, follow=False)][-20:],
    )
    files = client.download(job.id, tmp_path / "out")
    ranks = {json.loads(f.read_text())["rank"]: json.loads(f.read_text()) for f in files if f.name.startswith("rank")}
    assert sorted(ranks) == [0, 1]
    assert ranks[0]["world_size"] == ranks[1]["world_size"] == 2
    assert ranks[0]["digest"] == ranks[1]["digest"], ranks  # gradients were all-reduced every step
    assert ranks[0]["accuracy"] > 0.7
    # Each worker's log is kept apart: every output line is tagged with its member.
    lines = client.stream_logs(job.id, follow=False)
    by_member = {line.worker for line in lines if line.source == "stdout" and "done digest" in line.text}
    assert by_member == {member_tag("0"), member_tag("1")}
