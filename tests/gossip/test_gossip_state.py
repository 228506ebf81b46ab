"""What a round mixes: each neighbour's model for that round, whichever of its
pushes arrived first (a neighbour that mixed first may already have pushed its
next round), and a bounded number of rounds kept per neighbour."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedplat.gossip.state import ROUNDS_KEPT, PeerState


def _state() -> PeerState:
    return PeerState(torch.zeros(2), debiased=False)


def _push(s: PeerState, sender: str, r: int) -> None:
    s.deposit(sender, r, torch.full((2,), float(r)), 10, 2, 1.0)


def test_the_round_being_mixed_wins_over_a_newer_push() -> None:
    s = _state()
    _push(s, "1", 3)
    _push(s, "1", 4)  # neighbour 1 mixed round 3 first and pushed round 4
    _push(s, "2", 3)
    used = s.models_for(3, {"1", "2"}, 2)
    assert [m.round for m in used] == [3, 3]
    assert s.round_of("1") == 4
    latest = s.latest("1")
    assert latest is not None and latest.round == 4
    # Round 4 then mixes neighbour 1's round-4 model and 2's round 3 (stale by 1).
    assert [m.round for m in s.models_for(4, {"1", "2"}, 2)] == [4, 3]


def test_stale_missing_and_unlisted_senders() -> None:
    s = _state()
    _push(s, "1", 0)
    _push(s, "2", 5)
    _push(s, "3", 4)
    # 1 is 3 rounds old (> staleness 2): left out; 2 is only ahead: its oldest
    # newer model; 3 is not live: left out.
    assert [m.round for m in s.models_for(3, {"1", "2"}, 2)] == [5]
    assert s.models_for(3, {"9"}, 2) == []
    assert s.latest("9") is None and s.round_of("9") == -1


@settings(deadline=None)  # the first torch call is slow
@given(st.lists(st.integers(0, 50), min_size=1, max_size=30))
def test_at_most_rounds_kept_per_neighbour_the_newest(rounds: list[int]) -> None:
    s = _state()
    for r in rounds:
        _push(s, "1", r)
    held = s.inbox["1"]
    assert sorted(held) == sorted(set(rounds))[-ROUNDS_KEPT:]
    assert s.round_of("1") == max(rounds)
    for r, m in held.items():
        torch.testing.assert_close(m.x, torch.full((2,), float(r)))
