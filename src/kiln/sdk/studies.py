"""Hyperparameter tuning studies: a mixin of ``kiln.Client``. A study runs its ``trial`` job spec again and again
with parameters an Optuna sampler picks on the server; every trial is a job like any other.

    study = client.tune(spec, code_dir=Path("."))       # spec: a StudySpec or the mapping of a study.yaml
    for trial in client.follow_study(study.id):          # each trial as it ends, until the study ends
        print(trial.number, trial.state, trial.value, trial.params)
    best = client.best_trial(study.id)                   # the winning parameters and the trial's job id
    client.export_trials_csv(study.id, "trials.csv")

``client.studies`` holds the same calls under shorter names (``client.studies.list()``, ``.get(id)``, ...).
"""

from __future__ import annotations

import builtins
import csv
import io
import time
from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from kiln.domain.idempotency import new_key
from kiln.domain.spec import JobSpec, format_param
from kiln.domain.studies import (
    StudyEventList,
    StudyEventRead,
    StudyList,
    StudyRead,
    StudySpec,
    StudyState,
    StudySubmit,
    TrialList,
    TrialRead,
    TrialState,
)
from kiln.sdk.packaging import DEFAULT_MAX_CODE_BYTES, build_bundle
from kiln.sdk.transport import ClientTransport

if TYPE_CHECKING:
    from kiln.domain.job_requests import JobDryRun

Progress = Callable[[int], None]
TRIAL_ORDERS = ("objective", "number")
# How long ``follow_study`` keeps looking for the last trials' ends once the study itself has ended.
SETTLE_SECONDS = 30.0
CSV_LEADING = ("number", "state", "value")
CSV_TRAILING = ("pruned_step", "job_id", "duration_seconds")


def study_body(spec: StudySpec | dict[str, Any], code_sha256: str | None) -> dict[str, Any]:
    spec = spec if isinstance(spec, StudySpec) else StudySpec.model_validate(spec)
    return StudySubmit(spec=spec, code_sha256=code_sha256).model_dump(mode="json", exclude_none=True)


def parameter_names(trials: Iterable[TrialRead], spec: StudySpec | None = None) -> list[str]:
    """The parameters' names: the study's search space in its order, then any other name the trials have
    (a trial spec's fixed ``params``), sorted."""
    names = list(spec.parameters) if spec is not None else []
    extra = sorted({name for trial in trials for name in trial.params} - set(names))
    return names + extra


def write_trials_csv(fh: IO[str], trials: Iterable[TrialRead], names: list[str]) -> int:
    """The trials as CSV (``number,state,value,param.<name>...,pruned_step,job_id,duration_seconds``), one row
    each in the order given; returns how many rows. Parameters as on a trial's command line (booleans
    ``true``/``false``); what a trial lacks is empty."""
    writer = csv.writer(fh, lineterminator="\n")
    writer.writerow([*CSV_LEADING, *(f"param.{name}" for name in names), *CSV_TRAILING])
    rows = 0
    for trial in trials:
        params = [format_param(trial.params[name]) if name in trial.params else "" for name in names]
        writer.writerow(
            [
                trial.number,
                trial.state.value,
                _number(trial.value),
                *params,
                _number(trial.pruned_step),
                trial.job_id or "",
                _number(trial.duration_seconds),
            ]
        )
        rows += 1
    return rows


def _number(value: float | None) -> str:
    return "" if value is None else repr(value)


class StudiesMixin(ClientTransport):
    """The study methods of ``kiln.Client``."""

    if TYPE_CHECKING:

        def upload_blob(self, path: Path, sha256: str, progress: Progress | None = None) -> None: ...

        def dry_run(self, spec: JobSpec | dict[str, Any], code_sha256: str | None = None) -> JobDryRun: ...

    @property
    def studies(self) -> Studies:
        """The same calls under shorter names: ``client.studies.list()``, ``.get(id)``, ``.trials(id)``, ..."""
        return Studies(self)

    def submit_study(
        self, spec: StudySpec | dict[str, Any], code_sha256: str | None = None, *, idempotency_key: str | None = None
    ) -> StudyRead:
        """Start a study whose trials run the code bundle ``code_sha256`` (uploaded already, see ``tune``). Sent
        with ``idempotency_key`` (by default a new one per call) and retried with it: a retry never starts a second
        study."""
        key = new_key() if idempotency_key is None else idempotency_key
        body = study_body(spec, code_sha256)
        return StudyRead.model_validate(self.request("POST", "/studies", json_body=body, idempotency_key=key).json())

    def tune(
        self,
        spec: StudySpec | dict[str, Any],
        code_dir: Path | None = None,
        *,
        max_bytes: int = DEFAULT_MAX_CODE_BYTES,
        progress: Progress | None = None,
        idempotency_key: str | None = None,
    ) -> StudyRead:
        """Start a study with the code of ``code_dir`` (if given), as ``run`` submits a job: the code is packed
        here, the server checks the trial's job spec first (a dry run: runtime, resources, quota, permissions),
        and the bundle is uploaded only once that is accepted and only if the server lacks it.
        ``idempotency_key``: as for ``submit_study``."""
        spec = spec if isinstance(spec, StudySpec) else StudySpec.model_validate(spec)
        if code_dir is None:
            return self.submit_study(spec, idempotency_key=idempotency_key)
        bundle = build_bundle(code_dir, max_bytes)
        try:
            checked = self.dry_run(spec.trial, bundle.sha256)
            if not checked.code_stored:
                self.upload_blob(bundle.path, bundle.sha256, progress)
        finally:
            bundle.path.unlink(missing_ok=True)
        return self.submit_study(spec, bundle.sha256, idempotency_key=idempotency_key)

    def list_studies(
        self, state: StudyState | str | None = None, limit: int = 50, before: str | None = None
    ) -> list[StudyRead]:
        """Studies of your organisation, newest first; ``before``: only those older than that study id."""
        params = {"state": StudyState(state).value if state else None, "limit": limit, "before": before}
        return StudyList.model_validate(self.request("GET", "/studies", params=params).json()).items

    def get_study(self, study_id: str) -> StudyRead:
        return StudyRead.model_validate(self.request("GET", f"/studies/{study_id}").json())

    def study_trials(self, study_id: str, order: str = "objective") -> list[TrialRead]:
        """The study's trials: ``objective`` (succeeded best first, then pruned by their last value, then running,
        failed, cancelled) or ``number``."""
        if order not in TRIAL_ORDERS:
            raise ValueError(f"order: {order!r} is not one of {', '.join(TRIAL_ORDERS)}")
        data = self.request("GET", f"/studies/{study_id}/trials", params={"order": order}).json()
        return TrialList.model_validate(data).items

    def best_trial(self, study_id: str) -> TrialRead:
        """The best succeeded trial (its parameters, value and job id); NotFound while no trial has succeeded."""
        return TrialRead.model_validate(self.request("GET", f"/studies/{study_id}/best").json())

    def stop_study(self, study_id: str) -> StudyRead:
        """Stop a study: no new trial starts and every running trial's job is cancelled. Idempotent; Conflict if
        the study ended otherwise."""
        return StudyRead.model_validate(self.request("POST", f"/studies/{study_id}/stop").json())

    def study_events(self, study_id: str) -> list[StudyEventRead]:
        """The study's state changes and its trials' starts and ends, oldest first."""
        return StudyEventList.model_validate(self.request("GET", f"/studies/{study_id}/events").json()).items

    def wait_study(self, study_id: str, timeout: float | None = None, poll: float = 1.0) -> StudyRead:
        """Block until the study ends (or ``timeout`` seconds pass: TimeoutError)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            study = self.get_study(study_id)
            if study.state.terminal:
                return study
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"study {study_id} still {study.state} after {timeout}s")
            time.sleep(poll)

    def follow_study(
        self, study_id: str, poll: float = 1.0, settle: float = SETTLE_SECONDS
    ) -> Generator[TrialRead, None, StudyRead]:
        """Each trial as it ends (in the order their ends are seen, by number within one poll), until the study
        has ended and so have its trials (at most ``settle`` seconds after the study). The generator's return
        value is the study as it ended."""
        reported: set[int] = set()
        settle_until: float | None = None
        while True:
            study = self.get_study(study_id)  # before the trials: a study seen ended has every trial listed
            trials = self.study_trials(study_id, order="number")
            for trial in trials:
                if trial.state.terminal and trial.number not in reported:
                    reported.add(trial.number)
                    yield trial
            if study.state.terminal:
                settle_until = settle_until or time.monotonic() + settle
                if all(t.state is not TrialState.RUNNING for t in trials) or time.monotonic() > settle_until:
                    return study
            time.sleep(poll)

    def export_trials_csv(self, study_id: str, path_or_file: str | Path | IO[str]) -> int:
        """Write the study's trials, by number, as CSV to a path or an open text file; returns how many rows.
        Columns: ``number,state,value``, one ``param.<name>`` per parameter, ``pruned_step,job_id,
        duration_seconds``."""
        study = self.get_study(study_id)
        trials = self.study_trials(study_id, order="number")
        names = parameter_names(trials, study.spec)
        if isinstance(path_or_file, str | Path):
            buffer = io.StringIO()
            rows = write_trials_csv(buffer, trials, names)
            Path(path_or_file).write_text(buffer.getvalue(), encoding="utf-8")
            return rows
        return write_trials_csv(path_or_file, trials, names)


class Studies:
    """``client.studies``: the study calls of ``kiln.Client`` under shorter names."""

    def __init__(self, client: StudiesMixin) -> None:
        self._client = client

    def create(
        self,
        spec: StudySpec | dict[str, Any],
        code_dir: Path | None = None,
        *,
        max_bytes: int = DEFAULT_MAX_CODE_BYTES,
        progress: Progress | None = None,
        idempotency_key: str | None = None,
    ) -> StudyRead:
        """``client.tune``."""
        return self._client.tune(
            spec, code_dir, max_bytes=max_bytes, progress=progress, idempotency_key=idempotency_key
        )

    def list(
        self, state: StudyState | str | None = None, limit: int = 50, before: str | None = None
    ) -> builtins.list[StudyRead]:
        return self._client.list_studies(state, limit, before)

    def get(self, study_id: str) -> StudyRead:
        return self._client.get_study(study_id)

    def trials(self, study_id: str, order: str = "objective") -> builtins.list[TrialRead]:
        return self._client.study_trials(study_id, order)

    def best(self, study_id: str) -> TrialRead:
        return self._client.best_trial(study_id)

    def stop(self, study_id: str) -> StudyRead:
        return self._client.stop_study(study_id)

    def events(self, study_id: str) -> builtins.list[StudyEventRead]:
        return self._client.study_events(study_id)

    def wait(self, study_id: str, timeout: float | None = None, poll: float = 1.0) -> StudyRead:
        return self._client.wait_study(study_id, timeout, poll)

    def follow(
        self, study_id: str, poll: float = 1.0, settle: float = SETTLE_SECONDS
    ) -> Generator[TrialRead, None, StudyRead]:
        return self._client.follow_study(study_id, poll, settle)

    def export_csv(self, study_id: str, path_or_file: str | Path | IO[str]) -> int:
        return self._client.export_trials_csv(study_id, path_or_file)
