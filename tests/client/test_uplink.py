"""Compression and privacy through the real coordinator (in-memory transport)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from fedplat.client import Client
from fedplat.server.config import ConfigError, parse_config

from fedplat.sim import simulate
from fedplat.store import Store
from tests.support import digits_client, dp_fedavg_config, run_config


def _build(state_root: Path | None = None) -> Any:
    def build(i: int, factory: Any) -> Client:
        state_dir = None if state_root is None else state_root / f"c{i}"
        client: Client = digits_client(i, factory, 4, state_dir=state_dir)
        return client

    return build


@pytest.mark.parametrize(
    ("compression", "min_ratio"),
    [
        ({"name": "topk", "params": {"ratio": 0.05}}, 5.0),
        (
            {"name": "dgc", "params": {"ratio": 0.01}},
            1.5,
        ),  # warm-up: 75% .. 99.6% sparse
        ({"name": "countsketch", "params": {"rows": 1, "cols": 1000}}, 3.0),
        ({"name": "fp16", "params": {"inner": "identity"}}, 1.9),
    ],
)
def test_compressed_runs_learn_and_store_bytes(
    tmp_path: Path, compression: dict, min_ratio: float
) -> None:
    cfg = parse_config(
        run_config(
            tmp_path,
            rounds=4,
            clients=4,
            compression=compression,
            client_training={"epochs": 2, "lr": 0.1},
        )
    )
    res = simulate(cfg, _build(tmp_path / "state"), 4)
    assert all(r.completed for r in res.rounds)
    store = Store(cfg.store.url, migrate=False)
    ratios = [m.value for m in store.list_metrics(res.run_id, "compression.ratio")]
    assert len(ratios) == 4 and min(ratios) >= min_ratio, ratios
    parts = store.list_participations(res.run_id, 4)
    dense = 4 * 4810  # float32 bytes of the 64-hidden MLP on 8x8 digits
    assert all(0 < p.bytes_up < dense for p in parts)
    acc = [r.accuracy for r in res.rounds]
    assert acc[-1] > 0.3, acc  # learning happens through the compressed channel
    if compression["name"] in ("topk", "dgc"):  # error feedback persisted per client
        assert list((tmp_path / "state" / "c0").glob("compressor-*.safetensors"))


def test_central_dp_stores_epsilon_per_round(tmp_path: Path) -> None:
    cfg = parse_config(
        dp_fedavg_config(
            tmp_path,
            rounds=3,
            clients=4,
            rate=1.0,
            privacy={
                "epsilon": 8.0,
                "delta": 1e-5,
                "clip_norm": 0.5,
            },
        )
    )
    res = simulate(cfg, _build(), 4)
    store = Store(cfg.store.url, migrate=False)
    eps = [m.value for m in store.list_metrics(res.run_id, "privacy.epsilon")]
    assert len(eps) == 3 and eps == sorted(eps) and 0 < eps[-1] <= 8.0 + 1e-6
    # Calibrated for all rounds: the last round spends (almost exactly) the budget.
    assert eps[-1] > 7.5
    # Clients send their updates as they are; the coordinator clips (two epochs
    # of digits move the model by more than 0.5) and says so.
    flags = [p.verdict.flags for p in store.list_participations(res.run_id, 1)]
    assert all("dp-clipped" in f for f in flags)


def test_coordinator_enforces_the_clip_norm(tmp_path: Path) -> None:
    from fedplat.server.uplink_plan import UplinkPlan

    from fedplat.vectors import Layout, TensorSpec

    cfg = parse_config(
        dp_fedavg_config(
            tmp_path,
            rate=0.5,
            privacy={"noise_multiplier": 1.0, "clip_norm": 1.0},
        )
    )
    plan = UplinkPlan(cfg, Layout((TensorSpec("w", (2,)),)))
    big, small = torch.tensor([3.0, 4.0]), torch.tensor([0.3, 0.4])
    assert plan.clip_row(big, 5.0) and not plan.clip_row(small, 0.5)
    assert torch.allclose(big, torch.tensor([0.6, 0.8]))  # clipped in place
    assert torch.allclose(small, torch.tensor([0.3, 0.4]))
    privacy = plan.task_config(seed=0).privacy
    assert privacy is not None and privacy.noise_multiplier == 1.0


def test_an_unbounded_epsilon_is_a_flag_not_a_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedplat.server.central_dp import METRIC_EPSILON, METRIC_EPSILON_UNBOUNDED
    from fedplat.server.uplink_plan import UplinkPlan

    from fedplat.vectors import Layout, TensorSpec

    cfg = parse_config(
        run_config(
            tmp_path,
            privacy={"mode": "local", "noise_multiplier": 1.0, "clip_norm": 1.0},
        )
    )
    plan = UplinkPlan(cfg, Layout((TensorSpec("w", (2,)),)))
    bounded = plan.account()
    assert bounded[METRIC_EPSILON] > 0 and METRIC_EPSILON_UNBOUNDED not in bounded
    # Opacus reports an infinite epsilon when no order bounds the loss.
    from fedplat.privacy.accountant import PrivacyAccountant

    monkeypatch.setattr(PrivacyAccountant, "get_epsilon", lambda self, delta: math.inf)
    unbounded = plan.account()
    assert METRIC_EPSILON not in unbounded
    assert unbounded[METRIC_EPSILON_UNBOUNDED] == 1.0
    assert all(math.isfinite(v) for v in unbounded.values())


def test_local_dp_on_sketch(tmp_path: Path) -> None:
    cfg = parse_config(
        run_config(
            tmp_path,
            rounds=2,
            clients=4,
            compression={"name": "countsketch", "params": {"rows": 1, "cols": 2000}},
            privacy={"mode": "local", "noise_multiplier": 0.5, "clip_norm": 1.0},
        )
    )
    res = simulate(cfg, _build(), 4)
    store = Store(cfg.store.url, migrate=False)
    eps = [m.value for m in store.list_metrics(res.run_id, "privacy.epsilon")]
    sig = [m.value for m in store.list_metrics(res.run_id, "privacy.noise_multiplier")]
    assert len(eps) == 2 and eps[1] > eps[0] > 0 and sig == [0.5, 0.5]


def test_central_dp_requires_unweighted_fedavg(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unweighted mean"):
        parse_config(run_config(tmp_path, privacy={"mode": "central", "epsilon": 1.0}))
    with pytest.raises(ConfigError, match="epsilon"):
        parse_config(run_config(tmp_path, privacy={"mode": "local"}))


def test_forged_sketch_seed_is_rejected(tmp_path: Path) -> None:
    from fedplat.server.coordinator import Coordinator
    from fedplat.server.recorder import Recorder

    from fedplat.compression import CountSketch, PayloadError
    from fedplat.protocol.codec import PayloadSink

    cfg = parse_config(
        run_config(
            tmp_path,
            rounds=1,
            clients=2,
            compression={"name": "countsketch", "params": {"rows": 1, "cols": 100}},
        )
    )
    coord = Coordinator(cfg, Recorder(Store(cfg.store.url)))
    plan, d = coord.ctx.plan, coord.layout.numel
    forged = (
        CountSketch(rows=1, cols=100).encode(torch.ones(d), round=1, seed=12345)
    ).to_bytes()
    sink = PayloadSink(
        torch.empty(d), len(forged), plan.decode, seed=plan.seed, round=1
    )
    with pytest.raises(PayloadError, match="sketch seed 12345"):
        sink.write(forged)


def test_local_dp_counts_the_releases_of_a_failed_round(tmp_path: Path) -> None:
    """Under local DP an upload is a noised release even if its round then fails
    (here: quorum not reached), so the accountant must count that round."""
    from fedplat.server.coordinator import Coordinator
    from fedplat.server.recorder import Recorder

    from fedplat.sim import VirtualClock
    from fedplat.sim.simulation import admit
    from fedplat.transport.inmemory import InMemoryConnection

    cfg = parse_config(
        run_config(
            tmp_path,
            rounds=1,
            clients=2,
            compression={"name": "countsketch", "params": {"rows": 1, "cols": 500}},
            privacy={"mode": "local", "noise_multiplier": 1.0, "clip_norm": 1.0},
        )
    )
    store = Store(cfg.store.url)
    engine = Coordinator(cfg, Recorder(store), clock=VirtualClock())
    build = _build()
    a, b = (build(i, lambda: InMemoryConnection(engine)) for i in range(2))
    admit(store, cfg, [a, b])
    for c in (a, b):
        c.step(0)  # enrol
    engine.open_round()
    a.step(0)  # only a uploads
    failed = engine.close_round()
    assert not failed.completed and "quorum" in (failed.reason or "")
    eps = [m.value for m in store.list_metrics(engine.run_id, "privacy.epsilon")]
    assert len(eps) == 1 and eps[0] > 0
    engine.open_round()  # second attempt of round 1
    for c in (a, b):
        c.step(0)
    done = engine.close_round()
    assert done.completed
    eps = [m.value for m in store.list_metrics(engine.run_id, "privacy.epsilon")]
    # Two releases accounted: more than one round's worth.
    assert len(eps) == 2 and eps[1] > eps[0]
