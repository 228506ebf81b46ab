"""Comparator networks and the compiled order-statistic kernels."""

from __future__ import annotations

import functools
import itertools
import logging

import numpy as np
import pytest
import torch
from fedplat.aggregators import coordinatewise as cw
from fedplat.aggregators.kernels import fused_sort as fs
from fedplat.aggregators.kernels import order_stats as os_
from fedplat.aggregators.kernels.order_stats import ColumnReduction
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


def reductions(n: int) -> list[ColumnReduction]:
    """Every coordinate-wise rule's reduction for ``n`` rows."""
    out = [ColumnReduction(("median", n), None, cw.median_of_sorted)]
    for trim in range(0, (n - 1) // 2 + 1):
        out.append(
            ColumnReduction(
                ("trimmed_mean", n, trim),
                tuple(range(trim, n - trim)),
                functools.partial(cw.trimmed_mean_of_sorted, trim=trim),
            )
        )
    for f in range(n):
        out.append(
            ColumnReduction(
                ("meamed", n, f), None, functools.partial(cw.meamed_of_sorted, f=f)
            )
        )
    return out


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 40),
    d=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
    ties=st.booleans(),
)
def test_network_reductions_match_a_plain_sort(
    n: int, d: int, seed: int, ties: bool
) -> None:
    """What the compiled kernel computes (the comparator network, pruned to the
    ranks a reduction reads, then the reduction) equals the reduction over
    ``torch.sort``'s columns and the eager bitonic path."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen)
    if ties:
        x = x.round()
    rows = list(x.sort(dim=0).values.unbind(0))
    for red in reductions(n):
        got = fs.sorted_reduce(x, red.ranks, red.reduce)
        want = red.reduce(rows)
        eager = os_.reduce_columns(x, red)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b), red.key
        assert torch.equal(eager.aggregate, want[0]), red.key


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
    # MeaMed traps: the five values closest to the median 1 are 0, 1,
    # 1.5, 1.6, 1.7 (mean 1.16; the lowest window of largest distance 1 would
    # give 0.5), and a huge excluded value must not touch the mean.
    x[:, 100] = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.5, 1.6, 1.7])
    x[:, 101] = torch.tensor([-1e7, 1.2, 1.3, 1.25, 1.35, 1.45, 1.0])
    eager = {}
    monkeypatch.setenv("FEDPLAT_FUSED_ORDER_STATS", "0")
    eager["median"] = cw.coordinate_median(x)
    eager["trimmed_mean"] = cw.coordinate_trimmed_mean(x, 2)
    eager["meamed"] = cw.coordinate_meamed(x, 2)
    monkeypatch.setenv("FEDPLAT_FUSED_ORDER_STATS", "sync")
    fused = {
        "median": cw.coordinate_median(x),
        "trimmed_mean": cw.coordinate_trimmed_mean(x, 2),
        "meamed": cw.coordinate_meamed(x, 2),
    }
    for key in [("median", 7), ("trimmed_mean", 7, 2), ("meamed", 7, 2)]:
        assert fs.full_key(key, x) in fs._KERNELS._ready, key  # really compiled
    assert torch.equal(fused["median"].aggregate, eager["median"].aggregate)
    for name in ("trimmed_mean", "meamed"):
        assert torch.allclose(fused[name].aggregate, eager[name].aggregate, atol=1e-6)
    for name in fused:
        assert torch.allclose(fused[name].kept, eager[name].kept)
    meamed = fused["meamed"].aggregate.double()
    assert float(meamed[100]) == pytest.approx(5.8 / 5, rel=1e-7)
    closest = torch.tensor([1.2, 1.3, 1.25, 1.35, 1.45]).double()  # drops 1.0
    assert float(meamed[101]) == pytest.approx(float(closest.mean()), rel=1e-7)
    # NaN rows propagate (the rules drop non-finite rows before sorting).
    y = x.clone()
    y[3, 10] = float("nan")
    assert torch.isnan(cw.coordinate_median(y).aggregate[10])
    # Other column counts reuse the kernel (dynamic shapes) and stay exact.
    z = torch.randn(7, 333, generator=gen)
    assert np.array_equal(
        cw.coordinate_median(z).aggregate.numpy(), np.median(z.numpy(), axis=0)
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
        first = cw.coordinate_median(x)  # eager while the compile (fails) runs
        assert fs.wait(timeout=30)
        second = cw.coordinate_median(x)  # eager for good
        cw.coordinate_trimmed_mean(x, 1)
        assert fs.wait(timeout=30)
    want = torch.from_numpy(np.median(x.numpy(), axis=0))
    assert torch.equal(first.aggregate, want) and torch.equal(second.aggregate, want)
    assert fs.full_key(("median", 6), x) in kernels._failed
    warnings = [r for r in caplog.records if "compiled order statistics" in r.message]
    assert len(warnings) == 1


def test_a_kernel_that_raises_is_dropped_for_the_eager_network(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernels = fs._Kernels()

    def faulty(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        raise RuntimeError("simulated kernel fault")

    x = torch.randn(5, 30)
    key = fs.full_key(("median", 5), x)
    kernels._ready[key] = fs._Compiled(faulty, faulty)
    monkeypatch.setattr(fs, "_KERNELS", kernels)
    monkeypatch.setattr(fs, "MIN_COLUMNS", 8)
    monkeypatch.setenv("FEDPLAT_FUSED_ORDER_STATS", "1")
    got = cw.coordinate_median(x).aggregate
    assert torch.equal(got, torch.from_numpy(np.median(x.numpy(), axis=0)))
    assert key in kernels._failed
    assert not kernels.compiled_keys()
