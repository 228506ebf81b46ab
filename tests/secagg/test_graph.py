"""Neighbour graphs (complete and random Harary) and the SecAgg+ parameter search."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedplat.secagg.errors import SecAggError
from fedplat.secagg.graph import (
    GraphParameters,
    harary_parameters,
    neighbours,
    shuffle,
    threshold_for,
)


def test_shuffle_is_pinned_across_versions() -> None:
    # Every party rebuilds the graph: the permutation must not depend on the
    # NumPy or Python version, only on AES-CTR output of the seed.
    assert shuffle(list(range(10)), b"seed") == [9, 1, 2, 3, 8, 4, 6, 5, 7, 0]
    assert shuffle([5], b"x") == [5] and shuffle([], b"x") == []


def test_shuffle_is_uniform_enough() -> None:
    first = Counter(
        shuffle(list(range(5)), bytes([s % 256, s // 256]))[0] for s in range(2000)
    )
    assert set(first) == set(range(5))
    assert all(300 < c < 500 for c in first.values())  # 400 expected each


@settings(max_examples=30, deadline=None)
@given(
    roster=st.lists(st.integers(0, 2**31 - 1), min_size=3, max_size=40, unique=True),
    half=st.integers(1, 6),
    seed=st.binary(min_size=1, max_size=8),
)
def test_harary_graph_is_k_regular_and_symmetric(
    roster: list[int], half: int, seed: bytes
) -> None:
    k = 2 * half
    g = neighbours(roster, k, seed)
    assert set(g) == set(roster)
    expected = min(k, len(roster) - 1)
    for u, nbrs in g.items():
        assert u not in nbrs and len(nbrs) == expected
        assert list(nbrs) == sorted(nbrs)
        assert all(u in g[v] for v in nbrs)
    assert neighbours(list(reversed(roster)), k, seed) == g  # order-free


def test_complete_graph_and_seed_dependence() -> None:
    g = neighbours([4, 1, 9], None, b"s")
    assert g == {1: (4, 9), 4: (1, 9), 9: (1, 4)}
    ids = list(range(30))
    assert neighbours(ids, 4, b"a") != neighbours(ids, 4, b"b")
    with pytest.raises(SecAggError, match="even"):
        neighbours(ids, 3, b"a")
    with pytest.raises(SecAggError, match="distinct"):
        neighbours([1, 1, 2], None, b"a")


def test_parameters_for_ten_clients_by_hand() -> None:
    # n = 10, one dropout, no corrupt client. k = 2: a client keeps both
    # neighbours alive only if the dropout is not one of them (P = 2/9 that it
    # is), so t = 2 fails correctness. k = 4: at least 3 of 4 neighbours always
    # survive, and with no corrupt client t = 2 is secure.
    assert harary_parameters(10, 0.1, 0.0) == GraphParameters(10, 4, 2)


def test_parameters_at_one_hundred_clients() -> None:
    p = harary_parameters(100, 0.1, 0.05)
    assert (p.degree, p.threshold) == (16, 6)
    # 5 corrupt clients: a complete graph needs t > 5.
    assert threshold_for(100, 99, 0.1, 0.05) == 6
    # More collusion needs more neighbours and a higher threshold.
    q = harary_parameters(100, 0.1, 0.1)
    assert q.degree > p.degree and q.threshold > p.threshold
    # Degree grows slowly with n (Bell et al.: O(log n)).
    assert harary_parameters(1000, 0.1, 0.05).degree < 3 * p.degree


def test_bad_rates_are_refused() -> None:
    with pytest.raises(SecAggError, match=r"<= 0\.9"):
        harary_parameters(100, 0.5, 0.5)
    with pytest.raises(SecAggError, match="at least 3"):
        harary_parameters(2, 0.0, 0.0)
    with pytest.raises(SecAggError, match="no threshold"):
        threshold_for(10, 2, 0.3, 0.3)
