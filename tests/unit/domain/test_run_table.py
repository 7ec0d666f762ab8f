"""The runs table's rules (kiln.domain.run_table), which console/src/runTable.ts repeats: numbers to four
significant digits (a tester read 0.00012009732465102296), default columns a person would pick (they read a
notebook's base_url and a replica's max_batch_size first, alphabetically), states in Kiln's words."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kiln.domain.run_table import default_columns, format_number, format_value, run_state

NUMBERS = [
    (0.00012009732465102296, "0.0001201"),
    (0.9123456, "0.9123"),
    (1 / 3, "0.3333"),
    (123.456, "123.5"),
    (999.95, "1000"),
    (12345.678, "12346"),  # from 1,000 up the whole part is kept
    (3.0, "3"),
    (-1.0625, "-1.063"),  # halves away from zero, as JavaScript's toExponential
    (1.2345e-5, "1.234e-5"),
    (2.5e15, "2.5e+15"),
    (0.0, "0"),
    (float("nan"), "nan"),
    (float("-inf"), "-inf"),
]


@pytest.mark.parametrize(("value", "text"), NUMBERS)
def test_numbers_keep_four_significant_digits(value: float, text: str) -> None:
    assert format_number(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [("0.00012009732465102296", "0.0001201"), ("0.0", "0.0"), ("0.10", "0.10"), ("64", "64"), ("adam", "adam"),
     (None, "-"), (True, "true"), (7, "7")],
)  # fmt: skip
def test_a_params_text_is_rounded_only_where_it_has_more_digits(value: object, text: str) -> None:
    assert format_value(value) == text


@dataclass
class Row:
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


def test_columns_the_studys_objective_then_params_that_differ_then_metrics_most_runs_report() -> None:
    trial = {"kiln.objective": "val_acc"}
    rows = [
        Row({"base_url": "/notebooks/nb-1/", "idle": "7200"}),  # a notebook
        Row({"max_batch_size": "32"}, {"system/cpu": 1.0}),  # a replica
        *(
            Row({"lr": lr, "width": "64", "optimizer": opt}, {"val_acc": 0.9, "loss": 0.1, "epoch_time": 3.0}, trial)
            for lr, opt in (("0.1", "adam"), ("0.01", "adam"), ("0.001", "sgd"))
        ),
        Row({"lr": "0.5", "width": "64"}, {"loss": 0.2, "accuracy": 0.5}),
    ]
    assert default_columns(rows) == [
        "metrics.val_acc",
        "params.lr",
        "params.optimizer",
        "metrics.loss",
        "metrics.epoch_time",
        "metrics.accuracy",
    ]


def test_one_run_shows_its_params_since_none_can_differ() -> None:
    assert default_columns([Row({"b": "1", "a": "2"}, {"m": 1.0})]) == ["params.a", "params.b", "metrics.m"]


def test_a_state_is_kiln_s_name_pruned_from_the_server_s_tag() -> None:
    assert [run_state(s, {}) for s in ("FINISHED", "KILLED", "SCHEDULED", "RUNNING", "FAILED")] == [
        "SUCCEEDED",
        "CANCELLED",
        "QUEUED",
        "RUNNING",
        "FAILED",
    ]
    assert run_state("KILLED", {"kiln.state": "PRUNED"}) == "PRUNED"
