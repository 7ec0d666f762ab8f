"""The SDK's log records: stored lines parsed into time, source, worker, attempt and text."""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from datetime import UTC, datetime

import pytest

from kiln.injob.logline import format_line
from kiln.sdk.logs import LogLine, LogParser, LogSource, member_label, parse_time

T = "2026-11-30T12:00:00.250000Z"
WHEN = datetime(2026, 11, 30, 12, 0, 0, 250000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("raw", "source", "worker", "text", "shown"),
    [
        (f"{T} O hello", LogSource.STDOUT, None, "hello", "hello"),
        (f"{T} E oops: x", LogSource.STDERR, None, "oops: x", "oops: x"),
        (f"{T} K restarting", LogSource.KILN, None, "restarting", "[kiln] restarting"),
        (f"{T} O@worker1 hi there", LogSource.STDOUT, "worker1", "hi there", "[worker 1] hi there"),
        (f"{T} K@ps0 stopping", LogSource.KILN, "ps0", "stopping", "[ps 0] [kiln] stopping"),
        (f"{T} O ", LogSource.STDOUT, None, "", ""),  # an empty line the job printed
        (f"{T} O a\rb", LogSource.STDOUT, None, "a\rb", "a\rb"),  # a progress bar's carriage return is text
    ],
)
def test_a_stored_line_becomes_a_record(raw: str, source: LogSource, worker: str | None, text: str, shown: str) -> None:
    record = LogParser().parse(raw)
    assert (record.time, record.source, record.worker, record.text) == (WHEN, source, worker, text)
    assert str(record) == shown


def test_a_line_written_by_the_shared_format_parses_back() -> None:
    raw = format_line("E@worker2", b"loss=0.5", now=WHEN.timestamp()).decode()
    record = LogParser().parse(raw)
    assert (record.time, record.source, record.worker, record.text) == (WHEN, "stderr", "worker2", "loss=0.5")


def test_a_malformed_line_is_kept_as_stdout_text_without_a_time() -> None:
    record = LogParser().parse("no prefix at all")
    assert (record.time, record.source, record.worker, record.text) == (
        None,
        LogSource.STDOUT,
        None,
        "no prefix at all",
    )


def test_attempts_follow_kilns_starting_lines_per_member() -> None:
    parser = LogParser()
    lines = [
        f"{T} O before any attempt line (the read started mid-log)",
        f"{T} K@worker0 attempt 1 starting",
        f"{T} O@worker0 a",
        f"{T} O@worker1 b (worker 1 has not said yet)",
        f"{T} K@worker1 attempt 1 starting",
        f"{T} O@worker1 c",
        f"{T} K attempt 1 failed (Error); restarting",
        f"{T} K preempted: something about the whole job",
        f"{T} K@worker0 attempt 2 starting",
        f"{T} O@worker0 d",
        f"{T} O@worker1 e (still attempt 1's, until worker 1 says otherwise)",
        f"{T} K a note on the whole job",
    ]
    attempts = [parser.parse(line).attempt for line in lines]
    assert attempts == [None, 1, 1, None, 1, 1, 1, 1, 2, 2, 1, 2]


def test_a_single_worker_jobs_attempts() -> None:
    parser = LogParser()
    records = [
        parser.parse(f"{T} {line}")
        for line in [
            "K attempt 1 starting",
            "O x",
            "K attempt 1 failed (Error); restarting",
            "K attempt 2 starting",
            "O y",
        ]
    ]
    assert [(r.attempt, r.text) for r in records if r.source == "stdout"] == [(1, "x"), (2, "y")]


def test_records_are_frozen_and_compare_by_value() -> None:
    record = LogLine(WHEN, LogSource.STDOUT, "x", "worker0", 1)
    with pytest.raises(FrozenInstanceError):
        record.text = "y"  # type: ignore[misc]
    assert record == LogLine(WHEN, LogSource.STDOUT, "x", "worker0", 1)
    assert record.prefix(worker=False) == "" and LogLine(None, LogSource.KILN, "k").prefix(worker=False) == "[kiln] "


@pytest.mark.parametrize(("member", "label"), [("worker0", "worker 0"), ("worker12", "worker 12"), ("ps1", "ps 1")])
def test_member_labels(member: str, label: str) -> None:
    assert member_label(member) == label


@pytest.mark.parametrize("text", ["", "yesterday", "2026-11-30T12:00:00", "2026-13-30T12:00:00Z"])
def test_times_that_are_not_stored_ones_are_none(text: str) -> None:
    assert parse_time(text) is None
