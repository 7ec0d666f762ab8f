"""Ray Tune's side of benchmarks/tuning.py: the example's study (examples/tuning) as a Ray Tune user writes it, run
by the Ray virtualenv's interpreter, never by Kiln's (Ray is no dependency of Kiln):

    RAY_VENV/bin/python -c "import tuning_ray; tuning_ray.main()" CONFIG.json OUT.json   (cwd: benchmarks/)

CONFIG: {"seed", "trials", "parallelism", "epochs", "copies", "grace_period", "reduction_factor", "space", "metric",
"cgroup"}. The trainable runs examples/tuning/train.py's own ``train`` (the same code, data and seed as Kiln's
trials) and reports ``val_acc`` after every epoch; OptunaSearch with its default sampler (TPE, seeded),
``ASHAScheduler`` (grace_period, reduction_factor, max_t = epochs), ``parallelism`` trials at once of 1 CPU each on
``ray.init`` with as many CPUs; with ``cgroup``, each trial's worker in CPU groups under ``kiln/`` with a 1-CPU
quota, as Kiln's trial jobs are (``_join_cgroup``). OUT: the time ``Tuner.fit`` was called (``ray.init`` before it,
not timed) and, per trial, its parameters and every report as (epoch, wall time, val_acc). A helper: no
``__main__`` block (tests/e2e/test_benchmarks_smoke.py runs every script in benchmarks/ with Kiln's interpreter)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tuning"


def trainable(config: dict[str, Any]) -> None:
    from ray import tune

    sys.path.insert(0, str(EXAMPLE))
    from train import train  # examples/tuning/train.py

    epochs, copies, cgroup = config.pop("_epochs"), config.pop("_copies"), config.pop("_cgroup")
    group = _join_cgroup(cgroup) if cgroup else None
    try:
        for epoch, accuracy in train(config["lr"], config["width"], config["alpha"], epochs, copies):
            tune.report({"val_acc": round(accuracy, 4), "epoch": epoch, "wall": time.time()})
    finally:
        if group is not None:
            _leave_cgroup(group)


def _join_cgroup(prefix: str) -> Any:
    """This worker process into CPU groups of its own under ``kiln/``, with a quota of 1 CPU: as a Kiln trial job's
    (kiln.injob.cgroups, which the shim uses). On a machine shared with other work the ``kiln/`` group as a whole
    weighs as one process against everything outside it: a trial job there got about half the CPU a Ray worker
    outside it got (epochs 0.23 s against 0.10 s, the same code)."""
    sys.path.insert(0, str(EXAMPLE.parent.parent / "src"))
    from kiln.injob.cgroups import JobCgroup

    group = JobCgroup.create(f"{prefix}{os.getpid()}-{time.time_ns()}", cpus=1.0, pids=None)
    for path in group.paths():
        with open(os.path.join(path, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
    return group


def _remove_cgroups(prefix: str) -> None:
    """The groups of this run's workers that are left: a trial that ASHA stopped had its worker killed before it
    could leave its own."""
    sys.path.insert(0, str(EXAMPLE.parent.parent / "src"))
    from kiln.injob.cgroups import ROOT_NAME, hierarchies, remove

    names = set()
    for point, _ in hierarchies().values():
        root = os.path.join(point, ROOT_NAME)
        names |= {n for n in (os.listdir(root) if os.path.isdir(root) else []) if n.startswith(prefix)}
    for name in names:
        remove(name)


def _leave_cgroup(group: Any) -> None:
    for path in group.paths():  # back to the hierarchy's root (kiln/<name> → /), then the groups can go
        with open(os.path.join(os.path.dirname(os.path.dirname(path)), "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
    group.remove()


def main() -> None:
    import optuna
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    config_path, out_path = sys.argv[1], sys.argv[2]
    config = json.loads(Path(config_path).read_text())
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space: dict[str, Any] = {}
    for name, p in config["space"].items():
        if p["type"] == "float":
            space[name] = tune.loguniform(p["low"], p["high"]) if p.get("log") else tune.uniform(p["low"], p["high"])
        elif p["type"] == "int":  # high included, as Optuna's (and Kiln's) int range
            space[name] = (
                tune.lograndint(p["low"], p["high"] + 1) if p.get("log") else tune.randint(p["low"], p["high"] + 1)
            )
        else:
            space[name] = tune.choice(p["choices"])
    cgroup = f"bench-ray-{os.getpid()}-" if config.get("cgroup") else ""  # the prefix of this run's groups
    space |= {"_epochs": config["epochs"], "_copies": config["copies"], "_cgroup": cgroup}
    metric = config["metric"]
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    ray.init(num_cpus=config["parallelism"], include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(
            metric=metric,
            mode="max",
            search_alg=OptunaSearch(seed=config["seed"]),
            scheduler=ASHAScheduler(
                time_attr="training_iteration",
                grace_period=config["grace_period"],
                reduction_factor=config["reduction_factor"],
                max_t=config["epochs"],
            ),
            num_samples=config["trials"],
            max_concurrent_trials=config["parallelism"],
        ),
        run_config=tune.RunConfig(storage_path=str(Path(out_path).parent / "ray-results"), verbose=0, log_to_file=True),
    )
    started = time.time()
    try:
        grid = tuner.fit()
    finally:
        if cgroup:
            _remove_cgroups(cgroup)
    ended = time.time()
    trials = []
    for result in grid:
        frame = result.metrics_dataframe
        rows = [] if frame is None else frame[["epoch", "wall", metric]].dropna().values.tolist()
        params = {k: v for k, v in (result.config or {}).items() if not k.startswith("_")}
        trials.append({"params": params, "reports": [[int(e), float(t), float(v)] for e, t, v in rows]})
    Path(out_path).write_text(json.dumps({"started": started, "ended": ended, "trials": trials}))
    ray.shutdown()
