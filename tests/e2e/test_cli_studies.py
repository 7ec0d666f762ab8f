"""``kiln tune`` and ``kiln studies`` as the real command against a real server: a small study run with
``--follow`` to its end, then what ``studies show/trials/best/export/events/list`` print checked against the API's
answers; a followed study that is stopped exits 130; a spec refused here or by the server exits 2."""

from __future__ import annotations

import csv
import io
import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.domain.spec import format_param
from kiln.sdk.client import Client
from tests.e2e.test_cli import PY, base_env, kiln
from tests.helpers import wait_for
from tests.kilnserver import KilnServer

STUDY_ID = re.compile(r"^study-[0-9a-z]+$")
# Each trial reports its objective at two steps; its final (last) value is x itself, so the ranking is known.
TRAIN = "import sys\nx = float(sys.argv[1])\nprint(f'step=1 score={x / 2}', flush=True)\nprint(f'step=2 score={x}')\n"
STUDY = f"""\
name: cli-study
trial:
  command: python train.py {{x}}
  runtime: {{python: {PY}}}
  resources: {{cpus: 0.5}}
parameters:
  x: {{type: float, low: 0.0, high: 1.0}}
  act: {{type: categorical, choices: [relu, tanh]}}
objective: {{metric: score, direction: maximize}}
algorithm: random
max_trials: 4
parallelism: 2
seed: 3
"""


@pytest.fixture
def env(shared_server: KilnServer, tmp_path: Path) -> dict[str, str]:
    base = {**base_env(tmp_path), "KILN_CLIENT_DIR": str(tmp_path / "client")}  # `kiln tune` remembers what it packed
    return {**base, **shared_server.credentials(), "KILN_ENDPOINT": shared_server.url}


@pytest.fixture
def client(shared_server: KilnServer) -> Iterator[Client]:
    with shared_server.client() as client:
        yield client


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, result.stderr
    return result


def rows(table: str) -> list[list[str]]:
    """The data rows of a table as their cells (split on runs of spaces), heading and rule left out."""
    lines = [line for line in table.splitlines() if line.strip() and not line.lstrip().startswith("─")]
    return [line.split() for line in lines[1:]]


def test_a_study_tuned_and_followed_through_the_cli_reads_as_the_api_says(env, client, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    (code / "study.yaml").write_text(STUDY)
    tuned = kiln(env, "tune", "-f", "study.yaml", "--follow", cwd=code, timeout=180)
    assert tuned.returncode == 0, tuned.stderr
    study_id, *followed = tuned.stdout.splitlines()
    assert STUDY_ID.match(study_id), tuned.stdout
    assert "packed 2 files" in tuned.stderr and f"study {study_id} SUCCEEDED (Completed)" in tuned.stderr

    study = client.get_study(study_id)
    by_number = client.study_trials(study_id, order="number")
    by_objective = client.study_trials(study_id)
    best = client.best_trial(study_id)
    assert (study.state, study.trials.total, study.trials.succeeded, len(by_number)) == ("SUCCEEDED", 4, 4, 4)
    assert study.code_sha256 is not None
    for trial in by_number:  # the code bundle ran, with the sampled x on its command line
        assert trial.value == pytest.approx(trial.params["x"])
    # --follow printed each trial once as it ended, then the best one.
    trial_lines = [line for line in followed if line.startswith("trial ") and "SUCCEEDED" in line]
    assert sorted(int(line.split()[1]) for line in trial_lines) == [0, 1, 2, 3]
    assert any(best.job_id in line for line in followed[followed.index("best trial:") :])

    # show: the study, then the trials in the API's objective order.
    shown = ok(kiln(env, "studies", "show", study_id)).stdout
    assert "maximize score (last value)" in shown and "4/4 (4 succeeded)" in shown
    details, table = shown.split("\n\n", 1)
    assert f"trial {best.number}: {best.value:.6g} ({best.job_id})" in details
    assert [int(cells[0]) for cells in rows(table)] == [t.number for t in by_objective]
    as_json = json.loads(ok(kiln(env, "studies", "show", study_id, "-o", "json")).stdout)
    assert as_json["study"]["id"] == study_id
    assert [t["number"] for t in as_json["trials"]] == [t.number for t in by_objective]
    ordered = ok(kiln(env, "studies", "trials", study_id, "--order", "number")).stdout
    assert [(int(c[0]), c[1]) for c in rows(ordered)] == [(t.number, "SUCCEEDED") for t in by_number]

    # best: the winning parameters and its job.
    best_text = ok(kiln(env, "studies", "best", study_id)).stdout
    assert best.job_id is not None and best.job_id in best_text
    assert re.search(rf"^param act +{best.params['act']} *$", best_text, re.MULTILINE), best_text
    assert re.search(rf"^param x +{best.params['x']:.6g} *$", best_text, re.MULTILINE), best_text
    assert json.loads(ok(kiln(env, "studies", "best", study_id, "-o", "json")).stdout) == best.model_dump(mode="json")

    # export: CSV on stdout, or into a file; every cell as the API has it.
    exported = ok(kiln(env, "studies", "export", study_id)).stdout
    header, *lines = list(csv.reader(io.StringIO(exported)))
    assert header == ["number", "state", "value", "param.x", "param.act", "pruned_step", "job_id", "duration_seconds"]
    assert len(lines) == 4
    for line, trial in zip(lines, by_number, strict=True):
        assert line[:7] == [
            str(trial.number),
            "SUCCEEDED",
            repr(trial.value),
            format_param(trial.params["x"]),
            str(trial.params["act"]),
            "",
            trial.job_id,
        ]
        assert float(line[7]) > 0
    target = tmp_path / "trials.csv"
    wrote = ok(kiln(env, "studies", "export", study_id, "-o", str(target)))
    assert "wrote 4 trials" in wrote.stderr
    assert list(csv.reader(target.open()))[:1] == [header] and len(target.read_text().splitlines()) == 5

    # events, list and ls: what the API answers.
    events = json.loads(ok(kiln(env, "studies", "events", study_id, "-o", "json")).stdout)
    assert events == [e.model_dump(mode="json") for e in client.study_events(study_id)]
    reasons = [e["reason"] for e in events]
    assert reasons[0] == "Submitted" and reasons[-1] == "Completed"
    assert reasons.count("TrialStarted") == reasons.count("TrialSucceeded") == 4
    listed = json.loads(ok(kiln(env, "studies", "list", "--state", "succeeded", "-o", "json")).stdout)
    assert study_id in [s["id"] for s in listed] and all(s["state"] == "SUCCEEDED" for s in listed)
    assert any(cells[0] == study_id for cells in rows(ok(kiln(env, "studies", "ls")).stdout))

    # A study that succeeded is not stopped: the server's 409, said plainly.
    refused = kiln(env, "studies", "stop", study_id)
    assert refused.returncode == 1 and refused.stderr.startswith("error: ") and "Traceback" not in refused.stderr


def test_a_followed_study_that_is_stopped_exits_130_and_its_trial_is_cancelled(env, client, tmp_path):
    study_file = tmp_path / "sleep.yaml"
    study_file.write_text(
        STUDY.replace("command: python train.py {x}", "command: echo step=1 score={x}; sleep 120").replace(
            "max_trials: 4", "max_trials: 1"
        )
    )
    proc = subprocess.Popen(
        [PY, "-m", "kiln", "tune", "-f", str(study_file), "--no-code", "--follow"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout is not None
        study_id = proc.stdout.readline().strip()
        assert STUDY_ID.match(study_id), study_id

        deadline = time.monotonic() + 60
        while not (trials := client.study_trials(study_id)) or trials[0].job_id is None:
            assert time.monotonic() < deadline, f"study {study_id} started no trial job in 60 s"
            time.sleep(0.1)
        assert trials[0].job_id is not None
        wait_for(client, trials[0].job_id, "RUNNING")
        stopped = ok(kiln(env, "studies", "stop", study_id))
        assert f"study {study_id} STOPPED" in stopped.stderr
        assert proc.wait(60) == 130
        out, err = proc.communicate()
        assert "trial 0  CANCELLED" in out and f"study {study_id} STOPPED (Stopped)" in err
        [trial] = client.study_trials(study_id)
        assert trial.state == "CANCELLED" and trial.job_id is not None
        assert client.wait(trial.job_id, timeout=30).state == "CANCELLED"
    finally:
        proc.kill()
        proc.wait()


def test_a_spec_refused_here_or_by_the_server_exits_2_naming_the_field_and_starts_nothing(env, client, tmp_path):
    before = {s.id for s in client.list_studies()}
    bad = tmp_path / "bad.yaml"
    bad.write_text(STUDY.replace("low: 0.0, high: 1.0", "low: 2.0, high: 1.0"))
    local = kiln(env, "tune", "-f", str(bad), "--no-code")
    assert local.returncode == 2 and "parameters.x: low: 2 is above high (1)" in local.stderr, local.stderr
    bad.write_text(STUDY.replace(f"runtime: {{python: {PY}}}", "runtime: {framework: nosuchframework}"))
    remote = kiln(env, "tune", "-f", str(bad), "--no-code")
    assert remote.returncode == 2, remote.stderr
    assert "the server refused the study's trial spec" in remote.stderr and "nosuchframework" in remote.stderr
    assert {s.id for s in client.list_studies()} == before
