"""In-process gossip simulation: training, mixing rules, disruptions, store contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedplat.data import iid, load_dataset
from fedplat.gossip.batched import StackedModel
from fedplat.gossip.recorder import GossipRecorder
from fedplat.gossip.scenario import load_scenario, parse_scenario
from fedplat.gossip.sim import GossipSimulation, simulate
from fedplat.models import create_model, train_epochs
from fedplat.protocol.task import TrainingSettings
from fedplat.vectors import flatten, load_vector
from tests.support import REPO

EXAMPLES = REPO / "examples" / "scenarios"


def _scenario(**over: Any) -> Any:
    base: dict[str, Any] = {
        "name": "t",
        "rounds": 6,
        "seed": 0,
        "topology": {"kind": "ring", "n": 8},
        "data": {"dataset": "digits", "partition": "iid"},
        "model": {"name": "mlp", "params": {"hidden": [32]}},
        "training": {"epochs": 1, "batch_size": 16, "lr": 0.1},
        "mixing": {"rule": "metropolis_hastings"},
    }
    base.update(over)
    return parse_scenario(base)


def test_stacked_training_equals_train_epochs_per_node() -> None:
    train = load_dataset("digits", "train")
    parts = iid(len(train), 4, 0)
    # Unequal sizes: the shorter nodes idle (zero gradient) in the last steps.
    data = [train.subset(p[: 60 + 25 * i]) for i, p in enumerate(parts)]
    model = create_model("mlp", train.input_shape, 10, seed=0, hidden=(16,))
    stack = StackedModel(model)
    x = flatten(model).repeat(4, 1) + 0.01 * torch.randn(4, stack.dim)
    seeds = [11, 12, 13, 14]
    out = stack.train(x, data, seeds, TrainingSettings(epochs=2, batch_size=16, lr=0.1))
    for i in range(4):
        load_vector(model, x[i])
        train_epochs(model, data[i], epochs=2, batch_size=16, lr=0.1, seed=seeds[i])
        torch.testing.assert_close(out[i], flatten(model), atol=1e-6, rtol=1e-5)
    acc = stack.accuracy(out, load_dataset("digits", "test"))
    assert acc.shape == (4,) and bool(((acc >= 0) & (acc <= 1)).all())


def test_stacked_model_rejects_buffers() -> None:
    with pytest.raises(ValueError, match="buffers"):
        StackedModel(torch.nn.BatchNorm1d(3))


def test_stacked_training_is_plain_sgd() -> None:
    stack = StackedModel(torch.nn.Linear(4, 2))
    with pytest.raises(ValueError, match="plain SGD"):
        stack.train(torch.zeros(0, stack.dim), [], [], TrainingSettings(momentum=0.9))


def test_partition_and_heal_consensus_distance_grows_then_falls() -> None:
    # Label-sorted data: each half of the ring holds different digits, so the two
    # halves drift apart while they cannot talk, and pull together after the heal.
    s = load_scenario(EXAMPLES / "partition_heal.yaml")
    control = s.model_copy(update={"events": []})
    split = simulate(s)
    base = simulate(control)
    cd = {m.round: m.consensus_distance for m in split.rounds}
    cd0 = {m.round: m.consensus_distance for m in base.rounds}
    comps = {m.round: m.components for m in split.rounds}
    assert comps[6] == 1 and comps[7] == 2 and comps[14] == 2 and comps[15] == 1
    # Grows while split: above where it started and above the unsplit control.
    assert cd[14] > 1.2 * cd[6]
    assert cd[14] > 1.2 * cd0[14]
    # Falls after the heal, back toward the control.
    assert cd[24] < 0.85 * cd[14]
    assert cd[24] - cd0[24] < 0.5 * (cd[14] - cd0[14])
    kinds = [c.kind for c in split.changes]
    assert kinds == ["gossip_partition", "gossip_heal"]


@pytest.mark.parametrize(
    "mixing",
    [
        {"rule": "metropolis_hastings"},
        {"rule": "decavg"},
        {"rule": "uniform"},
        {"rule": "push_sum"},
        {"rule": "noloco"},
        {"rule": "noloco", "outer_step": True},
    ],
)
def test_every_rule_learns(mixing: dict[str, Any]) -> None:
    res = simulate(_scenario(mixing=mixing, rounds=8))
    accs = [m.mean_accuracy for m in res.rounds]
    assert accs[-1] is not None and accs[0] is not None
    assert accs[-1] > 0.6, accs
    assert accs[-1] > accs[0]
    assert all(m.components == 1 for m in res.rounds)


def test_push_sum_conserves_mass_and_estimates() -> None:
    sim = GossipSimulation(_scenario(mixing={"rule": "push_sum"}, rounds=3))
    sim.run()
    assert float(sim._pushsum_w.sum()) == pytest.approx(8.0)


def test_removal_relays_and_rejoin_catch_up() -> None:
    s = _scenario(
        rounds=8,
        mixing={"rule": "decavg"},
        events=[
            {"round": 2, "action": "remove_nodes", "nodes": [0, 4]},
            {"round": 3, "action": "remove_nodes", "nodes": [6], "with_data": False},
            {"round": 5, "action": "rejoin", "nodes": [0]},
        ],
    )
    sim = GossipSimulation(s)
    assert len(sim.data.train[6]) == 0 and sim.network.relay == {6}
    caught: list[torch.Tensor] = []
    orig = sim._catch_up

    def spy(nodes: tuple[int, ...]) -> None:
        nbrs = [1, 7]  # both alive at round 5
        expected = sim.x[nbrs].mean(0)
        orig(nodes)
        caught.append(sim.x[0] - expected)

    sim._catch_up = spy  # type: ignore[method-assign]
    res = sim.run()
    assert torch.count_nonzero(caught[0]) == 0
    alive = [m.alive for m in res.rounds]
    assert alive == [8, 8, 6, 5, 5, 6, 6, 6]
    # Ring 0..7 without 4 and 6: {5} is cut off; 0 rejoins the 7-0-1-2-3 arc.
    assert [m.components for m in res.rounds][3:] == [3, 3, 2, 2, 2]
    assert set(res.final.node_accuracy) == {0, 1, 2, 3, 5, 7}
    assert res.final_mean_accuracy is not None and res.final_mean_accuracy > 0.5


def test_compressed_links_send_fewer_bytes_and_still_learn() -> None:
    dense = simulate(_scenario(rounds=6))
    topk = simulate(
        _scenario(rounds=6, links={"compressor": "topk", "params": {"ratio": 0.1}})
    )
    assert topk.final.bytes_sent < 0.3 * dense.final.bytes_sent
    assert topk.final_mean_accuracy is not None and topk.final_mean_accuracy > 0.5
    assert sum(topk.link_bytes.values()) == sum(m.bytes_sent for m in topk.rounds)
    with pytest.raises(ValueError, match="noloco"):
        GossipSimulation(
            _scenario(mixing={"rule": "noloco"}, links={"compressor": "fp16"})
        )


def test_simulation_repeats_exactly() -> None:
    a = simulate(_scenario(rounds=3))
    b = simulate(_scenario(rounds=3))
    assert [m.consensus_distance for m in a.rounds] == [
        m.consensus_distance for m in b.rounds
    ]


def test_recorder_writes_the_store_contract(tmp_path: Path) -> None:
    from fedplat.store import Store

    s = _scenario(
        rounds=4,
        eval={"every": 2},
        events=[
            {"round": 1, "action": "remove_nodes", "nodes": [3]},
            {"round": 2, "action": "rejoin", "nodes": "removed"},
        ],
    )
    with Store(str(tmp_path / "g.db")) as store:
        rec = GossipRecorder(store)
        GossipSimulation(s, observers=[rec]).run()
        assert rec.run_id is not None
        run = store.get_run(rec.run_id)
        assert run is not None and run.status == "completed"
        assert run.current_round == 4 and run.best_accuracy is not None
        topo = run.config["topology"]
        assert run.config["mode"] == "gossip"
        assert topo["nodes"] == [str(i) for i in range(8)]
        assert ["0", "1"] in topo["edges"] and len(topo["edges"]) == 8
        names = {(m.name, m.client_id is None) for m in store.list_metrics(rec.run_id)}
        for name in (
            "gossip.mean_accuracy",
            "gossip.min_accuracy",
            "gossip.consensus_distance",
            "gossip.components",
        ):
            assert (name, True) in names
        assert ("gossip.accuracy", False) in names
        assert ("gossip.bytes_sent", False) in names
        acc = store.list_metrics(rec.run_id, "gossip.accuracy")
        assert {m.round_number for m in acc} == {2, 4}
        assert {m.client_id for m in acc if m.round_number == 4} == {
            str(i) for i in range(8)
        }
        removed = store.list_events(rec.run_id, kind="gossip_node_removed")
        assert removed[0].round_number == 1
        assert removed[0].details["nodes"] == ["3"]
        (links,) = store.list_events(rec.run_id, kind="gossip_link_bytes")
        assert set(links.details["links"]) >= {"0-1", "2-3"}
