"""Optuna as the tuning engine: where its storage lives beside Kiln's database, and the spec's sampler, pruner
and search space as Optuna objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from kiln.domain.studies import StudySpec
from kiln.usecases.tuning.tuning_engine import (
    load_study,
    open_storage,
    pruner,
    report_points,
    sampler,
    search_space,
    storage_location,
)


def spec(**extra: Any) -> StudySpec:
    data: dict[str, Any] = {
        "trial": {"command": "x"},
        "parameters": {
            "lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
            "width": {"type": "int", "low": 16, "high": 64, "step": 16},
            "act": {"type": "categorical", "choices": ["relu", "tanh"]},
        },
        "objective": {"metric": "acc", "direction": "maximize"},
    }
    return StudySpec.model_validate({**data, **extra})


def test_storage_is_beside_kilns_never_in_its_tables(tmp_path: Path) -> None:
    # Optuna's storage brings its own alembic_version table: it must never share Kiln's namespace.
    url, _ = storage_location(f"sqlite:///{tmp_path}/kiln.db", tmp_path)
    assert url == f"sqlite:///{tmp_path}/kiln-optuna.db"
    assert storage_location("sqlite://", tmp_path)[0] == f"sqlite:///{tmp_path}/optuna.db"
    url, options = storage_location("postgresql+psycopg://u:p@db:5432/kiln", tmp_path)
    assert url == "postgresql+psycopg://u:p@db:5432/kiln"
    assert options["connect_args"] == {"options": "-c search_path=kiln_optuna"}
    with pytest.raises(ValueError, match="SQLite or PostgreSQL"):
        storage_location("mysql://db/kiln", tmp_path)


def test_the_sqlite_storage_file_is_private(tmp_path: Path) -> None:
    open_storage(f"sqlite:///{tmp_path}/kiln.db", tmp_path)
    assert (tmp_path / "kiln-optuna.db").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("algorithm", "kind"),
    [
        ("random", optuna.samplers.RandomSampler),
        ("tpe", optuna.samplers.TPESampler),
        ("cmaes", optuna.samplers.CmaEsSampler),
        ("qmc", optuna.samplers.QMCSampler),
    ],
)
def test_each_algorithm_is_its_optuna_sampler(algorithm: str, kind: type) -> None:
    assert isinstance(sampler(spec(algorithm=algorithm), 1), kind)


@pytest.mark.parametrize(
    ("early", "active", "fixed"),
    [("none", False, False), ("median", True, False), ("asha", True, False), ("hyperband", True, False)],
)
def test_each_early_stopping_is_judged_by_kiln(early: str, active: bool, fixed: bool) -> None:
    judge = pruner(spec(early_stopping=early))
    assert (judge.kind, judge.active, judge.schedule is not None) == (early, active, fixed)
    assert judge.settings.bootstrap_count == 2  # a verdict at a rung needs two other trials there
    asha = pruner(spec(early_stopping={"type": "asha", "min_resource": 5}))
    assert asha.schedule is not None and asha.schedule.rungs(0, 50) == [5, 15, 45]
    band = pruner(spec(early_stopping={"type": "hyperband", "min_resource": 5, "max_resource": 50}))
    assert band.schedule is not None and band.schedule.brackets == 3


def test_optunas_study_has_no_pruner_of_its_own(tmp_path: Path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path}/kiln.db", tmp_path)
    study = load_study(storage, "s", spec(early_stopping="asha"), made=0)
    assert isinstance(study.pruner, optuna.pruners.NopPruner)


def _finished(study: optuna.Study, curve: dict[int, float], state: str = "complete") -> None:
    trial = study.ask()
    for step, value in curve.items():
        trial.report(value, step)
    if state == "complete":
        study.tell(trial, curve[max(curve)])
    else:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)


def test_a_batch_spanning_a_rung_is_judged_at_the_rung(tmp_path: Path) -> None:
    """Points that arrive in one batch used to be judged at the batch's last step (``pruned_step`` 6 or 16 for rungs
    5 and 15): each is judged as it is reported, by its value at the rung."""
    storage = open_storage(f"sqlite:///{tmp_path}/kiln.db", tmp_path)
    asha = {"type": "asha", "min_resource": 5, "reduction_factor": 3}
    study = load_study(storage, "s", spec(early_stopping=asha), made=0)
    _finished(study, {s: 0.80 for s in range(1, 21)})
    _finished(study, {s: 0.90 for s in range(1, 21)})
    judge = pruner(spec(early_stopping=asha))
    # Poor at step 5 (below 0.8 + 2/3 x 0.1), excellent from step 6 on: the batch 1..16 stops it at rung 5.
    slow_start = study.ask()
    batch = [(s, 0.5 if s <= 5 else 0.95) for s in range(1, 17)]
    stopped = report_points(study, slow_start._trial_id, batch, judge, None)
    assert stopped is not None
    index, verdict = stopped
    assert (batch[index][0], verdict.rung, verdict.step, verdict.value, verdict.compared) == (5, 5, 5, 0.5, 2)
    assert verdict.cutoff == pytest.approx(0.8 + 0.1 * 2 / 3)
    # Nothing past the point that stopped it was reported: it has no step past rung 5.
    assert max(study.get_trials()[-1].intermediate_values) == 5
    # Good at step 5, poor at 6..16 (the batch's last step): it passes rung 5 and is stopped at rung 15.
    fader = study.ask()
    batch = [(s, 0.95 if s <= 5 else 0.5) for s in range(1, 17)]
    stopped = report_points(study, fader._trial_id, batch, judge, None)
    assert stopped is not None and batch[stopped[0]][0] == 15 and stopped[1].rung == 15
    # The same trial in batches of one point is judged at the same steps.
    steady = study.ask()
    judged = None
    for step, value in [(s, 0.95 if s <= 5 else 0.5) for s in range(1, 17)]:
        if (stopped := report_points(study, steady._trial_id, [(step, value)], judge, judged)) is not None:
            break
        judged = step
    assert stopped is not None and stopped[1].rung == 15 and stopped[1].value == 0.5


def test_search_space_and_a_seeded_ask_in_it(tmp_path: Path) -> None:
    space = search_space(spec())
    assert space["width"] == optuna.distributions.IntDistribution(16, 64, step=16)
    assert space["lr"] == optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)
    storage = open_storage(f"sqlite:///{tmp_path}/kiln.db", tmp_path)
    first = load_study(storage, "s1", spec(algorithm="random", seed=7), made=0).ask(space).params
    again = load_study(storage, "s2", spec(algorithm="random", seed=7), made=0).ask(space).params
    later = load_study(storage, "s3", spec(algorithm="random", seed=7), made=1).ask(space).params
    assert first == again  # the seed makes a study repeatable
    assert later != first  # and a restarted driver (made > 0) does not draw the first trials again
    assert 16 <= first["width"] <= 64 and first["act"] in ("relu", "tanh")


def test_grid_space_is_categorical_over_the_grid() -> None:
    grid = spec(algorithm="grid", parameters={"lr": {"type": "float", "low": 0.1, "high": 0.3, "step": 0.1}})
    assert search_space(grid)["lr"] == optuna.distributions.CategoricalDistribution([0.1, 0.2, 0.3])
    assert isinstance(sampler(grid, None), optuna.samplers.GridSampler)


def test_hyperband_judges_a_trial_against_its_own_bracket_only() -> None:
    band = {"type": "hyperband", "min_resource": 1, "max_resource": 27, "bootstrap_count": 1}
    judge = pruner(spec(early_stopping=band))
    assert judge.schedule is not None and [judge.schedule.bracket_of(n) for n in range(4)] == [0, 1, 0, 2]
    study = optuna.create_study(direction="maximize")
    _finished(study, {s: 0.9 for s in range(1, 28)})  # trial 0, bracket 0: rungs 1, 3, 9
    _finished(study, {s: 0.95 for s in range(1, 28)})  # trial 1, bracket 1: rungs 3, 9
    low = study.ask()  # trial 2, bracket 0: compared with trial 0 alone at its first rung
    stopped = report_points(study, low._trial_id, [(1, 0.5)], judge, None)
    assert stopped is not None
    verdict = stopped[1]
    assert (verdict.rule, verdict.rung, verdict.compared, verdict.bracket) == ("hyperband", 1, 1, 0)
    assert verdict.cutoff == 0.9
    late = study.ask()  # trial 3, bracket 2: its first rung is 9, and no other trial of its bracket is there
    assert report_points(study, late._trial_id, [(s, 0.1) for s in range(1, 12)], judge, None) is None


def test_ashas_auto_first_rung_waits_for_a_finished_trial() -> None:
    judge = pruner(spec(early_stopping={"type": "asha", "bootstrap_count": 0}))
    study = optuna.create_study(direction="maximize")
    running = study.ask()
    assert report_points(study, running._trial_id, [(s, 0.1) for s in range(1, 10)], judge, None) is None
    assert judge.schedule is None  # no trial has finished: no rung yet, no verdict
    _finished(study, {s: 0.9 for s in range(1, 301)})  # 300 steps: the first rung at 3 (a hundredth)
    stopped = report_points(study, study.ask()._trial_id, [(s, 0.1) for s in range(1, 5)], judge, None)
    assert judge.schedule is not None and judge.schedule.min_resource == 3
    assert stopped is not None and stopped[1].rung == 3
