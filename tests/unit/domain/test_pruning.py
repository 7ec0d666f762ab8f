"""Early stopping's decision function (kiln.domain.pruning): a trial is judged at a rung by its value there, only
once enough other trials have reached the rung, and then by Ray Tune's percentile rule; Hyperband's brackets and
the median rule; and the reasons a verdict gives."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.domain.pruning import (
    RungSchedule,
    hyperband_brackets,
    judge_median,
    judge_rung,
    percentile,
    value_at,
)

ASHA = {"reduction_factor": 3, "direction": "maximize"}


def curve(**values: float) -> dict[int, float]:
    """A history from ``s5=0.9, s6=0.91``: step 5 → 0.9, step 6 → 0.91."""
    return {int(k.removeprefix("s")): v for k, v in values.items()}


def test_the_second_trial_at_a_rung_is_not_pruned_on_the_first_ones_value_alone() -> None:
    """Issue 50, seed 0: at rung 45 one other trial had 0.9889; the trial at 0.9867 (which would have ended best)
    was stopped on that one value, and the other then ended at 0.9867 itself. By default a verdict needs two."""
    first = {step: 0.9889 for step in range(1, 51)}
    second = {step: 0.9867 for step in range(1, 46)}
    verdict = judge_rung(second, [first], 45, bootstrap_count=2, **ASHA)
    assert not verdict.prune and not verdict.judged
    assert (verdict.compared, verdict.needed, verdict.value, verdict.cutoff) == (1, 2, 0.9867, None)
    # What it was before (one other's value, only the best passes): Ray Tune's ASHA does the same with one.
    assert judge_rung(second, [first], 45, bootstrap_count=1, **ASHA).prune
    # With a second other trial, it is judged, by the percentile rule: 0.9867 passes against 0.9889 and 0.9800.
    third = {step: 0.98 for step in range(1, 46)}
    verdict = judge_rung(second, [first, third], 45, bootstrap_count=2, **ASHA)
    assert verdict.judged and not verdict.prune and verdict.compared == 2
    assert verdict.cutoff == pytest.approx(0.98 + (0.9889 - 0.98) * 2 / 3)


def test_the_percentile_rule_keeps_about_the_top_third() -> None:
    others = [{5: v} for v in (0.95, 0.97, 0.99)]
    cutoff = 0.97 + (0.99 - 0.97) / 3  # numpy.percentile(..., 66.67), Ray Tune's ASHA cutoff
    assert judge_rung({5: 0.976}, others, 5, bootstrap_count=2, **ASHA).prune
    verdict = judge_rung({5: 0.977}, others, 5, bootstrap_count=2, **ASHA)
    assert not verdict.prune and verdict.cutoff == pytest.approx(cutoff) and verdict.compared == 3
    many = [{5: v / 100} for v in range(100)]
    assert not judge_rung({5: 0.67}, many, 5, bootstrap_count=2, **ASHA).prune
    assert judge_rung({5: 0.65}, many, 5, bootstrap_count=2, **ASHA).prune
    # Minimizing: the lowest third goes on.
    losses = [{5: v} for v in (1.0, 2.0, 3.0, 4.0)]
    assert not judge_rung({5: 1.9}, losses, 5, bootstrap_count=2, reduction_factor=3, direction="minimize").prune
    assert judge_rung({5: 2.1}, losses, 5, bootstrap_count=2, reduction_factor=3, direction="minimize").prune


def test_a_trial_is_judged_by_its_value_at_the_rung_not_a_later_one() -> None:
    others = [{s: 0.5 for s in range(1, 20)}, {s: 0.6 for s in range(1, 20)}]
    # Good at 5, bad at 6 (its last step): judged at 5, it goes on.
    verdict = judge_rung(curve(s4=0.1, s5=0.9, s6=0.1), others, 5, bootstrap_count=2, **ASHA)
    assert not verdict.prune and (verdict.step, verdict.value) == (5, 0.9)
    # Bad at 5, good at 16: stopped at 5.
    verdict = judge_rung(curve(s5=0.1, s16=0.9), others, 5, bootstrap_count=2, **ASHA)
    assert verdict.prune and (verdict.rung, verdict.step, verdict.value) == (5, 5, 0.1)
    # A series that skips the rung's step: the last value below it.
    verdict = judge_rung(curve(s4=0.3, s6=0.9), others, 5, bootstrap_count=2, **ASHA)
    assert verdict.prune and (verdict.step, verdict.value) == (4, 0.3)
    assert value_at(curve(s4=0.3, s6=0.9), 5) == (4, 0.3) and value_at(curve(s6=0.9), 5) is None
    # No value at or below the rung: no verdict.
    assert not judge_rung(curve(s6=0.0), others, 5, bootstrap_count=0, **ASHA).prune


def test_only_trials_that_reached_the_rung_count() -> None:
    behind = {s: 0.99 for s in range(1, 15)}  # still at step 14: not at rung 15
    stopped_at_5 = {s: 0.99 for s in range(1, 6)}  # stopped at rung 5: nothing past it
    skipped = {20: 0.99}  # its first report is past the rung: no value there
    there = {s: 0.5 for s in range(1, 30)}
    verdict = judge_rung({15: 0.1}, [behind, stopped_at_5, skipped, there], 15, bootstrap_count=2, **ASHA)
    assert (verdict.compared, verdict.judged, verdict.prune) == (1, False, False)
    verdict = judge_rung({15: 0.1}, [there, {s: 0.7 for s in range(1, 16)}], 15, bootstrap_count=2, **ASHA)
    assert verdict.compared == 2 and verdict.prune


def test_the_reasons_read_as_a_sentence() -> None:
    others = [{15: 0.97}, {15: 0.98}, {15: 0.99}]
    text = judge_rung({14: 0.95, 16: 0.99}, others, 15, bootstrap_count=2, **ASHA).describe("val_acc", "maximize")
    assert text == "pruned at step 15: val_acc=0.95 at step 14, below the cutoff 0.983333 of 3 other trials"
    text = judge_rung({15: 0.95}, others[:1], 15, bootstrap_count=2, **ASHA).describe("val_acc", "maximize")
    assert text == "went on at step 15: val_acc=0.95, 1 of 2 trials needed to judge"


@pytest.mark.parametrize("values", [[1.0], [3.0, 1.0], [0.1, 0.5, 0.2, 0.9], list(np.linspace(0, 1, 17))])
@pytest.mark.parametrize("q", [0.0, 33.3, 50.0, 66.67, 100.0])
def test_percentile_is_numpys(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_rungs_of_asha_and_of_hyperbands_brackets() -> None:
    asha = RungSchedule(5, 3)
    assert asha.rungs(0, 50) == [5, 15, 45] and asha.rungs(0, 14) == [5] and asha.bracket_of(7) == 0
    assert RungSchedule(5, 3, max_resource=45).rungs(0, 100) == [5, 15]  # none at or past the last step
    brackets = hyperband_brackets(1, 51, 3)
    assert brackets == 4  # floor(log3(51)) + 1: first rungs 1, 3, 9, 27
    band = RungSchedule(1, 3, 51, brackets)
    assert [band.rungs(b, 51) for b in range(4)] == [[1, 3, 9, 27], [3, 9, 27], [9, 27], [27]]
    budgets = band.budgets()
    assert budgets == [27, 12, 6, 4]  # Optuna's HyperbandPruner's weights: the most aggressive the most trials
    dealt = [band.bracket_of(n) for n in range(sum(budgets))]
    assert [dealt.count(b) for b in range(4)] == budgets
    assert dealt[:8] == [0, 1, 0, 2, 0, 3, 0, 1]  # dealt in turn: a small study's trials reach every bracket


def test_median_rule() -> None:
    done = [{1: 0.5, 2: 0.6}, {1: 0.7, 2: 0.8}, {1: 0.9}]
    verdict = judge_median({1: 0.6, 2: 0.65}, done, 2, direction="maximize", startup_trials=2, warmup_steps=0)
    assert verdict is not None and verdict.prune and verdict.cutoff == pytest.approx(0.7) and verdict.compared == 2
    assert not judge_median({1: 0.8}, done, 1, direction="maximize", startup_trials=2, warmup_steps=0).prune  # type: ignore[union-attr]
    waiting = judge_median({1: 0.1}, done, 1, direction="maximize", startup_trials=5, warmup_steps=0)
    assert waiting is not None and not waiting.prune and not waiting.judged
    assert judge_median({1: 0.1}, done, 1, direction="maximize", startup_trials=0, warmup_steps=2) is None
