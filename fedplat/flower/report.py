"""One round of :class:`~fedplat.flower.strategy.FedplatStrategy`, typed, and its
form in the round's Flower ``MetricRecord``.

A MetricRecord holds numbers and lists of numbers only, so the per-client
decisions travel as parallel lists keyed ``fedplat.*`` (one entry per accepted
client, in the same order as ``fedplat.node-id``)::

    fedplat.node-id            [uint]   Flower node ids of the accepted replies
    fedplat.selected           [0|1]    whether the rule used the client at all
    fedplat.weight             [float]  its effective weight in the aggregate
    fedplat.score              [float]  the rule's score (NaN: none)
    fedplat.flag.<name>        [0|1]    one list per flag raised this round
                                        (excluded, clipped, down-weighted, ...)
    fedplat.contribution.<s>   [float]  scorer <s> (gtg_shapley, ...), if enabled
    fedplat.rejected-node-id   [uint]   replies refused before aggregation
    fedplat.failed             0|1      the round produced no new model

plus scalars (``fedplat.num-accepted``, ``fedplat.aggregation-s`` (the whole
aggregation step), ``fedplat.rule-s`` (the rule and pre-aggregators alone),
``fedplat.uplink-bytes``, ``fedplat.compression-ratio``, ...).
:func:`decisions_from_metrics` reads the decisions back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from flwr.app import MetricRecord

from fedplat.aggregators import ClientDecision

__all__ = [
    "NodeDecision",
    "Rejection",
    "RoundReport",
    "decisions_from_metrics",
]

PREFIX = "fedplat."


@dataclass(frozen=True)
class NodeDecision:
    """What the aggregator did with one node's update (a
    :class:`~fedplat.aggregators.ClientDecision` keyed by Flower node id)."""

    node_id: int
    weight: float
    selected: bool
    score: float | None = None
    flags: tuple[str, ...] = ()
    contribution: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, node_id: int, d: ClientDecision) -> NodeDecision:
        return cls(node_id, d.weight, d.selected, d.score, d.flags)


@dataclass(frozen=True)
class Rejection:
    """A reply refused before aggregation, and why."""

    node_id: int
    reason: str


@dataclass(frozen=True)
class RoundReport:
    """Everything the strategy decided in one training round."""

    server_round: int
    decisions: tuple[NodeDecision, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    failure: str | None = None
    aggregation_s: float = 0.0
    rule_s: float = 0.0
    uplink_bytes: int = 0
    dense_bytes: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    def to_metrics(self) -> MetricRecord:
        """The report as ``fedplat.*`` entries of a MetricRecord."""
        m: dict[str, int | float | list[int] | list[float]] = {
            PREFIX + "num-accepted": len(self.decisions),
            PREFIX + "num-rejected": len(self.rejected),
            PREFIX + "failed": int(self.failure is not None),
            PREFIX + "aggregation-s": self.aggregation_s,
            PREFIX + "rule-s": self.rule_s,
            PREFIX + "uplink-bytes": self.uplink_bytes,
        }
        if self.uplink_bytes > 0:
            m[PREFIX + "compression-ratio"] = self.dense_bytes / self.uplink_bytes
        if self.rejected:
            m[PREFIX + "rejected-node-id"] = [r.node_id for r in self.rejected]
        ds = self.decisions
        if ds:
            m[PREFIX + "node-id"] = [d.node_id for d in ds]
            m[PREFIX + "selected"] = [int(d.selected) for d in ds]
            m[PREFIX + "weight"] = [float(d.weight) for d in ds]
            m[PREFIX + "score"] = [
                math.nan if d.score is None else float(d.score) for d in ds
            ]
            for name in sorted({f for d in ds for f in d.flags}):
                m[PREFIX + "flag." + name] = [int(name in d.flags) for d in ds]
            for name in sorted({s for d in ds for s in d.contribution}):
                m[PREFIX + "contribution." + name] = [
                    float(d.contribution.get(name, math.nan)) for d in ds
                ]
        m.update({PREFIX + k: v for k, v in self.extra.items()})
        return MetricRecord(m)


def decisions_from_metrics(metrics: MetricRecord) -> list[NodeDecision]:
    """The per-node decisions stored by :meth:`RoundReport.to_metrics`."""
    ids = metrics.get(PREFIX + "node-id", [])
    assert isinstance(ids, list)
    n = len(ids)

    def column(key: str) -> list[float]:
        values = metrics[key]
        if not isinstance(values, list) or len(values) != n:
            raise ValueError(f"{key} must be a list of {n} values")
        return [float(v) for v in values]

    weight = column(PREFIX + "weight") if n else []
    selected = column(PREFIX + "selected") if n else []
    score = column(PREFIX + "score") if n else []
    flags = {
        k[len(PREFIX + "flag.") :]: column(k)
        for k in metrics
        if k.startswith(PREFIX + "flag.")
    }
    contrib = {
        k[len(PREFIX + "contribution.") :]: column(k)
        for k in metrics
        if k.startswith(PREFIX + "contribution.")
    }
    return [
        NodeDecision(
            node_id=int(ids[i]),
            weight=weight[i],
            selected=bool(selected[i]),
            score=None if math.isnan(score[i]) else score[i],
            flags=tuple(name for name, col in flags.items() if col[i]),
            contribution={name: col[i] for name, col in contrib.items()},
        )
        for i in range(n)
    ]
