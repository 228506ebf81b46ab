"""The maths of the norm and weight bounds (fedplat.aggregators.bounds), by hand."""

from __future__ import annotations

import pytest
import torch
from fedplat.aggregators import AggregationError
from fedplat.aggregators.bounds import (
    bound_scales,
    max_attacker_share,
    median_low,
    norm_bound,
    weight_cap,
)


def test_norm_bound_and_scales_by_hand() -> None:
    norms = torch.tensor([1.0, 1.0, 2.0, 1000.0])
    # Sorted 1, 1, 2, 1000: the lower median is the 2nd value, 1.
    assert median_low(norms) == 1.0
    bound = norm_bound(norms, 3.0)
    assert bound == 3.0
    scales = bound_scales(norms, bound)
    assert scales.tolist() == pytest.approx([1.0, 1.0, 1.0, 3.0 / 1000.0])
    # Scaled norms: 1, 1, 2, 3 (the outlier lands on the bound exactly).
    assert (scales * norms.double()).tolist() == pytest.approx([1, 1, 2, 3])


def test_the_median_is_the_lower_one_and_odd_counts_take_the_middle() -> None:
    assert median_low(torch.tensor([4.0, 3.0, 2.0, 1.0])) == 2.0
    assert median_low(torch.tensor([5.0, 1.0, 3.0])) == 3.0
    assert median_low(torch.tensor([7.0])) == 7.0


def test_one_huge_norm_among_many_does_not_move_the_bound() -> None:
    honest = torch.tensor([0.4, 0.6, 0.5, 0.7, 0.3])
    # Sorted 0.3 0.4 0.5 0.6 0.7 (1e6): the 3rd smallest of 5 or of 6 is 0.5.
    assert norm_bound(honest, 3.0) == pytest.approx(1.5)
    assert norm_bound(torch.cat([honest, torch.tensor([1e6])]), 3.0) == 1.5
    # Two attackers of six: 0.4 0.5 0.6 0.7 1e6 1e6, the 3rd is an honest 0.6.
    two = torch.cat([honest[:4], torch.tensor([1e6, 1e6])])
    assert norm_bound(two, 3.0) == pytest.approx(3 * 0.6)


def test_zero_rows_keep_scale_one_and_a_zero_bound_zeroes_the_rest() -> None:
    assert bound_scales(torch.tensor([0.0, 2.0]), 0.0).tolist() == [1.0, 0.0]


def test_weight_cap_by_hand() -> None:
    # Declared 100, 120, 10^12, 80 -> sorted 80, 100, 120, 1e12: median 100.
    assert weight_cap(torch.tensor([100, 120, 10**12, 80]), 3.0) == 300.0
    # Clients that declared nothing count as one example each.
    assert weight_cap(torch.tensor([0, 0, 50]), 2.0) == 2.0


def test_attacker_share_bound_by_hand() -> None:
    # One attacker among 10, multiplier 2: 2 / (2 + 5 + 1 - 1) = 2/7.
    assert max_attacker_share(10, 1, 2.0) == pytest.approx(2 / 7)
    # Equal honest clients give less: 2 / (2 + 9); the bound is the worst case.
    assert max_attacker_share(10, 1, 2.0) > 2 / 11
    with pytest.raises(AggregationError, match="2f < n"):
        max_attacker_share(4, 2, 2.0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: norm_bound(torch.tensor([1.0]), 0.5), "multiplier must be >= 1"),
        (lambda: norm_bound(torch.tensor([]), 2.0), "no values"),
        (lambda: norm_bound(torch.tensor([float("inf")]), 2.0), "finite"),
        (lambda: bound_scales(torch.tensor([1.0]), -1.0), ">= 0"),
        (lambda: weight_cap(torch.tensor([1.0]), float("nan")), "finite"),
    ],
)
def test_bad_inputs_are_refused(call: object, message: str) -> None:
    with pytest.raises(AggregationError, match=message):
        call()  # type: ignore[operator]
