"""Log extraction: built-in recognition of progress lines, custom patterns, the spool and the log tail."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from kiln.injob import extract
from kiln.injob.extract import Extractor, recognize
from kiln.injob.shim import format_line

# (line, step, metrics): what built-in recognition takes from one line on its own.
ACCEPTED = [
    ("step=120 loss=0.31 lr=0.001", 120, {"loss": 0.31, "lr": 0.001}),
    ("loss: 0.2345", None, {"loss": 0.2345}),
    ("Train Loss: 0.5", None, {"train_loss": 0.5}),
    ("val_loss=0.4 train/acc=0.9", None, {"val_loss": 0.4, "train/acc": 0.9}),
    ("lr: 3e-4", None, {"lr": 0.0003}),
    ("lr=1.0E-03,", None, {"lr": 0.001}),
    ("accuracy: 91%", None, {"accuracy": 91.0}),
    ("epoch 3/10 - loss: 0.2345 - accuracy: 0.91", 3, {"loss": 0.2345, "accuracy": 0.91}),
    ("Epoch 3/10", 3, {}),
    ("Epoch [3/10]", 3, {}),
    ("Step 120", 120, {}),
    ("[step 120] done", 120, {}),
    ("iteration 5 loss=1.0", 5, {"loss": 1.0}),
    ("global_step=500 epoch=2 loss=0.1", 500, {"loss": 0.1, "epoch": 2.0}),
    ("Epoch [3/10], Step [100/600], Loss: 0.2876", 100, {"loss": 0.2876, "epoch": 3.0}),
    ("100/100 [====] - 1s 10ms/step - loss: 0.2000 - acc: 0.9000", None, {"loss": 0.2, "acc": 0.9}),
    ("Train Epoch: 1 [0/60000 (0%)]\tLoss: 2.300000", 1, {"loss": 2.3}),
    ("{'loss': 0.5, 'learning_rate': 5e-05, 'epoch': 0.5}", None, {"loss": 0.5, "learning_rate": 5e-05, "epoch": 0.5}),
    ('{"step": 7, "loss": 0.5}', 7, {"loss": 0.5}),
    (
        "Epoch 3: 100%|#####| 50/50 [00:05<00:00,  9.5it/s, v_num=0, train_loss=0.500]",
        3,
        {"v_num": 0.0, "train_loss": 0.5},
    ),
    ("2026-11-30 12:30:01,123 INFO step=5 loss=0.3", 5, {"loss": 0.3}),
    ("INFO: loss: 0.5", None, {"loss": 0.5}),
    ("ETA: 0:01:23 - loss: 0.5", None, {"loss": 0.5}),
    ("loss:0.25", None, {"loss": 0.25}),
    ("loss: nan", None, {"loss": "nan"}),
    ("loss = inf", None, {"loss": "inf"}),
    ("\x1b[32mloss=0.5\x1b[0m", None, {"loss": 0.5}),
    ("10%\r50%\rloss=0.7", None, {"loss": 0.7}),
    ("The best validation loss: 0.5.", None, {"validation_loss": 0.5}),
]

REJECTED = [
    "Downloading 50 files",
    "12:30:01",
    "2026-11-30",
    "date: 2026-11-30",
    "time: 12:30:01",
    "Memory: 16 GB",
    "connecting to host:8080",
    "Using device: cuda:0",
    "samples: 1,234",
    "x=1.2.3",
    "version 2.1.0",
    "loss: tensor(0.5)",
    "12abc=5",
    "2026-11-30T12:30:01Z started",
    "steps per epoch computed",
    "epochs: see below",
    "",
]


@pytest.mark.parametrize(("line", "step", "metrics"), ACCEPTED)
def test_accepted(line: str, step: int | None, metrics: dict) -> None:
    assert recognize(extract.clean_text(line)) == (step, metrics)


@pytest.mark.parametrize("line", REJECTED)
def test_rejected(line: str) -> None:
    assert recognize(extract.clean_text(line)) == (None, {})


def feed_all(ex: Extractor, lines: list[str]) -> list[tuple[int | None, dict]]:
    out = []
    for i, line in enumerate(lines):
        out += [(s, m) for _, s, m in ex.feed(float(i), line)]
    return out + [(s, m) for _, s, m in ex.flush()]


def test_keras_epoch_carries_over_to_the_following_lines() -> None:
    lines = [
        "Epoch 1/2",
        "100/100 [==============================] - 2s 20ms/step - loss: 0.5000 - accuracy: 0.8000",
        "Epoch 2/2",
        "100/100 [==============================] - 2s 20ms/step - loss: 0.4000 - accuracy: 0.8500",
        "val_loss: 0.45",
        "step 7",
        "loss=0.1",
    ]
    assert feed_all(Extractor(), lines) == [
        (1, {"loss": 0.5, "accuracy": 0.8}),
        (2, {"loss": 0.4, "accuracy": 0.85}),
        (2, {"val_loss": 0.45}),
        (7, {"loss": 0.1}),
    ]


def test_ranks_carry_their_own_step_and_the_prefix_is_stripped() -> None:
    lines = ["[0] epoch 1", "[1] epoch 5", "[0] loss=0.1", "[1] loss=0.2"]
    assert feed_all(Extractor(), lines) == [(1, {"loss": 0.1}), (5, {"loss": 0.2})]


def test_builtin_off_takes_nothing() -> None:
    assert feed_all(Extractor(builtin=False), ["step=1 loss=0.5"]) == []


def test_custom_pattern_one_line_with_step_group() -> None:
    pattern = {"regex": r"it (?P<it>\d+): top1 (?P<top1>[\d.]+)% top5 (?P<top5>\S+)", "lines": 1, "step": "it"}
    ex = Extractor(builtin=False, patterns=[pattern])
    assert feed_all(ex, ["it 10: top1 71.5% top5 90", "nothing"]) == [(10, {"top1": 71.5, "top5": 90.0})]


def test_custom_pattern_default_step_groups() -> None:
    for group in ("step", "epoch", "iteration", "iter"):
        ex = Extractor(builtin=False, patterns=[{"regex": rf"{group} (?P<{group}>\d+) cost (?P<cost>\S+)"}])
        assert feed_all(ex, [f"{group} 4 cost 1e-2"]) == [(4, {"cost": 0.01})]


def test_custom_pattern_lookahead_window_spans_lines() -> None:
    pattern = {"regex": r"== epoch (?P<epoch>\d+) ==\nloss (?P<loss>\S+)\nacc (?P<acc>\S+)", "lines": 3}
    lines = ["== epoch 1 ==", "loss 0.5", "acc 0.7", "noise", "== epoch 2 ==", "loss 0.4", "acc 0.8"]
    ex = Extractor(builtin=False, patterns=[pattern])
    out = []
    for i, line in enumerate(lines):
        out += [(s, m) for _, s, m in ex.feed(float(i), line)]
    # The second block's window completes with its last line: nothing waits for more.
    assert out == [(1, {"loss": 0.5, "acc": 0.7}), (2, {"loss": 0.4, "acc": 0.8})]
    assert ex.flush() == []


def test_window_longer_than_the_log_is_matched_at_the_end() -> None:
    pattern = {"regex": r"loss (?P<loss>\S+)\n.*\nacc (?P<acc>\S+)", "lines": 20}
    ex = Extractor(builtin=False, patterns=[pattern])
    assert [m for _, _, m in ex.feed(0.0, "loss 1")] == []
    ex.feed(1.0, "x")
    ex.feed(2.0, "acc 2")
    assert [(t, m) for t, _, m in ex.flush()] == [(0.0, {"loss": 1.0, "acc": 2.0})]


def test_a_match_is_counted_once_not_per_window() -> None:
    ex = Extractor(builtin=False, patterns=[{"regex": r"loss (?P<loss>\S+)", "lines": 3}])
    assert feed_all(ex, ["a", "loss 1", "b", "c"]) == [(None, {"loss": 1.0})]


def test_text_values_are_kept_with_one_event_per_pattern_and_group() -> None:
    events: list[tuple[str, str]] = []
    ex = Extractor(
        builtin=False,
        patterns=[{"regex": r"phase=(?P<phase>\w+) loss=(?P<loss>\S+)"}],
        on_event=lambda r, m: events.append((r, m)),
    )
    got = feed_all(ex, ["phase=warmup loss=0.5", "phase=train loss=0.4", "phase=train loss=oops"])
    assert got == [
        (None, {"phase": "warmup", "loss": 0.5}),
        (None, {"phase": "train", "loss": 0.4}),
        (None, {"phase": "train", "loss": "oops"}),
    ]
    assert [r for r, _ in events] == ["MetricsExtractionError", "MetricsExtractionError"]
    assert "'phase'" in events[0][1] and "'loss'" in events[1][1]


def test_an_invalid_pattern_is_reported_and_the_others_still_work() -> None:
    events: list[tuple[str, str]] = []
    ex = Extractor(
        builtin=False,
        patterns=[{"regex": "(?P<x"}, {"regex": r"y=(?P<y>\d+)"}],
        on_event=lambda r, m: events.append((r, m)),
    )
    assert feed_all(ex, ["y=3"]) == [(None, {"y": 3.0})]
    assert events[0][0] == "MetricsExtractionError" and "pattern 1" in events[0][1]


def test_huge_and_binary_lines_do_not_break_extraction() -> None:
    ex = Extractor(patterns=[{"regex": r"z=(?P<z>\d+)", "lines": 2}])
    huge = "loss=0.5 - " + "x" * 1_000_000
    binary = bytes(range(256)).decode("latin-1") * 10
    got = feed_all(ex, [huge, binary, "\x00\x01 loss=0.25", "z=1"])
    assert got[0] == (None, {"loss": 0.5})
    assert (None, {"loss": 0.25}) in got and (None, {"z": 1.0}) in got


# -- the spool ------------------------------------------------------------------------------------------


def read_spool(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


def test_spool_merges_a_steps_metrics_and_writes_batches(tmp_path: Path) -> None:
    path = tmp_path / "log-a1-worker0.jsonl"
    spool = extract.Spool(str(path), "worker0", "log")
    spool.add(10.0, 1, {"loss": 0.5})
    spool.add(10.2, 1, {"acc": 0.9})  # the same step, printed together: one line
    spool.add(10.3, 1, {"loss": 0.4})  # the same name again: a new line
    spool.add(11.0, 2, {"x": float("nan"), "y": float("-inf"), "z": "text"})
    spool.event("MetricsExtractionError", "bad")
    spool.flush()
    assert spool.writes == 1
    lines = read_spool(path)
    assert lines[0] == {"t": 10.0, "s": 1, "w": "worker0", "m": {"loss": 0.5, "acc": 0.9}, "src": "log"}
    assert lines[1]["m"] == {"loss": 0.4}
    assert lines[2]["m"] == {"x": "nan", "y": "-inf", "z": "text"}
    assert lines[3]["event"] == "MetricsExtractionError" and lines[3]["message"] == "bad" and lines[3]["w"] == "worker0"


def test_spool_flush_is_due_by_time_or_count(tmp_path: Path) -> None:
    now = [0.0]
    spool = extract.Spool(str(tmp_path / "s.jsonl"), "w", "log", clock=lambda: now[0])
    spool.add(1.0, 1, {"a": 1.0})
    assert not spool.due()
    now[0] = 0.6
    assert spool.due()
    spool.flush()
    for i in range(1000):
        spool.add(float(i * 2), i, {"a": 1.0})
    assert spool.due()


def test_spool_write_errors_drop_metrics_without_raising(tmp_path: Path) -> None:
    spool = extract.Spool(str(tmp_path / "missing" / "s.jsonl"), "w", "log")
    spool.add(1.0, 1, {"a": 1.0})
    spool.flush()  # cannot even open: dropped
    assert spool.dropped == 1
    full = extract.Spool("/dev/full", "w", "log")
    full.add(1.0, 1, {"a": 1.0})
    full.flush()
    assert full.dropped == 1
    full.close()


def test_names_and_texts_are_capped() -> None:
    line = json.loads(extract.encode_point(1.0, None, "w", {"n" * 300: "v" * 5000}, "log"))
    ((name, value),) = line["m"].items()
    assert len(name) == 200 and len(value) == 1000


# -- the log tail --------------------------------------------------------------------------------------


def test_tail_takes_only_its_members_job_lines_from_its_offset(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(format_line("O@worker1", b"loss=9 (an earlier attempt)"))
    offset = log.stat().st_size
    with open(log, "ab") as fh:
        fh.write(format_line("O@worker1", b"step=1 loss=0.5", now=1000.25))
        fh.write(format_line("O@worker0", b"step=1 loss=0.7"))  # another member
        fh.write(format_line("K@worker1", b"attempt 1 ended: loss=1"))  # Kiln's own line
        fh.write(format_line("E@worker1", b"[3] acc=0.5", now=1001.5))
        fh.write(format_line("O@worker1", b"val_loss=0.6")[:-1])  # no newline yet
    spool = extract.Spool(str(tmp_path / "s.jsonl"), "worker1", "log")
    tail = extract.LogTail(str(log), offset, "worker1", Extractor(), spool)
    while tail.read_chunk(100):
        pass
    tail.finish()
    spool.flush()
    lines = read_spool(tmp_path / "s.jsonl")
    assert [(x["t"], x["s"], x["m"]) for x in lines] == [
        (1000.25, 1, {"loss": 0.5}),
        (1001.5, None, {"acc": 0.5}),
        (lines[2]["t"], 1, {"val_loss": 0.6}),
    ]


def test_tail_lag_events(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(b"".join(format_line("O", b"x" * 100) for _ in range(1000)))
    spool = extract.Spool(str(tmp_path / "s.jsonl"), "w", "log")
    tail = extract.LogTail(str(log), 0, "", Extractor(), spool)
    tail.lag_bytes = 50_000
    tail.check_lag()
    while tail.read_chunk(10_000):
        tail.check_lag()
    spool.flush()
    assert [x["event"] for x in read_spool(tmp_path / "s.jsonl")] == ["MetricsLagging", "MetricsCaughtUp"]


def test_log_time_parses_the_shims_timestamps() -> None:
    assert extract.log_time("1970-01-01T00:00:01.500000Z") == 1.5
    assert extract.log_time("garbage") is None


def test_spool_names() -> None:
    assert extract.spool_path("/m", "log", 2, "worker1") == os.path.join("/m", "log-a2-worker1.jsonl")
    assert extract.spool_path("/m", "sys", 1, "a/b") == os.path.join("/m", "sys-a1-a_b.jsonl")


def test_visible_gpus_and_system_sampler_without_nvml() -> None:
    assert extract.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,2"}) == ["0", "2"]
    assert extract.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert extract.visible_gpus({}) == []
    sampler = extract.SystemSampler(lambda: [os.getpid()], ["0"], extract.Nvml.load())
    sampler.sample()
    values = sampler.sample()
    assert values["system/rss_bytes"] > 1_000_000 and "system/cpu_percent" in values


PLAIN_KEYS = [
    "step",
    "Step",
    "epoch",
    "iter",
    "iteration",
    "global_step",
    "loss",
    "acc",
    "lr",
    "m0",
    "_x",
    "train_step",
]
PLAIN_VALUES = ["0", "120", "05", "0.31", "-1.5", "+2", "1e-4", "3.5E+2", "1e999", "-1e999", "7.0"]


def test_plain_lines_take_the_fast_path_with_the_scanners_result() -> None:
    """``key=number`` lines are split, not scanned; the split must agree with the scan on every such line."""
    rng = random.Random(7)
    checked = 0
    for _ in range(3000):
        tokens = [f"{rng.choice(PLAIN_KEYS)}={rng.choice(PLAIN_VALUES)}" for _ in range(rng.randint(1, 6))]
        line = rng.choice(["", " ", "\t"]) + rng.choice([" ", "  ", "\t"]).join(tokens) + rng.choice(["", " "])
        assert extract._PLAIN_LINE.fullmatch(line), line
        assert extract._recognize_plain(line) == extract._recognize_scan(line), line
        checked += 1
    assert checked == 3000


@pytest.mark.parametrize("line", ["step=1 loss=0.5 note=x", "loss=5.", "a.b=1", "loss=1%", "loss=nan", "loss: 1"])
def test_lines_that_are_not_plain_are_scanned(line: str) -> None:
    assert not extract._PLAIN_LINE.fullmatch(line)


def test_encoded_points_clean_non_finite_values_and_long_names() -> None:
    plain = {"loss": 0.5, "acc": 1.0}
    assert json.loads(extract.encode_point(1.0, 3, "w", plain, "log"))["m"] == plain
    line = json.loads(extract.encode_point(1.0, 3, "w", {"a": 1.0, "b": float("inf"), "c": float("nan")}, "log"))
    assert line["m"] == {"a": 1.0, "b": "inf", "c": "nan"}
    line = json.loads(extract.encode_point(1.0, 3, "w", {"x" * 300: 2.0}, "log"))
    assert line["m"] == {"x" * 200: 2.0}
