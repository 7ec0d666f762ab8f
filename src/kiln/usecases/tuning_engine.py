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
import os
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from sqlalchemy import event
from sqlalchemy.engine import make_url

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


def pruner(spec: StudySpec) -> optuna.pruners.BasePruner:
    es = spec.early_stopping
    if es.type == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=es.startup_trials, n_warmup_steps=es.warmup_steps)
    if es.type == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=es.min_resource or "auto", reduction_factor=es.reduction_factor
        )
    if es.type == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=es.min_resource or 1,
            max_resource=es.max_resource or "auto",
            reduction_factor=es.reduction_factor,
        )
    return optuna.pruners.NopPruner()


def load_study(storage: optuna.storages.RDBStorage, name: str, spec: StudySpec, made: int) -> optuna.Study:
    """The Optuna study ``name`` (created on first use) with the spec's sampler and pruner."""
    seed = None if spec.seed is None else (spec.seed + made) % 2**32
    return optuna.create_study(
        storage=storage,
        study_name=name,
        direction=spec.objective.direction,
        sampler=sampler(spec, seed),
        pruner=pruner(spec),
        load_if_exists=True,
    )
