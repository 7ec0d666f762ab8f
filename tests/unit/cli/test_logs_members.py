"""`kiln logs --worker`: a distributed job's members tag their lines; the CLI prefixes or filters them."""

from __future__ import annotations

import pytest
import typer

from kiln.cli.logs import member_tag, print_log_lines

LINES = [
    "2026-11-30T12:00:00.000000Z O@worker0 hello from 0",
    "2026-11-30T12:00:00.100000Z O@worker1 hello from 1",
    "2026-11-30T12:00:00.200000Z E@ps0 ps says",
    "2026-11-30T12:00:00.300000Z K attempt 1 failed; restarting",
    "2026-11-30T12:00:00.400000Z O plain single-worker line",
]


def test_all_members_are_prefixed(capsys: pytest.CaptureFixture[str]) -> None:
    print_log_lines(LINES)
    out = capsys.readouterr().out.splitlines()
    assert out == ["[worker 0] hello from 0", "[worker 1] hello from 1", "[ps 0] ps says", "plain single-worker line"]


def test_one_member_only_and_kilns_own_lines(capsys: pytest.CaptureFixture[str]) -> None:
    print_log_lines(LINES, member=member_tag("1"))
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["hello from 1"]
    assert "restarting" in captured.err


@pytest.mark.parametrize(("given", "tag"), [("0", "worker0"), ("12", "worker12"), ("ps1", "ps1"), ("PS0", "ps0")])
def test_member_tags(given: str, tag: str) -> None:
    assert member_tag(given) == tag


@pytest.mark.parametrize("bad", ["-1", "w1", "ps", "chief"])
def test_bad_member_is_refused_by_name(bad: str) -> None:
    with pytest.raises(typer.BadParameter, match="worker index"):
        member_tag(bad)
