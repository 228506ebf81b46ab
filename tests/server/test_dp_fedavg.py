"""DP-FedAvg in the coordinator: Poisson sampling, the fixed-denominator release,
adaptive clipping, the budget that ends a run, and sketches summed in sketch
space."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from fedplat.aggregators import build_aggregator
from fedplat.server.accumulator import Accepted, RunningSum, SketchSum
from fedplat.server.aggregation import aggregate_round
from fedplat.server.config import ConfigError, RunConfig, parse_config
from fedplat.server.optimizers import ServerOptimizer
from fedplat.server.uplink_plan import UplinkPlan

from fedplat.compression import PayloadError
from fedplat.compression.wire import dense_header
from fedplat.protocol.codec import PayloadSink
from fedplat.sim import simulate
from fedplat.store import Store
from fedplat.vectors import Layout, TensorSpec
from tests.support import digits_client, dp_fedavg_config, run_config

D = 40
LAYOUT = Layout((TensorSpec("w", (D,)),))


def _cfg(tmp: Path, **sections: Any) -> RunConfig:
    base: dict[str, Any] = {
        "aggregator": {"name": "fedavg", "weighted": False},
        "selection": {"sampling": "poisson", "rate": 0.5, "quorum": 1},
    }
    for k, v in sections.items():
        base[k] = {**base.get(k, {}), **v}
    return parse_config(run_config(tmp, **base))


def _step(
    plan: UplinkPlan, acc: RunningSum, cfg: RunConfig, clipped: set[str] = frozenset()
) -> Any:
    return aggregate_round(
        acc,
        aggregator=build_aggregator("fedavg"),
        weighted=False,
        plan=plan,
        optimizer=ServerOptimizer(cfg.server_optimizer, cfg.run.rounds),
        global_weights=torch.zeros(D),
        round_number=1,
        clipped=set(clipped),
    )


def _fill(plan: UplinkPlan, acc: RunningSum, rows: list[torch.Tensor]) -> set[str]:
    """Rows through the intake's clip and into the sum; returns who was clipped."""
    clipped = set()
    for i, row in enumerate(rows):
        row = row.clone()
        if plan.clip_row(row, float(row.norm())):
            clipped.add(f"c{i}")
        acc.commit(Accepted(f"c{i}", i, 7.0), row)
    return clipped


# ----------------------------------------------------------------- config
@pytest.mark.parametrize(
    ("sections", "match"),
    [
        ({"selection": {"sampling": "fixed", "rate": None}}, "sampling: poisson"),
        ({"selection": {"rate": None}}, "needs a rate"),
        ({"selection": {"sampling": "fixed"}}, "needs sampling: poisson"),
        ({"selection": {"quorum": 2}}, "quorum is not used"),
        ({"contribution": {"enabled": True}}, "contribution scoring"),
    ],
)
def test_config_refuses_what_central_dp_cannot_account(
    tmp_path: Path, sections: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        _cfg(tmp_path, privacy={"mode": "central", "epsilon": 4.0}, **sections)


def test_adaptive_clipping_and_population_need_central_dp(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="need mode: central"):
        _cfg(tmp_path, privacy={"mode": "local", "epsilon": 4.0, "adaptive_clip": {}})
    with pytest.raises(ConfigError, match="max_epsilon needs"):
        _cfg(tmp_path, privacy={"max_epsilon": 4.0})


# ----------------------------------------------------------------- release
def test_release_divides_by_the_fixed_expected_count(tmp_path: Path) -> None:
    """q N = 0.5 * 10 = 5 whatever arrived: 3 clipped rows sum to (3 C e_0)."""
    cfg = _cfg(
        tmp_path,
        privacy={
            "mode": "central",
            "noise_multiplier": 1e-9,  # no visible noise: the estimator itself
            "clip_norm": 2.0,
            "population": 10,
        },
    )
    plan = UplinkPlan(cfg, LAYOUT)
    acc = RunningSum(D, weighted=False)
    e0 = torch.zeros(D)
    e0[0] = 1.0
    clipped = _fill(plan, acc, [10 * e0, 3 * e0, 0.5 * e0])
    assert clipped == {"c0", "c1"}  # norms 10 and 3 above C = 2; 0.5 is not
    step = _step(plan, acc, cfg, clipped)
    want = torch.zeros(D)
    want[0] = (2.0 + 2.0 + 0.5) / 5.0  # weights 7 are ignored: unweighted
    assert torch.allclose(step.aggregate, want, atol=1e-6)
    assert step.release is not None and step.release.count == 3
    assert step.release.unclipped == 1 and step.release.expected == 5.0
    assert all(v.weight == pytest.approx(0.2) for v in step.verdicts.values())
    m = plan.account(step.release)
    assert m["privacy.sample_rate"] == 0.5 and m["privacy.expected_clients"] == 5.0
    assert "privacy.max_epsilon" not in m  # no ceiling without an epsilon


def test_an_empty_draw_still_releases_noise_and_is_accounted(tmp_path: Path) -> None:
    cfg = _cfg(
        tmp_path,
        privacy={"mode": "central", "noise_multiplier": 1.0, "population": 4},
    )
    plan = UplinkPlan(cfg, LAYOUT)
    step = _step(plan, RunningSum(D, weighted=False), cfg)
    assert step.release is not None and step.release.count == 0
    # Noise of std z C = 1 on the sum, divided by q N = 2.
    assert 0.1 < float(step.aggregate.std()) < 1.5
    first = plan.account(step.release)["privacy.epsilon"]
    again = plan.account(_step(plan, RunningSum(D, weighted=False), cfg).release)
    assert 0 < first < again["privacy.epsilon"]


def test_adaptive_clip_moves_towards_the_quantile_on_the_noised_count(
    tmp_path: Path,
) -> None:
    cfg = _cfg(
        tmp_path,
        privacy={
            "mode": "central",
            "noise_multiplier": 1.0,
            "clip_norm": 1.0,
            "population": 200,
            "adaptive_clip": {"target_quantile": 0.5, "learning_rate": 0.2},
        },
    )
    plan = UplinkPlan(cfg, LAYOUT)
    central = plan.central
    assert central is not None and central.adaptive is not None
    # m = 100, sigma_b = 5: the sum is noised with z_sum > z (both releases
    # together spend z).
    assert central.sum_multiplier == pytest.approx((1 - 0.01) ** -0.5)
    rows = [torch.full((D,), 1.0) for _ in range(100)]  # norm 6.3 > C: clipped
    acc = RunningSum(D, weighted=False)
    clipped = _fill(plan, acc, rows)
    assert len(clipped) == 100
    step = _step(plan, acc, cfg, clipped)
    rel = step.release
    assert rel is not None and rel.unclipped == 0
    # b_bar = (0 - 50 + 5 xi) / 100 + 0.5, |xi| < 6: near 0, so C grows by ~e^0.1.
    assert rel.unclipped_fraction is not None and abs(rel.unclipped_fraction) < 0.3
    assert 1.0 < rel.next_clip < 1.2 and central.clip == 1.0  # not yet spent
    m = plan.account(rel)
    assert central.clip == rel.next_clip and m["privacy.clip_norm"] == 1.0
    assert plan.task_config(seed=0).privacy.clip_norm == rel.next_clip  # type: ignore[union-attr]
    # The state (N, C, budget) survives a restart.
    again = UplinkPlan(cfg, LAYOUT)
    again.load_state(plan.state())
    assert again.central is not None and again.central.clip == central.clip
    assert again.central.budget.spent == central.budget.spent


def test_adaptive_count_noise_too_small_for_z_is_a_config_error(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match="count noise std"):
        UplinkPlan(
            _cfg(
                tmp_path,
                privacy={
                    "mode": "central",
                    "noise_multiplier": 1.0,
                    "population": 10,  # m = 5: sigma_b = 0.25, 2 sigma_b < z
                    "adaptive_clip": {},
                },
            ),
            LAYOUT,
        )


# ----------------------------------------------------------------- sketches
@pytest.mark.parametrize("recovery", ["linear", "topk"])
def test_summed_sketches_versus_the_mean_of_desketched_updates(
    tmp_path: Path, recovery: str
) -> None:
    """Linear recovery: de-sketching the mean sketch equals the mean of the
    de-sketched updates (up to float rounding). Top-k recovery (a median over
    rows, then the k largest) is not linear: the two differ."""
    params: dict[str, Any] = {"rows": 3, "cols": 16, "recovery": recovery}
    if recovery == "topk":
        params["k"] = 8
    cfg = _cfg(
        tmp_path,
        selection={"sampling": "fixed", "rate": None},
        compression={"name": "countsketch", "params": params},
    )
    plan = UplinkPlan(cfg, LAYOUT)
    assert plan.sketcher is not None and plan.sketch_size() == 48
    g = torch.Generator().manual_seed(0)
    updates = [torch.randn(D, generator=g) for _ in range(5)]
    payloads = [plan.compressor.encode(u, round=1, seed=plan.seed) for u in updates]
    acc = SketchSum(48, weighted=False)
    for i, p in enumerate(payloads):
        acc.commit(Accepted(f"c{i}", i, 1.0), plan.sketch_values(p))
    step = _step(plan, acc, cfg)
    mean_of_desketched = torch.stack([plan.decode(p) for p in payloads]).mean(0)
    close = torch.allclose(step.aggregate, mean_of_desketched, atol=1e-5)
    assert close == (recovery == "linear")


def test_a_sketch_sum_refuses_a_dense_payload(tmp_path: Path) -> None:
    cfg = _cfg(
        tmp_path,
        selection={"sampling": "fixed", "rate": None},
        compression={"name": "countsketch", "params": {"rows": 1, "cols": 8}},
    )
    plan = UplinkPlan(cfg, LAYOUT)
    body = dense_header(D) + torch.ones(D).numpy().tobytes()
    sink = PayloadSink(
        torch.empty(8), len(body), plan.decoder(True), seed=plan.seed, round=1, d=D
    )
    sink.write(body)
    with pytest.raises(PayloadError, match="takes sketch payloads"):
        sink.finish()


# ----------------------------------------------------------------- runs
def _build(n: int) -> Any:
    return lambda i, factory: digits_client(i, factory, n)


def test_poisson_rounds_draw_a_random_number_of_clients(tmp_path: Path) -> None:
    cfg = parse_config(
        run_config(
            tmp_path,
            rounds=6,
            clients=10,
            selection={"sampling": "poisson", "rate": 0.4, "quorum": 1},
            deadlines={"max_round_attempts": 20},
        )
    )
    res = simulate(cfg, _build(10), 10)
    store = Store(cfg.store.url, migrate=False)
    counts = [
        len(store.list_participations(res.run_id, r.number))
        for r in store.list_rounds(res.run_id)
    ]
    store.close()
    assert len(counts) == 6 and len(set(counts)) > 1, counts
    assert all(0 < c <= 10 for c in counts)


def test_the_budget_ends_the_run_completed_with_its_reason(tmp_path: Path) -> None:
    cfg = parse_config(
        dp_fedavg_config(
            tmp_path,
            rounds=6,
            clients=4,
            rate=0.5,
            # Calibrated for 6 rounds at epsilon 8, but allowed only 4.
            privacy={"epsilon": 8.0, "max_epsilon": 4.0},
        )
    )
    res = simulate(cfg, _build(4), 4)
    store = Store(cfg.store.url, migrate=False)
    run = store.get_run(res.run_id)
    eps = [m.value for m in store.list_metrics(res.run_id, "privacy.epsilon")]
    events = [e.kind for e in store.list_events(res.run_id)]
    store.close()
    assert run is not None and run.status == "completed"
    assert run.reason is not None and "privacy budget reached" in run.reason
    assert 1 <= len(res.rounds) < 6 and len(eps) == len(res.rounds)
    assert max(eps) <= 4.0 and "privacy_budget_exhausted" in events
    assert f"stops after round {len(res.rounds)}" in run.reason


def test_adaptive_clipping_through_the_coordinator(tmp_path: Path) -> None:
    cfg = parse_config(
        dp_fedavg_config(
            tmp_path,
            rounds=4,
            clients=4,
            rate=1.0,
            privacy={
                "noise_multiplier": 0.3,
                "clip_norm": 0.05,
                # b_bar = (0 - 2 + 0.5 xi) / 4 + 1/2 = xi / 8 < 1/2: C grows.
                "adaptive_clip": {"count_noise_std": 0.5, "learning_rate": 0.5},
            },
        )
    )
    res = simulate(cfg, _build(4), 4)
    store = Store(cfg.store.url, migrate=False)
    clip = [m.value for m in store.list_metrics(res.run_id, "privacy.clip_norm")]
    frac = [
        m.value for m in store.list_metrics(res.run_id, "privacy.unclipped_fraction")
    ]
    store.close()
    # Every digits update is far above 0.05: C grows round after round.
    assert len(clip) == 4 and clip == sorted(clip) and clip[-1] > clip[0]
    assert len(frac) == 4 and all(math.isfinite(f) for f in frac)


def test_rounds_that_sample_nobody_complete_and_are_stored(tmp_path: Path) -> None:
    from fedplat.store.check import check_store

    cfg = parse_config(
        dp_fedavg_config(
            tmp_path,
            rounds=3,
            clients=2,
            min_available=1,
            rate=0.001,
            privacy={"noise_multiplier": 1.0},
        )
    )
    res = simulate(cfg, _build(2), 2)
    assert [r.completed for r in res.rounds] == [True, True, True]
    store = Store(cfg.store.url, migrate=False)
    try:
        rounds = store.list_rounds(res.run_id)
        assert sum(r.num_selected for r in rounds) <= 1  # almost surely 0
        assert len(store.list_metrics(res.run_id, "privacy.epsilon")) == 3
        assert check_store(store) == []
    finally:
        store.close()


def test_secure_aggregation_noise_covers_the_rounding(tmp_path: Path) -> None:
    """Under secure aggregation one client's decoded contribution may be off its
    clipped update by the fixed-point rounding r = sqrt(d') / (2 s): the noise is
    z (C + r), not z C (FixedPoint.sensitivity)."""
    from fedplat.server.accumulator import MaskedSum

    from fedplat.secagg import FixedPoint

    cfg = _cfg(
        tmp_path,
        privacy={"mode": "central", "noise_multiplier": 1.0, "population": 4},
    )
    plan = UplinkPlan(cfg, LAYOUT)
    assert plan.central is not None
    fp = FixedPoint(D, plan.clip_norm, 4, rotate=False, session=b"s")
    rounding = fp.sensitivity - fp.clip_norm
    assert rounding > 0
    acc = MaskedSum(D, sketch_space=False)
    acc.set_result(torch.zeros(D, dtype=torch.float64), [], 0, rounding=rounding)
    step = _step(plan, acc, cfg)
    assert step.release is not None
    z = plan.central.sum_multiplier
    assert step.release.noise_std == pytest.approx(z * (plan.clip_norm + rounding))
    plain = _step(plan, RunningSum(D, weighted=False), cfg).release
    assert plain is not None and plain.noise_std == pytest.approx(z * plan.clip_norm)
