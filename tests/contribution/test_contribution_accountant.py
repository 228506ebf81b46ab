"""The contribution accountant over a real store, with hand-made and FL rounds."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedplat.aggregators import ClientDecision, FedAvg
from pydantic import ValidationError

from fedplat.compression import CountSketch
from fedplat.contribution import (
    ContributionAccountant,
    ContributionError,
    ContributionSection,
    ContributionStore,
    RoundContribution,
    reward_shares,
    verify_run_ledger,
)
from fedplat.contribution.flags import (
    LOW_SCORE_OUTLIER,
    RANDOM_UPDATE,
    REPLAYED_UPDATE,
    ZERO_UPDATE,
    modified_z,
    sketch_cosine,
)
from fedplat.store import Store
from tests.support.contribution import close_accounted_round, commit_ledger

D = 4000


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Toy:
    """A smooth federated problem: the model should move to ``target``.

    Honest client ``i`` sends a step towards the target with noise shrinking
    with its data size; utility is ``1 / (1 + ||g - target|| / ||target||)``.
    """

    def __init__(self, ids: list[str], sizes: list[int], seed: int = 0) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.target = torch.randn(D, generator=self.gen)
        self.ids, self.sizes = ids, sizes
        self.global_ = torch.zeros(D)
        self.agg = FedAvg()

    def honest(self, i: int) -> torch.Tensor:
        noise = torch.randn(D, generator=self.gen) / self.sizes[i] ** 0.5
        return 0.3 * (self.target - self.global_) + noise

    def utility(self, g: torch.Tensor) -> float:
        return 1.0 / (1.0 + float((g - self.target).norm() / self.target.norm()))

    def aggregate_fn(self, u: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        return self.global_ + self.agg(u, w).aggregate

    def weights(self) -> torch.Tensor:
        return torch.tensor([float(s) for s in self.sizes])


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(str(tmp_path / "store.db")) as s:
        yield s


def _run(store: Store, ids: list[str], rounds: int = 10) -> str:
    run = store.create_run(f"run-{len(store.list_runs())}", {}, {}, rounds)
    for cid in ids:
        store.upsert_client(run.id, cid, name=cid, num_examples=10)
    return run.id


Write = Callable[[Store, ContributionAccountant, RoundContribution], None]


def _account(
    acc: ContributionAccountant,
    toy: Toy,
    r: int,
    updates: torch.Tensor,
    decisions: list[ClientDecision] | None = None,
) -> RoundContribution:
    """Account round ``r`` the way the coordinator does (FedAvg, its decisions
    and aggregate), then move the toy's global model."""
    res = toy.agg(updates, toy.weights())
    rc = acc.on_round(
        r, toy.ids, updates, toy.weights(), toy.global_, toy.aggregate_fn,
        toy.utility, res.decisions if decisions is None else decisions, None, None,
        aggregate=res.aggregate,
    )  # fmt: skip
    toy.global_ = toy.global_ + res.aggregate
    return rc


def _play(
    acc: ContributionAccountant,
    toy: Toy,
    store: Store,
    rounds: range,
    make: Any,
    write: Write = close_accounted_round,
) -> list[RoundContribution]:
    """Account ``rounds`` and store each one (with the round, by default)."""
    out = []
    for r in rounds:
        updates = torch.stack([make(i, r) for i in range(len(toy.ids))])
        rc = _account(acc, toy, r, updates)
        write(store, acc, rc)
        out.append(rc)
    return out


IDS = [f"c{i}" for i in range(8)]
SIZES = [100, 150, 200, 250, 300, 350, 400, 200]
ROLES = {"c0": "flipper", "c1": "zero", "c7": "random"}


def _behaviour(toy: Toy) -> Any:
    def make(i: int, r: int) -> torch.Tensor:
        role = ROLES.get(toy.ids[i])
        if role == "flipper":
            return -toy.honest(i)
        if role == "zero":
            return torch.zeros(D)
        if role == "random":
            return (
                torch.randn(D, generator=toy.gen) * float(toy.honest(2).norm()) / D**0.5
            )
        return toy.honest(i)

    return make


def test_accountant_scores_flags_and_rewards(store: Store) -> None:
    run_id = _run(store, IDS)
    key = Ed25519PrivateKey.generate()
    cfg = ContributionSection(
        enabled=True, scorers=["gtg_shapley", "leave_one_out", "cosine"]
    )
    acc = ContributionAccountant(cfg, store, run_id, key)
    toy = Toy(IDS, SIZES)
    rcs = _play(acc, toy, store, range(1, 6), _behaviour(toy))

    first = rcs[0]
    # U(∅) of round 2 is round 1's U(N), reused without evaluating it again.
    assert rcs[1].utility_before == first.utility_after
    assert first.valued and not first.truncated
    assert [e.seq for e in first.pending.entries] == list(range(1, 9))
    assert first.cost.utility_evaluations > 8 and first.cost.permutations >= 30
    assert first.utility_after is not None and first.utility_before is not None
    gtg = {c.client_id: c.scores["gtg_shapley"] for c in first.clients}
    # Efficiency (Shapley): a round's scores sum to ~U(N) - U(∅).
    gain = first.utility_after - first.utility_before
    assert sum(gtg.values()) == pytest.approx(gain, abs=2e-3)
    assert gtg["c0"] < 0 and min(gtg, key=gtg.__getitem__) == "c0"
    by = first.by_client()
    assert ZERO_UPDATE in by["c1"].flags and by["c1"].credit <= 0
    assert RANDOM_UPDATE in by["c7"].flags
    assert LOW_SCORE_OUTLIER in by["c0"].flags and by["c0"].suspect
    honest = ["c2", "c3", "c4", "c5", "c6"]
    assert not any(by[c].suspect for c in honest)
    assert all(by[c].scores["cosine"] > 0.5 for c in honest)
    assert by["c0"].scores["cosine"] < 0

    standing = {s.client_id: s for s in acc.standings()}
    assert standing["c1"].disqualified and standing["c7"].disqualified
    for bad in ("c0", "c1", "c7"):
        assert standing[bad].reward_share == 0.0
        assert standing[bad].cumulative < min(standing[c].cumulative for c in honest)
    assert sum(s.reward_share for s in standing.values()) == pytest.approx(1.0)
    assert sum(s.reward for s in standing.values()) == pytest.approx(cfg.budget)
    # Honest shares grow with data size (up to the noise of a toy).
    shares = [standing[c].reward_share for c in honest]
    assert shares[-1] > shares[0]
    # The last round's numbers are the standings.
    last_rc = rcs[-1].by_client()
    for cid, s in standing.items():
        assert last_rc[cid].cumulative == pytest.approx(s.cumulative)
        assert last_rc[cid].reward_share == pytest.approx(s.reward_share)

    # Everything is in the store, verifiable by a reader without the key.
    report = verify_run_ledger(store, run_id)
    assert report.ok and report.entries == 5 * 8
    last = store.list_ledger_entries(run_id, client_id="c4")[-1]
    payload = json.loads(last.payload_json)
    assert payload["cumulative"] == pytest.approx(standing["c4"].cumulative)
    assert payload["round"] == 5 and payload["attempt"] == 1
    rows = {c.client_id: c for c in store.list_contributions(run_id, 1)}
    assert set(rows) == set(IDS) and len(store.list_contributions(run_id)) == 5 * 8
    assert ZERO_UPDATE in rows["c1"].flags and rows["c1"].suspect
    assert rows["c1"].score == pytest.approx(by["c1"].credit)
    assert not rows["c4"].flags and not rows["c4"].suspect
    assert rows["c4"].scores == pytest.approx(by["c4"].scores)
    names = {m.name for m in store.list_metrics(run_id)}
    assert {"contribution.utility_evaluations", "contribution.seconds"} <= names


def test_replayed_updates_are_flagged(store: Store) -> None:
    ids = [f"c{i}" for i in range(5)]
    run_id = _run(store, ids)
    cfg = ContributionSection(enabled=True, scorers=["cosine"], primary="cosine")
    acc = ContributionAccountant(cfg, store, run_id, None)
    toy = Toy(ids, [100] * 5)
    first: dict[int, torch.Tensor] = {}
    step: list[torch.Tensor] = []

    def make(i: int, r: int) -> torch.Tensor:
        if i == 0:  # replays its own first update
            first.setdefault(i, toy.honest(i))
            return first[i]
        if i == 1 and r > 1:  # replays the previous global step, rescaled
            return 3.0 * step[-1]
        return toy.honest(i)

    before = toy.global_.clone()
    rcs = []
    for r in (1, 2, 3):
        rcs += _play(acc, toy, store, range(r, r + 1), make)
        step.append(toy.global_ - before)
        before = toy.global_.clone()
    assert not any(c.flags for c in rcs[0].clients)
    for rc in rcs[1:]:
        by = rc.by_client()
        assert REPLAYED_UPDATE in by["c0"].flags and REPLAYED_UPDATE in by["c1"].flags
        assert not any(by[c].flags for c in ("c2", "c3", "c4"))
    assert {s.client_id for s in acc.standings() if s.disqualified} == {"c0", "c1"}


def test_resume_continues_the_chain_and_totals(store: Store) -> None:
    run_id = _run(store, IDS)
    key = Ed25519PrivateKey.generate()
    cfg = ContributionSection(enabled=True)
    toy = Toy(IDS, SIZES)
    acc = ContributionAccountant(cfg, store, run_id, key)
    _play(acc, toy, store, range(1, 3), _behaviour(toy))
    before = {s.client_id: s for s in acc.standings()}

    again = ContributionAccountant(cfg, store, run_id, key)  # coordinator restart
    after = {s.client_id: s for s in again.standings()}
    assert set(after) == set(before)
    for cid, s in before.items():
        assert after[cid].cumulative == pytest.approx(s.cumulative)
        assert after[cid].disqualified == s.disqualified
        assert after[cid].suspect_rounds == s.suspect_rounds
    (rc,) = _play(again, toy, store, range(3, 4), _behaviour(toy))
    assert rc.pending.entries[0].seq == 17 and rc.pending.entries[-1].seq == 24
    assert rc.by_client()["c4"].cumulative == pytest.approx(
        before["c4"].cumulative + rc.by_client()["c4"].credit
    )
    assert verify_run_ledger(store, run_id).ok
    with pytest.raises(ContributionError, match="signed with key"):
        ContributionAccountant(cfg, store, run_id, Ed25519PrivateKey.generate())


def test_retried_round_replaces_its_earlier_attempt(store: Store) -> None:
    """A ledger may hold a round twice (a round accounted again after a restart,
    or a ledger written before rounds and ledger shared one transaction): the
    latest attempt replaces the earlier one in the totals, live and resumed."""
    ids = IDS[2:7]
    run_id = _run(store, ids)
    acc = ContributionAccountant(ContributionSection(enabled=True), store, run_id, None)
    toy = Toy(ids, SIZES[2:7])
    start = toy.global_.clone()

    def honest(i: int, r: int) -> torch.Tensor:
        return toy.honest(i)

    (one,) = _play(acc, toy, store, range(1, 2), honest, commit_ledger)
    toy.global_ = start  # the coordinator restarted before finishing round 1
    (two,) = _play(acc, toy, store, range(1, 2), honest, commit_ledger)
    assert (one.attempt, two.attempt) == (1, 2)
    standing = {s.client_id: s for s in acc.standings()}
    for c in two.clients:
        assert standing[c.client_id].cumulative == pytest.approx(c.credit)
        assert standing[c.client_id].rounds == 1
    assert not any(REPLAYED_UPDATE in c.flags for c in two.clients)
    assert len(store.list_ledger_entries(run_id)) == 10
    assert verify_run_ledger(store, run_id, require_signature=False).ok
    resumed = ContributionAccountant(acc.cfg, store, run_id, None)
    assert {s.client_id: s.cumulative for s in resumed.standings()} == pytest.approx(
        {s.client_id: s.cumulative for s in acc.standings()}
    )


def test_uncommitted_rounds_leave_no_trace(store: Store) -> None:
    """Until ``committed``, a round changes neither totals nor chain: a round
    the coordinator abandoned is accounted afresh (attempt 1, same seq)."""
    ids = IDS[2:7]
    run_id = _run(store, ids)
    acc = ContributionAccountant(ContributionSection(enabled=True), store, run_id, None)
    toy = Toy(ids, SIZES[2:7])
    updates = torch.stack([toy.honest(i) for i in range(5)])
    start = toy.global_.clone()
    abandoned = _account(acc, toy, 1, updates)
    assert acc.standings() == []
    toy.global_ = start
    again = _account(acc, toy, 1, updates)
    assert again.attempt == 1 and again.pending.entries[0].seq == 1
    with pytest.raises(ContributionError, match="last on_round"):
        acc.committed(abandoned.pending)  # not the round last accounted
    close_accounted_round(store, acc, again)
    assert [s.rounds for s in acc.standings()] == [1] * 5
    with pytest.raises(ContributionError, match="last on_round"):
        acc.committed(again.pending)  # committed once only


def test_every_skips_valuation_and_failures_are_contained(store: Store) -> None:
    ids = IDS[2:7]
    run_id = _run(store, ids)
    cfg = ContributionSection(enabled=True, every=2)
    acc = ContributionAccountant(cfg, store, run_id, None)
    toy = Toy(ids, SIZES[2:7])

    def honest(i: int, r: int) -> torch.Tensor:
        return toy.honest(i)

    rcs = _play(acc, toy, store, range(1, 4), honest)
    assert [rc.valued for rc in rcs] == [True, False, True]
    assert rcs[1].cost.utility_evaluations == 0
    assert all("cosine" in c.scores and "gtg_shapley" not in c.scores
               for c in rcs[1].clients)  # fmt: skip
    assert all(c.credit == 0.0 for c in rcs[1].clients)

    def broken(g: torch.Tensor) -> float:
        raise RuntimeError("evaluator down")

    _play(acc, toy, store, range(4, 5), honest)
    updates = torch.stack([toy.honest(i) for i in range(5)])
    rc = acc.on_round(
        5, ids, updates, None, toy.global_, toy.aggregate_fn, broken, [], None, None
    )
    assert not rc.valued and any("evaluator down" in e for e in rc.errors)
    assert "cosine" in rc.clients[0].scores  # what needs no utility still ran
    assert rc.pending.entries[-1].seq == 25  # the round is still recorded
    close_accounted_round(store, acc, rc)
    assert verify_run_ledger(store, run_id, require_signature=False).ok


class _FlakyStore:
    """A real store whose next ``close_round`` fails, before or after writing
    (a lost connection can hide a commit that happened)."""

    def __init__(self, inner: Store, *, after_write: bool) -> None:
        self.inner, self.after_write, self.armed = inner, after_write, True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def close_round(self, *a: Any, **k: Any) -> Any:
        if not self.armed:
            return self.inner.close_round(*a, **k)
        self.armed = False
        if self.after_write:
            self.inner.close_round(*a, **k)
            raise OSError("connection lost after commit")
        raise OSError("disk full")


def _write_or_discard(store: Any, acc: ContributionAccountant, rc: Any) -> None:
    """The coordinator's closing step: write, commit, or discard on failure."""
    try:
        close_accounted_round(store, acc, rc)
    except OSError:
        acc.discard()


@pytest.mark.parametrize("after_write", [False, True])
def test_failed_write_then_discard_resyncs_from_the_ledger(
    store: Store, after_write: bool
) -> None:
    ids = IDS[2:7]
    run_id = _run(store, ids)
    acc = ContributionAccountant(ContributionSection(enabled=True), store, run_id, None)
    toy = Toy(ids, SIZES[2:7])

    def honest(i: int, r: int) -> torch.Tensor:
        return toy.honest(i)

    _play(acc, toy, store, range(1, 2), honest)
    flaky: Any = _FlakyStore(store, after_write=after_write)
    start = toy.global_.clone()
    (failed,) = _play(acc, toy, flaky, range(2, 3), honest, _write_or_discard)
    stored = store.list_ledger_entries(run_id)
    assert len(stored) == (10 if after_write else 5)
    if not after_write:
        toy.global_ = start  # round 2 did not happen: it is run again
    # The accountant re-reads the ledger: the next round continues the stored
    # chain (a stale tail would fork it and the store would refuse the write).
    later = _play(acc, toy, store, range(3 if after_write else 2, 4), honest)
    assert later[0].pending.entries[0].seq == len(stored) + 1
    assert later[0].pending.entries[0].prev_hash == stored[-1].entry_hash
    assert all(rc.attempt == 1 for rc in later)
    assert verify_run_ledger(store, run_id, require_signature=False).ok
    standing = {s.client_id: s for s in acc.standings()}
    resumed = {s.client_id: s for s in ContributionAccountant(
        acc.cfg, store, run_id, None).standings()}  # fmt: skip
    for cid in ids:
        assert standing[cid].rounds == 3
        assert standing[cid].cumulative == pytest.approx(resumed[cid].cumulative)
    if after_write:  # the round that did reach the store counts once
        got = {c.client_id: c.score for c in store.list_contributions(run_id, 2)}
        assert got == pytest.approx({c.client_id: c.credit for c in failed.clients})


def test_exact_shapley_scorer_runs_on_small_rounds_only(store: Store) -> None:
    ids = IDS[2:7]
    run_id = _run(store, ids)
    cfg = ContributionSection(
        enabled=True, scorers=["gtg_shapley", "exact_shapley"], exact_max_clients=4
    )
    acc = ContributionAccountant(cfg, store, run_id, None)
    toy = Toy(ids, SIZES[2:7])

    def honest(i: int, r: int) -> torch.Tensor:
        return toy.honest(i)

    (rc,) = _play(acc, toy, store, range(1, 2), honest)
    assert any("exact_shapley skipped" in e for e in rc.errors)
    assert all("exact_shapley" not in c.scores for c in rc.clients)
    cfg = ContributionSection(enabled=True, scorers=["gtg_shapley", "exact_shapley"])
    acc = ContributionAccountant(cfg, store, run_id, None)
    (rc,) = _play(acc, toy, store, range(2, 3), honest)
    ex = torch.tensor([c.scores["exact_shapley"] for c in rc.clients])
    gtg = torch.tensor([c.scores["gtg_shapley"] for c in rc.clients])
    assert float((ex - gtg).abs().max()) < 0.2 * float(ex.abs().max())


def test_input_validation(store: Store) -> None:
    run_id = _run(store, IDS[:2])
    acc = ContributionAccountant(ContributionSection(enabled=True), store, run_id, None)
    g, u = torch.zeros(3), torch.zeros(2, 3)

    def call(**kw: Any) -> Any:
        args: dict[str, Any] = {
            "round_number": 1, "client_ids": ["a", "b"], "updates": u,
            "weights": None, "global_before": g, "aggregate_fn": lambda x, w: g,
            "utility": lambda w: 0.0, "decisions": [], "utility_before": None,
            "utility_after": None,
        }  # fmt: skip
        args.update(kw)
        return acc.on_round(**args)

    with pytest.raises(ContributionError, match="distinct"):
        call(client_ids=["a", "a"])
    with pytest.raises(ContributionError, match="global_before"):
        call(global_before=torch.zeros(4))
    with pytest.raises(ContributionError, match="finite"):
        call(updates=torch.tensor([[0.0, float("nan"), 0.0], [0.0, 0.0, 0.0]]))
    with pytest.raises(ContributionError, match="round_number"):
        call(round_number=0)


def test_config_validation() -> None:
    cfg = ContributionSection()
    assert not cfg.enabled and cfg.primary in cfg.scorers and cfg.uses_utility
    with pytest.raises(ValidationError, match="unknown scorer"):
        ContributionSection(scorers=["gtg", "cosine"])
    with pytest.raises(ValidationError, match="primary"):
        ContributionSection(scorers=["cosine"])
    with pytest.raises(ValidationError, match="duplicate"):
        ContributionSection(scorers=["cosine", "cosine"], primary="cosine")
    with pytest.raises(ValidationError, match="Extra inputs"):
        ContributionSection.model_validate({"budgets": 3})
    with pytest.raises(ValidationError, match="max_permutations"):
        ContributionSection.model_validate(
            {"gtg": {"min_permutations": 50, "max_permutations": 40}}
        )
    assert not ContributionSection(scorers=["cosine"], primary="cosine").uses_utility


def test_store_satisfies_the_protocol(store: Store) -> None:
    typed: ContributionStore = store  # mypy checks this line
    assert typed is store


# ---------------------------------------------------------------- pure rules
def test_reward_rule() -> None:
    shares = reward_shares({"a": 3.0, "b": 1.0, "c": -2.0, "d": 5.0}, {"d"})
    assert shares == {"a": 0.75, "b": 0.25, "c": 0.0, "d": 0.0}
    assert reward_shares({"a": -1.0, "b": 0.0}) == {"a": 0.0, "b": 0.0}
    with pytest.raises(ValueError, match="finite"):
        reward_shares({"a": float("inf")})


def test_modified_z_and_sketch() -> None:
    z = modified_z(torch.tensor([0.0, 0.1, 0.1, 0.2, -1.0]))
    assert float(z[-1]) < -3.5 and float(z[:4].abs().max()) < 3.5
    assert torch.equal(modified_z(torch.zeros(4)), torch.zeros(4, dtype=torch.float64))
    cs = CountSketch(rows=1, cols=256)

    def sk(x: torch.Tensor) -> torch.Tensor:
        return cs.sketch(x, round=0, seed=1, dtype=torch.float64)

    a, b = torch.randn(10_000), torch.randn(10_000)
    assert sketch_cosine(sk(a), sk(2 * a)) == pytest.approx(1.0)
    assert abs(sketch_cosine(sk(a), sk(b))) < 0.3
    both = sk(torch.stack([a, b]))
    assert both.shape == (2, 256) and both.dtype == torch.float64
    assert torch.allclose(both[1], sk(b))
    assert sketch_cosine(sk(torch.zeros(10_000)), sk(a)) == 0.0


def test_aggregator_decisions_become_labels_but_not_suspicion(store: Store) -> None:
    ids = IDS[2:7]
    run_id = _run(store, ids)
    cfg = ContributionSection(enabled=True, scorers=["cosine"], primary="cosine")
    acc = ContributionAccountant(cfg, store, run_id, None)
    toy = Toy(ids, SIZES[2:7])
    updates = torch.stack([toy.honest(i) for i in range(5)])
    decisions = [
        ClientDecision(0, 0.0, selected=False, flags=("excluded",)),
        ClientDecision(1, 0.1, flags=("clipped",)),
        *(ClientDecision(i, 0.3) for i in range(2, 5)),
    ]
    rc = _account(acc, toy, 1, updates, decisions)
    assert rc.clients[0].flags == ("agg:excluded",)
    assert rc.clients[1].flags == ("agg:clipped",)
    assert not any(c.suspect for c in rc.clients)
    weights = [json.loads(e.payload_json)["weight"] for e in rc.pending.entries]
    assert weights == [0.0, 0.1, 0.3, 0.3, 0.3]
    close_accounted_round(store, acc, rc)
    rows = store.list_contributions(run_id, 1)
    assert [r.flags for r in rows[:2]] == [("agg:excluded",), ("agg:clipped",)]
    assert not any(r.suspect for r in rows)
