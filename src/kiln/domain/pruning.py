"""Early stopping's decisions: whether a trial goes on past a rung (ASHA, Hyperband) or a step (median), and why
one was stopped. Pure: a trial's reported objective by step (its *history*), the other trials' histories and the
settings; the studies driver (kiln.tasks.studies) reads the histories from Optuna's storage and asks here.

Why not Optuna's own pruners: its ``SuccessiveHalvingPruner`` (and ``HyperbandPruner``, made of them) judges a trial
by its value at the last step it reported, not at the rung (points that arrive in one batch were judged at the
batch's last step: ``pruned_step`` 6 or 16 for rungs 5 and 15); with fewer than ``reduction_factor`` trials at a
rung it promotes the best one only, so the second trial there is stopped on the first's value alone (issue 50: the
trial that would have ended best, stopped at epoch 45 by one other that then ended worse); and its
``bootstrap_count`` *prunes* every trial until that many have reached a rung (Optuna cannot keep a trial waiting),
where a Kiln trial simply goes on. Its verdict also says nothing of why. Here:

- **At the rung.** A trial is judged at rung ``r`` by its value at step ``r``, or the last step it reported below
  ``r`` (a series that skips steps), whatever batch the points arrived in.
- **Evidence first.** No verdict at a rung until ``bootstrap_count`` *other* trials have a value there: before
  that, a trial goes on (it is never held waiting: promotion is asynchronous, as in ASHA).
- **Ray Tune's percentile rule.** Then the trial goes on if its value is at least the ``1 - 1/reduction_factor``
  percentile of the others' values at the rung (linear interpolation, as ``numpy.percentile``: with two others
  ``a < b`` and a factor of 3, ``a + 2/3 (b - a)``), the rule of Ray Tune's ``ASHAScheduler``. It keeps about the
  top ``1/reduction_factor`` when many trials are there, without "only the best passes" when few are.
- **Hyperband** is several ASHA brackets, each with its own first rung (``min_resource x factor^k``); a trial is
  compared with the trials of its own bracket only.

A trial counts at rung ``r`` once it has reported a step at or past ``r`` (and has a value at or below it). A
trial that was stopped at an earlier rung has no step past that one (the driver reports nothing after a verdict),
so it is not counted at later rungs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

History = Mapping[int, float]  # a trial's objective by step, finite values only
Direction = Literal["minimize", "maximize"]

# The number of other trials a verdict at a rung needs, where the spec does not say: with one, the second trial at
# a rung is stopped on the first's value alone (issue 50's seed 0 lost its winner so). Replayed on the digits
# example's curves (benchmarks/tuning.py --baseline offline, 5 seeds), two kept the best trial in every seed for 5 %
# more trial-epochs than one (Ray Tune's rule), three for 9 %.
DEFAULT_BOOTSTRAP = 2


@dataclass(frozen=True)
class Verdict:
    """What the pruner made of a trial at one rung (or one step, for the median rule)."""

    prune: bool
    rule: str  # "asha", "hyperband" or "median"
    rung: int  # the step the trial was judged at
    step: int | None  # the step whose value was judged: the rung, or the last reported below it
    value: float | None  # the trial's value there (median: its best so far)
    cutoff: float | None  # what it had to reach; None where there was no verdict
    compared: int  # how many other trials' values at the rung it was compared with
    needed: int  # how many a verdict needs (bootstrap_count; median: startup_trials finished)
    bracket: int | None = None  # hyperband: the trial's bracket

    @property
    def judged(self) -> bool:
        """False where the trial went on for want of evidence (or of a value at the rung)."""
        return self.cutoff is not None

    def describe(self, metric: str, direction: Direction) -> str:
        """One line: ``pruned at step 15: val_acc=0.9711 at step 15, below the cutoff 0.9756 of 4 other trials``."""
        what = "pruned" if self.prune else "went on"
        value = "-" if self.value is None else f"{self.value:.6g}"
        at = f" at step {self.step}" if self.step is not None and self.step != self.rung else ""
        own = f"{metric}={value}{at}" if self.rule != "median" else f"best {metric} so far {value}"
        if self.cutoff is None:
            return f"{what} at step {self.rung}: {own}, {self.compared} of {self.needed} trials needed to judge"
        side = ("below" if direction == "maximize" else "above") if self.prune else "not worse than"
        of = "the median" if self.rule == "median" else "the cutoff"
        return f"{what} at step {self.rung}: {own}, {side} {of} {self.cutoff:.6g} of {self.compared} other trials"


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation, as ``numpy.percentile`` (Ray Tune's cutoff)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def value_at(history: History, step: int) -> tuple[int, float] | None:
    """The value at ``step``, or at the last step reported below it: (that step, the value); None if none."""
    if step in history:
        return step, history[step]
    below = [s for s in history if s <= step]
    if not below:
        return None
    last = max(below)
    return last, history[last]


def reached(history: History, step: int) -> bool:
    return any(s >= step for s in history)


def worse(value: float, cutoff: float, direction: Direction) -> bool:
    return value < cutoff if direction == "maximize" else value > cutoff


def judge_rung(
    history: History,
    others: Iterable[History],
    rung: int,
    *,
    reduction_factor: int,
    bootstrap_count: int,
    direction: Direction,
    rule: str = "asha",
    bracket: int | None = None,
) -> Verdict:
    """The verdict on a trial at ``rung`` against the other trials' values there (see the module's docstring)."""
    own = value_at(history, rung)
    recorded = [v for other in others if reached(other, rung) and (v := value_at(other, rung)) is not None]
    values = [value for _, value in recorded]
    step, value = own if own is not None else (None, None)
    if value is None or len(values) < bootstrap_count or not values:
        return Verdict(False, rule, rung, step, value, None, len(values), bootstrap_count, bracket)
    keep = (1 - 1 / reduction_factor) * 100 if direction == "maximize" else 100 / reduction_factor
    cutoff = percentile(values, keep)
    prune = worse(value, cutoff, direction)
    return Verdict(prune, rule, rung, step, value, cutoff, len(values), bootstrap_count, bracket)


@dataclass(frozen=True)
class RungSchedule:
    """Where the rungs are: bracket ``b`` (0 for ASHA) has rungs ``min_resource x factor^(b + k)``, k = 0, 1, …
    (below ``max_resource`` where there is one); a trial's bracket comes from its number."""

    min_resource: int
    reduction_factor: int
    max_resource: int | None = None
    brackets: int = 1

    def bracket_of(self, number: int) -> int:
        """Hyperband's brackets take trials in proportion to Hyperband's budgets (the most aggressive the most, as
        Optuna's HyperbandPruner weighs them), dealt in turn rather than by a hash: a small study's trials are
        spread over every bracket."""
        if self.brackets <= 1:
            return 0
        return _deal(self.budgets())[number % sum(self.budgets())]

    def budgets(self) -> list[int]:
        n = self.brackets
        return [math.ceil(n * self.reduction_factor ** (n - 1 - b) / (n - b)) for b in range(n)]

    def rungs(self, bracket: int, up_to: int) -> list[int]:
        """The rungs of ``bracket`` at or below step ``up_to``."""
        out: list[int] = []
        k = bracket
        while True:
            rung = self.min_resource * self.reduction_factor**k
            if rung > up_to or (self.max_resource is not None and rung >= self.max_resource):
                return out
            out.append(rung)
            k += 1


def _deal(budgets: list[int]) -> list[int]:
    """One cycle of bracket ids, each ``budgets[b]`` times, spread evenly (smooth weighted round robin)."""
    total = sum(budgets)
    current = [0] * len(budgets)
    cycle = []
    for _ in range(total):
        current = [c + w for c, w in zip(current, budgets, strict=True)]
        pick = max(range(len(budgets)), key=lambda b: (current[b], -b))
        current[pick] -= total
        cycle.append(pick)
    return cycle


def hyperband_brackets(min_resource: int, max_resource: int, reduction_factor: int) -> int:
    """``floor(log_factor(max / min)) + 1`` brackets (Hyperband's s_max + 1, as Optuna counts them)."""
    if max_resource <= min_resource:
        return 1
    return math.floor(math.log(max_resource / min_resource, reduction_factor) + 1e-9) + 1


def judge_median(
    history: History,
    completed: Iterable[History],
    step: int,
    *,
    direction: Direction,
    startup_trials: int,
    warmup_steps: int,
) -> Verdict | None:
    """Optuna's MedianPruner's rule, with its reasons: after ``warmup_steps``, and once ``startup_trials`` trials
    have finished, a trial whose best value so far is worse than the median of the finished trials' values at the
    same step is stopped. None where it is not judged at this step (warm-up, or no finished trial has the step)."""
    finished = list(completed)
    own = [v for s, v in history.items() if s <= step]
    if step < warmup_steps or not own:
        return None
    best = max(own) if direction == "maximize" else min(own)
    if len(finished) < startup_trials:
        return Verdict(False, "median", step, step, best, None, len(finished), startup_trials)
    values = [h[step] for h in finished if step in h]
    if not values:
        return None
    cutoff = percentile(values, 50.0)
    return Verdict(worse(best, cutoff, direction), "median", step, step, best, cutoff, len(values), startup_trials)
