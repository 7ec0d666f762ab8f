"""Optuna as Kiln's tuning engine: where its storage lives, and a study spec's sampler, pruner and search space.

Optuna's RDB storage keeps its own tables and its own Alembic version table, named ``alembic_version`` like
Kiln's, so it cannot share Kiln's table namespace. On PostgreSQL it lives in the schema ``kiln_optuna`` of
Kiln's database (created by Kiln's migration 20261202_0008; Optuna's connections put it first on their
``search_path``). A SQLite file has no schemas: Optuna gets the file beside Kiln's (``kiln.db`` →
``kiln-optuna.db``), private to the server like Kiln's own.

Optuna is imported here only (it takes a while): the driver imports this module when a study first runs.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState
from sqlalchemy import event
from sqlalchemy.engine import make_url

from kiln.domain import pruning
from kiln.domain.studies import ParameterSpec, StudySpec

OPTUNA_SCHEMA = "kiln_optuna"

optuna.logging.set_verbosity(optuna.logging.WARNING)
# A step reported twice (a driver that restarted reports from its last saved position) is ignored: not news.
warnings.filterwarnings("ignore", message=r".*is already reported", module="optuna")
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
logging.getLogger("alembic").setLevel(logging.WARNING)


def storage_location(kiln_url: str, home: Path) -> tuple[str, dict[str, Any]]:
    """Optuna's storage URL and engine options for Kiln's database at ``kiln_url``."""
    url = make_url(kiln_url)
    if url.get_backend_name() == "postgresql":
        options = {"connect_args": {"options": f"-c search_path={OPTUNA_SCHEMA}"}, "pool_pre_ping": True}
        return url.render_as_string(hide_password=False), options
    if url.get_backend_name() == "sqlite":
        database = url.database or ""
        if database and database != ":memory:" and not database.startswith("file:"):
            path = Path(database)
            target = path.with_name(f"{path.stem}-optuna{path.suffix or '.db'}")
        else:
            target = home / "optuna.db"
        return f"sqlite:///{target}", {"connect_args": {"timeout": 30}}
    raise ValueError(f"tuning studies need SQLite or PostgreSQL, not {url.get_backend_name()}")


def open_storage(kiln_url: str, home: Path) -> optuna.storages.RDBStorage:
    url, options = storage_location(kiln_url, home)
    storage = optuna.storages.RDBStorage(url, engine_kwargs=options)
    if url.startswith("sqlite:///"):
        os.chmod(url.removeprefix("sqlite:///"), 0o600)  # the server's, like Kiln's own database file
        # Kiln's own SQLite settings (kiln.db.session): a write-ahead log, synced at checkpoints. In the default
        # rollback journal every report the pruner judges was a synced commit (~15 ms each on a busy machine,
        # against ~5), and the verdict of a report waited for them.
        event.listen(storage.engine, "connect", _sqlite_pragmas)
        storage.engine.dispose()  # the connections Optuna opened to set itself up, without them
    return storage


def _sqlite_pragmas(dbapi_conn: Any, _record: object) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def distribution(param: ParameterSpec, grid: bool) -> BaseDistribution:
    """The Optuna distribution of one parameter; every parameter of a grid is the list of its grid values."""
    if grid or param.type == "categorical":
        return CategoricalDistribution(param.grid("") if grid else list(param.choices or []))
    assert param.low is not None and param.high is not None
    if param.type == "int":
        step = int(param.step or 1)
        return IntDistribution(int(param.low), int(param.high), log=param.log, step=step)
    return FloatDistribution(param.low, param.high, log=param.log, step=param.step)


def search_space(spec: StudySpec) -> dict[str, BaseDistribution]:
    grid = spec.algorithm == "grid"
    return {name: distribution(p, grid) for name, p in spec.parameters.items()}


def sampler(spec: StudySpec, seed: int | None) -> optuna.samplers.BaseSampler:
    """The spec's algorithm as an Optuna sampler. ``seed`` is the spec's seed moved on by the trials made so far
    (a server that restarts must not draw the first trials' parameters again)."""
    algorithm = spec.algorithm
    if algorithm == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if algorithm == "grid":
        return optuna.samplers.GridSampler(spec.grid(), seed=seed)  # type: ignore[arg-type]
    if algorithm == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if algorithm == "qmc":
        return optuna.samplers.QMCSampler(seed=seed, warn_independent_sampling=False)
    # TPE: a quarter of the trials (2 to 5) sampled at random first — Optuna's default of 10 spends half of a
    # 20-trial study before the model guides anything; a "constant liar" keeps parallel trials from all being sent
    # to the same promising point.
    startup = max(2, min(5, spec.planned_trials // 4))
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, constant_liar=True)


class Pruner:
    """The spec's early stopping. Kiln judges (kiln.domain.pruning, which says why Optuna's own pruners are not
    used) over the objective histories Optuna keeps (every trial's ``intermediate_values``); Optuna's study gets
    a ``NopPruner``. Settings that are ``auto`` are fixed from the first finished trial, as Optuna's are."""

    def __init__(self, spec: StudySpec) -> None:
        es = spec.early_stopping
        self.settings = es
        self.kind = es.type
        self.direction: pruning.Direction = spec.objective.direction
        self.schedule: pruning.RungSchedule | None = None
        if self.kind == "asha" and es.min_resource is not None:
            self.schedule = pruning.RungSchedule(es.min_resource, es.reduction_factor, es.max_resource)
        elif self.kind == "hyperband" and es.max_resource is not None:
            self.schedule = self._hyperband(es.max_resource)

    @property
    def active(self) -> bool:
        return self.kind != "none"

    def _hyperband(self, max_resource: int) -> pruning.RungSchedule:
        es = self.settings
        low = es.min_resource or 1
        brackets = pruning.hyperband_brackets(low, max_resource, es.reduction_factor)
        return pruning.RungSchedule(low, es.reduction_factor, max_resource, brackets)

    def needs_trials(self, before: int | None, step: int) -> bool:
        """Whether judging a report at ``step`` (a trial whose last judged step is ``before``) reads the study's
        trials: not for a report that crosses no rung of a fixed ASHA schedule (most reports)."""
        if self.kind in ("median", "hyperband") or self.schedule is None:
            return self.active
        return any(before is None or rung > before for rung in self.schedule.rungs(0, step))

    def resolve(self, trials: Sequence[optuna.trial.FrozenTrial]) -> pruning.RungSchedule | None:
        """The rung schedule, fixing an ``auto`` setting from the finished trials' last steps once one has finished
        (None until then: no verdict)."""
        if self.schedule is not None or self.kind not in ("asha", "hyperband"):
            return self.schedule
        steps = [t.last_step for t in trials if t.state == TrialState.COMPLETE and t.last_step is not None]
        if not steps:
            return None
        es = self.settings
        if self.kind == "asha":  # Optuna's estimate: a hundredth of the longest finished trial
            self.schedule = pruning.RungSchedule(max(max(steps) // 100, 1), es.reduction_factor, es.max_resource)
        else:
            self.schedule = self._hyperband(max(steps) + 1)
        return self.schedule

    def judge(
        self,
        trials: Sequence[optuna.trial.FrozenTrial],
        trial_id: int,
        history: Mapping[int, float],
        before: int | None,
        step: int,
    ) -> list[pruning.Verdict]:
        """The verdicts on trial ``trial_id`` (``history``: its values so far, this report's included) at the
        report of ``step``: one per rung it crossed since ``before``, in order, up to the first that stops it; for
        the median rule, at most one, at ``step``."""
        others = [t for t in trials if t._trial_id != trial_id]
        es = self.settings
        if self.kind == "median":
            done = [_history(t) for t in others if t.state == TrialState.COMPLETE]
            verdict = pruning.judge_median(
                history,
                done,
                step,
                direction=self.direction,
                startup_trials=es.startup_trials,
                warmup_steps=es.warmup_steps,
            )
            return [] if verdict is None else [verdict]
        schedule = self.resolve(trials)
        if schedule is None:
            return []
        own = next((t for t in trials if t._trial_id == trial_id), None)
        bracket = schedule.bracket_of(own.number) if own is not None else 0
        peers = [_history(t) for t in others if schedule.bracket_of(t.number) == bracket]
        verdicts = []
        for rung in schedule.rungs(bracket, step):
            if before is not None and rung <= before:
                continue
            verdict = pruning.judge_rung(
                history,
                peers,
                rung,
                reduction_factor=schedule.reduction_factor,
                bootstrap_count=es.bootstrap_count,
                direction=self.direction,
                rule=self.kind,
                bracket=bracket if schedule.brackets > 1 else None,
            )
            verdicts.append(verdict)
            if verdict.prune:
                break
        return verdicts


def report_points(
    study: optuna.Study, trial_id: int, points: Sequence[tuple[int, float]], pruner: Pruner | None, judged: int | None
) -> tuple[int, pruning.Verdict] | None:
    """Report a trial's new points ``(step, value)`` (finite values, in order) to Optuna, each judged as it is
    reported when there is a ``pruner`` (``judged``: the last step it saw before): a batch spanning a rung is judged
    at the rung, by the value at that step, not at the batch's last step. Returns (the index of the point that
    stopped the trial, the verdict) and reports nothing after it, so that a trial stopped at a rung has no step
    past it; None when it goes on."""
    otrial = optuna.trial.Trial(study, trial_id)
    trials: list[optuna.trial.FrozenTrial] | None = None  # read once for the batch, where a verdict needs them
    history: dict[int, float] = {}
    for index, (step, value) in enumerate(points):
        otrial.report(value, step)
        history[step] = value
        if pruner is None or not pruner.active:
            continue
        if pruner.needs_trials(judged, step):
            if trials is None:
                trials = study.get_trials(deepcopy=False)
                own = next((t for t in trials if t._trial_id == trial_id), None)
                history = {**(_history(own) if own is not None else {}), **history}
            stop = next((v for v in pruner.judge(trials, trial_id, history, judged, step) if v.prune), None)
            if stop is not None:
                return index, stop
        judged = step if judged is None else max(judged, step)
    return None


def _history(trial: optuna.trial.FrozenTrial) -> dict[int, float]:
    return {step: v for step, v in trial.intermediate_values.items() if v is not None and math.isfinite(v)}


def pruner(spec: StudySpec) -> Pruner:
    return Pruner(spec)


def load_study(storage: optuna.storages.RDBStorage, name: str, spec: StudySpec, made: int) -> optuna.Study:
    """The Optuna study ``name`` (created on first use) with the spec's sampler (Kiln's Pruner judges the trials:
    Optuna's study has none)."""
    seed = None if spec.seed is None else (spec.seed + made) % 2**32
    return optuna.create_study(
        storage=storage,
        study_name=name,
        direction=spec.objective.direction,
        sampler=sampler(spec, seed),
        pruner=optuna.pruners.NopPruner(),  # Kiln judges: Pruner
        load_if_exists=True,
    )
