"""Attacks: shapes, formulas, seeding, registry, and attacks against rules."""

from __future__ import annotations

import math

import pytest
import torch
from fedplat.aggregators import create_aggregator
from fedplat.aggregators.attacks import (
    ALittleIsEnough,
    AttackError,
    InnerProductManipulation,
    Mimic,
    alie_z,
    available_attacks,
    create_attack,
    flip_labels,
    register_attack,
)

HONEST = torch.tensor([[1.0, 2.0, 0.0], [3.0, 2.0, 0.0], [2.0, 5.0, 3.0]])


def test_registry() -> None:
    assert available_attacks() == [
        "alie",
        "gaussian",
        "ipm",
        "mimic",
        "random",
        "sign_flip",
    ]
    with pytest.raises(AttackError, match="already registered"):
        register_attack("ALIE", ALittleIsEnough)
    with pytest.raises(AttackError, match=r"unknown attack 'lie'.*alie"):
        create_attack("lie")
    with pytest.raises(AttackError, match=r"unknown parameter.*'eps'.*epsilon"):
        create_attack("ipm", eps=0.5)
    with pytest.raises(AttackError, match="sigma"):
        create_attack("gaussian", sigma=-1.0)


@pytest.mark.parametrize(
    "name", ["alie", "gaussian", "ipm", "mimic", "random", "sign_flip"]
)
def test_every_attack_returns_f_rows(name: str) -> None:
    out = create_attack(name)(HONEST, 2)
    assert out.shape == (2, 3) and out.dtype == HONEST.dtype
    assert create_attack(name)(HONEST, 0).shape == (0, 3)
    with pytest.raises(AttackError):
        create_attack(name)(HONEST, -1)


def test_sign_flip_and_ipm() -> None:
    mean = HONEST.mean(dim=0)
    assert torch.allclose(create_attack("sign_flip")(HONEST, 2), -mean.expand(2, 3))
    ipm = InnerProductManipulation(epsilon=0.5)(HONEST, 1)
    assert torch.allclose(ipm[0], -0.5 * mean)
    assert float(ipm[0] @ mean) < 0  # inner product with the true mean turns negative


def test_alie_formula() -> None:
    # n = 25, f = 5 (the benchmark): s = floor(25/2 + 1) - 5 = 8, Phi(z) = 17/25.
    z = alie_z(25, 5)
    assert 0.5 * (1 + math.erf(z / math.sqrt(2))) == pytest.approx(17 / 25)
    out = ALittleIsEnough()(HONEST, 2)
    expect = HONEST.mean(dim=0) - alie_z(5, 2) * HONEST.std(dim=0)
    assert torch.allclose(out, expect.expand(2, 3))
    assert torch.allclose(
        ALittleIsEnough(z=1.0)(HONEST, 1)[0], HONEST.mean(0) - HONEST.std(0)
    )


def test_random_and_gaussian_are_seeded() -> None:
    a = create_attack("random", seed=3)(HONEST, 2)
    assert torch.equal(a, create_attack("random", seed=3)(HONEST, 2))
    assert not torch.equal(a, create_attack("random", seed=4)(HONEST, 2))
    assert bool(((a >= 0) & (a < 1)).all())  # FA paper: uniform [0, 1)
    g = create_attack("gaussian", mu=5.0, sigma=0.0)(HONEST, 2)
    assert torch.equal(g, torch.full((2, 3), 5.0))


def test_mimic_copies_one_honest_client() -> None:
    assert torch.equal(Mimic(target=1)(HONEST, 3), HONEST[1].expand(3, 3))
    gen = torch.Generator().manual_seed(0)
    honest = torch.randn(6, 50, generator=gen)
    honest[4] += 10 * torch.randn(50, generator=gen)  # the most "different" client
    attack = Mimic(warmup=2)
    first = attack(honest, 2)
    assert any(torch.equal(first[0], h) for h in honest)
    assert torch.equal(first[0], first[1])
    assert torch.equal(first[0], honest[4])
    # after the warm-up the same client index stays the target
    attack(honest, 2)
    later = honest.flip(1)
    assert torch.equal(attack(later, 1)[0], later[4])
    with pytest.raises(AttackError, match="out of range"):
        Mimic(target=9)(HONEST, 1)


def test_flip_labels() -> None:
    y = torch.tensor([0, 1, 9, 4])
    assert flip_labels(y, 10).tolist() == [9, 8, 0, 5]
    assert torch.equal(flip_labels(flip_labels(y, 10), 10), y)
    with pytest.raises(AttackError, match=r"\[0, 10\)"):
        flip_labels(torch.tensor([10]), 10)
    with pytest.raises(AttackError, match="integers"):
        flip_labels(torch.tensor([0.0]), 10)


def test_attacks_against_rules() -> None:
    # 15 clients, 3 Byzantine sending uniform [0,1) vectors (the FA paper's
    # setting): the plain mean moves towards them, robust rules much less.
    gen = torch.Generator().manual_seed(0)
    d = 500
    g = torch.randn(d, generator=gen) * 0.01
    honest = g + 0.002 * torch.randn(12, d, generator=gen)
    x = torch.cat([honest, create_attack("random", seed=0)(honest, 3)])
    target = honest.mean(dim=0)

    def err(name: str, **params: object) -> float:
        return float((create_aggregator(name, **params)(x).aggregate - target).norm())

    mean_err = err("fedavg")
    for name, params in [
        ("median", {}),
        ("trimmed_mean", {"f": 3}),
        ("krum", {"f": 3}),
        ("multi_krum", {"f": 3}),
        ("bulyan", {"f": 3}),
        ("geometric_median", {}),
        ("meamed", {"f": 3}),
        ("centered_clipping", {"tau": 0.05}),
        ("flag", {"m": 1, "rescale": "median_norm"}),
    ]:
        assert err(name, **params) < 0.1 * mean_err, name
