"""Which names a real job's log gives as metrics: a DDP script's `rank=0` is no metric, and the spec's
`metrics.include` / `metrics.exclude` choose the rest (the shim's extraction, through the API)."""

from __future__ import annotations

import sys
import time

from tests.helpers import wait_for
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api

PY = sys.executable
SCRIPT = r"""
import os
print(f"rank={os.environ.get('RANK', 0)} world_size=1 local_rank=0 seed=1234 pid={os.getpid()}", flush=True)
for step in range(3):
    print(f"epoch=1 iter={step} step={step} loss={1 / (step + 1):.3f} lr=0.1 debug_queue=7", flush=True)
"""


def _log_names(shared_server: KilnServer, metrics: dict) -> set[str]:  # type: ignore[type-arg]
    client = shared_server.client()
    job = client.submit(
        {"command": [PY, "-c", SCRIPT], "runtime": {"python": PY}, "metrics": {**metrics, "system": False}}
    )
    assert wait_for(client, job.id, timeout=60).state == "SUCCEEDED"
    deadline = time.monotonic() + 20
    while True:  # ingestion follows the job by up to a pass: wait for the last step's points
        summary = client.metrics_summary(job.id)
        if any(s.last_step == 2 for s in summary):
            return {s.name for s in summary}
        assert time.monotonic() < deadline, summary
        time.sleep(0.2)


def test_well_known_non_metrics_are_left_out_by_default(shared_server: KilnServer) -> None:
    # rank, world_size, local_rank, seed and pid are who the process is; step is the axis, iter a position.
    assert _log_names(shared_server, {}) == {"loss", "lr", "debug_queue", "epoch"}


def test_include_and_exclude_choose_the_names(shared_server: KilnServer) -> None:
    assert _log_names(shared_server, {"exclude": ["debug_*", "LR"]}) == {"loss", "epoch"}
    assert _log_names(shared_server, {"include": ["loss", "seed"]}) == {"loss", "seed"}


def test_a_bad_name_pattern_is_refused_naming_the_field(shared_server: KilnServer) -> None:
    api = Api.admin(shared_server)
    try:
        response = api.post("/jobs", {"spec": {"command": "true", "metrics": {"exclude": ["ok", "bad\nname"]}}})
    finally:
        api.close()
    assert response.status_code == 422, response.text
    assert "metrics.exclude" in response.text and "is not a metric name or pattern" in response.text, response.text
