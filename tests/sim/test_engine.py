"""The simulator at scale: only selected clients work, enrolment past the burst,
liveness without polls, one model and lazy data per population."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from fedplat.server.config import parse_config

from fedplat.sim import simulate
from fedplat.sim.clients import ReferencePopulation
from fedplat.store import Store
from fedplat.transport.inmemory import InMemoryConnection
from tests.support import run_config


class _Counting(InMemoryConnection):
    """An in-memory connection that counts its client's calls after enrolment."""

    calls: ClassVar[Counter[str]] = Counter()

    def get_task(self, wait_seconds: float) -> Any:
        _Counting.calls[self._client_id] += 1
        return super().get_task(wait_seconds)


def test_only_selected_clients_are_polled_and_each_once(tmp_path: Path) -> None:
    cfg = parse_config(run_config(tmp_path, rounds=4, clients=3, min_available=3))
    population = ReferencePopulation.of(cfg, 30)
    _Counting.calls = Counter()

    def build(i: int, factory: Any) -> Any:
        return population.build(i, lambda: _Counting(factory().service))

    store = Store(cfg.store.url)
    res = simulate(cfg, build, 30, store=store)
    assert [r.completed for r in res.rounds] == [True] * 4
    selected = Counter(
        p.client_id
        for r in res.rounds
        for p in store.list_participations(res.run_id, r.number)
    )
    assert sum(selected.values()) == 12
    # One poll per selection; the 18+ clients never selected made no call at all.
    assert _Counting.calls == selected
    store.close()


def test_more_clients_than_the_enrolment_burst_and_a_short_liveness(
    tmp_path: Path,
) -> None:
    """300 clients enrol past the burst of 200 (the virtual clock moves at the
    admission rate: 6 s), which is longer than liveness_seconds: the simulator
    keeps them live without polls."""
    raw = run_config(tmp_path, rounds=3, clients=5, min_available=300)
    raw["deadlines"] = {"round_seconds": 60, "liveness_seconds": 4}
    cfg = parse_config(raw)
    assert cfg.admission.enrol_burst < 300
    store = Store(cfg.store.url)
    res = simulate(cfg, ReferencePopulation.of(cfg, 300), 300, store=store)
    assert [r.completed for r in res.rounds] == [True] * 3
    assert store.count_clients(res.run_id) == 300
    store.close()


def test_population_shares_one_model_and_loads_data_on_first_use(
    tmp_path: Path,
) -> None:
    cfg = parse_config(run_config(tmp_path, rounds=2, clients=2, min_available=2))
    population = ReferencePopulation.of(cfg, 20)
    clients = []

    def build(i: int, factory: Any) -> Any:
        clients.append(population.build(i, factory))
        return clients[-1]

    store = Store(cfg.store.url)
    res = simulate(cfg, build, 20, store=store)
    assert all(c.model is clients[0].model for c in clients)
    trained = {c.name for c in clients if c.rounds_done}
    loaded = {c.name for c in clients if c.train_fn.__self__.data is not None}
    assert trained == loaded and 0 < len(loaded) <= 4
    parts = store.list_participations(res.run_id, 1)
    names = {c.id: c.name for c in store.list_clients(res.run_id)}
    assert {names[p.client_id] for p in parts} <= trained
    store.close()


def test_population_examples_match_the_partition(tmp_path: Path) -> None:
    from fedplat.reference.clients import reference_data

    cfg = parse_config(run_config(tmp_path))
    population = ReferencePopulation.of(cfg, 7)
    c = population.build(3, lambda: None)  # type: ignore[arg-type, return-value]
    assert c.num_examples == len(reference_data(population.spec(3)))
    assert c.name == "sim-3"
    # The population crosses process boundaries as its settings only.
    population.model()
    state = population.__getstate__()
    assert state["_model"] is None and state["config"] == population.config
    assert isinstance(population.model(), torch.nn.Module)


def test_an_unconverged_rule_is_recorded_with_the_round(tmp_path: Path) -> None:
    # One Weiszfeld step cannot converge: the round says so (a metric and a
    # warning event), it is not a silent result.
    agg = {"name": "geometric_median", "params": {"max_iter": 1}}
    cfg = parse_config(
        run_config(tmp_path, rounds=1, clients=4, min_available=4, aggregator=agg)
    )
    with Store(cfg.store.url) as store:
        simulate(cfg, ReferencePopulation.of(cfg, 4), 4, store=store)
        run = store.get_run_by_name(cfg.run.name)
        assert run is not None and run.status == "completed"
        converged = store.list_metrics(run.id, "aggregator.converged")
        iterations = store.list_metrics(run.id, "aggregator.iterations")
        assert [m.value for m in converged] == [0.0]
        assert [m.value for m in iterations] == [1.0]
        events = store.list_events(run.id, kind="aggregator_unconverged")
        assert len(events) == 1 and events[0].details["converged"] is False


def test_enrol_retries_what_the_coordinator_asks_to_retry() -> None:
    from fedplat.protocol.errors import PermissionDenied, ResourceExhausted
    from fedplat.sim.engine import ENROL_ATTEMPTS, enrol

    class Flaky:
        def __init__(self, busy: int, then: Exception | None = None) -> None:
            self.calls, self.busy, self.then = 0, busy, then

        def enroll(self) -> None:
            self.calls += 1
            if self.calls <= self.busy:
                raise ResourceExhausted("enrolment token not known yet; retry")
            if self.then is not None:
                raise self.then

    waits: list[float] = []
    ok = Flaky(busy=2)
    enrol(ok, sleep=waits.append)  # type: ignore[arg-type]
    assert ok.calls == 3 and len(waits) == 2
    refused = Flaky(busy=0, then=PermissionDenied("revoked"))
    with pytest.raises(PermissionDenied):
        enrol(refused, sleep=waits.append)  # type: ignore[arg-type]
    assert refused.calls == 1  # any other refusal at once
    stuck = Flaky(busy=10**6)
    with pytest.raises(ResourceExhausted):
        enrol(stuck, sleep=lambda s: None)  # type: ignore[arg-type]
    assert stuck.calls == ENROL_ATTEMPTS
