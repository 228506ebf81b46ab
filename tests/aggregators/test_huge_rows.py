"""One huge but finite row (~1e20, accepted by a finiteness check) among honest
rows, at the rule level: no exception, no NaN, the attacker's row is excluded or
clipped, and the aggregate stays close to the honest rows (issue 11)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fedplat.aggregators import create_aggregator

from tests.support import ref_geometric_median

N, D, ATTACKER = 10, 1000, 3


def honest_and_attacked(offset: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N - 1, D]`` honest rows and ``[N, D]`` with the attacker's row."""
    gen = torch.Generator().manual_seed(0)
    honest = offset + 0.01 * torch.randn(N - 1, D, generator=gen)
    x = torch.cat([honest[:ATTACKER], torch.full((1, D), 1e20), honest[ATTACKER:]])
    return honest, x


def radius(honest: torch.Tensor) -> float:
    """Largest distance of an honest row to the honest mean (float64)."""
    h = honest.double()
    return float((h - h.mean(dim=0)).norm(dim=1).max())


RULES = [
    ("krum", {"f": 1}, "excluded"),
    ("multi_krum", {"f": 1}, "excluded"),
    ("bulyan", {"f": 1}, "excluded"),
    ("geometric_median", {}, "down-weighted"),
    ("median", {}, "down-weighted"),
    ("trimmed_mean", {"f": 1}, "down-weighted"),
]


@pytest.mark.parametrize("offset", [0.0, 1000.0])
@pytest.mark.parametrize(("name", "params", "flag"), RULES)
def test_a_1e20_row_is_excluded(
    offset: float, name: str, params: dict[str, int], flag: str
) -> None:
    honest, x = honest_and_attacked(offset)
    r = create_aggregator(name, **params)(x)
    assert bool(torch.isfinite(r.aggregate).all())
    bad = r.decisions[ATTACKER]
    assert flag in bad.flags and bad.weight < 1e-12, bad
    mean = honest.double().mean(dim=0)
    err = float((r.aggregate.double() - mean).norm())
    assert err <= radius(honest), (name, err)


@pytest.mark.parametrize("offset", [0.0, 1000.0])
def test_krum_family_matches_the_honest_reference(offset: float) -> None:
    honest, x = honest_and_attacked(offset)
    multi = create_aggregator("multi_krum", f=1)(x).aggregate.double()
    assert torch.allclose(multi, honest.double().mean(dim=0), rtol=1e-6, atol=1e-6)
    krum = create_aggregator("krum", f=1)(x)
    chosen = [d.index for d in krum.decisions if d.selected]
    assert chosen != [ATTACKER] and torch.equal(krum.aggregate, x[chosen[0]])


def test_geometric_median_matches_float64_weiszfeld() -> None:
    _, x = honest_and_attacked(0.0)
    got = create_aggregator("geometric_median")(x).aggregate.double().numpy()
    want = ref_geometric_median(x.double().numpy())
    assert np.linalg.norm(got - want) <= 1e-4 * (1.0 + np.linalg.norm(want))


def test_centered_clipping_clips_the_row_to_tau() -> None:
    honest, x = honest_and_attacked(0.0)
    cc = create_aggregator("centered_clipping", tau=1.0, iterations=3)
    cc(honest)  # a clean round puts the reference point among the honest rows
    r = cc(x)
    assert bool(torch.isfinite(r.aggregate).all())
    assert "clipped" in r.decisions[ATTACKER].flags
    assert r.decisions[ATTACKER].weight < 1e-12
    # Each step moves the output by at most tau / N towards the attacker.
    err = float((r.aggregate.double() - honest.double().mean(dim=0)).norm())
    assert err <= 3 * 1.0 / N + 0.01
