"""A job's token reads exactly the dataset and model versions its job pinned as inputs (a Kubernetes pod's init
container stages them with it) and nothing else of its organisation: a real job calls the API with its token."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.helpers import log_text, wait_for
from tests.kilnserver import KilnServer

PROBE = r"""
import os, urllib.request, urllib.error
def status(path):
    request = urllib.request.Request(os.environ["KILN_ENDPOINT"] + "/api/v1" + path,
                                     headers={"Authorization": "Bearer " + os.environ["KILN_JOB_TOKEN"]})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
for path in ["/datasets/mine/versions/1", "/datasets/mine/versions/1/files/a.txt", "/datasets/other/versions/1",
             "/datasets/other/versions/1/files/a.txt", "/datasets", "/models/net/versions/1",
             "/models/net/versions/1/files/w.txt", "/models/net/versions/2", "/models"]:
    print("probe", path, status(path))
"""


def test_a_job_token_reads_its_own_inputs_only(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server: KilnServer = make_server()
    client = server.client()
    for name in ("mine", "other"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.txt").write_text(name)
        client.put_dataset(tmp_path / name, name)
    make_files = 'echo w > "$KILN_OUTPUT_DIR/w.txt"; echo v > "$KILN_OUTPUT_DIR/v.txt"'
    maker = client.submit({"command": make_files, "runtime": {"python": sys.executable}})
    assert wait_for(client, maker.id, "SUCCEEDED").state == "SUCCEEDED"
    # Versions 1 and 2 of model "net" (other files: the same files again would be version 1).
    for path in ("w.txt", "v.txt"):
        client.register_model("net", job_id=maker.id, path=path)
    spec = {
        "command": ["python", "-c", PROBE],
        "runtime": {"python": sys.executable},
        "inputs": [{"dataset": "mine"}, {"model": "net@1"}],
    }
    job = client.submit(spec)
    assert wait_for(client, job.id, "SUCCEEDED").state == "SUCCEEDED"
    seen = {line.split()[-2]: int(line.split()[-1]) for line in log_text(client, job.id) if "probe " in line}
    assert seen == {
        "/datasets/mine/versions/1": 200,
        "/datasets/mine/versions/1/files/a.txt": 200,
        "/datasets/other/versions/1": 403,
        "/datasets/other/versions/1/files/a.txt": 403,
        "/datasets": 403,
        "/models/net/versions/1": 200,
        "/models/net/versions/1/files/w.txt": 200,
        "/models/net/versions/2": 403,
        "/models": 403,
    }
