"""ClippedGossip maths: hand-checked clips and radii, weights that nothing a
neighbour declares can steer, the bound on a Byzantine neighbour (hypothesis),
and the matrix form equal to the per-peer form."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedplat.gossip import mixing as mx

F64 = torch.float64


def _adj(n: int, edges: list[tuple[int, int]]) -> torch.Tensor:
    a = torch.zeros(n, n, dtype=torch.bool)
    for u, v in edges:
        a[u, v] = a[v, u] = True
    return a


# ------------------------------------------------------------------ CLIP


def test_clip_by_hand() -> None:
    z = torch.tensor([[3.0, 4.0], [3.0, 4.0], [0.0, 0.0], [6.0, 8.0]])
    tau = torch.tensor([10.0, 2.5, 1.0, 0.0], dtype=F64)
    # ||(3, 4)|| = 5: inside 10 unchanged, scaled by 2.5 / 5 = 0.5 to (1.5, 2);
    # the zero difference stays zero; radius 0 removes the difference.
    expected = torch.tensor([[3.0, 4.0], [1.5, 2.0], [0.0, 0.0], [0.0, 0.0]])
    torch.testing.assert_close(mx.clip(z, tau), expected)


def test_clip_drops_a_difference_that_overflowed() -> None:
    z = torch.tensor([[math.inf, 1.0], [1.0, 1.0]])
    out = mx.clip(z, torch.tensor([1.0, math.inf], dtype=F64))
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0], [1.0, 1.0]]))


# ------------------------------------------------------------------ radius


@pytest.mark.parametrize(
    ("dist", "weights", "fraction", "tau"),
    [
        # Two equal neighbours: the farther is clipped to the nearer's distance.
        ([1.0, 100.0], [1.0, 1.0], 0.5, 1.0),
        # Three equal: 1/3 of the weight <= 1/2 is clipped, 2/3 is not: tau = 2.
        ([3.0, 1.0, 2.0], [1.0, 1.0, 1.0], 0.5, 2.0),
        # Four equal: the two farthest (exactly half the weight) are clipped.
        ([4.0, 1.0, 3.0, 2.0], [1.0, 1.0, 1.0, 1.0], 0.5, 2.0),
        # One neighbour: no honest reference, nothing clipped (reference code).
        ([7.0], [1.0], 0.5, 7.0),
        # delta = 0: nothing clipped, plain gossip.
        ([3.0, 1.0, 2.0], [1.0, 1.0, 1.0], 0.0, 3.0),
        # Weighted: the farthest holds 0.1 of the weight, the next 0.6, so only
        # the farthest fits in delta = 0.5; tau is the next one's distance.
        ([10.0, 5.0, 1.0], [0.1, 0.6, 0.3], 0.5, 5.0),
        # A heavy farthest neighbour (0.6 > 0.5) cannot be clipped.
        ([10.0, 5.0, 1.0], [0.6, 0.1, 0.3], 0.5, 10.0),
    ],
)
def test_clipping_radius_by_hand(
    dist: list[float], weights: list[float], fraction: float, tau: float
) -> None:
    got = mx.clipping_radius(torch.tensor([dist]), torch.tensor([weights]), fraction)
    assert got.tolist() == [tau]


def test_clipping_radius_rows_padding_and_no_neighbours() -> None:
    # Row 0 has two neighbours and a padding slot (weight 0, any distance);
    # row 1 has none.
    dist = torch.tensor([[1.0, 100.0, 1e9], [5.0, 5.0, 5.0]])
    w = torch.tensor([[0.25, 0.25, 0.0], [0.0, 0.0, 0.0]])
    assert mx.clipping_radius(dist, w).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match=r"clip fraction must be in \[0, 1\), got 1"):
        mx.clipping_radius(dist, w, 1.0)
    with pytest.raises(ValueError, match="non-negative"):
        mx.clipping_radius(dist, -w)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 1e6), min_size=2, max_size=12))
def test_one_clipped_neighbour_is_the_reference_codes_rule(dist: list[float]) -> None:
    # epfml/byzantine-robust-decentralized-optimizer, SelfCenteredClipping:
    # tau = sorted(distances)[-2]. Equal weights and delta = 1/k clip one.
    k = len(dist)
    got = mx.clipping_radius(
        torch.tensor([dist], dtype=F64), torch.ones(1, k), fraction=1.0 / k
    )
    assert float(got[0]) == sorted(dist)[-2]


# ------------------------------------------------------------------ weights


def test_weights_ignore_what_neighbours_declare() -> None:
    rule = mx.get_mixing_rule(mx.DEFAULT_RULE)
    honest = rule.row_weights(
        2, 100.0, torch.tensor([2, 2]), torch.tensor([100.0, 100.0])
    )
    lying = rule.row_weights(
        2, 100.0, torch.tensor([1, 10**9]), torch.tensor([1e12, 0.0])
    )
    third = torch.full((3,), 1 / 3, dtype=F64)
    torch.testing.assert_close(honest, third)
    torch.testing.assert_close(lying, third)
    # A live neighbour whose model did not arrive keeps its share with the peer.
    torch.testing.assert_close(
        rule.row_weights(3, 0.0, torch.tensor([5, 5]), torch.tensor([1.0, 1.0])),
        torch.tensor([0.5, 0.25, 0.25], dtype=F64),
    )
    # The legacy rules do read the declarations (why they are not the default).
    decavg = mx.get_mixing_rule("decavg").row_weights(
        2, 100.0, torch.tensor([1, 1]), torch.tensor([1e12, 100.0])
    )
    assert float(decavg[1]) > 0.999


def test_default_rule_everywhere() -> None:
    import argparse

    from fedplat.cli.gossip_flags import training_flags
    from fedplat.gossip.config import PeerConfig
    from fedplat.gossip.scenario import MixingSpec

    assert mx.DEFAULT_RULE == "clipped_gossip" in mx.RULES
    assert PeerConfig(node_id="a").rule == mx.DEFAULT_RULE
    assert MixingSpec().rule == mx.DEFAULT_RULE
    flags = argparse.ArgumentParser()
    training_flags(flags)
    assert flags.parse_args([]).rule == mx.DEFAULT_RULE  # fedplat gossip node
    rule = mx.get_mixing_rule("clipped_gossip")
    assert rule.exchange == "average" and not rule.debiased
    with pytest.raises(ValueError, match="'clipped_gossip' is already registered"):
        mx.register_mixing_rule(mx.MixingRule("clipped_gossip", "average"))


# ------------------------------------------------------------------ the step


def test_clipped_gossip_row_by_hand() -> None:
    own = torch.tensor([0.0, 0.0])
    nb = torch.tensor([[1.0, 0.0], [0.0, 100.0]])
    w = mx.own_degree_row(2, 2)  # 1/3 each
    # Distances 1 and 100: tau = 1, the second difference becomes (0, 1).
    out = mx.clipped_gossip_row(w, own, nb)
    torch.testing.assert_close(out, torch.tensor([1 / 3, 1 / 3]))
    torch.testing.assert_close(mx.clipped_gossip_row(w[:1], own, nb[:0]), own)


def test_without_clipping_it_is_plain_gossip() -> None:
    gen = torch.Generator().manual_seed(0)
    a = _adj(5, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0), (0, 2)])
    w = mx.uniform(a)
    x = torch.randn(5, 7, generator=gen, dtype=F64)
    pub = x + 0.1 * torch.randn(5, 7, generator=gen, dtype=F64)
    torch.testing.assert_close(
        mx.clipped_gossip(w, x, pub, fraction=0.0), mx.mix_public(w, x, pub)
    )


@st.composite
def graph_and_models(
    draw: st.DrawFn,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = draw(st.integers(1, 8))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    chosen = draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=gen)
    # Some senders lie by a lot: public copies far from the models.
    scale = torch.tensor([draw(st.sampled_from([0.0, 0.1, 1e3])) for _ in range(n)])
    public = x + scale[:, None] * torch.randn(n, 6, generator=gen)
    return _adj(n, chosen), x, public


@settings(max_examples=40, deadline=None)
@given(graph_and_models())
def test_matrix_form_equals_each_peers_row(
    case: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    a, x, public = case
    rule = mx.get_mixing_rule(mx.DEFAULT_RULE)
    w = rule.weights(a, torch.ones(a.shape[0]))
    out = rule.mix(w, x, public)
    deg = a.sum(1)
    for i in range(a.shape[0]):
        nb = torch.nonzero(a[i]).reshape(-1)
        row = rule.row_weights(int(deg[i]), 1.0, deg[nb], torch.ones(nb.numel()))
        torch.testing.assert_close(
            rule.mix_row(row, x[i], public[nb]), out[i], rtol=1e-5, atol=1e-4
        )


# ------------------------------------------------------------------ the bound


@settings(max_examples=60, deadline=None)
@given(
    honest=st.integers(1, 6),
    magnitude=st.floats(1.0, 1e30),
    seed=st.integers(0, 2**31 - 1),
)
def test_a_byzantine_neighbour_moves_a_peer_by_at_most_its_weight_times_tau(
    honest: int, magnitude: float, seed: int
) -> None:
    """One Byzantine among ``honest + 1`` equally weighted neighbours (at most
    half the weight, the default delta) sends a vector of any size: it moves the
    peer by at most ``W_ib * tau_i``, and ``tau_i`` is at most the largest honest
    distance, so the whole step is bounded without looking at what it sent."""
    gen = torch.Generator().manual_seed(seed)
    d = 5
    own = torch.randn(d, generator=gen, dtype=F64)
    good = own + torch.randn(honest, d, generator=gen, dtype=F64)
    direction = torch.randn(d, generator=gen, dtype=F64)
    bad = own + magnitude * direction / direction.norm()
    nb = torch.cat([good, bad[None]])
    k = honest + 1
    w = mx.own_degree_row(k, k)
    out = mx.clipped_gossip_row(w, own, nb)

    dist = (nb - own).norm(dim=1)
    tau = float(mx.clipping_radius(dist[None], w[None, 1:])[0])
    honest_far = float(dist[:honest].max())
    assert tau <= honest_far * (1 + 1e-12)
    honest_part = own + (
        w[1 : honest + 1, None]
        * mx.clip(good - own, torch.full((honest,), tau, dtype=F64))
    ).sum(0)
    moved_by_liar = float((out - honest_part).norm())
    assert moved_by_liar <= float(w[-1]) * tau * (1 + 1e-9) + 1e-12
    assert float((out - own).norm()) <= float(w[1:].sum()) * honest_far * (1 + 1e-9)


def test_honest_consensus_under_a_huge_neighbour_stays_with_the_honest() -> None:
    """Pure averaging on a ring of 6 with node 2 sending 10^6 every step (no
    training, only the mixing acts): the honest models end within the honest
    start's radius of the honest start's mean (0.56-0.82 of it over seeds 0-5,
    measured), while Metropolis-Hastings drags them ~10^6 away."""
    a = _adj(6, [(i, (i + 1) % 6) for i in range(6)])
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(6, 4, generator=gen, dtype=F64)
    honest = torch.tensor([True, True, False, True, True, True])
    centre = x0[honest].mean(0)
    radius = float((x0[honest] - centre).norm(dim=1).max())
    spread = {}
    for name in ("clipped_gossip", "metropolis_hastings"):
        rule = mx.get_mixing_rule(name)
        w = rule.weights(a, torch.ones(6))
        x = x0.clone()
        for _ in range(200):
            public = x.clone()
            public[2] = 1e6
            x = rule.mix(w, x, public)
        spread[name] = float((x[honest] - centre).norm(dim=1).max()) / radius
    assert spread["clipped_gossip"] <= 1.0, spread
    assert spread["metropolis_hastings"] > 1e3, spread
