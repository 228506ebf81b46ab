"""The bounds' Byzantine guarantee as a property (hypothesis): with fewer
attackers than half of the clients (any norms, any declared example counts),
through the coordinator's own accumulators, weighted FedAvg's aggregate

1. has norm at most ``m x`` the ``ceil(k / 2)``-th smallest honest norm of the
   reference set (``k`` its size: the round's rows, or the previous round's);
2. gives the attackers a weight share of at most ``f c / (f c + floor(n/2) + 1
   - f)`` (``c`` the weight multiplier, :func:`max_attacker_share`);
3. lies within ``2 x share x B`` of the weighted mean of the honest rows alone.
"""

from __future__ import annotations

import math

import torch
from fedplat.aggregators.bounds import max_attacker_share
from fedplat.server.accumulator import Accepted, RowStack, RunningSum
from fedplat.server.aggregator_section import NormBound, WeightBound
from fedplat.server.bounds import RoundBounds, round_weight_cap
from hypothesis import given, settings
from hypothesis import strategies as st

M, C = 3.0, 2.0
D = 4


@st.composite
def rounds(draw: st.DrawFn) -> dict[str, object]:
    n = draw(st.integers(3, 11))
    f = draw(st.integers(0, (n - 1) // 2))
    honest_norm = st.floats(1e-3, 10.0)
    attack_norm = st.one_of(st.just(0.0), st.floats(0.0, 1e6))
    norms = [draw(honest_norm) for _ in range(n - f)]
    norms += [draw(attack_norm) for _ in range(f)]
    declared = [draw(st.integers(1, 1000)) for _ in range(n - f)]
    declared += [draw(st.integers(0, 10**12)) for _ in range(f)]
    seed = draw(st.integers(0, 2**16))
    order = draw(st.permutations(range(n)))
    # The previous round (the running sum's reference): its own minority.
    k = draw(st.integers(1, 11))
    fk = draw(st.integers(0, (k - 1) // 2))
    ref = [draw(honest_norm) for _ in range(k - fk)]
    ref += [draw(attack_norm) for _ in range(fk)]
    return {
        "n": n,
        "f": f,
        "norms": norms,
        "declared": declared,
        "seed": seed,
        "order": order,
        "ref": ref,
        "ref_honest": k - fk,
    }


def _rows(norms: list[float], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(norms), D, generator=g, dtype=torch.float64)
    x = x / x.norm(dim=1, keepdim=True)
    return x * torch.tensor(norms, dtype=torch.float64)[:, None]


def _kth_honest(values: list[float], honest: int, total: int) -> float:
    """The ceil(total/2)-th smallest of the honest values (the first ``honest``)."""
    return sorted(values[:honest])[math.ceil(total / 2) - 1]


def _aggregate(r: dict, mode: str) -> tuple[torch.Tensor, list[Accepted], float]:
    n, norms = r["n"], r["norms"]
    rows = _rows(norms, r["seed"])
    spec = NormBound(multiplier=M, prefix=n)
    cap = round_weight_cap(r["declared"], WeightBound(multiplier=C))
    if mode == "rows":
        bounds = RoundBounds(spec, (), cap)
        acc = RowStack(n, D, bounds)
        for i in r["order"]:
            acc.acquire(i).copy_(rows[i])
            w = bounds.weigh(r["declared"][i])
            acc.commit(Accepted(str(i), i, w, norms[i]), acc.acquire(i))
        stack, accepted = acc.take()
        w = torch.tensor([a.weight for a in accepted], dtype=torch.float64)
        agg = (w[:, None] * stack.double()).sum(0) / w.sum()
        ref, honest, total = norms, n - r["f"], n
    else:
        bounds = RoundBounds(spec, tuple(r["ref"]), cap)
        acc = RunningSum(D, weighted=True, bounds=bounds, selected=n)
        for i in r["order"]:
            w = bounds.weigh(r["declared"][i])
            acc.commit(Accepted(str(i), i, w, norms[i]), rows[i].float().clone())
        acc.settle()
        accepted = acc.accepted()
        assert acc.sum is not None
        agg = acc.sum.double() / acc.total_weight
        ref, honest, total = r["ref"], r["ref_honest"], len(r["ref"])
    return agg, accepted, M * _kth_honest(ref, honest, total)


@settings(max_examples=150, deadline=None)
@given(r=rounds(), mode=st.sampled_from(["rows", "running_sum"]))
def test_a_minority_cannot_move_the_mean_far(r: dict, mode: str) -> None:
    agg, accepted, limit = _aggregate(r, mode)
    n, f = r["n"], r["f"]
    honest = [a for a in accepted if int(a.client_id) < n - f]
    total = sum(a.weight for a in accepted)
    share = sum(a.weight for a in accepted if int(a.client_id) >= n - f) / total
    bound = max(a.bound or 0.0 for a in accepted)
    eps = 1e-5 * (1.0 + limit)
    # 1. The aggregate is no longer than m x an honest norm of the reference.
    assert bound <= limit * (1 + 1e-12)
    assert float(agg.norm()) <= limit + eps
    # 2. The attackers' weight share.
    assert share <= max_attacker_share(n, f, C) + 1e-12
    # 3. Distance to the mean of the honest rows alone (bounded likewise).
    rows = _rows(r["norms"], r["seed"])
    hw = torch.tensor([a.weight for a in honest], dtype=torch.float64)
    hs = torch.tensor([a.scale for a in honest], dtype=torch.float64)
    hx = rows[[int(a.client_id) for a in honest]] * hs[:, None]
    h_mean = (hw[:, None] * hx).sum(0) / hw.sum()
    assert float((agg - h_mean).norm()) <= 2 * share * bound + eps
