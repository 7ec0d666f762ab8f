"""The pruning rules alone, replayed offline (benchmarks/tuning.py --baseline offline): the example's study (TPE as
Kiln configures it, 2 trials at a time, ASHA rungs 5/15/45 of 50 epochs) with each rule deciding, on the same
training curves, with no platform in between. Run by an interpreter with Optuna, scikit-learn and NumPy (the Ray
virtualenv has them), Kiln's ``src`` on its path for kiln.domain.pruning (standard library only):

    PYTHON -c "import tuning_offline; tuning_offline.main()" CONFIG.json OUT.json   (cwd: benchmarks/)

CONFIG: {"seeds", "rules", "trials", "parallelism", "epochs", "copies", "min_resource", "reduction_factor",
"startup_s", "epoch_s", "cache"}. Rules: ``kiln`` (kiln.domain.pruning, ``bootstrap_count`` 2), ``kiln-bN`` (another
bootstrap count), ``ray`` (Ray Tune's ASHAScheduler: the percentile of the values recorded at the rung, none
recorded → go on; the same as kiln with a bootstrap count of 1), ``optuna`` (Optuna's SuccessiveHalvingPruner,
Kiln's pruner before issue 50: with fewer than reduction_factor trials at a rung, the best one alone goes on) and
``none``. Time is simulated: a trial starts ``startup_s`` after the one before it ended and every epoch takes
``epoch_s``, so the trials reach the rungs in the order the platforms' timing would give, and a verdict is instant.
A trial's curve is train.py's own ``train`` (examples/tuning), computed once per parameter set and kept in
``cache`` (trials the rules share are trained once). OUT: per rule and seed, the best final value, the trial-epochs
and the trials. A helper: no ``__main__`` block (tests/e2e/test_benchmarks_smoke.py runs every script here)."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


class Curves:
    """Every trial's val_acc by epoch, trained as far as a rule asked and kept (by parameters) in a JSON file."""

    def __init__(self, path: Path, epochs: int, copies: int) -> None:
        sys.path.insert(0, str(REPO / "examples" / "tuning"))
        self.path, self.epochs, self.copies = path, epochs, copies
        self.known: dict[str, list[float]] = json.loads(path.read_text()) if path.exists() else {}
        self.live: dict[str, Any] = {}  # key -> the generator still training it

    def value(self, params: dict[str, Any], epoch: int) -> float:
        key = json.dumps([params["lr"], params["width"], params["alpha"], self.copies])
        curve = self.known.setdefault(key, [])
        while len(curve) < epoch:
            if key not in self.live:
                from train import train  # examples/tuning/train.py

                self.live[key] = train(params["lr"], params["width"], params["alpha"], self.epochs, self.copies)
                for _ in curve:  # a curve cut short by an earlier run: train it again to where it was
                    next(self.live[key])
            curve.append(round(next(self.live[key])[1], 4))
        return curve[epoch - 1]

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.known))


def stops(rule: str, history: dict[int, float], others: list[dict[int, float]], rung: int, factor: int) -> bool:
    from kiln.domain.pruning import judge_rung

    if rule == "none":
        return False
    if rule == "optuna":  # SuccessiveHalvingPruner: the competing values include its own
        competing = sorted([o[rung] for o in others if rung in o] + [history[rung]])
        index = max(len(competing) // factor - 1, 0)
        return history[rung] < competing[-(index + 1)]
    bootstrap = 1 if rule == "ray" else int(rule.removeprefix("kiln-b")) if rule.startswith("kiln-b") else 2
    return judge_rung(
        history, others, rung, reduction_factor=factor, bootstrap_count=bootstrap, direction="maximize"
    ).prune


def study(rule: str, seed: int, config: dict[str, Any], curves: Curves) -> dict[str, Any]:
    import optuna

    epochs, factor = config["epochs"], config["reduction_factor"]
    rungs = [config["min_resource"] * factor**k for k in range(8)]
    rungs = [r for r in rungs if r < epochs]
    startup = max(2, min(5, config["trials"] // 4))  # kiln.usecases.tuning.tuning_engine.sampler
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, constant_liar=True)
    ostudy = optuna.create_study(direction="maximize", sampler=sampler)
    space = {
        "lr": optuna.distributions.FloatDistribution(0.0001, 0.3, log=True),
        "width": optuna.distributions.IntDistribution(8, 256, log=True),
        "alpha": optuna.distributions.FloatDistribution(0.000001, 0.1, log=True),
    }
    histories: dict[int, dict[int, float]] = {}
    running: list[dict[str, Any]] = []
    ended: list[dict[str, Any]] = []

    def start(now: float) -> None:
        trial = ostudy.ask(space)
        histories[trial.number] = {}
        running.append({"trial": trial, "epoch": 0, "next": now + config["startup_s"] + config["epoch_s"]})

    while len(histories) < min(config["parallelism"], config["trials"]):
        start(0.0)
    while running:
        current = min(running, key=lambda r: r["next"])
        now, trial = current["next"], current["trial"]
        current["epoch"] += 1
        epoch = current["epoch"]
        value = curves.value(trial.params, epoch)
        histories[trial.number][epoch] = value
        trial.report(value, epoch)
        others = [h for n, h in histories.items() if n != trial.number]
        stopped = epoch in rungs and stops(rule, histories[trial.number], others, epoch, factor)
        if stopped or epoch == epochs:
            running.remove(current)
            if stopped:
                ostudy.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:
                ostudy.tell(trial, value)
            ended.append({"number": trial.number, "epochs": epoch, "final": None if stopped else value, "at": now})
            if len(histories) < config["trials"]:
                start(now)
        else:
            current["next"] = now + config["epoch_s"]
    finals = [t["final"] for t in ended if t["final"] is not None]
    return {"best": max(finals), "epochs": sum(t["epochs"] for t in ended), "trials": ended}


def main() -> None:
    import optuna

    sys.path.insert(0, str(REPO / "src"))
    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    config = json.loads(Path(sys.argv[1]).read_text())
    curves = Curves(Path(config["cache"]), config["epochs"], config["copies"])
    out: dict[str, dict[str, Any]] = {}
    try:
        for seed in config["seeds"]:
            for rule in config["rules"]:
                result = study(rule, seed, config, curves)
                out.setdefault(rule, {})[str(seed)] = result
                print(f"  {rule:8s} seed {seed}: best {result['best']:.4f}, {result['epochs']} epochs", flush=True)
                curves.save()
    finally:
        curves.save()
    Path(sys.argv[2]).write_text(json.dumps(out))
