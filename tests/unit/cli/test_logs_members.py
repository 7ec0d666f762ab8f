"""`kiln logs --worker`: a distributed job's members tag their lines; the CLI prefixes or filters them."""

from __future__ import annotations

import pytest
import typer

from kiln.cli.logs import member_tag, print_log_lines
from kiln.sdk.logs import LogLine, LogParser

# A two-worker job's log as the server stores it: every member's shim says when its attempt starts and ends.
LINES = [
    "2026-11-30T12:00:00.000000Z K@worker0 attempt 1 starting",
    "2026-11-30T12:00:00.010000Z K@worker1 attempt 1 starting",
    "2026-11-30T12:00:00.020000Z O@worker0 hello from 0",
    "2026-11-30T12:00:00.100000Z O@worker1 hello from 1",
    "2026-11-30T12:00:00.200000Z E@ps0 ps says",
    "2026-11-30T12:00:00.250000Z K@worker1 attempt 1 ended: Error (exit code 1)",
    "2026-11-30T12:00:00.260000Z K@worker0 attempt 1 ended: GangStopped (exit code 143)",
    "2026-11-30T12:00:00.300000Z K attempt 1 failed; restarting",
    "2026-11-30T12:00:00.400000Z O plain single-worker line",
]


def records(lines: list[str] = LINES) -> list[LogLine]:
    parser = LogParser()
    return [parser.parse(line) for line in lines]


def test_all_members_are_prefixed(capsys: pytest.CaptureFixture[str]) -> None:
    print_log_lines(records())
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert out == ["[worker 0] hello from 0", "[worker 1] hello from 1", "[ps 0] ps says", "plain single-worker line"]
    assert captured.err.splitlines() == [
        "[worker 0] [kiln] attempt 1 starting",
        "[worker 1] [kiln] attempt 1 starting",
        "[worker 1] [kiln] attempt 1 ended: Error (exit code 1)",
        "[worker 0] [kiln] attempt 1 ended: GangStopped (exit code 143)",
        "[kiln] attempt 1 failed; restarting",
    ]


def test_one_member_shows_its_own_and_the_jobs_kiln_lines_once_marked_as_kilns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Each of Kiln's lines once: worker 0's "attempt 1 starting" is not worker 1's (it used to print both,
    # unmarked, so the one view showed every line of Kiln's twice).
    print_log_lines(records(), member=member_tag("1"))
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["hello from 1"]
    assert captured.err.splitlines() == [
        "[kiln] attempt 1 starting",
        "[kiln] attempt 1 ended: Error (exit code 1)",
        "[kiln] attempt 1 failed; restarting",
    ]


def test_timestamps_are_the_stored_ones(capsys: pytest.CaptureFixture[str]) -> None:
    print_log_lines(records(LINES[2:3]), timestamps=True)
    assert capsys.readouterr().out == "2026-11-30T12:00:00.020000Z [worker 0] hello from 0\n"


@pytest.mark.parametrize(("given", "tag"), [("0", "worker0"), ("12", "worker12"), ("ps1", "ps1"), ("PS0", "ps0")])
def test_member_tags(given: str, tag: str) -> None:
    assert member_tag(given) == tag


@pytest.mark.parametrize("bad", ["-1", "w1", "ps", "chief"])
def test_bad_member_is_refused_by_name(bad: str) -> None:
    with pytest.raises(typer.BadParameter, match="worker index"):
        member_tag(bad)


def test_stored_lines_print_like_records(capsys: pytest.CaptureFixture[str]) -> None:
    print_log_lines(["", *LINES], member=member_tag("1"))  # e.g. a runtime build's log, read as text
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["hello from 1"]
    assert captured.err.splitlines()[0] == "[kiln] attempt 1 starting"
