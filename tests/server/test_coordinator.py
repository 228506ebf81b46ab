"""The coordinator over the in-memory transport (no sockets, virtual clock)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from fedplat.client import Client, FitResult
from fedplat.server.checkpoint import CheckpointError
from fedplat.server.config import ConfigError, parse_config
from fedplat.server.coordinator import Coordinator
from fedplat.server.optimizers import ServerOptimizer
from fedplat.server.recorder import Recorder

from fedplat.protocol.messages import TaskKind
from fedplat.sim import VirtualClock, simulate
from fedplat.sim.simulation import admit
from fedplat.store import Store
from fedplat.transport.inmemory import InMemoryConnection
from tests.support import digits_client, run_config


def _cfg(tmp: Path, **kw: Any) -> Any:
    return parse_config(run_config(tmp, **kw))


def _shift_client(
    engine: Coordinator, name: str, value: float, examples: int = 10
) -> Client:
    """A client whose update adds ``value`` to every weight."""
    from fedplat.models import create_model

    model = create_model("mlp", (1, 8, 8), 10, hidden=(64,))

    def train(m: torch.nn.Module, config: Mapping[str, Any]) -> FitResult:
        with torch.no_grad():
            for p in m.parameters():
                p.add_(value)
        return FitResult(examples, {"train_loss": 1.0})

    client = Client(
        None,
        model,
        train,
        num_examples=examples,
        name=name,
        connection_factory=lambda: InMemoryConnection(engine),
    )
    with Store(engine.cfg.store.url, migrate=False) as store:
        admit(store, engine.cfg, [client])
    return client


def test_simulation_learns_on_digits(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, rounds=3, clients=4)

    res = simulate(cfg, lambda i, factory: digits_client(i, factory, 4), 4)
    acc = [r.accuracy for r in res.rounds]
    assert len(acc) == 3 and all(r.completed for r in res.rounds)
    assert acc[-1] > acc[0] + 0.1, acc


def test_seeded_simulation_is_reproducible(tmp_path: Path) -> None:
    """Client ids are random tokens; selection and the stacking order of updates
    follow enrolment order, so two runs with one seed agree bit for bit."""

    def run(tmp: Path) -> tuple[list[Any], list[list[str]], torch.Tensor]:
        tmp.mkdir()
        cfg = _cfg(tmp, rounds=3, clients=3, min_available=5)

        store = Store(cfg.store.url)
        res = simulate(
            cfg, lambda i, factory: digits_client(i, factory, 5), 5, store=store
        )
        names = {c.id: c.name for c in store.list_clients(res.run_id)}
        chosen = [
            sorted(
                names[p.client_id]
                for p in store.list_participations(res.run_id, r.number)
            )
            for r in res.rounds
        ]
        ckpt = sorted((tmp / "ckpt").rglob("*.safetensors"))[-1]
        from safetensors.torch import load_file

        weights = torch.cat([t.reshape(-1) for t in load_file(ckpt).values()])
        return [(r.loss, r.accuracy) for r in res.rounds], chosen, weights

    a, b = run(tmp_path / "a"), run(tmp_path / "b")
    assert a[1] == b[1]
    assert a[0] == b[0]
    assert torch.equal(a[2], b[2])
    assert any(len(c) == 3 for c in a[1])  # a real subset was selected


def test_weighted_fedavg_applies_exact_mean(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, rounds=1, clients=2)
    store = Store(cfg.store.url)
    engine = Coordinator(cfg, Recorder(store), clock=VirtualClock())
    w0 = engine.weights.clone()
    a = _shift_client(engine, "a", 1.0, examples=30)
    b = _shift_client(engine, "b", -1.0, examples=10)
    for c in (a, b):
        c.step(0)
    engine.open_round()
    for c in (a, b):
        c.step(0)
    out = engine.close_round()
    assert out.completed and out.num_succeeded == 2
    # (30 * 1 + 10 * -1) / 40 = 0.5 on every coordinate
    assert torch.allclose(engine.weights - w0, torch.full_like(w0, 0.5), atol=1e-5)
    parts = {p.client_id: p for p in store.list_participations(engine.run_id, 1)}
    assert sorted(round(p.weight or 0, 3) for p in parts.values()) == [0.25, 0.75]
    assert all(p.verdict.selected for p in parts.values())
    assert a.step(0).kind is TaskKind.FINISHED


def test_straggler_dropped_at_deadline_and_quorum(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, rounds=1, clients=3, quorum=2, deadlines={"round_seconds": 30})
    store = Store(cfg.store.url)
    clock = VirtualClock()
    engine = Coordinator(cfg, Recorder(store), clock=clock)
    clients = [_shift_client(engine, f"c{i}", 0.1) for i in range(3)]
    for c in clients:
        c.step(0)
    engine.open_round()
    for c in clients[:2]:
        c.step(0)
    stop = threading.Event()
    waiter = threading.Thread(target=engine.driver.wait_round, args=(stop,))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # still waiting for the third client
    clock.advance(31)
    waiter.join(5)
    assert not waiter.is_alive()
    out = engine.close_round()
    assert out.completed and out.num_succeeded == 2
    statuses = sorted(p.status for p in store.list_participations(engine.run_id, 1))
    assert statuses == ["dropped", "succeeded", "succeeded"]
    # The straggler's late upload is refused with a clear reason.
    clients[2].step(0)  # FINISHED now: nothing to upload
    assert store.list_events(engine.run_id, kind="client_dropped")


def test_failed_round_is_retried_then_run_fails(tmp_path: Path) -> None:
    cfg = _cfg(
        tmp_path,
        rounds=1,
        clients=2,
        quorum=2,
        deadlines={"round_seconds": 5, "max_round_attempts": 2},
    )
    store = Store(cfg.store.url)
    clock = VirtualClock()
    engine = Coordinator(cfg, Recorder(store), clock=clock)
    clients = [_shift_client(engine, f"c{i}", 0.1) for i in range(2)]
    for _attempt in (1, 2):
        for c in clients:
            c.step(0)
        engine.open_round()
        clients[0].step(0)  # only one update: quorum of 2 not reached
        clock.advance(6)
        out = engine.close_round()
        assert not out.completed and "quorum not reached" in (out.reason or "")
    assert engine.finished
    run = store.get_run(engine.run_id)
    assert run is not None and run.status == "failed"
    # The first attempt is an event; the last one closes the round, for good.
    assert len(store.list_events(engine.run_id, kind="round_attempt_failed")) == 1
    assert len(store.list_events(engine.run_id, kind="round_failed")) == 1
    rnd = store.get_round(engine.run_id, 1)
    assert rnd is not None and rnd.status == "failed"
    assert run.reason and "quorum not reached" in run.reason


def test_resume_from_checkpoint(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, rounds=4, clients=2)
    store = Store(cfg.store.url)
    e1 = Coordinator(cfg, Recorder(store), clock=VirtualClock())
    cl = [_shift_client(e1, f"c{i}", 0.01 * (i + 1)) for i in range(2)]
    for _ in range(2):
        for c in cl:
            c.step(0)
        e1.open_round()
        for c in cl:
            c.step(0)
        assert e1.close_round().completed
    w_after_2 = e1.weights.clone()
    # A new engine on the same store (a restart) continues after round 2.
    e2 = Coordinator(cfg, Recorder(store), clock=VirtualClock())
    assert e2.model_version == 2 and torch.equal(e2.weights, w_after_2)
    assert store.list_events(e2.run_id, kind="run_resumed")
    # A tampered checkpoint is detected, not silently loaded.
    last = store.last_completed_round(e2.run_id)
    assert last is not None and last.checkpoint_path is not None
    with open(last.checkpoint_path, "r+b") as f:
        f.seek(-4, 2)
        f.write(b"XXXX")
    with pytest.raises(CheckpointError, match="SHA-256"):
        Coordinator(cfg, Recorder(store), clock=VirtualClock())


def test_existing_run_with_other_model_is_refused(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, rounds=1, clients=2)
    store = Store(cfg.store.url)
    Coordinator(cfg, Recorder(store))
    other = parse_config(
        run_config(tmp_path, rounds=1, clients=2, model={"params": {"hidden": [32]}})
    )
    with pytest.raises(ConfigError, match="another model layout"):
        Coordinator(other, Recorder(store))


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"name": "nope"}, "unknown aggregator 'nope'"),
        ({"name": "krum", "params": {"f": -1}}, "f must be >= 0"),
        ({"name": "trimmed_mean", "params": {"bogus": 1}}, "unknown parameter"),
        ({"name": "median", "pre": [{"name": "nope"}]}, "nope"),
    ],
)
def test_a_wrong_aggregator_is_refused_when_the_file_is_read(
    tmp_path: Path, section: dict[str, object], message: str
) -> None:
    # At validation, before any model is built or store opened.
    with pytest.raises(ConfigError, match=message):
        _cfg(tmp_path, rounds=1, clients=2, aggregator=section)


@pytest.mark.parametrize(
    "name", ["fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad"]
)
def test_server_optimizers_hand_checked(name: str) -> None:
    from fedplat.server.config import ServerOptimizerSection

    opt = ServerOptimizer(
        ServerOptimizerSection(
            name=name, lr=0.1, momentum=0.5, beta1=0.9, beta2=0.99, tau=0.01
        )
    )
    w = torch.zeros(2)
    d = torch.tensor([1.0, -2.0])
    w1 = opt.step(w, d)
    if name == "fedavg":
        expected = 0.1 * d
    elif name == "fedavgm":
        expected = 0.1 * d  # first step: m = delta
    else:
        m = 0.1 * d
        v0 = torch.full((2,), 1e-4)
        v = {
            "fedadam": 0.99 * v0 + 0.01 * d**2,
            "fedyogi": v0 - 0.01 * d**2 * torch.sign(v0 - d**2),
            "fedadagrad": v0 + d**2,
        }[name]
        expected = 0.1 * m / (v.sqrt() + 0.01)
    assert torch.allclose(w1, expected, atol=1e-6)
    state = opt.state_dict()
    opt2 = ServerOptimizer(opt.cfg)
    opt2.load_state_dict(state)
    assert torch.equal(opt.step(w1, d), opt2.step(w1, d))


def test_cosine_server_lr_schedule(tmp_path: Path) -> None:
    from fedplat.server.config import ServerOptimizerSection

    sec = ServerOptimizerSection(name="fedavgm", lr=0.1, lr_schedule="cosine")
    opt = ServerOptimizer(sec, total_rounds=4)
    # 0.1 * (1 + cos(pi * (t - 1) / 4)) / 2 for t = 1..4
    want = [0.1, 0.0853553, 0.05, 0.0146447]
    assert [round(opt.lr_at(t), 7) for t in (1, 2, 3, 4)] == want
    assert opt.lr_at(9) == opt.lr_at(4)  # clamped past the last round
    with pytest.raises(ValueError, match="round number"):
        opt.lr_at(None)
    with pytest.raises(ValueError, match="needs the run's rounds"):
        ServerOptimizer(sec)
    # FedAvgM with the schedule is momentum SGD, lr applied on arrival:
    # m_t = 0.9 m_{t-1} + d_t, w_t = w_{t-1} + lr_t m_t.
    w = torch.zeros(1)
    d = torch.ones(1)
    w = opt.step(w, d, 1)
    w = opt.step(w, d, 2)
    assert torch.allclose(w, torch.tensor([0.1 * 1 + 0.0853553 * 1.9]))
    floor = ServerOptimizer(
        ServerOptimizerSection(lr=0.1, lr_schedule="cosine", lr_min=0.02), 2
    )
    assert floor.lr_at(2) == pytest.approx(0.06)
    with pytest.raises(ConfigError, match="lr_min"):
        _cfg(tmp_path, server_optimizer={"lr": 0.1, "lr_min": 0.5})
    # The engine applies it per round and stores the lr it used.
    cfg = _cfg(
        tmp_path,
        rounds=2,
        clients=2,
        server_optimizer={"name": "fedavg", "lr": 1.0, "lr_schedule": "cosine"},
    )
    store = Store(cfg.store.url)
    engine = Coordinator(cfg, Recorder(store), clock=VirtualClock())
    a = _shift_client(engine, "a", 1.0)
    b = _shift_client(engine, "b", 1.0)
    w0 = engine.weights.clone()
    for rnd_lr in (1.0, 0.5):
        for c in (a, b):
            c.step(0)
        engine.open_round()
        for c in (a, b):
            c.step(0)
        before = engine.weights.clone()
        assert engine.close_round().completed
        assert torch.allclose(engine.weights - before, torch.full_like(w0, rnd_lr))
    lrs = [m.value for m in store.list_metrics(engine.run_id, "server_lr")]
    assert lrs == [1.0, 0.5]
