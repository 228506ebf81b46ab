"""Central DP in sketch space: the norm bound of a count-sketch, noise on the
aggregate sketch, de-sketching afterwards."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedplat.compression import CountSketch
from fedplat.compression.sketch import mean_sketch
from fedplat.compression.wire import dense_payload, sketch_payload
from fedplat.privacy import (
    PrivacyError,
    count_sketch_norm_bound,
    dp_sketch_release,
    make_noise_generator,
    noise_sketch_sum,
)

D, ROUND, SEED = 2000, 3, 11


def _matrix(cs: CountSketch, d: int) -> torch.Tensor:
    """The sketch matrix R [rows * cols, d], column by column."""
    eye = torch.eye(d)
    return torch.stack(
        [cs.encode(eye[i], round=ROUND, seed=SEED).values for i in range(d)], 1
    )


def test_bound_is_tight_for_one_row() -> None:
    cs = CountSketch(rows=1, cols=100)
    loads = cs.bucket_loads(D, round=ROUND, seed=SEED)
    assert int(loads.sum()) == D
    bound = count_sketch_norm_bound(cs, D, round=ROUND, seed=SEED)
    assert bound == pytest.approx(math.sqrt(int(loads.max())))  # ~ sqrt(20 + ...)
    # Equality: put sign-matched mass on every coordinate of the fullest bucket.
    r = _matrix(cs, D)
    a = int(loads.argmax())
    h = r[a].clone()  # entries +-1 on that bucket's coordinates, 0 elsewhere
    ratio = float(torch.linalg.vector_norm(r @ h) / torch.linalg.vector_norm(h))
    assert ratio == pytest.approx(bound, rel=1e-5)


def test_bound_at_the_compression_benchmark_size() -> None:
    # docs/privacy.md: L is 6.2-6.6 for d = 199,210 in 9,961 buckets.
    cs = CountSketch(rows=1, cols=9961)
    for rnd, seed in ((1, 0), (2, 1), (3, 0)):
        assert 6.1 < count_sketch_norm_bound(cs, 199_210, round=rnd, seed=seed) < 6.6


def test_bound_is_above_the_operator_norm_for_several_rows() -> None:
    cs = CountSketch(rows=3, cols=40)
    bound = count_sketch_norm_bound(cs, 300, round=ROUND, seed=SEED)
    top = float(torch.linalg.matrix_norm(_matrix(cs, 300), ord=2))
    assert top <= bound + 1e-5


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31), rows=st.integers(1, 4))
def test_bound_holds_for_any_update(seed: int, rows: int) -> None:
    cs = CountSketch(rows=rows, cols=40)
    bound = count_sketch_norm_bound(cs, 300, round=ROUND, seed=SEED)
    h = torch.randn(300, generator=torch.Generator().manual_seed(seed))
    h[: seed % 300] = 0.0  # sparse and dense updates alike
    s = cs.encode(h, round=ROUND, seed=SEED).values
    norm_h = float(torch.linalg.vector_norm(h))
    assert float(torch.linalg.vector_norm(s)) <= bound * norm_h * (1 + 1e-6)


def test_release_is_desketch_of_noised_sum_over_expected() -> None:
    cs = CountSketch(rows=1, cols=50)
    g = torch.Generator().manual_seed(0)
    updates = [torch.randn(D, generator=g) for _ in range(3)]
    sketches = [cs.encode(u, round=ROUND, seed=SEED) for u in updates]
    total = sketch_payload(
        sketches[0].sketch, D, mean_sketch(sketches).values * 3.0
    )  # the sum of the three sketches
    rel = dp_sketch_release(
        total,
        3,
        sketcher=cs,
        expected=4.0,
        clip_norm=1.0,
        noise_multiplier=0.0,
        generator=make_noise_generator(0),
    )
    want = cs.desketch(total.values / 4.0, D, round=ROUND, seed=SEED)
    torch.testing.assert_close(rel.mean, want)
    # Linear: de-sketching the sum is summing the de-sketched updates.
    each = sum(cs.decode(s) for s in sketches) / 4.0
    torch.testing.assert_close(rel.mean, each, rtol=1e-4, atol=1e-4)


def test_noise_lands_in_sketch_space_with_std_z_s_l() -> None:
    cs = CountSketch(rows=2, cols=50_000)
    zero = cs.encode(torch.zeros(1000), round=ROUND, seed=SEED)
    noised = noise_sketch_sum(
        zero,
        clip_norm=0.5,
        noise_multiplier=2.0,
        generator=make_noise_generator(3),
        norm_bound=1.5,
    )
    assert noised.sketch == zero.sketch and noised.values.numel() == 100_000
    assert float(noised.values.std()) == pytest.approx(2.0 * 0.5 * 1.5, rel=0.02)
    with pytest.raises(PrivacyError, match="sketch payload"):
        noise_sketch_sum(
            dense_payload(torch.zeros(3)),
            clip_norm=1.0,
            noise_multiplier=1.0,
            generator=make_noise_generator(0),
        )
    with pytest.raises(PrivacyError, match="norm_bound"):
        noise_sketch_sum(
            zero,
            clip_norm=1.0,
            noise_multiplier=1.0,
            generator=make_noise_generator(0),
            norm_bound=0.5,
        )
