"""Which names log extraction keeps: the well-known non-metrics a training script prints (a DDP script's
``rank=0``), the step axis, and the spec's ``metrics.include`` / ``metrics.exclude``."""

from __future__ import annotations

import pytest

from kiln.injob.recognize import NOT_METRICS, Extractor, NameFilter, recognize
from kiln.injob.spool import Value


@pytest.mark.parametrize(
    ("line", "step", "metrics"),
    [
        ("rank=0", None, {}),
        ("rank=1 world_size=2 local_rank=1 node_rank=0", None, {}),
        ("RANK=0 loss=0.5", None, {"loss": 0.5}),
        ("pid=4242 seed=42 step=3 loss=1.5", 3, {"loss": 1.5}),
        ("local_rank: 0, global_rank: 1, group_rank: 0, local_world_size: 2", None, {}),
        ("[rank 0] step=5 acc=0.9", 5, {"acc": 0.9}),
        ("ranking=3 seeds=2 random_seed=1", None, {"ranking": 3.0, "seeds": 2.0, "random_seed": 1.0}),
        # The step axis is no metric; a second marker is one only when it is the epoch (plotted against, as
        # W&B and TensorBoard users log it); a second counter is a position, not a measurement.
        ("epoch=2 iter=50 global_step=250 loss=0.1", 250, {"loss": 0.1, "epoch": 2.0}),
        ("Epoch 2, Iter 50, Global Step 250, loss: 0.1", 250, {"loss": 0.1, "epoch": 2.0}),
        ("global_step=500 step=20 loss=0.1", 500, {"loss": 0.1}),
        ("Epoch [3/10], Step [100/600], Loss: 0.2876", 100, {"loss": 0.2876, "epoch": 3.0}),
        ("step=7 epoch=0.5 loss=2", 7, {"loss": 2.0, "epoch": 0.5}),  # a fractional epoch (HF Trainer) is a value
    ],
)
def test_well_known_non_metrics_and_axes_are_not_metrics(line: str, step: int | None, metrics: dict) -> None:
    assert recognize(line) == (step, metrics)


def test_recognize_can_keep_everything() -> None:
    assert recognize("rank=0 seed=3 loss=1", skip=frozenset()) == (None, {"rank": 0.0, "seed": 3.0, "loss": 1.0})


def _names(extractor: Extractor, lines: list[str]) -> list[set[str]]:
    return [set(m) for i, line in enumerate(lines) for _, _, m in extractor.feed(float(i), line)]


LINE = "rank=0 seed=7 step=1 loss=0.5 val_loss=0.6 val_acc=0.9 lr=0.001"


@pytest.mark.parametrize(
    ("include", "exclude", "kept"),
    [
        ([], [], {"loss", "val_loss", "val_acc", "lr"}),
        ([], ["lr"], {"loss", "val_loss", "val_acc"}),
        ([], ["VAL_*"], {"loss", "lr"}),  # without regard to case
        (["loss", "val_*"], [], {"loss", "val_loss", "val_acc"}),
        (["val_*"], ["val_acc"], {"val_loss"}),
        (["seed", "loss"], [], {"seed", "loss"}),  # a well-known non-metric, asked for by name
        (["*"], [], {"rank", "seed", "loss", "val_loss", "val_acc", "lr"}),
        (["*"], ["rank"], {"seed", "loss", "val_loss", "val_acc", "lr"}),
        (["nothing*"], [], set()),
    ],
)
def test_include_and_exclude(include: list[str], exclude: list[str], kept: set[str]) -> None:
    assert _names(Extractor(include=include, exclude=exclude), [LINE]) == ([kept] if kept else [])


def test_include_and_exclude_apply_to_custom_patterns_too() -> None:
    pattern = {"regex": r"rank (?P<rank>\d+) speed (?P<speed>[0-9.]+) mem (?P<mem>\d+)"}
    line = "rank 1 speed 3.5 mem 12"
    assert _names(Extractor(builtin=False, patterns=[pattern]), [line]) == [{"rank", "speed", "mem"}]  # named: kept
    assert _names(Extractor(builtin=False, patterns=[pattern], exclude=["mem"]), [line]) == [{"rank", "speed"}]
    assert _names(Extractor(builtin=False, patterns=[pattern], include=["speed"]), [line]) == [{"speed"}]


def test_the_filter_remembers_a_bounded_number_of_names() -> None:
    names = NameFilter(exclude=["x*"])
    metrics: dict[str, Value] = {f"m{i}": 1.0 for i in range(20_000)}
    assert names.apply(metrics) == metrics
    assert len(names.cache) == 10_000
    assert names.skip == NOT_METRICS
