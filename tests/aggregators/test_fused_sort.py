"""Comparator networks and the compiled order-statistic kernels."""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pytest
import torch
from fedplat.aggregators.kernels import fused_sort as fs
from fedplat.aggregators.kernels import order_stats as os_
from hypothesis import given, settings
from hypothesis import strategies as st


def binary_inputs(n: int) -> torch.Tensor:
    """All 2**n 0/1 columns, ``[n, 2**n]``."""
    cols = list(itertools.product((0.0, 1.0), repeat=n))
    return torch.tensor(cols, dtype=torch.float32).t().contiguous()


@pytest.mark.parametrize("n", range(1, 14))
def test_network_sorts_every_binary_input(n: int) -> None:
    # 0-1 principle (Knuth, TAOCP 5.3.4): a comparator network sorts every input
    # iff it sorts every 0/1 input, so this proves the pruned network sorts.
    x = binary_inputs(n)
    out = torch.stack(fs.apply_network(x.unbind(0), fs.comparators(n)))
    assert torch.equal(out, x.sort(dim=0).values)


@pytest.mark.parametrize("n", [2, 3, 7, 8, 13])
def test_pruned_network_keeps_requested_ranks(n: int) -> None:
    x = binary_inputs(n)
    want = x.sort(dim=0).values
    for ranks in [((n - 1) // 2, n // 2), (0,), (n - 1,), tuple(range(1, n - 1))]:
        ranks = tuple(sorted(set(r for r in ranks if 0 <= r < n)))
        if not ranks:
            continue
        comps = fs.comparators(n, ranks)
        assert len(comps) <= len(fs.comparators(n))
        out = fs.apply_network(x.unbind(0), comps)
        for r in ranks:
            assert torch.equal(out[r], want[r])


def test_pruning_saves_comparators_and_padding_rows_are_dropped() -> None:
    full = fs.comparators(50)
    assert all(0 <= i < j < 50 for i, j in full)
    assert len(fs.comparators(50, (24, 25))) < len(full)
    with pytest.raises(ValueError, match="ranks"):
        fs.comparators(5, (5,))
    with pytest.raises(ValueError, match="n must be"):
        fs.comparators(0)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40),
    d=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
    ties=st.booleans(),
)
def test_reductions_match_the_eager_rules(
    n: int, d: int, seed: int, ties: bool
) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen)
    if ties:
        x = x.round()
    med, lo, hi = fs.sorted_reduce(x, *fs.median_reduction(n))
    assert torch.equal(med, os_.coordinate_median(x).aggregate)
    assert torch.equal(lo, x.sort(dim=0).values[(n - 1) // 2])
    assert torch.equal(hi, x.sort(dim=0).values[n // 2])
    for trim in range(0, (n - 1) // 2 + 1):
        got, first, last = fs.sorted_reduce(x, *fs.trimmed_mean_reduction(n, trim))
        want = os_.coordinate_trimmed_mean(x, trim).aggregate
        assert torch.allclose(got, want, atol=1e-5)
        s = x.sort(dim=0).values
        assert torch.equal(first, s[trim]) and torch.equal(last, s[n - trim - 1])
    for f in range(n):
        got, first, last = fs.sorted_reduce(x, *fs.meamed_reduction(n, f))
        ref_mean, ref_first, ref_last = os_.closest_window(x.sort(dim=0).values, n - f)
        assert torch.allclose(got, ref_mean, atol=1e-5)
        assert torch.equal(first, ref_first) and torch.equal(last, ref_last)


def test_mode_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDPLAT_FUSED_ORDER_STATS", "yes")
    with pytest.raises(ValueError, match="FEDPLAT_FUSED_ORDER_STATS"):
        fs.mode()
    monkeypatch.setenv("FEDPLAT_FUSED_ORDER_STATS", "0")
    assert not fs.applicable(torch.zeros(5, fs.MIN_COLUMNS))


@pytest.mark.integration
def test_compiled_kernels_agree_with_the_eager_network(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One real compile per reduction (needs a C++ compiler, as CI installs)."""
    monkeypatch.setenv("FEDPLAT_FUSED_ORDER_STATS", "sync")
    monkeypatch.setattr(fs, "MIN_COLUMNS", 64)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(7, 5000, generator=gen)
    x[:, :100] = x[:, :100].round()  # ties
    eager = {}
    monkeypatch.setenv("FEDPLAT_FUSED_ORDER_STATS", "0")
    eager["median"] = os_.coordinate_median(x)
    eager["trimmed_mean"] = os_.coordinate_trimmed_mean(x, 2)
    eager["meamed"] = os_.coordinate_meamed(x, 2)
    monkeypatch.setenv("FEDPLAT_FUSED_ORDER_STATS", "sync")
    fused = {
        "median": os_.coordinate_median(x),
        "trimmed_mean": os_.coordinate_trimmed_mean(x, 2),
        "meamed": os_.coordinate_meamed(x, 2),
    }
    for key in [("median", 7), ("trimmed_mean", 7, 2), ("meamed", 7, 2)]:
        assert (*key, torch.float32) in fs._KERNELS._ready, key  # really compiled
    assert torch.equal(fused["median"].aggregate, eager["median"].aggregate)
    for name in ("trimmed_mean", "meamed"):
        assert torch.allclose(fused[name].aggregate, eager[name].aggregate, atol=1e-6)
    for name in fused:
        assert torch.allclose(fused[name].kept, eager[name].kept)
    # NaN rows propagate (the rules drop non-finite rows before sorting).
    y = x.clone()
    y[3, 10] = float("nan")
    assert torch.isnan(os_.coordinate_median(y).aggregate[10])
    # Other column counts reuse the kernel (dynamic shapes) and stay exact.
    z = torch.randn(7, 333, generator=gen)
    assert np.array_equal(
        os_.coordinate_median(z).aggregate.numpy(), np.median(z.numpy(), axis=0)
    )


def test_compile_failure_falls_back_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object) -> object:
        raise RuntimeError("no C++ compiler")

    kernels = fs._Kernels()
    monkeypatch.setattr(fs, "_KERNELS", kernels)
    monkeypatch.setattr(fs, "_compile", broken)
    monkeypatch.setattr(fs, "MIN_COLUMNS", 8)
    monkeypatch.setenv("FEDPLAT_FUSED_ORDER_STATS", "1")  # background compile
    x = torch.randn(6, 40)
    with caplog.at_level(logging.WARNING, logger=fs.__name__):
        first = os_.coordinate_median(x)  # eager while the compile (fails) runs
        assert fs.wait(timeout=30)
        second = os_.coordinate_median(x)  # eager for good
        os_.coordinate_trimmed_mean(x, 1)
        assert fs.wait(timeout=30)
    want = torch.from_numpy(np.median(x.numpy(), axis=0))
    assert torch.equal(first.aggregate, want) and torch.equal(second.aggregate, want)
    assert ("median", 6, torch.float32) in kernels._failed
    warnings = [r for r in caplog.records if "compiled order statistics" in r.message]
    assert len(warnings) == 1


def test_a_kernel_that_raises_is_dropped_for_the_eager_network(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernels = fs._Kernels()

    def faulty(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        raise RuntimeError("simulated kernel fault")

    kernels._ready[("median", 5, torch.float32)] = faulty
    monkeypatch.setattr(fs, "_KERNELS", kernels)
    monkeypatch.setattr(fs, "MIN_COLUMNS", 8)
    monkeypatch.setenv("FEDPLAT_FUSED_ORDER_STATS", "1")
    x = torch.randn(5, 30)
    got = os_.coordinate_median(x).aggregate
    assert torch.equal(got, torch.from_numpy(np.median(x.numpy(), axis=0)))
    assert ("median", 5, torch.float32) in kernels._failed
    assert not kernels.compiled_keys()
