"""Compiled order-statistic kernels never block a round on a recompile: a new
thread count (or other guarded runtime state) after warm-up is answered by the
eager network while its kernel compiles in the background (issue 25: the next
call blocked 14-19 s at ``n = 50``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from fedplat.aggregators import coordinatewise as cw
from fedplat.aggregators.kernels import fused_sort as fs


@pytest.fixture
def threads() -> Iterator[int]:
    """The thread count to switch to (restored afterwards)."""
    before = torch.get_num_threads()
    yield 1 if before > 1 else 2
    torch.set_num_threads(before)


def median(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.median(x.numpy(), axis=0))


def test_a_new_thread_count_compiles_in_the_background(
    monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    release = threading.Event()
    built: list[int] = []

    def slow_compile(name: str, n: int, ranks: object, reduce: fs.Reduction) -> object:
        built.append(torch.get_num_threads())
        if len(built) > 1:
            release.wait(timeout=30)  # a compile that takes as long as we like

        def kernel(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return fs.sorted_reduce(t, ranks, reduce)  # type: ignore[arg-type]

        return fs._Compiled(kernel, kernel)

    monkeypatch.setattr(fs, "_KERNELS", fs._Kernels())
    monkeypatch.setattr(fs, "_compile", slow_compile)
    monkeypatch.setattr(fs, "MIN_COLUMNS", 8)
    monkeypatch.setenv("FEDPLAT_FUSED_ORDER_STATS", "1")
    x = torch.randn(5, 40)
    cw.coordinate_median(x)
    assert fs.wait(timeout=30)
    assert fs.full_key(("median", 5), x) in fs.compiled_keys()
    torch.set_num_threads(threads)
    start = time.perf_counter()
    got = cw.coordinate_median(x).aggregate  # eager: the new kernel is compiling
    assert time.perf_counter() - start < 5.0
    assert torch.equal(got, median(x))
    assert fs.full_key(("median", 5), x) not in fs.compiled_keys()
    release.set()
    assert fs.wait(timeout=30)
    assert built[-1] == threads
    assert fs.full_key(("median", 5), x) in fs.compiled_keys()
    assert torch.equal(cw.coordinate_median(x).aggregate, median(x))


@pytest.mark.integration
def test_changing_threads_after_a_real_compile_does_not_block(
    monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """Real compiles (needs a C++ compiler): the call after
    ``torch.set_num_threads`` returns at eager speed, and the kernel compiled
    for the new count is then served without recompiling."""
    monkeypatch.setattr(fs, "_KERNELS", fs._Kernels())
    monkeypatch.setattr(fs, "MIN_COLUMNS", 64)
    monkeypatch.setenv("FEDPLAT_FUSED_ORDER_STATS", "sync")
    x = torch.randn(9, 5000)
    assert torch.equal(cw.coordinate_median(x).aggregate, median(x))
    assert fs.full_key(("median", 9), x) in fs.compiled_keys()
    monkeypatch.setenv("FEDPLAT_FUSED_ORDER_STATS", "1")
    torch.set_num_threads(threads)
    start = time.perf_counter()
    assert torch.equal(cw.coordinate_median(x).aggregate, median(x))
    assert time.perf_counter() - start < 2.0  # a recompile takes 5-30 s
    assert fs.wait(timeout=300)
    assert fs.full_key(("median", 9), x) in fs.compiled_keys()
    start = time.perf_counter()
    with torch.inference_mode():  # a state the kernel was not compiled for
        y = x.clone()
    assert torch.equal(cw.coordinate_median(y).aggregate, median(x))
    assert time.perf_counter() - start < 2.0
