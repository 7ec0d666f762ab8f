"""Hyperparameter tuning on the digits task (examples/tuning): Kiln's TPE + ASHA against Ray Tune's ASHA on the same
study, or (``--baseline random``) against random search without pruning; and what a study adds to the scheduling of
its trials' jobs.

    .venv/bin/python benchmarks/tuning.py [--ray-venv PATH] [--seeds 0 1 2 3 4] [--json PATH]
    .venv/bin/python benchmarks/tuning.py --baseline random [--seeds 0 1 2] [--epochs 30] [--copies 25]

One fresh ``kiln server`` (``tests.kilnserver.KilnServer``, ``KILN_CPUS=2``: two 1-CPU trials fill it), the code
of ``examples/tuning`` and the search space and ASHA settings of its ``study.yaml``; every trial runs
``train.py --epochs E --copies C`` with its sampled ``--lr``, ``--width`` and ``--alpha`` on the sklearn runtime.

``--baseline ray`` (the default): per seed, interleaved (Kiln first on even seeds, Ray first on odd ones), the
example's study on Kiln (``--trials`` trials, 2 at a time, TPE, ASHA rungs 5/15/45) and the same study on Ray Tune
(benchmarks/tuning_ray.py, run by the interpreter of ``--ray-venv``, a virtualenv of its own: Ray is never a
dependency of Kiln): the same search space, ``OptunaSearch`` with its default sampler (TPE) and the same seed,
``ASHAScheduler(grace_period=min_resource, reduction_factor, max_t=epochs)``, ``max_concurrent_trials=2`` of 1 CPU
each on ``ray.init(num_cpus=2)``, and a trainable that runs train.py's own ``train`` and reports ``val_acc`` every
epoch; Ray's workers at nice 0 like Kiln's jobs (Ray's default, 15, starves them on a shared machine). Per study:
the best final ``val_acc`` of a trial that ran every epoch, the time from the study's submit (Ray: ``Tuner.fit``;
``ray.init`` not counted) until a trial ended with a final value at or above a target, and every trial-epoch run
(a pruned Kiln trial's epochs count until its job stopped, not until the verdict). Targets: the median over seeds
of Kiln's best ≥ Ray's; the median time to Ray's median best ≤ 0.5x Ray's (a seed that never reaches it counts as
never); trial-epochs summed over seeds ≤ Ray's. Without the virtualenv (absent, or
``--smoke`` without ``--ray-venv``) it says so and runs Kiln's side alone. Make it with the versions of Kiln's
Optuna and of the sklearn runtime's scikit-learn and NumPy (the script prints both and says where they differ):

    python3 -m venv .cache/ray-venv && .cache/ray-venv/bin/pip install 'ray[tune]==2.60.0' optuna==5.1.0 \\
        scikit-learn==1.9.1 numpy==2.4.6

``--baseline random``: for each seed, a random-search study without pruning (``--trials`` trials, 2 at a time), whose
best final ``val_acc`` is the target; then a TPE + ASHA study with the same seed, search space and parallelism,
given the random study's budget of epochs (stopped once it has spent them, or has reached the target). Per study,
the trial-epochs consumed until it first reaches the target: every epoch any of its trials reported (the metric
points, ordered by their time) up to the moment a trial ended with a final ``val_acc`` at or above the target. A
pruned trial's epochs count until its job was stopped, not until the pruner's decision: the reaction time is
Kiln's. Target: TPE + ASHA needs at most a third of random search's epochs (the seeds summed). Also shown, as
information: the same count had every pruned trial stopped at the step the pruner judged it, and the reaction time.

In both: each trial job's QUEUED → RUNNING (its job events) against plain jobs of the same spec (the default
parameters) that this script submits before the first study and after each Kiln study (``--plain-jobs`` each time,
two in flight like the trials), so that both see the same server and the same machine over the run. Target: the
trials' p50 at most 1.2x the plain jobs' p50.

``--copies`` sets the training data per epoch (random's default 25: every image moved by up to two pixels; an epoch
~0.1-0.25 s here), so that an epoch outlasts the time between a report and its trial being stopped; ``--copies 5
--epochs 50`` is the example's own study (Ray's default), where an epoch is 20-50 ms. The machine is shared and
noisy: nothing is asserted, figures are ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from report import finish, parse_args, print_table, summary  # noqa: E402
from tests.kilnserver import KilnServer  # noqa: E402

from kiln.domain.studies import StudySpec, TrialRead, TrialState, substitute  # noqa: E402
from kiln.errors import Conflict  # noqa: E402
from kiln.sdk.client import Client  # noqa: E402

EXAMPLE = REPO / "examples" / "tuning"
RAY_VENV = Path(os.environ.get("KILN_RAY_VENV", REPO / ".cache" / "ray-venv"))
RAY_TIMEOUT = 3600.0
DEFAULTS = {"lr": 0.001, "width": 100, "alpha": 0.0001}
METRIC = "val_acc"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
STUDY_TIMEOUT = 3600.0


# -- what a study did -----------------------------------------------------------------------------------------------


@dataclass
class Trial:
    number: int
    state: str
    value: float | None
    pruned_step: int | None
    points: list[tuple[int, float, float]]  # (epoch, time, val_acc), by time
    queued_to_running: float | None
    ended_at: float | None  # the job's end event
    decided_at: float | None  # when Kiln marked it PRUNED

    def epochs_by(self, moment: float, ideal: bool = False) -> int:
        """Epochs this trial had reported by ``moment``; ``ideal``: none past the step it was pruned at."""
        limit = self.pruned_step if ideal and self.pruned_step is not None else None
        return sum(1 for step, t, _ in self.points if t <= moment and (limit is None or step <= limit))


@dataclass
class StudyRun:
    label: str
    study_id: str
    state: str
    wall_s: float
    trials: list[Trial] = field(default_factory=list)

    @property
    def epochs(self) -> int:
        return sum(len(t.points) for t in self.trials)

    def best(self) -> float | None:
        values = [t.value for t in self.trials if t.state == TrialState.SUCCEEDED and t.value is not None]
        return max(values) if values else None

    def reached_at(self, target: float) -> float | None:
        """When a trial first ended with a final value at or above ``target`` (the time of its last report)."""
        times = [
            t.points[-1][1]
            for t in self.trials
            if t.state == TrialState.SUCCEEDED and t.value is not None and t.value >= target and t.points
        ]
        return min(times) if times else None

    def epochs_to(self, target: float, ideal: bool = False) -> int | None:
        moment = self.reached_at(target)
        return None if moment is None else sum(t.epochs_by(moment, ideal) for t in self.trials)

    def past_verdict(self) -> int:
        """Epochs pruned trials reported after the step the pruner stopped them at (issue 26's target: ≤ 5% of all
        trial-epochs; each is training the pruner had already given up on)."""
        return sum(
            1
            for t in self.trials
            if t.state == TrialState.PRUNED and t.pruned_step is not None
            for step, _, _ in t.points
            if step > t.pruned_step
        )

    def reactions(self) -> list[tuple[float, float]]:
        """Per pruned trial whose job was stopped: (the report the pruner judged → the trial marked PRUNED, that →
        its job's end)."""
        out = []
        for t in self.trials:
            judged = [time_ for step, time_, _ in t.points if step == t.pruned_step]
            if t.state == TrialState.PRUNED and judged and t.decided_at is not None and t.ended_at is not None:
                out.append((t.decided_at - judged[0], t.ended_at - t.decided_at))
        return out


def job_times(client: Client, job_id: str) -> tuple[float | None, float | None]:
    """(QUEUED → RUNNING in seconds, the time the job ended) from its events."""
    first: dict[str, float] = {}
    for event in client.events(job_id):
        if event.to_state is not None:
            first.setdefault(str(event.to_state), event.time.timestamp())
    queued, running = first.get("QUEUED"), first.get("RUNNING")
    ended = min((first[s] for s in TERMINAL if s in first), default=None)
    return (running - queued if queued is not None and running is not None else None), ended


def series(client: Client, job_id: str) -> list[tuple[int, float, float]]:
    data = client.metrics(job_id, names=METRIC)
    if not data:
        return []
    return sorted(
        (int(step), float(t), float(v))
        for step, t, v in data[0].points
        if isinstance(step, int) and isinstance(t, int | float) and isinstance(v, int | float)
    )


def wait_jobs_ended(client: Client, job_ids: list[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    pending = set(job_ids)
    while pending and time.monotonic() < deadline:
        pending = {j for j in pending if str(client.get_job(j).state) not in TERMINAL}
        if pending:
            time.sleep(0.25)


def collect(client: Client, label: str, study_id: str, wall_s: float) -> StudyRun:
    """The study's trials once their jobs have ended and their last points are stored (metrics lag a job's end by a
    spool flush and an ingest pass: read until two reads agree)."""
    study = client.get_study(study_id)
    reads = client.study_trials(study_id, order="number")
    job_ids = [t.job_id for t in reads if t.job_id]
    wait_jobs_ended(client, job_ids)
    points: dict[str, list[tuple[int, float, float]]] = {}
    for _ in range(20):
        fresh = {j: series(client, j) for j in job_ids}
        if fresh == points:
            break
        points = fresh
        time.sleep(0.5)
    run = StudyRun(label, study_id, str(study.state), wall_s)
    for t in reads:
        delay, ended = job_times(client, t.job_id) if t.job_id else (None, None)
        decided = t.finished_at.timestamp() if t.finished_at is not None and t.state == TrialState.PRUNED else None
        run.trials.append(
            Trial(t.number, str(t.state), t.value, t.pruned_step, points.get(t.job_id or "", []), delay, ended, decided)
        )
    return run


# -- running studies ------------------------------------------------------------------------------------------------


def study_spec(base: StudySpec, label: str, seed: int, **changes: Any) -> StudySpec:
    data = base.model_dump(mode="json", exclude_none=True)
    data.update(name=f"bench-{label}-seed{seed}", seed=seed, **changes)
    return StudySpec.model_validate(data)


class EpochMeter:
    """The epochs a study's trials have run so far: the points of every trial whose job has ended (read once: a
    pruned trial runs on for a while after the pruner's decision), the last step the pruner saw of the others."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.ended: dict[str, int] = {}

    def used(self, trials: list[TrialRead]) -> int:
        total = 0
        for t in trials:
            job_id = t.job_id or ""
            ended = job_id in self.ended or (
                bool(job_id) and t.state != TrialState.RUNNING and str(self.client.get_job(job_id).state) in TERMINAL
            )
            if ended and job_id not in self.ended:
                self.ended[job_id] = len(series(self.client, job_id))
            total += self.ended.get(job_id, t.last_step or 0)
        return total


def run_study(
    client: Client,
    spec: StudySpec,
    code: str,
    label: str,
    budget: int | None = None,
    target: float | None = None,
) -> StudyRun:
    """Run one study to its end; with a ``budget`` of epochs (or a ``target`` reached) stop it then."""
    started = time.monotonic()
    study = client.submit_study(spec, code)
    meter = EpochMeter(client)
    stopped = False
    deadline = time.monotonic() + STUDY_TIMEOUT
    while not client.get_study(study.id).state.terminal:
        if time.monotonic() > deadline:
            raise SystemExit(f"study {study.id} ({label}) did not end in {STUDY_TIMEOUT:.0f} s")
        if not stopped and (budget is not None or target is not None):
            trials = client.study_trials(study.id, order="number")
            reached = target is not None and any(
                t.state == TrialState.SUCCEEDED and t.value is not None and t.value >= target for t in trials
            )
            if reached or (budget is not None and meter.used(trials) >= budget):
                try:
                    client.stop_study(study.id)
                except Conflict:
                    pass  # it ended meanwhile
                stopped = True
        time.sleep(0.5)
    run = collect(client, label, study.id, time.monotonic() - started)
    states = [t.state for t in run.trials]
    counts = ", ".join(f"{states.count(s)} {s.lower()}" for s in sorted(set(states)))
    best = run.best()
    delays = [t.queued_to_running for t in run.trials if t.queued_to_running is not None]
    print(
        f"  {label:9s} {run.study_id} {run.state}: {len(run.trials)} trials ({counts}), {run.epochs} epochs, "
        f"best {METRIC} {best if best is None else f'{best:.4f}'}, {run.wall_s:.0f} s; "
        f"trial jobs QUEUED → RUNNING p50 {summary(delays).get('p50', 0) * 1000:.0f} ms"
    )
    return run


def run_plain(client: Client, spec: Any, code: str, n: int, in_flight: int = 2) -> list[float]:
    """``n`` plain jobs of ``spec``, ``in_flight`` at a time (a new one as soon as one ends): QUEUED → RUNNING each."""
    running: list[str] = []
    done: list[str] = []
    submitted = 0
    deadline = time.monotonic() + 60 * n
    while (submitted < n or running) and time.monotonic() < deadline:
        while submitted < n and len(running) < in_flight:
            running.append(client.submit(spec, code).id)
            submitted += 1
        time.sleep(0.1)
        ended = [j for j in running if str(client.get_job(j).state) in TERMINAL]
        running = [j for j in running if j not in ended]
        done += ended
    delays = [d for j in done if (d := job_times(client, j)[0]) is not None]
    print(f"  plain jobs: {len(delays)}, QUEUED → RUNNING {', '.join(f'{d * 1000:.0f}' for d in delays)} ms")
    return delays


# -- report ---------------------------------------------------------------------------------------------------------


def row(metric: str, value: float, baseline: float | None, target: str, ok: bool | None, unit: str) -> dict:
    return {
        "metric": metric,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "ratio": (value / baseline) if baseline else None,
        "target": target,
        "pass": ok,
    }


def efficiency_rows(seeds: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per seed and summed: TPE + ASHA's epochs to random search's best against random search's own; a seed whose
    TPE + ASHA study never got there counts with every epoch it spent (a lower bound, and a FAIL)."""
    rows = []
    ran_sum = tuned_sum = ideal_sum = 0
    missed = 0
    reactions = []
    for seed, fig in seeds.items():
        ran, tuned = fig["random"]["epochs_to_target"], fig["tpe_asha"]["epochs_to_target"]
        label = f"seed {seed}: epochs to {METRIC} ≥ {fig['target']:.4f}"
        if tuned is None:
            missed += 1
            tuned = fig["tpe_asha"]["epochs"]
            label += " (not reached)"
        ran_sum += ran
        tuned_sum += tuned
        ideal_sum += fig["tpe_asha"]["epochs_to_target_ideal"] or fig["tpe_asha"]["epochs"]
        reactions += fig["tpe_asha"]["reactions_s"]
        rows.append(row(label, tuned, ran, "(info)", None, "epochs"))
    if seeds:
        label = "epochs to random's best, seeds summed" + (f" (≥: {missed} missed)" if missed else "")
        ok = not missed and tuned_sum <= ran_sum / 3
        rows.append(row(label, tuned_sum, ran_sum, "≤ 0.33x", ok, "epochs"))
        rows.append(row("  the same, pruned at the step judged", ideal_sum, ran_sum, "(info)", None, "epochs"))
    if seeds:
        past = sum(fig["tpe_asha"]["past_verdict"] for fig in seeds.values())
        spent = sum(fig["tpe_asha"]["epochs"] for fig in seeds.values())
        share = past / spent if spent else 0.0
        label = f"epochs run past the pruner's verdict ({past} of {spent})"
        past_row = row(label, 100 * share, None, "≤ 5%", share <= 0.05, "%")
        rows.append(past_row)
    if reactions:
        decide, stop = summary([d for d, _ in reactions]), summary([k for _, k in reactions])
        rows.append(row("pruned: judged report → PRUNED, p50", decide["p50"], None, "(info)", None, "ms"))
        rows.append(row("pruned: PRUNED → its job ended, p50", stop["p50"], None, "(info)", None, "ms"))
    return rows


def trial_command(base: StudySpec, epochs: int, copies: int) -> str:
    command = str(base.trial.command)
    if not re.search(r"--epochs \d+", command):
        raise SystemExit(f"{EXAMPLE / 'study.yaml'}: its trial command has no --epochs N: {command}")
    return re.sub(r"--epochs \d+", f"--epochs {epochs} --copies {copies}", command)


# -- against Ray Tune -----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One study, Kiln's or Ray's, as the comparison reads it: every trial's reports (epoch, seconds since the study
    was submitted, val_acc) and its final value where it ran every epoch."""

    system: str
    wall_s: float
    trials: list[tuple[list[tuple[int, float, float]], float | None]]  # (reports, final value or None)
    pruned_past: int = 0  # Kiln: epochs pruned trials ran after the step the pruner stopped them at
    reactions: list[tuple[float, float]] = field(default_factory=list)

    @property
    def epochs(self) -> int:
        return sum(len(reports) for reports, _ in self.trials)

    @property
    def completed(self) -> int:
        return sum(final is not None for _, final in self.trials)

    def best(self) -> float | None:
        finals = [final for _, final in self.trials if final is not None]
        return max(finals) if finals else None

    def time_to(self, target: float) -> float:
        """Seconds until a trial ended (its last report) with a final value ≥ ``target``; inf if none did."""
        times = [reports[-1][1] for reports, final in self.trials if final is not None and final >= target and reports]
        return min(times) if times else float("inf")

    def figures(self) -> dict[str, Any]:
        return {
            "wall_s": self.wall_s,
            "best": self.best(),
            "epochs": self.epochs,
            "trials": len(self.trials),
            "completed": self.completed,
            "pruned_past": self.pruned_past,
            "reactions_s": self.reactions,
            "reports": [[reports, final] for reports, final in self.trials],
        }


def kiln_outcome(run: StudyRun, submitted: float, epochs: int) -> Outcome:
    trials = []
    for t in run.trials:
        reports = [(step, moment - submitted, value) for step, moment, value in sorted(t.points, key=lambda p: p[1])]
        final = t.value if t.state == TrialState.SUCCEEDED and t.value is not None and t.points else None
        trials.append((reports, final if final is not None and max(p[0] for p in t.points) >= epochs else None))
    return Outcome("kiln", run.wall_s, trials, run.past_verdict(), run.reactions())


def run_kiln(client: Client, spec: StudySpec, code: str, epochs: int) -> Outcome:
    submitted = time.time()
    run = run_study(client, spec, code, "kiln")
    return kiln_outcome(run, submitted, epochs)


def ray_versions(python: Path) -> dict[str, str]:
    script = (
        "import json, ray, optuna, sklearn, numpy; print(json.dumps({m.__name__: m.__version__ for m in "
        "(ray, optuna, sklearn, numpy)}))"
    )
    run = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=300, check=False)
    if run.returncode != 0:
        raise SystemExit(f"{python} cannot import ray, optuna, scikit-learn and numpy:\n{run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run_ray(
    python: Path, base: StudySpec, seed: int, trials: int, epochs: int, copies: int, tmp: Path, cgroup: bool
) -> Outcome:
    """The example's study on Ray Tune (benchmarks/tuning_ray.py in the Ray virtualenv)."""
    es = base.early_stopping
    config = {
        "seed": seed,
        "trials": trials,
        "parallelism": base.parallelism,
        "epochs": epochs,
        "copies": copies,
        "grace_period": min(es.min_resource or 1, epochs),  # Ray refuses a grace period past max_t (--smoke)
        "reduction_factor": es.reduction_factor,
        "metric": METRIC,
        "space": {name: p.model_dump(exclude_none=True) for name, p in base.parameters.items()},
        "cgroup": cgroup,
    }
    work = tmp / f"ray-seed{seed}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.json").write_text(json.dumps(config))
    started = time.monotonic()
    run = subprocess.run(
        [str(python), "-c", "import tuning_ray; tuning_ray.main()", str(work / "config.json"), str(work / "out.json")],
        cwd=REPO / "benchmarks",
        # Ray starts its workers at nice 15 (RAY_worker_niceness): on this shared machine they then got a fraction of
        # the CPU Kiln's trial jobs (nice 0) got. Both at 0 here.
        env={k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        | {"RAY_worker_niceness": "0"},
        capture_output=True,
        text=True,
        timeout=RAY_TIMEOUT,
        check=False,
    )
    if run.returncode != 0 or not (work / "out.json").exists():
        raise SystemExit(
            f"Ray Tune's study (seed {seed}) exited {run.returncode}:\n{(run.stdout + run.stderr)[-4000:]}"
        )
    data = json.loads((work / "out.json").read_text())
    origin = data["started"]
    outcome = Outcome("ray", data["ended"] - origin, [])
    for trial in data["trials"]:
        reports = sorted(((int(e), t - origin, v) for e, t, v in trial["reports"]), key=lambda r: r[1])
        final = reports[-1][2] if reports and max(r[0] for r in reports) >= epochs else None
        outcome.trials.append((reports, final))
    print(
        f"  ray       seed {seed}: {len(outcome.trials)} trials ({outcome.completed} ran every epoch), "
        f"{outcome.epochs} epochs, best {METRIC} {outcome.best()}, {outcome.wall_s:.0f} s "
        f"(with ray.init: {time.monotonic() - started:.0f} s)"
    )
    return outcome


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ray_rows(seeds: dict[int, dict[str, Outcome]]) -> list[dict[str, Any]]:
    rows = []
    kiln = {s: o["kiln"] for s, o in seeds.items()}
    ray = {s: o["ray"] for s, o in seeds.items() if "ray" in o}
    for seed, outcome in kiln.items():
        other = ray.get(seed)
        best, base = outcome.best() or 0.0, (other.best() or 0.0) if other else None
        label = f"seed {seed}: best final {METRIC} ({outcome.completed} vs {other.completed if other else '-'} ran all)"
        rows.append(row(label, best, base, "(info)", None, METRIC))
    if not ray:
        rows.append(
            row(
                "best final, median of seeds",
                median([o.best() or 0.0 for o in kiln.values()]),
                None,
                "(no Ray)",
                None,
                METRIC,
            )
        )
        rows.append(
            row("trial-epochs, seeds summed", sum(o.epochs for o in kiln.values()), None, "(no Ray)", None, "epochs")
        )
        return rows
    paired = [s for s in kiln if s in ray]
    kiln_best = median([kiln[s].best() or 0.0 for s in paired])
    ray_best = median([ray[s].best() or 0.0 for s in paired])
    rows.append(row("best final, median of seeds", kiln_best, ray_best, "≥ 1.00x", kiln_best >= ray_best, METRIC))
    kiln_to = median([kiln[s].time_to(ray_best) for s in paired])
    ray_to = median([ray[s].time_to(ray_best) for s in paired])
    label = f"time to Ray's median best ({ray_best:.4f}), median"
    ok = kiln_to <= 0.5 * ray_to if ray_to != float("inf") else None
    rows.append(row(label, kiln_to, ray_to if ray_to != float("inf") else None, "≤ 0.50x", ok, "s"))
    for s in paired:
        rows.append(
            row(f"  seed {s}", kiln[s].time_to(ray_best), _finite(ray[s].time_to(ray_best)), "(info)", None, "s")
        )
    kiln_epochs, ray_epochs = sum(kiln[s].epochs for s in paired), sum(ray[s].epochs for s in paired)
    rows.append(
        row("trial-epochs, seeds summed", kiln_epochs, ray_epochs, "≤ 1.00x", kiln_epochs <= ray_epochs, "epochs")
    )
    kiln_wall, ray_wall = median([kiln[s].wall_s for s in paired]), median([ray[s].wall_s for s in paired])
    rows.append(row("study wall time, median", kiln_wall, ray_wall, "(info)", None, "s"))
    past = sum(kiln[s].pruned_past for s in paired)
    rows.append(
        row(
            f"Kiln: epochs run past the pruner's verdict ({past})",
            100 * past / max(kiln_epochs, 1),
            None,
            "(info)",
            None,
            "%",
        )
    )
    return rows


def _finite(value: float) -> float | None:
    return None if value == float("inf") else value


def compare_with_ray(
    args: argparse.Namespace,
    client: Client,
    base: StudySpec,
    code: str,
    tmp: Path,
    plain: list[float],
    plain_spec: Any,
    results: dict[str, Any],
) -> tuple[list[StudyRun], list[dict]]:
    python = args.ray_venv / "bin" / "python" if args.ray_venv is not None else None
    if python is not None and not python.exists():
        print(
            f"NO RAY: {args.ray_venv} is not a virtualenv with Ray Tune: Kiln's side runs alone. Make it with\n"
            f"  python3 -m venv {args.ray_venv} && {args.ray_venv}/bin/pip install 'ray[tune]==2.60.0' "
            "optuna scikit-learn numpy   (the versions of Kiln's Optuna and the sklearn runtime's)"
        )
        python = None
    elif python is None:
        print("NO RAY: --smoke without --ray-venv runs Kiln's side alone")
    if python is not None:
        versions = ray_versions(python)
        results["ray_versions"] = versions
        import optuna

        ours = {"optuna": optuna.__version__, **results.get("runtime_versions", {})}
        differ = {k: (v, versions.get(k)) for k, v in ours.items() if versions.get(k) != v}
        print(f"Ray's virtualenv: {versions}" + (f"; DIFFERS from Kiln's (ours, Ray's): {differ}" if differ else ""))
    runs: list[StudyRun] = []
    outcomes: dict[int, dict[str, Outcome]] = {}
    for index, seed in enumerate(args.seeds):
        print(f"seed {seed}:")
        spec = study_spec(base, "kiln", seed, max_trials=args.trials)
        order = ["kiln", "ray"] if index % 2 == 0 else ["ray", "kiln"]
        outcomes[seed] = {}
        for system in order:
            if system == "kiln":
                submitted = time.time()
                run = run_study(client, spec, code, "kiln")
                runs.append(run)
                outcomes[seed]["kiln"] = kiln_outcome(run, submitted, args.epochs)
                plain += run_plain(client, plain_spec, code, args.plain_jobs)
            elif python is not None:
                outcomes[seed]["ray"] = run_ray(
                    python, base, seed, args.trials, args.epochs, args.copies, tmp, args.ray_cgroups
                )
        results["seeds"][seed] = {system: o.figures() for system, o in outcomes[seed].items()}
    return runs, ray_rows(outcomes)


# -- the rules alone, offline ---------------------------------------------------------------------------------------

OFFLINE_RULES = ["ray", "kiln", "optuna", "kiln-b3"]
CURVES = REPO / ".cache" / "tuning-curves.json"


def compare_offline(args: argparse.Namespace, base: StudySpec, tmp: Path, results: dict[str, Any]) -> list[dict]:
    """benchmarks/tuning_offline.py in the Ray virtualenv (Optuna, scikit-learn and NumPy): each rule on the same
    curves and the same sampler, with simulated time."""
    python = args.ray_venv / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"--baseline offline runs in {args.ray_venv} (Optuna, scikit-learn, NumPy): it is absent")
    es = base.early_stopping
    config = {
        "seeds": args.seeds,
        "rules": OFFLINE_RULES,
        "trials": args.trials,
        "parallelism": base.parallelism,
        "epochs": args.epochs,
        "copies": args.copies,
        "min_resource": es.min_resource or 1,
        "reduction_factor": es.reduction_factor,
        "startup_s": 2.0,  # a trial's start (Kiln's 1.4-2.4 s, Ray's 3.1-4.6 s, issue 50, quiet machine)
        "epoch_s": 0.04,
        "cache": str(CURVES),
    }
    (tmp / "offline.json").write_text(json.dumps(config))
    run = subprocess.run(
        [
            str(python),
            "-c",
            "import tuning_offline; tuning_offline.main()",
            str(tmp / "offline.json"),
            str(tmp / "out.json"),
        ],
        cwd=REPO / "benchmarks",
        env={k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))},
        stderr=subprocess.STDOUT,
        timeout=RAY_TIMEOUT * 4,
        check=False,
    )
    if run.returncode != 0:
        raise SystemExit(f"the offline replay exited {run.returncode}")
    data = json.loads((tmp / "out.json").read_text())
    results["offline"] = {"config": config, "rules": data}
    ray = data["ray"]
    rows = []
    for rule in OFFLINE_RULES:
        got = data[rule]
        best = median([got[str(s)]["best"] for s in args.seeds])
        worse = sum(got[str(s)]["best"] < ray[str(s)]["best"] for s in args.seeds)
        epochs = sum(got[str(s)]["epochs"] for s in args.seeds)
        base_epochs = sum(ray[str(s)]["epochs"] for s in args.seeds)
        label = f"{rule}: best final, median ({worse} of {len(args.seeds)} seeds below ray's)"
        rows.append(row(label, best, median([ray[str(s)]["best"] for s in args.seeds]), "(info)", None, METRIC))
        rows.append(row(f"{rule}: trial-epochs, seeds summed", epochs, base_epochs, "(info)", None, "epochs"))
    return rows


# -- against random search ------------------------------------------------------------------------------------------


def compare_with_random(
    args: argparse.Namespace,
    client: Client,
    base: StudySpec,
    code: str,
    plain: list[float],
    plain_spec: Any,
    results: dict[str, Any],
) -> tuple[list[StudyRun], list[dict]]:
    runs: list[StudyRun] = []
    for seed in args.seeds:
        print(f"seed {seed}:")
        random_spec = study_spec(
            base, "random", seed, algorithm="random", early_stopping="none", max_trials=args.trials
        )
        random_run = run_study(client, random_spec, code, "random")
        plain += run_plain(client, plain_spec, code, args.plain_jobs)
        target = random_run.best()
        if target is None:
            raise SystemExit(f"random search (seed {seed}) had no successful trial")
        tuned_spec = study_spec(
            base, "tpe-asha", seed, algorithm="tpe", max_trials=args.tuned_trials or 5 * args.trials
        )
        tuned_run = run_study(client, tuned_spec, code, "tpe+asha", budget=random_run.epochs, target=target)
        plain += run_plain(client, plain_spec, code, args.plain_jobs)
        runs += [random_run, tuned_run]
        results["seeds"][seed] = {
            "target": target,
            "random": {"epochs_to_target": random_run.epochs_to(target), "epochs": random_run.epochs},
            "tpe_asha": {
                "epochs_to_target": tuned_run.epochs_to(target),
                "epochs_to_target_ideal": tuned_run.epochs_to(target, ideal=True),
                "epochs": tuned_run.epochs,
                "trials": len(tuned_run.trials),
                "pruned": sum(t.state == TrialState.PRUNED for t in tuned_run.trials),
                "reactions_s": tuned_run.reactions(),
                "past_verdict": tuned_run.past_verdict(),
            },
            "studies": [random_run.study_id, tuned_run.study_id],
        }
    return runs, efficiency_rows(results["seeds"])


RUNTIME_VERSIONS = (
    "import json, sklearn, numpy; print('versions=' + json.dumps({'sklearn': sklearn.__version__, "
    "'numpy': numpy.__version__}))"
)


def runtime_versions(client: Client, spec: Any, code: str) -> dict[str, str]:
    """scikit-learn's and NumPy's versions in the trials' runtime (a job of the trial spec's runtime)."""
    job = client.submit(spec.model_copy(update={"command": ["python", "-c", RUNTIME_VERSIONS]}), code)
    client.wait(job.id, timeout=300)
    for line in client.stream_logs(job.id, follow=False):
        if line.source != "kiln" and line.text.startswith("versions="):
            return json.loads(line.text.removeprefix("versions="))  # type: ignore[no-any-return]
    return {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--baseline",
        choices=("ray", "random", "offline"),
        default="ray",
        help="Ray Tune's ASHA (default), random search without pruning, or the pruning rules alone replayed offline "
        "(Kiln's, Ray's, Optuna's, in the Ray virtualenv; no server).",
    )
    parser.add_argument(
        "--ray-venv", type=Path, help=f"The virtualenv with Ray Tune (default {RAY_VENV}; $KILN_RAY_VENV)."
    )
    parser.add_argument(
        "--no-ray-cgroups",
        dest="ray_cgroups",
        action="store_false",
        help="Leave Ray's trial workers where Ray starts them (by default each joins CPU groups under kiln/ with a "
        "1-CPU quota, as a Kiln trial job does: on a shared machine kiln/ weighs as one process against the rest).",
    )
    parser.add_argument("--seeds", type=int, nargs="+", help="Samplers' seeds (default: 0 1 2 3 4; random: 0 1 2).")
    parser.add_argument(
        "--trials", type=int, default=20, help="Trials of each study (random: of random search; default 20)."
    )
    parser.add_argument(
        "--tuned-trials",
        type=int,
        help="random: max_trials of each TPE + ASHA study (default 5 x --trials: the epoch budget is what stops it)",
    )
    parser.add_argument("--epochs", type=int, help="Epochs of a trial that is not pruned (default 50; random: 30).")
    parser.add_argument("--copies", type=int, help="train.py --copies: data per epoch (default 5; random: 25).")
    parser.add_argument("--plain-jobs", type=int, default=2, help="Plain jobs before and after each study (default 2).")
    parser.add_argument("--cpus", default="2", help="KILN_CPUS (default 2: the two parallel trials fill it).")
    parser.add_argument("--reconcile-interval", default="0.5", help="KILN_RECONCILE_INTERVAL (default 0.5).")
    parser.add_argument("--json", type=Path, help="Also write every figure here.")
    args = parse_args(parser, {"seeds": [0], "trials": 2, "tuned_trials": 2, "epochs": 2, "copies": 1, "plain_jobs": 1})
    ray_mode = args.baseline in ("ray", "offline")
    if args.seeds is None:
        args.seeds = [0, 1, 2, 3, 4] if ray_mode else [0, 1, 2]
    if args.epochs is None:
        args.epochs = 50 if ray_mode else 30
    if args.copies is None:
        args.copies = 5 if ray_mode else 25
    if ray_mode and args.ray_venv is None and not args.smoke:
        args.ray_venv = RAY_VENV
    started = time.monotonic()
    if args.baseline == "offline":
        base = StudySpec.model_validate(yaml.safe_load((EXAMPLE / "study.yaml").read_text()))
        offline: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
        with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
            rows = compare_offline(args, base, Path(tmp), offline)
        print_table(rows, metric_width=52, digits={"epochs": 0, METRIC: 4})
        print(
            "The rules on the same curves and sampler (Kiln's TPE), 2 trials at a time, simulated time (a trial's "
            "start 2 s, an epoch 0.04 s), instant verdicts: ray = Ray Tune's ASHAScheduler, kiln = Kiln's "
            "(bootstrap_count 2), optuna = Optuna's SuccessiveHalvingPruner (Kiln's before issue 50)."
        )
        finish(offline, rows, started, args.json)
        return 0

    base = StudySpec.model_validate(yaml.safe_load((EXAMPLE / "study.yaml").read_text()))
    command = trial_command(base, args.epochs, args.copies)
    base = base.model_copy(update={"trial": base.trial.model_copy(update={"command": command})})
    plain_spec = base.trial.model_copy(update={"command": substitute(command, DEFAULTS)})
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "command": command, "seeds": {}}
    print(f"trial: {command}\nsearch space: {', '.join(base.parameters)}; {base.early_stopping}")

    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        server = KilnServer(Path(tmp) / "home", cpus=args.cpus, reconcile_interval=args.reconcile_interval)
        server.start()
        client = server.client()
        print(f"kiln server at {server.url}")
        try:
            code = client.upload_code(EXAMPLE)
            # Warm-up (builds the sklearn runtime where .cache/test-runtimes lacks it): the defaults' accuracy.
            warm = client.submit(plain_spec, code)
            client.wait(warm.id, timeout=900)
            default = series(client, warm.id)
            results["default_val_acc"] = default[-1][2] if default else None
            print(f"default parameters: {METRIC} {results['default_val_acc']} after {len(default)} epochs")
            if ray_mode:
                results["runtime_versions"] = runtime_versions(client, plain_spec, code)

            plain = run_plain(client, plain_spec, code, args.plain_jobs)
            if ray_mode:
                runs, rows = compare_with_ray(args, client, base, code, Path(tmp), plain, plain_spec, results)
            else:
                runs, rows = compare_with_random(args, client, base, code, plain, plain_spec, results)
        finally:
            try:
                for study in client.list_studies(state="RUNNING"):
                    client.stop_study(study.id)
            except Exception as exc:  # clean-up must go on
                print(f"clean-up: stopping studies failed: {exc}", file=sys.stderr)
            client.close()
            server.stop()

    results["plain_queued_to_running"] = plain
    trial_delays = [t.queued_to_running for run in runs for t in run.trials if t.queued_to_running is not None]
    results["trial_queued_to_running"] = trial_delays
    if trial_delays and plain:
        trials, plains = summary(trial_delays), summary(plain)
        ok = trials["p50"] <= 1.2 * plains["p50"]
        rows.append(row("trial QUEUED → RUNNING p50 (vs plain jobs)", trials["p50"], plains["p50"], "≤ 1.2x", ok, "ms"))
        rows.append(
            row("trial QUEUED → RUNNING p90 (vs plain jobs)", trials["p90"], plains["p90"], "(info)", None, "ms")
        )
    print_table(rows, metric_width=52, digits={"epochs": 0, "ms": 0, METRIC: 4, "s": 1, "%": 2})
    if ray_mode:
        print(
            f"Ray Tune: OptunaSearch (TPE, its defaults) + ASHAScheduler(grace_period="
            f"{min(base.early_stopping.min_resource or 1, args.epochs)}, "
            f"reduction_factor={base.early_stopping.reduction_factor}, "
            f"max_t={args.epochs}), {base.parallelism} trials "
            f"at once; Kiln: examples/tuning/study.yaml. Times from the study's submit (Ray: Tuner.fit) to the end of "
            f"the first trial whose final {METRIC} reached the target."
        )
    else:
        print(
            f"epochs to target: every epoch a study's trials reported until one ended with {METRIC} ≥ random search's "
            f"best (same seed); TPE+ASHA had random's epochs as its budget."
        )
    print(f"{len(trial_delays)} trial jobs against {len(plain)} plain jobs of the default parameters, two in flight.")
    finish(results, rows, started, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
