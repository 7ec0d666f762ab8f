"""The tuning issue's real study: examples/tuning as it is (a scikit-learn MLPClassifier on the bundled digits
data, tuning learning rate, width and alpha), 20 trials, 2 in parallel, TPE with ASHA, on the sklearn catalog
runtime. The script knows nothing of tuning: it reads its flags and prints ``epoch=N val_acc=X``.

What only this test shows: on a real task the study ends SUCCEEDED with exactly its 20 trials, ASHA stopped some of
them early (their jobs cancelled before the last epoch), and the best trial's validation accuracy beats the same
script run as a plain job with the default parameters for the same number of epochs.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from kiln.domain.states import JobState
from kiln.domain.studies import StudyReason, StudySpec, StudyState, TrialRead, TrialState, substitute
from kiln.sdk.client import Client
from tests.helpers import wait_for
from tests.kilnserver import REPO

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "tuning"
DEFAULTS = {"lr": 0.001, "width": 100, "alpha": 0.0001}  # scikit-learn's, and train.py's without flags


def _last_val_acc(client: Client, job_id: str, epochs: int) -> tuple[int, float]:
    """The last (epoch, val_acc) of an ended job, as Kiln extracted it from its log: the last points reach the
    metrics store a spool flush and an ingest pass after the job's end, so this waits for epoch ``epochs`` (at most
    30 s) and returns the last point there is."""
    deadline = time.monotonic() + 30
    while True:
        series = client.metrics(job_id, names="val_acc")
        last = series[0].points[-1] if series else None
        if (last is not None and last[0] == epochs) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert last is not None, f"job {job_id} reported no val_acc"
    step, _, value = last
    assert isinstance(step, int) and isinstance(value, float), last
    return step, value


def _epochs_run(client: Client, job_id: str) -> int:
    series = client.metrics(job_id, names="val_acc")
    return len(series[0].points) if series else 0


# What it waits for, at most: the default run 600 s (the first job on the sklearn runtime builds it, ~20 s when
# .cache/test-runtimes lacks it), the study 600 s (about 1 minute here), the last metric points 2 x 30 s, and a
# minute for the rest.
@pytest.mark.timeout(1320)
def test_a_tuned_digits_network_beats_the_default_parameters(make_server, tmp_path: Path) -> None:
    server = make_server()
    client = server.client()
    spec = StudySpec.model_validate(yaml.safe_load((EXAMPLE / "study.yaml").read_text()))
    assert (spec.max_trials, spec.parallelism, spec.early_stopping.type) == (20, 2, "asha")
    assert spec.trial.runtime.framework == "sklearn" and spec.objective.metric == "val_acc"
    epochs = int(str(spec.trial.command).split("--epochs ")[1].split()[0])

    # The baseline: the trial's own job spec with the defaults in place of the placeholders (same script, same
    # epochs). It runs first, alone: it also builds the runtime the trials share.
    code = client.upload_code(EXAMPLE)
    default_spec = spec.trial.model_copy(update={"command": substitute(spec.trial.command, DEFAULTS)})
    default_job = client.submit(default_spec, code)
    assert wait_for(client, default_job.id, timeout=600).state == JobState.SUCCEEDED
    default_epoch, default_acc = _last_val_acc(client, default_job.id, epochs)
    assert default_epoch == epochs

    study = client.tune(spec, EXAMPLE)
    deadline = time.monotonic() + 600
    while not (study := client.get_study(study.id)).state.terminal:
        assert time.monotonic() < deadline, f"study still {study.state} after 600 s: {study.trials}"
        time.sleep(1)
    assert (study.state, study.reason) == (StudyState.SUCCEEDED, StudyReason.COMPLETED), study.message

    trials = client.study_trials(study.id, order="number")
    assert [t.number for t in trials] == list(range(20)), "exactly max_trials trials, each once"
    states = {t.number: t.state for t in trials}
    assert set(states.values()) <= {TrialState.SUCCEEDED, TrialState.PRUNED}, states
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert pruned, f"ASHA pruned no trial: {[(t.number, t.value) for t in trials]}"
    # Pruning saved work: a pruned trial's job was cancelled before its last epoch (its CPU went to the next trial).
    # Not every one: a job may end on its own while the pruner's decision is on its way.
    ran = {t.number: (client.get_job(t.job_id).state, _epochs_run(client, t.job_id)) for t in pruned if t.job_id}
    assert any(state == JobState.CANCELLED and n < epochs for state, n in ran.values()), ran

    best: TrialRead = client.best_trial(study.id)
    assert best.state == TrialState.SUCCEEDED and best.value is not None and best.job_id is not None
    assert best.value == max(t.value for t in trials if t.value is not None)
    # The objective is what the trial's job printed last (aggregate: last), read from Kiln's metrics.
    assert _last_val_acc(client, best.job_id, epochs) == (epochs, best.value)
    assert best.value > default_acc, (
        f"best trial {best.number} ({best.params}) val_acc {best.value} does not beat the defaults' {default_acc}"
    )
