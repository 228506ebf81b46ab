"""A selected client's outcome states: every allowed change, and refusals."""

from __future__ import annotations

import pytest

from fedplat.protocol.outcomes import (
    FINAL_STATUSES,
    TRANSITIONS,
    IllegalTransition,
    OutcomeStatus,
    check_transition,
)
from fedplat.store import PARTICIPATION_STATUSES

S = OutcomeStatus
ENDINGS = {S.SUCCEEDED, S.REJECTED, S.DROPPED, S.LATE, S.FAILED}
#: Written out by hand, so a change to TRANSITIONS must change this too.
LEGAL = {
    S.SELECTED: ENDINGS | {S.DOWNLOADED},
    S.DOWNLOADED: ENDINGS,
    **{s: set() for s in ENDINGS},
}
PAIRS = [(a, b) for a in S for b in S]


def test_the_states_are_the_stores_participation_statuses() -> None:
    assert [s.value for s in S] == list(PARTICIPATION_STATUSES)
    assert S.SELECTED == "selected"  # a str: the store takes it as it is


def test_the_table_is_complete_and_as_written() -> None:
    assert set(TRANSITIONS) == set(S)
    assert {s: set(after) for s, after in TRANSITIONS.items()} == LEGAL
    assert FINAL_STATUSES == ENDINGS


@pytest.mark.parametrize(
    ("current", "new"), [(a, b) for a, b in PAIRS if b in LEGAL[a]], ids=str
)
def test_every_legal_transition(current: OutcomeStatus, new: OutcomeStatus) -> None:
    assert check_transition(current, new) is new
    assert check_transition(current.value, new.value) is new


@pytest.mark.parametrize(
    ("current", "new"), [(a, b) for a, b in PAIRS if b not in LEGAL[a]], ids=str
)
def test_every_illegal_transition(current: OutcomeStatus, new: OutcomeStatus) -> None:
    with pytest.raises(IllegalTransition) as info:
        check_transition(current, new)
    assert (info.value.current, info.value.new) == (current, new)
    assert repr(current.value) in str(info.value)


def test_every_state_has_an_illegal_next_state() -> None:
    for s in S:
        assert any(b not in LEGAL[s] for b in S), s


def test_the_refusal_says_what_is_allowed() -> None:
    with pytest.raises(IllegalTransition, match="allowed: none: it is final"):
        check_transition("succeeded", "failed")
    with pytest.raises(IllegalTransition, match="allowed: dropped, failed, late"):
        check_transition("downloaded", "selected")


def test_an_unknown_state_is_refused() -> None:
    with pytest.raises(ValueError, match="'accepted' is not a valid OutcomeStatus"):
        check_transition("selected", "accepted")
    with pytest.raises(ValueError):
        check_transition("unknown", "succeeded")
