"""A job that floods its log does not stall the server or cost another job its log or its metrics: extraction
falls behind (and says so), and catches up."""

from __future__ import annotations

import sys
import time

import httpx

from tests.helpers import log_text, wait_for

PY = sys.executable
FLOOD = "import sys\nline = 'step=1 noise=' + 'x' * 120 + '\\n'\nfor _ in range(250_000):\n    sys.stdout.write(line)"
CALM = (
    "import time\nfor i in range(50):\n    print(f'step={i} loss={1 / (i + 1):.4f}', flush=True)\n    time.sleep(0.02)"
)


def test_a_flooding_job_does_not_stall_the_server_or_other_jobs(make_server):
    server = make_server(cpus="2")
    client = server.client()
    flood = client.submit({"command": [PY, "-c", FLOOD], "runtime": {"python": PY}, "resources": {"cpus": 1}})
    calm = client.submit({"command": [PY, "-c", CALM], "runtime": {"python": PY}, "resources": {"cpus": 1}})
    # The API keeps answering while ~32 MB of output pours in.
    seen_running = False
    while not client.get_job(flood.id).state.terminal:
        assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
        seen_running = True
        time.sleep(0.2)
    assert seen_running
    assert wait_for(client, flood.id).state == "SUCCEEDED"
    assert wait_for(client, calm.id).state == "SUCCEEDED"
    # The calm job's log and metrics are whole.
    assert log_text(client, calm.id) == [f"step={i} loss={1 / (i + 1):.4f}" for i in range(50)]
    deadline = time.monotonic() + 30
    while True:
        loss = [s for s in client.metrics(calm.id, names=["loss"]) if s.name == "loss"]
        if loss and loss[0].count == 50:
            break
        assert time.monotonic() < deadline, loss
        time.sleep(0.2)
    # The flood's output is all in its log (250,000 lines), and its extraction says if it fell behind.
    size = server.home.joinpath("logs").glob(f"{flood.id}*")
    assert sum(p.stat().st_size for p in size) > 250_000 * 120
    deadline = time.monotonic() + 30
    while True:  # the extractor's last words are ingested after the job ended
        reasons = {e.reason for e in client.events(flood.id)}
        if "MetricsLagging" not in reasons or reasons & {"MetricsCaughtUp", "MetricsIncomplete"}:
            break
        assert time.monotonic() < deadline, reasons
        time.sleep(0.2)
