"""FedplatStrategy in Flower's round loop, driven in process (no SuperLink)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from fedplat.flower import (
    ContributionScoring,
    FedplatStrategy,
    decisions_from_metrics,
    uplink_mod,
)
from tests.support.flower import (
    contexts,
    flat,
    flower_identity,
    model_arrays,
    run_round,
    shift_app,
)

SHAPES = {"w": (3, 4), "b": (4,)}
D = 16
NODES = [101, 202, 303, 404, 505]
SAMPLE_ALL = {"min_train_nodes": 5, "min_available_nodes": 5, "fraction_evaluate": 0.0}


@pytest.fixture(autouse=True)
def _identity() -> Iterator[None]:
    with flower_identity():
        yield


def _honest(seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    base = rng.normal(size=D).astype(np.float32)
    return {n: base + 0.1 * rng.normal(size=D).astype(np.float32) for n in NODES}


def _zeros() -> ArrayRecord:
    return model_arrays(np.zeros(D, dtype=np.float32), SHAPES)


def test_krum_decisions_are_in_the_round_metrics() -> None:
    updates = _honest()
    updates[505] = updates[505] + 50.0  # an outlier Krum must not pick
    strategy = FedplatStrategy({"name": "krum", "params": {"f": 1}}, **SAMPLE_ALL)
    app = shift_app(updates, dict.fromkeys(NODES, 10))
    arrays, metrics = run_round(strategy, 1, _zeros(), app, contexts(NODES))
    assert arrays is not None and metrics is not None
    decisions = decisions_from_metrics(metrics)
    assert [d.node_id for d in decisions] == NODES
    chosen = [d for d in decisions if d.selected]
    assert len(chosen) == 1 and chosen[0].node_id != 505 and chosen[0].weight == 1.0
    outlier = decisions[-1]
    assert outlier.flags == ("excluded",) and outlier.weight == 0.0
    assert outlier.score is not None and outlier.score > max(
        d.score for d in decisions[:-1] if d.score is not None
    )
    # Krum's output is the chosen client's model, exactly.
    np.testing.assert_allclose(flat(arrays), updates[chosen[0].node_id], atol=1e-6)
    assert metrics["train_loss"] == pytest.approx(0.5)  # the clients' own metric
    assert metrics["fedplat.num-accepted"] == 5 and metrics["fedplat.failed"] == 0
    report = strategy.reports[1]
    assert report.decisions == tuple(decisions) and report.failure is None


def test_weighted_fedavg_uses_the_example_counts() -> None:
    updates = {n: np.full(D, float(i), dtype=np.float32) for i, n in enumerate(NODES)}
    counts = {n: i + 1 for i, n in enumerate(NODES)}
    expect = sum(i * (i + 1) for i in range(5)) / sum(range(1, 6))
    for weighted, want in ((True, expect), (False, 2.0)):
        strategy = FedplatStrategy(
            {"name": "fedavg", "weighted": weighted}, **SAMPLE_ALL
        )
        arrays, _ = run_round(
            strategy, 1, _zeros(), shift_app(updates, counts), contexts(NODES)
        )
        assert arrays is not None
        np.testing.assert_allclose(flat(arrays), want, rtol=1e-6)


def _forged(node: int, *, error: bool = False, **metrics: object) -> object:
    """A reply from ``node`` to the round's first message, forged."""

    def forge(messages: list[Message]) -> Message:
        first = messages[0]
        if error:
            return Message(Error(code=2, reason="boom " * 100), reply_to=first)
        content = RecordDict(
            {
                "arrays": model_arrays(np.ones(D, dtype=np.float32), SHAPES),
                "metrics": MetricRecord(dict(metrics) or {"num-examples": 1}),
            }
        )
        reply = Message(content, reply_to=first)
        reply.metadata.__dict__["_src_node_id"] = node
        return reply

    return forge


def test_bad_replies_are_rejected_one_by_one_with_reasons() -> None:
    nodes = NODES[:4]
    updates = _honest()
    counts = dict.fromkeys(nodes, 10)
    good = shift_app(updates, counts)
    bad_count = shift_app(updates, {**counts, 202: 10**12})
    nan_update = {**updates, 303: np.full(D, np.nan, dtype=np.float32)}
    bad_values = shift_app(nan_update, counts)

    def client(msg: Message, ctx: Context) -> Message:
        node = msg.metadata.dst_node_id
        app = {202: bad_count, 303: bad_values}.get(node, good)
        return app(msg, ctx)

    strategy = FedplatStrategy(
        {"name": "median"}, **SAMPLE_ALL | {"min_train_nodes": 4}
    )
    strategy.min_available_nodes = 4
    arrays, metrics = run_round(
        strategy,
        1,
        _zeros(),
        client,
        contexts(nodes),
        extra_replies=[_forged(999), _forged(101)],
    )
    assert arrays is not None and metrics is not None
    reasons = {r.node_id: r.reason for r in strategy.reports[1].rejected}
    assert reasons[999] == "node was not sampled this round"
    assert reasons[202].startswith("metric 'num-examples' = 1000000000000 is not in")
    assert reasons[303] == "the update holds non-finite values"
    assert [d.node_id for d in decisions_from_metrics(metrics)] == [101, 404]
    assert metrics["fedplat.num-rejected"] == 4
    assert sorted(metrics["fedplat.rejected-node-id"]) == [101, 202, 303, 999]
    # The second reply claiming to be node 101 is refused; the first one counts.
    assert "second reply" in reasons[101]


def test_an_error_reply_is_rejected_with_its_reason_cut_short() -> None:
    strategy = FedplatStrategy({"name": "fedavg"}, **SAMPLE_ALL)
    updates = _honest()

    def client(msg: Message, ctx: Context) -> Message:
        if msg.metadata.dst_node_id == 303:
            return Message(Error(code=2, reason="boom " * 100), reply_to=msg)
        return shift_app(updates, dict.fromkeys(NODES, 1))(msg, ctx)

    arrays, _ = run_round(strategy, 1, _zeros(), client, contexts(NODES))
    assert arrays is not None
    (rejected,) = strategy.reports[1].rejected
    assert rejected.node_id == 303
    assert rejected.reason.startswith("client error 2: boom boom")
    assert len(rejected.reason) < 250


def test_a_round_the_rule_refuses_keeps_the_global_model() -> None:
    # Krum with f = 1 needs n >= 2f + 3 = 5 updates; 4 arrive.
    strategy = FedplatStrategy({"name": "krum", "params": {"f": 1}}, **SAMPLE_ALL)
    nodes = NODES[:4]
    strategy.min_train_nodes = strategy.min_available_nodes = 4
    app = shift_app(_honest(), dict.fromkeys(nodes, 1))
    arrays, metrics = run_round(strategy, 1, _zeros(), app, contexts(nodes))
    assert arrays is None and metrics is not None
    assert metrics["fedplat.failed"] == 1
    assert "n >= 2f + 3" in str(strategy.reports[1].failure)


def test_bad_aggregator_sections_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="bad aggregator section"):
        FedplatStrategy({"name": "krum", "parms": {}})
    # A wrong rule parameter or pre-aggregator is a section error, found when
    # the section is read (the rule is built there), with what is wrong named.
    with pytest.raises(ValueError, match=r"unknown parameter.*'g'.*krum"):
        FedplatStrategy({"name": "krum", "params": {"f": 1, "g": 2}})
    with pytest.raises(ValueError, match="nosuch"):
        FedplatStrategy({"name": "fedavg", "pre": [{"name": "nosuch"}]})


def test_pre_aggregators_and_compressed_updates_together() -> None:
    updates = _honest(1)
    strategy = FedplatStrategy(
        {
            "name": "trimmed_mean",
            "params": {"f": 1},
            "pre": [{"name": "clipping", "params": {"max_norm": 1.0}}],
        },
        uplink={"compression": {"name": "topk", "params": {"ratio": 0.5}}},
        **SAMPLE_ALL,
    )
    app = shift_app(updates, dict.fromkeys(NODES, 1), mods=[uplink_mod])
    ctxs = contexts(NODES)
    arrays = _zeros()
    for r in (1, 2):
        arrays, metrics = run_round(strategy, r, arrays, app, ctxs)
        assert arrays is not None and metrics is not None
        assert metrics["fedplat.num-accepted"] == 5
        # 8 of 16 values as float32 + 8 one-byte index deltas + the 57-byte header.
        assert metrics["fedplat.uplink-bytes"] == 5 * (57 + 8 * 4 + 8)
        assert all("clipped" in d.flags for d in decisions_from_metrics(metrics))
    # Two rounds of clipped steps of norm <= 1.
    assert np.linalg.norm(flat(arrays)) <= 2.0 + 1e-5


def test_contribution_scores_put_a_free_rider_last() -> None:
    target = np.linspace(-1, 1, D).astype(np.float32)
    updates = {n: target * (0.45 + 0.05 * i) for i, n in enumerate(NODES)}
    updates[505] = np.zeros(D, dtype=np.float32)  # sends back the global model

    def utility(arrays: ArrayRecord) -> float:
        return -float(np.linalg.norm(flat(arrays) - target))

    scoring = ContributionScoring(
        utility=utility, scorers=("gtg_shapley", "leave_one_out", "cosine")
    )
    strategy = FedplatStrategy({"name": "fedavg"}, contribution=scoring, **SAMPLE_ALL)
    app = shift_app(updates, dict.fromkeys(NODES, 1))
    _, metrics = run_round(strategy, 1, _zeros(), app, contexts(NODES))
    assert metrics is not None
    decisions = decisions_from_metrics(metrics)
    for scorer in ("gtg_shapley", "leave_one_out", "cosine"):
        scores = {d.node_id: d.contribution[scorer] for d in decisions}
        assert min(scores, key=scores.__getitem__) == 505, scorer
    assert metrics["fedplat.contribution-evaluations"] > 0


def test_contribution_needs_a_utility_for_utility_scorers() -> None:
    with pytest.raises(ValueError, match="need a utility"):
        ContributionScoring(scorers=("gtg_shapley",))
    with pytest.raises(ValueError, match="nosuch"):
        ContributionScoring(scorers=("nosuch",))
    ContributionScoring(scorers=("cosine",))  # no utility needed


def test_a_failing_utility_drops_the_scores_not_the_round() -> None:
    def utility(arrays: ArrayRecord) -> float:
        raise RuntimeError("validation set missing")

    strategy = FedplatStrategy(
        {"name": "fedavg"}, contribution=ContributionScoring(utility), **SAMPLE_ALL
    )
    app = shift_app(_honest(), dict.fromkeys(NODES, 1))
    arrays, metrics = run_round(strategy, 1, _zeros(), app, contexts(NODES))
    assert arrays is not None and metrics is not None
    assert all(d.contribution == {} for d in decisions_from_metrics(metrics))


def test_clients_cannot_plant_fedplat_metrics() -> None:
    updates = _honest()
    app = ClientApp()

    @app.train()
    def train(msg: Message, ctx: Context) -> Message:
        reply = shift_app(updates, dict.fromkeys(NODES, 1))(msg, ctx)
        metrics = reply.content["metrics"]
        metrics["fedplat.flag.excluded"] = [1, 1, 1, 1, 1]
        metrics["fedplat.score"] = [0.0]
        return reply

    strategy = FedplatStrategy({"name": "fedavg"}, **SAMPLE_ALL)
    _, metrics = run_round(strategy, 1, _zeros(), app, contexts(NODES))
    assert metrics is not None
    assert "fedplat.flag.excluded" not in metrics
    scores = metrics["fedplat.score"]
    assert isinstance(scores, list) and len(scores) == 5  # FedAvg scores none: NaN
    assert all(math.isnan(x) for x in scores)
    assert all(d.flags == () for d in decisions_from_metrics(metrics))
    assert metrics["train_loss"] == pytest.approx(0.5)
