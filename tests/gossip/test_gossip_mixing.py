"""Mixing maths: hand-checked weights, stochasticity properties, convergence."""

from __future__ import annotations

import math

import networkx as nx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedplat.gossip import mixing as mx


def _adj(n: int, edges: list[tuple[int, int]]) -> torch.Tensor:
    a = torch.zeros(n, n, dtype=torch.bool)
    for u, v in edges:
        a[u, v] = a[v, u] = True
    return a


def _nx_adj(g: nx.Graph) -> torch.Tensor:
    n = g.number_of_nodes()
    return _adj(n, list(g.edges()))


@st.composite
def graphs(draw: st.DrawFn, max_n: int = 9) -> torch.Tensor:
    n = draw(st.integers(1, max_n))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    chosen = draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
    return _adj(n, chosen)


# ----------------------------------------------------------- Metropolis-Hastings


def test_metropolis_hastings_path_by_hand() -> None:
    # Path 0-1-2: degrees 1, 2, 1. W01 = W12 = 1/(1+2) = 1/3.
    w = mx.metropolis_hastings(_adj(3, [(0, 1), (1, 2)]))
    third = 1 / 3
    expected = torch.tensor(
        [[2 * third, third, 0.0], [third, third, third], [0.0, third, 2 * third]],
        dtype=torch.float64,
    )
    torch.testing.assert_close(w, expected)


def test_metropolis_hastings_star_by_hand() -> None:
    # Star with centre 0 and 3 leaves: every edge weight 1/(1+3) = 1/4.
    w = mx.metropolis_hastings(_adj(4, [(0, 1), (0, 2), (0, 3)]))
    assert w[0, 0] == pytest.approx(0.25)
    assert w[1, 1] == pytest.approx(0.75)
    assert w[1, 0] == pytest.approx(0.25)
    assert w[1, 2] == 0.0


@settings(max_examples=30, deadline=None)
@given(graphs())
def test_metropolis_hastings_is_symmetric_doubly_stochastic(a: torch.Tensor) -> None:
    w = mx.metropolis_hastings(a)
    n = a.shape[0]
    torch.testing.assert_close(w, w.T)
    torch.testing.assert_close(w.sum(0), torch.ones(n, dtype=torch.float64))
    torch.testing.assert_close(w.sum(1), torch.ones(n, dtype=torch.float64))
    assert bool((w >= 0).all())
    # Support is exactly the neighbourhood (plus the diagonal).
    off = w.clone()
    off.fill_diagonal_(0)
    assert bool(((off > 0) == a).all())


@settings(max_examples=25, deadline=None)
@given(graphs())
def test_metropolis_hastings_row_equals_matrix_row(a: torch.Tensor) -> None:
    w = mx.metropolis_hastings(a)
    deg = a.sum(1)
    for i in range(a.shape[0]):
        nbrs = torch.nonzero(a[i]).reshape(-1)
        row = mx.metropolis_hastings_row(int(deg[i]), deg[nbrs])
        torch.testing.assert_close(row[0], w[i, i])
        torch.testing.assert_close(row[1:], w[i, nbrs])


def test_metropolis_hastings_converges_to_average_on_connected_graph() -> None:
    g = nx.barabasi_albert_graph(30, 2, seed=1)
    w = mx.metropolis_hastings(_nx_adj(g))
    x = torch.randn(30, 5, dtype=torch.float64)
    target = x.mean(0)
    for _ in range(400):
        x = mx.mix(w, x)
    torch.testing.assert_close(x, target.expand_as(x), atol=1e-8, rtol=0)


def test_mixing_keeps_components_apart() -> None:
    # Two disjoint edges: each pair converges to its own mean, never the global one.
    w = mx.metropolis_hastings(_adj(4, [(0, 1), (2, 3)]))
    x = torch.tensor([[0.0], [2.0], [10.0], [20.0]], dtype=torch.float64)
    for _ in range(50):
        x = mx.mix(w, x)
    torch.testing.assert_close(
        x.reshape(-1), torch.tensor([1.0, 1.0, 15.0, 15.0], dtype=torch.float64)
    )


def test_check_adjacency_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="square"):
        mx.check_adjacency(torch.zeros(2, 3, dtype=torch.bool))
    a = torch.zeros(2, 2, dtype=torch.bool)
    a[0, 1] = True
    with pytest.raises(ValueError, match="symmetric"):
        mx.metropolis_hastings(a)


# ------------------------------------------------------------------------ DecAvg


def test_data_weighted_by_hand() -> None:
    # Path 0-1-2 with sizes 100, 300, 0 (node 2 is a relay).
    w = mx.data_weighted(_adj(3, [(0, 1), (1, 2)]), torch.tensor([100.0, 300.0, 0.0]))
    expected = torch.tensor(
        [[0.25, 0.75, 0.0], [0.25, 0.75, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64
    )
    torch.testing.assert_close(w, expected)


def test_data_weighted_empty_neighbourhood_keeps_own_model() -> None:
    w = mx.data_weighted(_adj(3, [(0, 1)]), torch.tensor([0.0, 0.0, 5.0]))
    torch.testing.assert_close(w, torch.eye(3, dtype=torch.float64))


@settings(max_examples=30, deadline=None)
@given(graphs(), st.data())
def test_data_weighted_rows_are_stochastic_and_local(
    a: torch.Tensor, data: st.DataObject
) -> None:
    n = a.shape[0]
    sizes = torch.tensor(
        data.draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n)),
        dtype=torch.float64,
    )
    w = mx.data_weighted(a, sizes)
    torch.testing.assert_close(w.sum(1), torch.ones(n, dtype=torch.float64))
    hood = a | torch.eye(n, dtype=torch.bool)
    assert bool((w[~hood] == 0).all())
    for i in range(n):
        nbrs = torch.nonzero(a[i]).reshape(-1)
        row = mx.data_weighted_row(float(sizes[i]), sizes[nbrs])
        torch.testing.assert_close(row[0], w[i, i])
        torch.testing.assert_close(row[1:], w[i, nbrs])


def test_uniform_equals_equal_sizes() -> None:
    a = _adj(4, [(0, 1), (1, 2), (2, 3), (3, 0)])
    torch.testing.assert_close(
        mx.uniform(a),
        torch.where(a | torch.eye(4, dtype=torch.bool), 1 / 3, 0.0).to(torch.float64),
    )
    torch.testing.assert_close(
        mx.uniform_row(2), torch.full((3,), 1 / 3, dtype=torch.float64)
    )


def test_mix_row_matches_matrix_product() -> None:
    own = torch.tensor([1.0, 2.0])
    nb = torch.tensor([[3.0, 4.0], [5.0, 6.0]])
    w = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    torch.testing.assert_close(mx.mix_row(w, own, nb), torch.tensor([2.5, 3.5]))
    with pytest.raises(ValueError, match="weights"):
        mx.mix_row(w[:2], own, nb)


# ---------------------------------------------------------------------- push-sum


def test_push_sum_matrix_is_column_stochastic_by_hand() -> None:
    # Directed cycle 0 -> 1 -> 2 -> 0 plus 0 -> 2: out-degrees 2, 1, 1.
    a = torch.zeros(3, 3, dtype=torch.bool)
    for u, v in [(0, 1), (1, 2), (2, 0), (0, 2)]:
        a[u, v] = True
    p = mx.push_sum_matrix(a)
    expected = torch.tensor(
        [[1 / 3, 0.0, 0.5], [1 / 3, 0.5, 0.0], [1 / 3, 0.5, 0.5]], dtype=torch.float64
    )
    torch.testing.assert_close(p, expected)
    torch.testing.assert_close(p.sum(0), torch.ones(3, dtype=torch.float64))


def test_push_sum_converges_to_average_on_directed_graph() -> None:
    # Row sums of P are not 1 here, so plain P @ x would converge to a *weighted*
    # average; dividing by the pushed weights removes that bias.
    g = nx.DiGraph([(0, 1), (1, 2), (2, 3), (3, 0), (0, 2), (1, 3), (0, 3)])
    a = torch.zeros(4, 4, dtype=torch.bool)
    for u, v in g.edges():
        a[u, v] = True
    p = mx.push_sum_matrix(a)
    x0 = torch.tensor(
        [[1.0, -4.0], [2.0, 0.0], [7.0, 8.0], [10.0, 2.0]], dtype=torch.float64
    )
    state = mx.PushSumState.start(x0)
    for _ in range(200):
        state = mx.push_sum_step(p, state)
    torch.testing.assert_close(state.estimate, x0.mean(0).expand(4, 2))
    # Mass is conserved at every step.
    torch.testing.assert_close(state.x.sum(0), x0.sum(0))
    assert float(state.w.sum()) == pytest.approx(4.0)
    plain = x0.clone()
    for _ in range(200):
        plain = p @ plain
    assert not torch.allclose(plain[0], x0.mean(0), atol=1e-3)


def test_push_sum_survives_changing_links() -> None:
    # Two different directed graphs, alternating: each alone is not strongly
    # connected, their union is.
    a1 = torch.zeros(4, 4, dtype=torch.bool)
    a2 = torch.zeros(4, 4, dtype=torch.bool)
    for u, v in [(0, 1), (2, 3)]:
        a1[u, v] = True
    for u, v in [(1, 2), (3, 0)]:
        a2[u, v] = True
    p1, p2 = mx.push_sum_matrix(a1), mx.push_sum_matrix(a2)
    x0 = torch.arange(4, dtype=torch.float64).reshape(4, 1)
    state = mx.PushSumState.start(x0)
    for t in range(400):
        state = mx.push_sum_step(p1 if t % 2 else p2, state)
    torch.testing.assert_close(
        state.estimate, torch.full((4, 1), 1.5, dtype=torch.float64)
    )


def test_push_sum_share() -> None:
    share = mx.push_sum_share(torch.tensor([3.0, 6.0]), 1.5, 2)
    torch.testing.assert_close(share.x, torch.tensor([1.0, 2.0]))
    assert share.w == pytest.approx(0.5)
    with pytest.raises(ValueError):
        mx.push_sum_estimate(torch.ones(2, 1), torch.tensor([1.0, 0.0]))


# ------------------------------------------------------------------------ NoLoCo


@settings(max_examples=25, deadline=None)
@given(graphs(), st.integers(0, 2**31 - 1))
def test_random_pairs_is_a_matching_of_edges(a: torch.Tensor, seed: int) -> None:
    partner = mx.random_pairs(a, torch.Generator().manual_seed(seed))
    n = a.shape[0]
    assert bool((partner[partner] == torch.arange(n)).all())
    for i in range(n):
        j = int(partner[i])
        assert j == i or bool(a[i, j])
    # Maximal: no edge joins two unpaired nodes.
    alone = partner == torch.arange(n)
    assert not bool((a & alone[:, None] & alone[None, :]).any())


def test_random_pairs_on_complete_graph_pairs_everyone() -> None:
    a = ~torch.eye(6, dtype=torch.bool)
    seen = set()
    for s in range(30):
        partner = mx.random_pairs(a, torch.Generator().manual_seed(s))
        assert bool((partner != torch.arange(6)).all())
        seen.add(int(partner[0]))
    assert seen == {1, 2, 3, 4, 5}  # every peer gets picked eventually


def test_pair_average_conserves_sum_and_converges() -> None:
    g = nx.cycle_graph(8)
    a = _nx_adj(g)
    x = torch.randn(8, 3, dtype=torch.float64)
    total = x.sum(0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        x = mx.pair_average(mx.random_pairs(a, gen), x)
        torch.testing.assert_close(x.sum(0), total)
    assert mx.consensus_distance(x) < 1e-6


def test_noloco_outer_step_by_hand() -> None:
    # Two nodes paired. theta - phi = [1] and [3]; phi = [0] and [2].
    theta = torch.tensor([[1.0], [5.0]])
    phi = torch.tensor([[0.0], [2.0]])
    m = torch.tensor([[1.0], [0.0]])
    out = mx.noloco_outer_step(
        mx.NoLoCoState(theta, phi, m), torch.tensor([1, 0]), alpha=0.5, beta=0.5
    )
    # g_bar = 2, phi_bar = 1. m0 = 0.5*1 + 0.5*2 + 0.5*(1-0) = 2.0 -> phi0 = 2
    # m1 = 0 + 1 + 0.5*(1-2) = 0.5 -> phi1 = 2.5
    torch.testing.assert_close(out.momentum, torch.tensor([[2.0], [0.5]]))
    torch.testing.assert_close(out.phi, torch.tensor([[2.0], [2.5]]))
    torch.testing.assert_close(out.theta, out.phi)


def test_noloco_consensus_term_pulls_replicas_together() -> None:
    # With no local progress (theta == phi) only the consensus pull acts: the
    # spread must shrink; the ablation (alpha applied to g_bar only) keeps it.
    a = ~torch.eye(8, dtype=torch.bool)
    gen = torch.Generator().manual_seed(0)
    phi = torch.randn(8, 4, dtype=torch.float64)
    state = mx.NoLoCoState(phi.clone(), phi, torch.zeros_like(phi))
    start = mx.consensus_distance(phi)
    ablated = state
    for _ in range(60):
        partner = mx.random_pairs(a, gen)
        state = mx.noloco_outer_step(state, partner)
        ablated = mx.noloco_outer_step(ablated, partner, consensus=False)
    assert mx.consensus_distance(state.phi) < 0.05 * start
    assert mx.consensus_distance(ablated.phi) == pytest.approx(start)


# ---------------------------------------------------------------------- consensus


def test_consensus_distance_by_hand() -> None:
    x = torch.tensor([[0.0, 0.0], [2.0, 0.0], [1.0, 3.0], [1.0, -3.0]])
    # mean = (1, 0); squared distances 1, 1, 9, 9 -> mean 5.
    assert mx.consensus_distance(x) == pytest.approx(math.sqrt(5))
    mask = torch.tensor([True, True, False, False])
    assert mx.consensus_distance(x, mask) == pytest.approx(1.0)
    assert math.isnan(mx.consensus_distance(x, torch.zeros(4, dtype=torch.bool)))


def test_noloco_local_step_equals_pair_step() -> None:
    # A peer that knows only its partner's theta reproduces the pair update.
    gen = torch.Generator().manual_seed(3)
    theta, phi, m = (
        torch.randn(2, 5, generator=gen, dtype=torch.float64) for _ in range(3)
    )
    pair = mx.noloco_outer_step(mx.NoLoCoState(theta, phi, m), torch.tensor([1, 0]))
    for i in range(2):
        step = mx.noloco_local_step(theta.mean(0), phi[i], m[i])
        torch.testing.assert_close(step.phi, pair.phi[i])
        torch.testing.assert_close(step.momentum, pair.momentum[i])


def test_one_registry_of_mixing_rules_serves_the_sim_and_the_peers() -> None:
    # Each averaging rule's per-peer row equals the row of its matrix form.
    g = torch.tensor(
        [[0, 1, 1, 0], [1, 0, 1, 1], [1, 1, 0, 0], [0, 1, 0, 0]], dtype=torch.bool
    )
    sizes = torch.tensor([10.0, 0.0, 30.0, 5.0])
    deg = g.sum(1)
    for name in ("clipped_gossip", "metropolis_hastings", "decavg", "uniform"):
        rule = mx.get_mixing_rule(name)
        w = rule.weights(g, sizes)
        for i in range(4):
            nb = torch.nonzero(g[i]).reshape(-1)
            row = rule.row_weights(int(deg[i]), float(sizes[i]), deg[nb], sizes[nb])
            torch.testing.assert_close(row[0], w[i, i])
            torch.testing.assert_close(row[1:], w[i, nb])
    assert mx.get_mixing_rule("push_sum").debiased
    assert mx.get_mixing_rule("noloco").exchange == "pairs"
    assert set(mx.RULES) == {
        "clipped_gossip",
        "metropolis_hastings",
        "decavg",
        "uniform",
        "push_sum",
        "noloco",
    }
    with pytest.raises(ValueError, match="unknown mixing rule 'gossip'; available"):
        mx.get_mixing_rule("gossip")
    with pytest.raises(ValueError, match="already registered"):
        mx.register_mixing_rule(mx.MixingRule("uniform", "average"))
    with pytest.raises(ValueError, match="no per-peer weights"):
        mx.get_mixing_rule("push_sum").row_weights(1, 1.0, deg[:1], sizes[:1])
