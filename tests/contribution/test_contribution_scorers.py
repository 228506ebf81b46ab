"""Contribution scorers: GTG-Shapley vs exact Shapley, leave-one-out, cosine."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import torch
from fedplat.aggregators import FedAvg
from scipy.stats import spearmanr

from fedplat.contribution import (
    ContributionSection,
    GTGSettings,
    SubsetUtility,
    UtilityError,
    cosine_to_reference,
    exact_shapley,
    gtg_shapley,
    leave_one_out,
)
from fedplat.contribution.valuation import Coalitions, round_game


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    # Tiny models: intra-op threads only add contention on a shared machine.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _additive(values: Sequence[float], base: float = 0.3) -> Any:
    a = np.asarray(values, dtype=np.float64)
    return lambda s: base + float(a[list(s)].sum())


def _permutation_shapley(value: Any, n: int) -> np.ndarray:
    """Shapley values by the definition: mean marginal over all n! orders."""
    phi = np.zeros(n)
    orders = list(itertools.permutations(range(n)))
    for order in orders:
        prev = value([])
        for j, i in enumerate(order):
            cur = value(order[: j + 1])
            phi[i] += cur - prev
            prev = cur
    return phi / len(orders)


# --------------------------------------------------------------- exact Shapley
def test_exact_shapley_matches_the_definition_on_a_nonadditive_game() -> None:
    w = np.array([1.0, 2.0, 3.0, 5.0, 8.0])

    def value(s: Sequence[int]) -> float:  # concave: synergies are negative
        return math.sqrt(float(w[list(s)].sum()))

    phi = exact_shapley(value, 5)
    assert np.allclose(phi.numpy(), _permutation_shapley(value, 5), atol=1e-12)
    # Efficiency: the values split U(N) - U(∅) exactly.
    assert float(phi.sum()) == pytest.approx(value(range(5)) - value([]), abs=1e-12)


def test_exact_shapley_additive_game_and_bounds() -> None:
    a = [0.1, -0.05, 0.0, 0.2]
    assert torch.allclose(
        exact_shapley(_additive(a), 4), torch.tensor(a, dtype=torch.float64)
    )
    with pytest.raises(ValueError, match="1 <= n"):
        exact_shapley(_additive([0.0]), 0)
    with pytest.raises(ValueError, match="<= 16"):
        exact_shapley(_additive([0.0] * 17), 17)


# ---------------------------------------------------------------- GTG-Shapley
def test_gtg_is_exact_on_an_additive_game() -> None:
    a = [0.1, 0.05, -0.03, 0.2, 0.0, 0.07]
    value = _additive(a)
    res = gtg_shapley(
        value,
        6,
        value(range(6)),
        GTGSettings(within_truncation=0.0),
        np.random.default_rng(0),
    )
    # Additive: every marginal equals a_i whatever the order.
    assert np.allclose(res.values.numpy(), a, atol=1e-12)
    assert res.converged and res.permutations == 30 and not res.round_truncated


def test_gtg_between_round_truncation_zeroes_the_round() -> None:
    calls: list[Sequence[int]] = []

    def value(s: Sequence[int]) -> float:
        calls.append(list(s))
        return 0.80 + 0.001 * len(s)

    # |U(N) - U(∅)| = 0.006 <= 0.01, GTG-Shapley's between-round truncation (Liu
    # et al., ACM TIST 2022; threshold of FedML's gtg_shapley_value.py): no
    # evaluations.
    res = gtg_shapley(value, 6, value(range(6)), rng=np.random.default_rng(0))
    assert res.round_truncated and res.permutations == 0
    assert torch.equal(res.values, torch.zeros(6, dtype=torch.float64))
    assert len(calls) == 2  # U(N) by the test, U(∅) by gtg_shapley


def test_gtg_within_round_truncation_skips_the_tail() -> None:
    # Client 0 alone reaches U(N); every later marginal is truncated to 0.
    evaluated: set[tuple[int, ...]] = set()

    def value(s: Sequence[int]) -> float:
        evaluated.add(tuple(sorted(s)))
        return 0.9 if 0 in s else 0.5 + 0.01 * len(s)

    res = gtg_shapley(value, 5, 0.9, rng=np.random.default_rng(1))
    # When client 0 leads, nothing after it is evaluated.
    assert all(len(s) <= 4 for s in evaluated)
    assert float(res.values[0]) > 0.3
    # Step 3's rule: the estimate still telescopes to ~U(N) - U(∅).
    assert float(res.values.sum()) == pytest.approx(0.4, abs=1e-3)


def test_gtg_guided_permutations_let_every_client_lead() -> None:
    firsts: list[int] = []
    last_len = 0

    def value(s: Sequence[int]) -> float:
        nonlocal last_len
        if len(s) == 1 and last_len != 1:
            firsts.append(s[0])
        last_len = len(s)
        return float(len(s)) + 0.5 * (0 in s)

    n = 4
    res = gtg_shapley(
        value,
        n,
        value(range(n)),
        GTGSettings(min_permutations=8, max_permutations=8),
        np.random.default_rng(0),
    )
    assert res.permutations == 8
    # Each client leads exactly twice (singletons are cached after the first).
    assert sorted(set(firsts)) == [0, 1, 2, 3]


def test_gtg_stops_at_max_permutations_when_noisy() -> None:
    rng = np.random.default_rng(0)

    def value(s: Sequence[int]) -> float:  # no cache: pure noise never converges
        return 0.5 + float(rng.normal(0, 0.2)) + 0.1 * len(s)

    res = gtg_shapley(
        value,
        3,
        1.0,
        GTGSettings(min_permutations=3, max_permutations=12),
        np.random.default_rng(0),
    )
    assert res.permutations == 12 and not res.converged


def _digits_round(n: int, flipped: Sequence[int] = (), seed: int = 0) -> Any:
    """One FedAvg round of n digits clients from a common start (iid, sizes vary)."""
    from fedplat.data import Dataset, load_dataset, partition
    from fedplat.models import create_model, evaluate, train_epochs
    from fedplat.vectors import flatten, layout_of, load_vector

    torch.manual_seed(seed)
    train = load_dataset("digits", "train")
    test = load_dataset("digits", "test")
    sizes = [int(x) for x in np.linspace(60, 240, n)]
    parts = partition("sized", train.y.numpy(), n, seed, sizes=sizes)
    model = create_model("logreg", (1, 8, 8), 10, seed=seed)
    layout = layout_of(model)
    start = flatten(model, layout)
    rows = []
    for i, idx in enumerate(parts):
        local = train.subset(idx)
        if i in flipped:
            local = Dataset(local.x, 9 - local.y, local.name, local.num_classes)
        load_vector(model, start, layout)
        train_epochs(model, local, epochs=2, batch_size=16, lr=0.2, seed=seed + i)
        rows.append(flatten(model, layout) - start)
    updates = torch.stack(rows)
    weights = torch.tensor([float(s) for s in sizes])
    agg = FedAvg()

    def aggregate_fn(u: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        return start + agg(u, w).aggregate

    def utility(g: torch.Tensor) -> float:
        load_vector(model, g, layout)
        return float(evaluate(model, test).accuracy)

    return updates, weights, start, aggregate_fn, utility


def test_gtg_against_exact_shapley_on_six_real_clients() -> None:
    """GTG-Shapley vs exact Shapley, n = 6 digits clients (one label-flipper).

    Measured (seed 0): exact values span 0.004 .. 0.219 (sum 0.678 = U(N) - U(∅));
    GTG (42 permutations, 63 distinct coalitions shared with the exact pass) has
    MAE 0.015 (7 % of the spread) and Spearman 1.0 with exact. Over GTG seeds
    0-3 the MAE is 0.007-0.015 and Spearman 0.94-1.0: the sampling error of ~40
    of the 720 orders.
    """
    updates, weights, start, aggregate_fn, utility = _digits_round(6, flipped=[1])
    value = SubsetUtility(updates, weights, aggregate_fn, utility, utility(start))
    exact = exact_shapley(value, 6)
    assert value.evaluations == 63  # every non-empty coalition once
    gtg = gtg_shapley(value, 6, value(range(6)), rng=np.random.default_rng(0))
    mae = float((gtg.values - exact).abs().mean())
    rho = float(spearmanr(gtg.values.numpy(), exact.numpy()).statistic)
    spread = float(exact.max() - exact.min())
    print(
        f"\nGTG vs exact Shapley (n=6): MAE {mae:.4f} (value spread {spread:.3f}), "
        f"Spearman {rho:.3f}, {gtg.permutations} permutations"
    )
    assert int(exact.argmin()) == 1 == int(gtg.values.argmin())  # the flipper
    assert mae <= 0.1 * spread
    assert rho >= 0.9


def test_gtg_against_exact_on_random_smooth_games() -> None:
    """Monotone, concave games of weighted clients: GTG's estimates agree."""
    maes, rhos = [], []
    for seed in range(5):
        rng = np.random.default_rng(seed)
        w = rng.uniform(0.5, 4.0, 6)
        bad = int(rng.integers(0, 6))

        def value(s: Sequence[int], w: np.ndarray = w, bad: int = bad) -> float:
            good = sum(w[i] for i in s if i != bad)
            return 0.1 + 0.8 * (1 - math.exp(-good / 4)) - (0.15 if bad in s else 0)

        exact = exact_shapley(value, 6)
        res = gtg_shapley(value, 6, value(range(6)), rng=np.random.default_rng(seed))
        maes.append(float((res.values - exact).abs().mean()))
        rhos.append(float(spearmanr(res.values.numpy(), exact.numpy()).statistic))
    print(f"\nrandom games: MAE {np.mean(maes):.4f}, min Spearman {min(rhos):.3f}")
    assert np.mean(maes) < 0.01
    assert min(rhos) >= 0.8


# -------------------------------------------------------------- leave-one-out
def _distance_game(updates: torch.Tensor, target: torch.Tensor) -> SubsetUtility:
    """U(S) = -||mean(S) - target||: hand-checkable without training."""
    start = torch.zeros(updates.shape[1])

    def aggregate_fn(u: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        return start + u.mean(dim=0)

    def utility(g: torch.Tensor) -> float:
        return -float((g - target).norm())

    return SubsetUtility(updates, None, aggregate_fn, utility, utility(start))


def test_leave_one_out_on_hand_made_updates() -> None:
    target = torch.tensor([1.0, 0.0])
    updates = torch.tensor(
        [
            [1.0, 0.0],  # exactly the target
            [1.0, 0.0],  # a duplicate of it
            [-1.0, 0.0],  # the opposite direction
        ]
    )
    value = _distance_game(updates, target)
    full = value(range(3))  # mean = (1/3, 0): distance 2/3
    assert full == pytest.approx(-2 / 3)
    loo = leave_one_out(value, 3, full)
    # Without a good client: mean (0, 0), distance 1 -> LOO = -2/3 + 1 = 1/3.
    assert loo[0].item() == pytest.approx(1 / 3)
    assert loo[1].item() == pytest.approx(1 / 3)
    # Without the opposite one: mean (1, 0), distance 0 -> LOO = -2/3.
    assert loo[2].item() == pytest.approx(-2 / 3)
    # A single client: N \ {0} is ∅.
    single = _distance_game(updates[:1], target)
    assert leave_one_out(single, 1, single([0]))[0].item() == pytest.approx(1.0)


def test_leave_one_out_undervalues_redundant_clients() -> None:
    # Two identical helpful clients: each is replaceable, LOO gives both ~0
    # while Shapley splits the credit. This is why GTG-Shapley is primary.
    target = torch.tensor([1.0, 0.0])
    updates = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    value = _distance_game(updates, target)
    loo = leave_one_out(value, 2, value(range(2)))
    phi = exact_shapley(value, 2)
    assert torch.allclose(loo, torch.zeros(2, dtype=torch.float64))
    assert torch.allclose(phi, torch.full((2,), 0.5, dtype=torch.float64))


# ------------------------------------------------------------- subset utility
def test_subset_utility_caches_and_counts() -> None:
    calls = []

    def aggregate_fn(u: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        calls.append((u.shape[0], None if w is None else w.tolist()))
        return u.sum(dim=0)

    value = SubsetUtility(
        torch.eye(3), torch.tensor([1.0, 2.0, 3.0]), aggregate_fn, lambda g: 1.0, 0.5
    )
    assert value([]) == 0.5 and value.evaluations == 0
    assert value([2, 0]) == value((0, 2, 0)) == 1.0
    assert value.evaluations == 1 and calls == [(2, [1.0, 3.0])]
    value.remember([0, 1, 2], 0.9)
    assert value(range(3)) == 0.9 and value.evaluations == 1
    with pytest.raises(ValueError, match="out of range"):
        value([3])


def test_subset_utility_reports_failures() -> None:
    value = SubsetUtility(
        torch.eye(2), None, lambda u, w: u.sum(0), lambda g: float("nan"), 0.0
    )
    with pytest.raises(UtilityError, match="not finite"):
        value([0])

    def boom(u: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        raise RuntimeError("2f >= n")

    value = SubsetUtility(torch.eye(2), None, boom, lambda g: 1.0, 0.0)
    with pytest.raises(UtilityError, match="2f >= n"):
        value([0, 1])


# ---------------------------------------------------------------------- cosine
def test_cosine_to_reference() -> None:
    ref = torch.tensor([1.0, 1.0, 0.0])
    updates = torch.tensor(
        [[2.0, 2.0, 0.0], [-1.0, -1.0, 0.0], [0.0, 0.0, 5.0], [0.0, 0.0, 0.0]]
    )
    cos = cosine_to_reference(updates, ref)
    assert cos.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0])
    assert cos.dtype == torch.float64
    assert cosine_to_reference(updates, torch.zeros(3)).tolist() == [0.0] * 4
    with pytest.raises(ValueError):
        cosine_to_reference(updates, torch.zeros(2))


def test_the_reference_without_an_aggregate_is_the_median_rules() -> None:
    cfg = ContributionSection()
    honest = torch.ones(5, 4)
    bad = torch.full((2, 4), -100.0)
    game = round_game(
        cfg, cfg.gtg.settings(), 1, 0, torch.cat([honest, bad]), None, Coalitions()
    )
    assert torch.equal(game.reference, torch.ones(4))  # resists a minority
    # Even n: the mean of the two middle values (not torch.median's lower one).
    pair = torch.tensor([[0.0, 2.0], [4.0, -2.0]])
    game = round_game(cfg, cfg.gtg.settings(), 1, 0, pair, None, Coalitions())
    assert game.reference.tolist() == [2.0, 0.0]
