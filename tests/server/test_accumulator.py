"""The running sum: float64, chunked widening, and a mean that does not depend
on the order uploads arrive in (:mod:`fedplat.server.accumulator`)."""

from __future__ import annotations

import itertools

import torch
from fedplat.server import accumulator
from fedplat.server.accumulator import Accepted, RunningSum, add_widened


def _mean(
    rows: list[torch.Tensor], weights: list[float], order: list[int]
) -> torch.Tensor:
    acc = RunningSum(rows[0].numel(), weighted=True, selected=len(rows))
    for i in order:
        buf = acc.acquire(i)
        buf.copy_(rows[i])
        acc.commit(Accepted(f"c{i}", i, weights[i], float(rows[i].norm())), buf)
    acc.settle()
    assert acc.sum is not None
    return (acc.sum / acc.total_weight).to(torch.float32)


def test_the_sum_does_not_depend_on_arrival_order_by_hand() -> None:
    # float32: (1e8 + 1) - 1e8 = 0 but (1e8 - 1e8) + 1 = 1; float64 holds both.
    rows = [torch.tensor([1e8]), torch.tensor([1.0]), torch.tensor([-1e8])]
    means = {
        float(_mean(rows, [1.0] * 3, list(p))[0])
        for p in itertools.permutations(range(3))
    }
    assert means == {float(torch.tensor(1.0 / 3.0))}  # the sum is exactly 1
    f32 = torch.zeros(1)
    for r in rows:
        f32.add_(r)
    assert float(f32[0]) == 0.0  # what a float32 sum in this order gives


def test_ten_clients_in_every_sampled_order_give_one_mean() -> None:
    g = torch.Generator().manual_seed(7)
    rows = [torch.randn(5_000, generator=g) * (10.0 ** (i % 4)) for i in range(10)]
    weights = [float(w) for w in torch.randint(1, 500, (10,), generator=g)]
    first = _mean(rows, weights, list(range(10)))
    for _ in range(20):
        order = torch.randperm(10, generator=g).tolist()
        assert torch.equal(_mean(rows, weights, order), first)


def test_add_widened_across_chunk_edges(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(accumulator, "CHUNK", 3)
    total = torch.arange(7, dtype=torch.float64)
    add_widened(total, torch.ones(7), 0.5)
    assert total.tolist() == [0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5]
