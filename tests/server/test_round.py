"""The round contract: :class:`fedplat.server.round.Round` is the only owner of an
open round, driven here directly with hand-checkable inputs (no gRPC, no store).

Every legal outcome transition is made through the round's methods, an illegal
one from every state raises, and a hypothesis property test interleaves
downloads, uploads (reserve/commit/succeed or unreserve), refusals, row writes,
sealing and closing at random: each selected client ends in exactly one final
state, the accumulator holds exactly the succeeded clients' rows, and a closed
round never changes.
"""

from __future__ import annotations

import threading
from dataclasses import astuple

import pytest
import torch
from fedplat.server.accumulator import Accepted, RowStack, RunningSum
from fedplat.server.round import NO_UPDATE, Assignment, Delivery, Outcome, Round
from hypothesis import given, settings
from hypothesis import strategies as st

from fedplat.protocol.errors import DuplicateUpdate, StaleUpdate
from fedplat.protocol.outcomes import (
    FINAL_STATUSES,
    TRANSITIONS,
    IllegalTransition,
    OutcomeStatus,
)

S = OutcomeStatus
D = 3  # model size of these rounds


def _round(n: int = 3, rows: bool = False) -> Round:
    assignments = {
        f"c{i}": Assignment(f"c{i}", f"client {i}", f"t{i}", b"n", i, i)
        for i in range(n)
    }
    acc = RowStack(n, D) if rows else RunningSum(D)
    return Round(1, 1, 100.0, 160.0, 0, assignments, acc, n)


def _delivery(examples: int = 10) -> Delivery:
    return Delivery(
        bytes_up=7, num_examples=examples, weight=float(examples), train_loss=0.5,
        metrics={"train_loss": 0.5}, clipped=False,
    )  # fmt: skip


def _upload(r: Round, cid: str, value: float) -> None:
    """What the intake does for an accepted update: refuse an answered client
    before a byte lands in its row (Intake.begin), then write the row, reserve,
    commit and succeed."""
    a = r.assignments[cid]
    if r.answered(cid):
        raise DuplicateUpdate("answered")
    with r.writing():
        row = r.accumulator.acquire(a.row)
        row.fill_(value)
        r.reserve(cid)
        r.accumulator.commit(Accepted(cid, a.row, 10.0, float(row.norm())), row)
        r.succeed(cid, _delivery(), now=130.0)


# ---------------------------------------------------------------- transitions
def _into(r: Round, cid: str, status: OutcomeStatus) -> None:
    """Bring ``cid`` from ``selected`` to ``status`` through the round."""
    if status is S.DOWNLOADED:
        r.downloaded(cid, 110.0)
    elif status is S.SUCCEEDED:
        _upload(r, cid, 1.0)
    elif status is S.DROPPED:
        r.close()
    elif status is not S.SELECTED:
        assert r.settle(cid, status, f"it was {status.value}")


@pytest.mark.parametrize(
    ("first", "then"),
    [(a, b) for a, after in TRANSITIONS.items() for b in after],
    ids=lambda s: s.value,
)
def test_every_legal_transition_through_the_round(
    first: OutcomeStatus, then: OutcomeStatus
) -> None:
    r = _round()
    _into(r, "c0", first)
    _into(r, "c0", then)
    assert r.outcomes["c0"].status is then


def test_outcomes_by_hand() -> None:
    r = _round()
    r.downloaded("c0", 110.0)
    r.downloaded("c0", 120.0)  # a second download: only the first time counts
    r.count("c0", down=100)
    _upload(r, "c0", 2.0)
    assert r.settle("c1", S.REJECTED, "bad signature", bytes_up=5)
    assert not r.settle("c1", S.LATE, "again")  # answered: nothing changes
    o0, o1 = r.outcomes["c0"], r.outcomes["c1"]
    assert (o0.status, o0.downloaded_at, o0.bytes_down) == (S.SUCCEEDED, 110.0, 100)
    assert (o0.bytes_up, o0.num_examples, o0.duration_s) == (7, 10, 20.0)
    assert (o1.status, o1.reason, o1.bytes_up) == (S.REJECTED, "bad signature", 5)
    assert r.succeeded() == ["c0"] and r.num_answered() == 2
    r.close()
    assert r.outcomes["c2"].status is S.DROPPED and r.outcomes["c2"].reason == NO_UPDATE
    assert isinstance(r.accumulator, RunningSum)
    assert r.accumulator.sum is not None
    assert torch.equal(r.accumulator.sum, torch.full((D,), 20.0))  # weight 10 x 2


@pytest.mark.parametrize("status", sorted(FINAL_STATUSES), ids=lambda s: s.value)
def test_a_final_state_never_changes(status: OutcomeStatus) -> None:
    r = _round()
    _into(r, "c0", status)
    with pytest.raises(IllegalTransition):
        r.unreserve("c0", "a bug: no reservation")  # -> failed, from a final state
    if status is not S.SUCCEEDED:
        with pytest.raises(IllegalTransition):
            r.succeed("c0", _delivery(), 130.0)
    assert r.outcomes["c0"].status is status


@pytest.mark.parametrize("status", [S.SELECTED, S.DOWNLOADED], ids=lambda s: s.value)
def test_open_states_refuse_what_they_do_not_allow(status: OutcomeStatus) -> None:
    r = _round()
    _into(r, "c0", status)
    with pytest.raises(ValueError, match="not a failure"):
        r.settle("c0", S.SUCCEEDED, "only an accepted update succeeds")
    with pytest.raises(ValueError, match="not a failure"):
        r.settle("c0", S.DOWNLOADED, "no")
    assert r.outcomes["c0"].status is status


def test_a_reservation_is_one_answer_and_blocks_sealing() -> None:
    r = _round()
    r.reserve("c0")
    with pytest.raises(DuplicateUpdate):
        r.reserve("c0")
    sealed = threading.Event()
    t = threading.Thread(target=lambda: (r.seal(0.05), sealed.set()))
    t.start()
    assert not sealed.wait(0.3)  # the reservation holds the round open
    with pytest.raises(StaleUpdate):
        r.reserve("c1")  # sealing began: no new answer
    r.succeed("c0", _delivery(), 130.0)
    assert sealed.wait(5)
    t.join()
    with pytest.raises(StaleUpdate), r.writing():
        pass
    assert not r.settle("c1", S.LATE, "sealed")


def test_a_closed_round_never_changes() -> None:
    r = _round()
    _upload(r, "c0", 1.0)
    r.close()
    before = {cid: astuple(o) for cid, o in r.outcomes.items()}
    r.count("c0", up=9, down=9)
    r.downloaded("c1", 150.0)
    assert not r.settle("c1", S.REJECTED, "too late")
    r.close()
    with pytest.raises((StaleUpdate, IllegalTransition)):
        r.reserve("c2")
    assert {cid: astuple(o) for cid, o in r.outcomes.items()} == before
    with pytest.raises(TypeError):
        r.outcomes["c0"] = Outcome()  # type: ignore[index]


# ---------------------------------------------------------------- property
ACTIONS = ("download", "upload", "refuse", "late", "fail_commit", "write", "seal")


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 6),
    rows=st.booleans(),
    plan=st.lists(
        st.tuples(st.sampled_from(ACTIONS), st.integers(0, 5), st.floats(-3, 3)),
        max_size=40,
    ),
)
def test_random_interleavings_keep_the_round_invariants(
    n: int, rows: bool, plan: list[tuple[str, int, float]]
) -> None:
    r = _round(n, rows)
    expected: dict[str, float] = {}
    for action, who, value in plan:
        cid = f"c{who % n}"
        try:
            if action == "download":
                r.downloaded(cid, 110.0)
            elif action == "upload":
                _upload(r, cid, value)
                expected[cid] = value
            elif action == "refuse":
                r.settle(cid, S.REJECTED, "refused")
            elif action == "late":
                r.settle(cid, S.LATE, "late")
            elif action == "fail_commit":
                r.reserve(cid)
                r.unreserve(cid, "could not be added")
            elif action == "write":
                with r.writing():
                    pass
            else:
                r.seal()
        except (StaleUpdate, DuplicateUpdate):
            pass  # refused answers: nothing of them may show below
    r.close()
    final = {cid: o.status for cid, o in r.outcomes.items()}
    # Each selected client ends in exactly one final state.
    assert set(final) == set(r.assignments)
    assert all(s in FINAL_STATUSES for s in final.values())
    # The aggregated rows are exactly the accepted (succeeded) ones.
    succeeded = sorted(c for c, s in final.items() if s is S.SUCCEEDED)
    assert succeeded == sorted(expected) == sorted(r.succeeded())
    in_acc = sorted(a.client_id for a in r.accumulator.accepted())
    assert in_acc == succeeded
    if rows and succeeded:
        assert isinstance(r.accumulator, RowStack)
        stack, accepted = r.accumulator.take()
        for i, a in enumerate(accepted):
            assert torch.all(stack[i] == expected[a.client_id])
    # A closed round never changes.
    snapshot = {cid: astuple(o) for cid, o in r.outcomes.items()}
    for cid in r.assignments:
        r.downloaded(cid, 150.0)
        r.count(cid, up=1)
        assert not r.settle(cid, S.FAILED, "after close")
    assert {cid: astuple(o) for cid, o in r.outcomes.items()} == snapshot
