"""Hyperparameter tuning on the digits task: TPE + ASHA against random search without pruning, and what a study
adds to the scheduling of its trials' jobs.

    .venv/bin/python benchmarks/tuning.py [--seeds 0 1 2] [--trials 20] [--epochs 30] [--copies 25] [--json PATH]

One fresh ``kiln server`` (``tests.kilnserver.KilnServer``, ``KILN_CPUS=2``: two 1-CPU trials fill it), the code
of ``examples/tuning`` and the search space and ASHA settings of its ``study.yaml``; every trial runs
``train.py --epochs E --copies C`` with its sampled ``--lr``, ``--width`` and ``--alpha`` on the sklearn runtime.

1. efficiency  For each seed: a random-search study without pruning (``--trials`` trials, 2 at a time), whose best
               final ``val_acc`` is the target; then a TPE + ASHA study with the same seed, search space and
               parallelism, given the random study's budget of epochs (stopped once it has spent them, or has
               reached the target). Per study, the trial-epochs consumed until it first reaches the target: every
               epoch any of its trials reported (the metric points, ordered by their time) up to the moment a trial
               ended with a final ``val_acc`` at or above the target. A pruned trial's epochs count until its job
               was stopped, not until the pruner's decision: the reaction time is Kiln's. Target: TPE + ASHA needs
               at most a third of random search's epochs (the seeds summed). Also shown, as information: the same
               count had every pruned trial stopped at the step the pruner judged it, and the reaction time.
2. overhead    Each trial job's QUEUED → RUNNING (its job events) in those studies, against plain jobs of the same
               spec (the default parameters) that this script submits before the first study and after each one
               (``--plain-jobs`` each time, two in flight like the trials), so that both see the same server and the
               same machine over the run. Target: the trials' p50 at most 1.2x the plain jobs' p50.

``--copies`` sets the training data per epoch (25: every image moved by up to two pixels; an epoch ~0.1-0.25 s
here), so that an epoch outlasts the time between a report and its trial being stopped; ``--copies 5 --epochs 50``
is the example's own study, where the reaction time is 10-30 epochs. The machine is shared and noisy: nothing is
asserted, figures are ratios within one run.
"""

from __future__ import annotations

import argparse
import re
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Samplers' seeds (default 0 1 2).")
    parser.add_argument("--trials", type=int, default=20, help="Trials of each random-search study (default 20).")
    parser.add_argument(
        "--tuned-trials",
        type=int,
        help="max_trials of each TPE + ASHA study (default 5 x --trials: the epoch budget is what stops it; Kiln's "
        "TPE samples max_trials/4 trials, 2 to 10, at random first)",
    )
    parser.add_argument("--epochs", type=int, default=30, help="Epochs of a trial that is not pruned (default 30).")
    parser.add_argument("--copies", type=int, default=25, help="train.py --copies: data per epoch (default 25).")
    parser.add_argument("--plain-jobs", type=int, default=2, help="Plain jobs before and after each study (default 2).")
    parser.add_argument("--cpus", default="2", help="KILN_CPUS (default 2: the two parallel trials fill it).")
    parser.add_argument("--reconcile-interval", default="0.5", help="KILN_RECONCILE_INTERVAL (default 0.5).")
    parser.add_argument("--json", type=Path, help="Also write every figure here.")
    args = parse_args(parser, {"seeds": [0], "trials": 2, "tuned_trials": 2, "epochs": 2, "copies": 1, "plain_jobs": 1})
    started = time.monotonic()

    base = StudySpec.model_validate(yaml.safe_load((EXAMPLE / "study.yaml").read_text()))
    command = trial_command(base, args.epochs, args.copies)
    base = base.model_copy(update={"trial": base.trial.model_copy(update={"command": command})})
    plain_spec = base.trial.model_copy(update={"command": substitute(command, DEFAULTS)})
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "command": command, "seeds": {}}
    print(f"trial: {command}\nsearch space: {', '.join(base.parameters)}; ASHA {base.early_stopping}")

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

            plain = run_plain(client, plain_spec, code, args.plain_jobs)

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
        finally:
            try:
                for study in client.list_studies(state="RUNNING"):
                    client.stop_study(study.id)
            except Exception as exc:  # clean-up must go on
                print(f"clean-up: stopping studies failed: {exc}", file=sys.stderr)
            client.close()
            server.stop()

    rows = efficiency_rows(results["seeds"])
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
    print_table(rows, metric_width=52, digits={"epochs": 0, "ms": 0})
    print(
        f"epochs to target: every epoch a study's trials reported until one ended with {METRIC} ≥ random search's best "
        f"(same seed); TPE+ASHA had random's epochs as its budget.\n{len(trial_delays)} trial jobs against "
        f"{len(plain)} plain jobs of the default parameters, two in flight."
    )
    finish(results, rows, started, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
