"""The TensorBoard launcher (``python -m kiln.injob.tensorboard``) without TensorBoard: its config, where event
files land, and the puller's copies (appending what a file gained, starting over when it shrank, refusing paths
that would leave the log dir) against a stand-in of Kiln's two event endpoints on 127.0.0.1. TensorBoard itself
runs under the real server in tests/integration/notebooks/test_notebooks.py. And the spec a TensorBoard is created
from."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from pydantic import ValidationError

from kiln.domain.notebooks import NotebookSpec
from kiln.injob import tensorboard
from kiln.usecases.notebooks import job_spec, run_names

JOB_A, JOB_B = "job-01m90ef8xxts7sep", "job-01m90ef8xxts7seq"


def _env(tmp_path: Path, params: dict[str, Any]) -> dict[str, str]:
    (tmp_path / "params.json").write_text(json.dumps(params))
    return {
        "KILN_PARAMS_FILE": str(tmp_path / "params.json"),
        "KILN_ENDPOINT": "http://127.0.0.1:1",
        "KILN_JOB_TOKEN": "t",
        "KILN_WORK_DIR": str(tmp_path),
    }


def test_the_config_is_what_the_server_sends_and_bad_ones_are_named(tmp_path: Path) -> None:
    spec = NotebookSpec.model_validate({"name": "tb", "kind": "tensorboard", "jobs": [JOB_A, JOB_B]})
    params = job_spec("nb-x", spec, "3", 60, {JOB_A: "train", JOB_B: "eval"}).params
    assert spec.suffix == "+tensorboard"
    config = tensorboard.read_config(_env(tmp_path, params))
    assert config.runs == {JOB_A: "train", JOB_B: "eval"} and config.base_url == "/notebooks/nb-x/"
    for runs, says in (
        ("", "naming at least one job"),
        (f"{JOB_A}=..", "not a job id and a run name"),
        (f"{JOB_A}=a/b", "not a job id and a run name"),
        ("job-x=train", "not a job id and a run name"),
        (f"{JOB_A}=same,{JOB_B}=same", "same run name"),
    ):
        with pytest.raises(ValueError, match=says):
            tensorboard.read_config(_env(tmp_path, {**params, "runs": runs}))


def test_run_names_are_the_jobs_names_made_safe_and_told_apart() -> None:
    assert run_names([(JOB_A, "mnist run/1"), (JOB_B, "eval")]) == {JOB_A: "mnist-run-1", JOB_B: "eval"}
    assert run_names([(JOB_A, "same"), (JOB_B, "same")]) == {JOB_A: f"same-{JOB_A}", JOB_B: f"same-{JOB_B}"}
    assert run_names([(JOB_A, "../..")]) == {JOB_A: JOB_A}


def test_a_tensorboard_spec_names_jobs_and_only_a_tensorboard_does() -> None:
    for spec, says in (
        ({"name": "tb", "kind": "tensorboard"}, "name at least one"),
        ({"name": "tb", "kind": "tensorboard", "jobs": ["mnist"]}, "is not a job id"),
        ({"name": "nb", "jobs": [JOB_A]}, "is for kind tensorboard"),
        ({"name": "tb", "kind": "tensorboard", "jobs": [JOB_A], "inputs": [{"dataset": "d@1"}]}, "no `inputs`"),
        ({"name": "tb", "kind": "tensorboard", "jobs": [JOB_A], "runtime": {"version": "3+tensorboard"}}, "without"),
        ({"name": "tb", "kind": "tensorboard", "jobs": [JOB_A], "network": "host"}, "no token of its own"),
    ):
        with pytest.raises(ValidationError, match=says):
            NotebookSpec.model_validate(spec)
    assert NotebookSpec.model_validate({"name": "tb", "kind": "tensorboard", "jobs": [JOB_A, JOB_A]}).jobs == [JOB_A]
    assert NotebookSpec.model_validate({"name": "nb", "network": "host"}).network == "host"  # a 0600 socket guards it


def test_event_files_land_under_their_run_and_nowhere_else() -> None:
    assert tensorboard.local_name("train", "sub/events.out.tfevents.1.h") == Path("train/sub/events.out.tfevents.1.h")
    for path in ("../events.out.tfevents.1", "/etc/events.out.tfevents.1", "a/../../events.out.tfevents.1", "x.txt"):
        assert tensorboard.local_name("train", path) is None, path


class _Kiln:
    """What Kiln's event endpoints answer: ``files`` (path → bytes) of one job, ``state`` its state."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.state = "RUNNING"
        self.offsets: list[int] = []


@pytest.fixture
def kiln_events() -> Iterator[tuple[_Kiln, str]]:
    kiln = _Kiln()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            assert self.headers["Authorization"] == "Bearer t"
            if parts.path.endswith("/events"):
                files = [{"path": p, "size": len(b)} for p, b in kiln.files.items()]
                body = json.dumps({"items": [{"job_id": JOB_A, "state": kiln.state, "files": files}]}).encode()
            else:
                path = unquote(parts.path.split(f"/events/{JOB_A}/", 1)[1])
                offset = int(parse_qs(parts.query)["offset"][0])
                kiln.offsets.append(offset)
                body = kiln.files[path][offset:]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield kiln, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_puller_appends_what_a_file_gained_and_starts_over_when_it_shrank(
    tmp_path: Path, kiln_events: tuple[_Kiln, str]
) -> None:
    kiln, endpoint = kiln_events
    env = {**_env(tmp_path, {"notebook_id": "nb-x", "base_url": "/notebooks/nb-x/", "runs": f"{JOB_A}=train"})}
    env["KILN_ENDPOINT"] = endpoint
    puller = tensorboard.Puller(tensorboard.read_config(env))
    assert (tmp_path / "logs" / "train").is_dir()  # a run from the start, before the job has written anything
    kiln.files = {"events.out.tfevents.1.h": b"first", "../events.out.tfevents.2.h": b"escape"}
    assert puller.pull() is True  # the job runs: more may come
    local = tmp_path / "logs" / "train" / "events.out.tfevents.1.h"
    assert local.read_bytes() == b"first" and not (tmp_path / "logs" / "events.out.tfevents.2.h").exists()
    kiln.files["events.out.tfevents.1.h"] = b"first+more"
    kiln.state = "SUCCEEDED"
    assert puller.pull() is False
    assert local.read_bytes() == b"first+more" and kiln.offsets == [0, 5]
    kiln.files["events.out.tfevents.1.h"] = b"anew"  # rewritten shorter: copied again from the start
    puller.pull()
    assert local.read_bytes() == b"anew" and kiln.offsets[-1] == 0
