"""The coordinator's norm bound and weight cap (fedplat.server.bounds): by hand
on tiny inputs, through both accumulators, in the verdicts, across a restart."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from fedplat.client import Client, FitResult
from fedplat.server.accumulator import Accepted, RowStack, RunningSum
from fedplat.server.aggregator_section import NormBound, WeightBound
from fedplat.server.bounds import (
    REFERENCE_KEY,
    RoundBounds,
    StreamingBound,
    reference_extra,
    reference_from,
    round_weight_cap,
)
from fedplat.server.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from fedplat.server.config import ConfigError, parse_config
from fedplat.server.coordinator import Coordinator
from fedplat.server.recorder import Recorder

from fedplat.sim import VirtualClock
from fedplat.sim.simulation import admit
from fedplat.store import Store
from fedplat.vectors import Layout, TensorSpec
from tests.support import run_config

#: Parameters of run_config's model (digits MLP 64-64-10).
D = 64 * 64 + 64 + 64 * 10 + 10


def _scales(out: list[Any]) -> dict[str, float]:
    return {b.item: round(b.scale, 9) for b in out}


# --------------------------------------------------------------------------- #
# The running sum's bound: reference, held prefix


def test_held_prefix_sets_the_bound_of_the_round_by_hand() -> None:
    sb: StreamingBound[str] = StreamingBound(
        NormBound(multiplier=3.0, prefix=3), prefix=10
    )
    assert sb.offer(1.0, "a") == [] and sb.offer(2.0, "b") == []
    assert sb.held == 2
    # The third row completes the prefix: median_low(1, 2, 100) = 2, B = 6.
    out = sb.offer(100.0, "c")
    assert _scales(out) == {"a": 1.0, "b": 1.0, "c": 0.06}
    assert {b.bound for b in out} == {6.0} and sb.held == 0
    # Later rows are bounded at once by the same B.
    assert _scales(sb.offer(1.5, "d")) == {"d": 1.0}
    assert _scales(sb.offer(50.0, "e")) == {"e": 0.12}


def test_a_prefix_that_never_fills_is_released_at_close() -> None:
    sb: StreamingBound[str] = StreamingBound(NormBound(prefix=5), prefix=10)
    assert sb.prefix == 5  # min(NormBound.prefix, selected clients)
    assert StreamingBound(NormBound(prefix=5), prefix=2).prefix == 2
    assert sb.offer(4.0, "a") == [] and sb.offer(1.0, "b") == []
    # median_low(4, 1) = 1, B = 3: the 4 is scaled to 3.
    assert _scales(sb.flush()) == {"a": 0.75, "b": 1.0}
    assert sb.flush() == []


def test_a_reference_fixes_the_bound_before_any_row() -> None:
    sb: StreamingBound[str] = StreamingBound(
        NormBound(multiplier=3.0), (1.0, 1.0, 2.0, 1000.0), prefix=4
    )
    assert sb.bound == 3.0  # 3 x median_low(1, 1, 2, 1000)
    assert _scales(sb.offer(10.0, "a")) == {"a": 0.3}
    # A reference whose median is 0 says nothing of the scale: hold a prefix.
    zero: StreamingBound[str] = StreamingBound(NormBound(), (0.0, 0.0, 5.0), prefix=4)
    assert zero.bound is None and zero.offer(1.0, "a") == []


def _row(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_running_sum_adds_w_s_u_by_hand() -> None:
    bounds = RoundBounds(NormBound(multiplier=3.0, prefix=2))
    acc = RunningSum(2, weighted=True, bounds=bounds, selected=3)
    acc.commit(Accepted("a", 0, 1.0, 1.0), _row(1.0, 0.0))
    assert acc.sum is None  # held: the prefix is not complete
    acc.commit(Accepted("b", 1, 1.0, 1.0), _row(0.0, 1.0))
    # Prefix complete: B = 3 x median_low(1, 1) = 3; the third row is bounded.
    acc.commit(Accepted("c", 2, 2.0, 1000.0), _row(1000.0, 0.0))
    acc.settle()
    assert acc.sum is not None and acc.total_weight == 4.0
    # 1 (1, 0) + 1 (0, 1) + 2 x 0.003 (1000, 0) = (7, 1)
    assert torch.allclose(acc.sum.float(), _row(7.0, 1.0))
    got = {a.client_id: (a.scale, a.bound, a.norm_bounded) for a in acc.accepted()}
    assert got == {
        "a": (1.0, 3.0, False),
        "b": (1.0, 3.0, False),
        "c": (pytest.approx(0.003), 3.0, True),
    }


def test_row_stack_bounds_with_the_rounds_own_median() -> None:
    acc = RowStack(4, 2, RoundBounds(NormBound(multiplier=3.0)))
    rows = [(1.0, 0.0), (0.0, 1.0), (2.0, 0.0), (0.0, 1000.0)]
    for i, r in enumerate(rows):
        acc.acquire(i).copy_(_row(*r))
        acc.commit(Accepted(f"c{i}", i, 1.0, float(max(map(abs, r)))), acc.acquire(i))
    stack, accepted = acc.take()
    # Norms 1, 1, 2, 1000: B = 3, only the last row is scaled (to norm 3).
    assert torch.allclose(stack[3], _row(0.0, 3.0))
    assert torch.equal(stack[:3], torch.tensor(rows[:3]))
    assert [a.norm_bounded for a in accepted] == [False, False, False, True]


def test_the_weight_cap_by_hand() -> None:
    # Enrolment counts 10, 20, 1000: median_low 20, cap 3 x 20 = 60.
    cap = round_weight_cap([10, 20, 1000], WeightBound(multiplier=3.0))
    assert cap == 60.0
    bounds = RoundBounds(weight_cap=cap)
    assert [bounds.weigh(n) for n in (10, 20, 1000)] == [10.0, 20.0, 60.0]
    assert round_weight_cap([10, 20], None) is None
    assert round_weight_cap([], WeightBound()) is None


# --------------------------------------------------------------------------- #
# Persistence


def test_the_reference_survives_a_checkpoint(tmp_path: Path) -> None:
    norms = [0.1 + 1e-17, 0.3, 2.0 / 3.0]
    layout = Layout((TensorSpec("w", (2,)),))
    path, _ = save_checkpoint(
        tmp_path,
        Checkpoint("run", 1, 1, layout, torch.zeros(2), {}, {}, reference_extra(norms)),
    )
    extra = load_checkpoint(path).extra
    assert REFERENCE_KEY in extra
    assert reference_from(extra) == tuple(norms)  # bit for bit
    assert reference_from({}) == ()


# --------------------------------------------------------------------------- #
# Through the coordinator (in-memory transport, virtual clock)


def _client(
    engine: Coordinator,
    name: str,
    value: Callable[[], float],
    examples: int = 10,
) -> Client:
    """A client whose update adds ``value()`` to every weight (norm ``|value()|
    sqrt(D)``) and declares ``examples`` (at enrolment and with the update)."""
    from fedplat.models import create_model

    model = create_model("mlp", (1, 8, 8), 10, hidden=(64,))

    def train(m: torch.nn.Module, config: Mapping[str, Any]) -> FitResult:
        with torch.no_grad():
            for p in m.parameters():
                p.add_(value())
        return FitResult(examples, {"train_loss": 1.0})

    from fedplat.transport.inmemory import InMemoryConnection

    c = Client(
        None,
        model,
        train,
        num_examples=examples,
        name=name,
        connection_factory=lambda: InMemoryConnection(engine),
    )
    with Store(engine.cfg.store.url, migrate=False) as store:
        admit(store, engine.cfg, [c])
    return c


def _round(engine: Coordinator, clients: list[Client]) -> None:
    for c in clients:
        c.step(0)
    engine.open_round()
    for c in clients:
        c.step(0)
    assert engine.close_round().completed


def _verdicts(store: Store, run_id: str, number: int) -> dict[str, Any]:
    names = {c.id: c.name for c in store.list_clients(run_id)}
    return {
        names[p.client_id]: p.verdict for p in store.list_participations(run_id, number)
    }


def test_verdicts_carry_the_flags_the_norm_and_the_events(tmp_path: Path) -> None:
    cfg = parse_config(
        run_config(
            tmp_path,
            rounds=1,
            clients=3,
            aggregator={"weight_bound": {"multiplier": 3.0}},
        )
    )
    store = Store(cfg.store.url)
    engine = Coordinator(cfg, Recorder(store), clock=VirtualClock())
    clients = [
        _client(engine, "a", lambda: 0.01, examples=10),
        _client(engine, "b", lambda: 0.01, examples=20),
        _client(engine, "big", lambda: 5.0, examples=1000),
    ]
    w0 = engine.weights.clone()
    _round(engine, clients)
    v = _verdicts(store, engine.run_id, 1)
    # Weights 10, 20 and min(1000, 3 x median(10, 20, 1000) = 60): 1/9, 2/9, 6/9.
    assert [round(v[n].weight, 6) for n in ("a", "b", "big")] == [
        round(x / 90, 6) for x in (10, 20, 60)
    ]
    assert "weight-capped" in v["big"].flags and "norm-bounded" in v["big"].flags
    assert v["a"].flags == () and v["b"].flags == ()
    # The score is the norm as received: 5 sqrt(D) for the bounded update.
    assert v["big"].score == pytest.approx(5.0 * D**0.5, rel=1e-5)
    # B = 3 x 0.01 sqrt(D): the big update counts as 0.03 on every weight.
    step = (10 * 0.01 + 20 * 0.01 + 60 * 0.03) / 90
    assert torch.allclose(engine.weights - w0, torch.full_like(w0, step), atol=1e-6)
    events = {e.kind: e for e in store.list_events(engine.run_id)}
    assert "big" in events["norm_bounded"].message
    (capped,) = events["weight_capped"].details["clients"]  # type: ignore[index]
    assert (capped["name"], capped["declared"], capped["weight"]) == ("big", 1000, 60)
    metrics = {m.name: m.value for m in store.list_metrics(engine.run_id)}
    assert metrics["norm_bound.bounded"] == 1.0
    assert metrics["weight_bound.cap"] == 60.0


def _four(engine: Coordinator, k: list[int]) -> list[Client]:
    """Three honest clients and one far one; the honest updates grow with the
    round ``k[0]`` (round 2: norms 0.02, 0.04, 0.08 against a round-1 median of
    0.02, in units of sqrt(D))."""
    return [
        _client(engine, "a", lambda: 0.01 * k[0]),
        _client(engine, "b", lambda: 0.02 * k[0]),
        _client(engine, "c", lambda: 0.04 * k[0]),
        _client(engine, "far", lambda: 5.0),
    ]


def test_a_restarted_coordinator_bounds_the_next_round_the_same(
    tmp_path: Path,
) -> None:
    def config(tmp: Path) -> Any:
        tmp.mkdir()
        return parse_config(run_config(tmp, rounds=2, clients=4))

    cfg = config(tmp_path / "straight")
    straight = Coordinator(cfg, Recorder(Store(cfg.store.url)), clock=VirtualClock())
    k = [1]
    clients = _four(straight, k)
    _round(straight, clients)
    k[0] = 2
    _round(straight, clients)

    cfg = config(tmp_path / "restarted")
    store = Store(cfg.store.url)
    first = Coordinator(cfg, Recorder(store), clock=VirtualClock())
    k[0] = 1
    _round(first, _four(first, k))
    # A new coordinator on the same store (as after a SIGKILL), new clients.
    second = Coordinator(cfg, Recorder(store), clock=VirtualClock())
    assert second.ctx.state.extra == first.ctx.state.extra
    assert reference_from(second.ctx.state.extra) == pytest.approx(
        sorted(x * D**0.5 for x in (0.01, 0.02, 0.04, 5.0)), rel=1e-5
    )
    k[0] = 2
    _round(second, _four(second, k))
    assert torch.equal(second.weights, straight.weights)
    v = _verdicts(store, second.run_id, 2)
    # Round 2's bound is 3 x the round-1 median norm (0.02 sqrt(D)): c's 0.08
    # is scaled; a bound from round 2's own norms (3 x 0.04) would not.
    assert "norm-bounded" in v["c"].flags and "norm-bounded" in v["far"].flags
    assert "norm-bounded" not in v["b"].flags
    assert v["c"].score == pytest.approx(0.08 * D**0.5, rel=1e-5)


# --------------------------------------------------------------------------- #
# Configuration


@pytest.mark.parametrize("off", [None, False, "off"])
def test_bounds_can_be_turned_off(tmp_path: Path, off: Any) -> None:
    a = parse_config(
        run_config(tmp_path, aggregator={"norm_bound": off, "weight_bound": off})
    ).aggregator
    assert a.norm_bounding is None and a.weight_bounding is None


def test_bounds_default_on_for_fedavg_only(tmp_path: Path) -> None:
    a = parse_config(run_config(tmp_path)).aggregator
    assert a.norm_bound == "auto" and a.norm_bounding == NormBound()
    assert a.weight_bounding == WeightBound()
    krum = parse_config(
        run_config(tmp_path, aggregator={"name": "krum", "params": {"f": 1}})
    ).aggregator
    assert krum.norm_bounding is None and krum.weight_bounding is None
    asked = parse_config(
        run_config(
            tmp_path,
            aggregator={
                "name": "krum",
                "params": {"f": 1},
                "norm_bound": {"multiplier": 2.0},
            },
        )
    ).aggregator
    assert asked.norm_bounding == NormBound(multiplier=2.0)
    # A stored run file (JSON) parses back to the same bounds.
    cfg = parse_config(run_config(tmp_path))
    assert parse_config(cfg.model_dump(mode="json")).aggregator == cfg.aggregator


@pytest.mark.parametrize(
    "section",
    [
        {"norm_bound": {"multiplier": 0.5}},
        {"norm_bound": {"prefix": 0}},
        {"norm_bound": "on"},
        {"weight_bound": {"multiplier": 0.9}},
    ],
)
def test_bad_bounds_are_config_errors(tmp_path: Path, section: Any) -> None:
    with pytest.raises(ConfigError, match="aggregator"):
        parse_config(run_config(tmp_path, aggregator=section))


# --------------------------------------------------------------------------- #
# Where the norm bound is off, and sketches


def test_central_dp_and_secure_aggregation_rounds_are_not_norm_bounded(
    tmp_path: Path,
) -> None:
    from tests.support import dp_fedavg_config

    privacy = {"noise_multiplier": 1.0, "clip_norm": 1.0}
    for name, extra in (
        ("dp", {}),
        ("secagg", {"secure_aggregation": {"phase_seconds": 4.0}}),
    ):
        (tmp_path / name).mkdir()
        raw = dp_fedavg_config(tmp_path / name, rate=0.5, privacy={**privacy, **extra})
        cfg = parse_config(raw)
        assert cfg.aggregator.norm_bounding is not None  # fedavg's default
        engine = Coordinator(cfg, Recorder(Store(cfg.store.url)), clock=VirtualClock())
        # DP's clip is the bound; under secure aggregation no row is seen.
        assert engine.driver._bounds([]).norm is None


def test_sketches_are_bounded_in_sketch_space(tmp_path: Path) -> None:
    cfg = parse_config(
        run_config(
            tmp_path,
            rounds=1,
            clients=3,
            compression={"name": "countsketch", "params": {"rows": 1, "cols": 400}},
        )
    )
    store = Store(cfg.store.url)
    engine = Coordinator(cfg, Recorder(store), clock=VirtualClock())
    clients = [
        _client(engine, "a", lambda: 0.01),
        _client(engine, "b", lambda: 0.012),
        _client(engine, "far", lambda: 5.0),
    ]
    _round(engine, clients)
    v = _verdicts(store, engine.run_id, 1)
    assert "norm-bounded" in v["far"].flags
    assert "norm-bounded" not in v["a"].flags and "norm-bounded" not in v["b"].flags
    # The norm recorded is the sketch's ([400] values), not the update's; a
    # count sketch keeps norms only in expectation.
    dense = 5.0 * D**0.5
    assert v["far"].score is not None and v["far"].score != pytest.approx(dense)
    assert 0.5 < v["far"].score / dense < 2.0
