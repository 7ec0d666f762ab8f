"""Optuna as the tuning engine: where its storage lives beside Kiln's database, and the spec's sampler, pruner
and search space as Optuna objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from kiln.domain.studies import StudySpec
from kiln.usecases.tuning_engine import load_study, open_storage, pruner, sampler, search_space, storage_location


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
    ("early", "kind"),
    [
        ("none", optuna.pruners.NopPruner),
        ("median", optuna.pruners.MedianPruner),
        ("asha", optuna.pruners.SuccessiveHalvingPruner),
        ("hyperband", optuna.pruners.HyperbandPruner),
    ],
)
def test_each_early_stopping_is_its_optuna_pruner(early: str, kind: type) -> None:
    assert isinstance(pruner(spec(early_stopping=early)), kind)


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
