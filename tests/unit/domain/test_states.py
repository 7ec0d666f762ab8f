"""The job state machine: the FROM→TO table every change is checked against."""

from __future__ import annotations

import itertools

import pytest

from kiln.domain.states import TERMINAL_STATES, TRANSITIONS, JobState

Q, ST, R, RS = JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.RESTARTING
OK, FAIL, CXL = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED

LEGAL = {
    (Q, ST),
    (Q, CXL),
    (Q, FAIL),
    (ST, R),
    (ST, RS),
    (ST, FAIL),
    (ST, CXL),
    (ST, Q),  # preempted before it ran
    (R, OK),
    (R, FAIL),
    (R, CXL),
    (R, RS),
    (R, Q),  # preempted: queued again without spending a restart
    (RS, ST),
    (RS, FAIL),
    (RS, CXL),
}


def test_states_are_exactly_these() -> None:
    assert [s.value for s in JobState] == [
        "QUEUED",
        "STARTING",
        "RUNNING",
        "RESTARTING",
        "SUCCEEDED",
        "FAILED",
        "CANCELLED",
    ]


def test_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(JobState)


def test_table_lists_exactly_the_legal_moves() -> None:
    table = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert table == LEGAL


@pytest.mark.parametrize(("src", "dst"), sorted(LEGAL))
def test_each_legal_move_is_allowed(src: JobState, dst: JobState) -> None:
    assert dst in TRANSITIONS[src]


@pytest.mark.parametrize(
    ("src", "dst"),
    sorted(set(itertools.product(JobState, JobState)) - LEGAL),
)
def test_every_other_move_is_absent(src: JobState, dst: JobState) -> None:
    assert dst not in TRANSITIONS[src]


@pytest.mark.parametrize("state", [OK, FAIL, CXL])
def test_terminal_states_have_no_moves(state: JobState) -> None:
    assert TRANSITIONS[state] == frozenset()
    assert state.terminal


def test_examples_of_illegal_moves() -> None:
    assert R not in TRANSITIONS[OK]
    assert Q not in TRANSITIONS[OK]
    assert R not in TRANSITIONS[Q]  # must pass through STARTING
    assert OK not in TRANSITIONS[ST]  # cannot succeed without running
    assert RS not in TRANSITIONS[Q]


def test_terminal_and_active_flags() -> None:
    assert frozenset({OK, FAIL, CXL}) == TERMINAL_STATES
    assert {s for s in JobState if s.terminal} == {OK, FAIL, CXL}
    assert {s for s in JobState if s.active} == {ST, R}


def test_no_state_moves_to_itself() -> None:
    assert all(s not in TRANSITIONS[s] for s in JobState)


def test_every_non_terminal_state_can_reach_a_terminal_state() -> None:
    for start in JobState:
        seen, frontier = {start}, [start]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen & TERMINAL_STATES, start
