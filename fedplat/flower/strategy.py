"""fedplat's aggregation as a Flower strategy (Message API, ``flwr.serverapp``).

:class:`FedplatStrategy` is Flower's ``FedAvg`` (sampling, messages, federated
evaluation) with fedplat's aggregation step: each training reply is checked and
decoded on its own (:mod:`fedplat.flower.intake`) into the round update
``new - global`` (dense model arrays from any Flower client, or fedplat payload
bytes from :func:`~fedplat.flower.mods.uplink_mod`), the ``[n, d]`` stack goes
through the rule and pre-aggregators built by
:func:`fedplat.aggregators.build_aggregator` from a run file's ``aggregator:``
section, and the new global model is ``global + aggregate``. Each round's
per-client decisions (and optional contribution scores) are returned in the
round's MetricRecord (:mod:`fedplat.flower.report`) and kept, typed, in
:attr:`FedplatStrategy.reports`.

Usage (in a ServerApp)::

    strategy = FedplatStrategy(
        aggregator={"name": "krum", "params": {"f": 1},
                    "pre": [{"name": "bucketing", "params": {"bucket_size": 2}}]},
        uplink={"compression": {"name": "dgc", "params": {"ratio": 0.01}}},
        fraction_evaluate=0.0,
    )
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=10)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.exception import InconsistentMessageReplies
from flwr.serverapp.strategy import FedAvg
from pydantic import ValidationError

from fedplat.aggregators import AggregationError, AggregationResult
from fedplat.compression import Compressor
from fedplat.config import validation_message
from fedplat.flower.contribution import ContributionScoring
from fedplat.flower.intake import Intake, RoundInput, take_replies
from fedplat.flower.records import arrays_to_vector, layout_of_arrays, vector_to_arrays
from fedplat.flower.report import PREFIX, NodeDecision, RoundReport
from fedplat.flower.uplink import CONFIG_KEY, UplinkSpec
from fedplat.privacy import PrivacyAccountant
from fedplat.server.config import AggregatorSection
from fedplat.vectors import all_finite

__all__ = ["FedplatStrategy"]

log = logging.getLogger("fedplat.flower")


def _aggregator_section(value: AggregatorSection | Mapping[str, Any] | None) -> Any:
    if isinstance(value, AggregatorSection):
        return value
    try:
        return AggregatorSection.model_validate(dict(value or {}))
    except ValidationError as exc:
        raise ValueError(validation_message(exc, "bad aggregator section:")) from exc


@dataclass(frozen=True)
class _Outcome:
    """The aggregation step of one round: the accepted rows ``[n, d]``, their
    weights ``[n]`` (``None``: unweighted), the rule's result or why there is
    none, and the seconds spent in the rule (and pre-aggregators)."""

    stack: torch.Tensor
    weights: torch.Tensor | None
    result: AggregationResult | None
    failure: str | None
    rule_s: float = 0.0


class FedplatStrategy(FedAvg):
    """Flower's FedAvg loop with a fedplat aggregator, uplink and scoring.

    Parameters
    ----------
    aggregator : mapping or AggregatorSection, optional
        A fedplat run file's ``aggregator:`` section: ``name``, ``params``,
        ``pre: [{name, params}]``, ``weighted`` (pass example counts to the
        rule as weights). Default: weighted FedAvg.
    uplink : mapping or UplinkSpec, optional
        ``compression: {name, params}``, ``privacy: {mode: local, clip_norm,
        noise_multiplier}``, ``seed``: what :func:`~fedplat.flower.mods.
        uplink_mod` applies on every client (default: dense updates).
    contribution : ContributionScoring, optional
        Per-round contribution scores of the accepted clients.
    max_num_examples : float
        Replies claiming more examples than this are rejected: a client's own
        number must not buy it an unbounded weight.
    **kwargs
        Flower's ``FedAvg`` arguments (``fraction_train``, ``min_train_nodes``,
        ``weighted_by_key``, ...).
    """

    def __init__(
        self,
        aggregator: AggregatorSection | Mapping[str, Any] | None = None,
        *,
        uplink: UplinkSpec | Mapping[str, Any] | None = None,
        contribution: ContributionScoring | None = None,
        max_num_examples: float = 1e9,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.aggregator_config = _aggregator_section(aggregator)
        self.aggregator = self.aggregator_config.build()  # AggregationError: bad config
        self.uplink = UplinkSpec.parse(uplink)
        self.contribution = contribution
        if not max_num_examples > 0:
            raise ValueError(f"max_num_examples must be > 0, got {max_num_examples}")
        self.max_num_examples = float(max_num_examples)
        self.reports: dict[int, RoundReport] = {}
        self._sent: RoundInput | None = None
        self._compressor: Compressor | None = None
        self._accountant: PrivacyAccountant | None = None
        if self.uplink.privacy.mode == "local":
            self._accountant = PrivacyAccountant(self.uplink.privacy.accountant)

    def summary(self) -> None:
        log.info("fedplat aggregator: %s", self.aggregator.name)
        log.info("fedplat uplink: %s", self.uplink.to_config())
        super().summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Flower's sampling, plus the uplink spec in the config; remembers the
        global model so the replies can be turned into updates."""
        layout = layout_of_arrays(arrays)
        if (
            self._compressor is None
            or self._sent is None
            or (self._sent.layout != layout)
        ):
            self._compressor = self.uplink.compressor(layout)
        if not self.uplink.is_dense:
            # Without it uplink_mod leaves the reply alone: dense updates travel
            # as Flower's own arrays, which any client and strategy can read.
            config[CONFIG_KEY] = self.uplink.to_config()
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self._sent = RoundInput(
            server_round=server_round,
            layout=layout,
            global_vec=arrays_to_vector(arrays, layout),
            template=arrays,
            node_ids=frozenset(int(m.metadata.dst_node_id) for m in messages),
        )
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check, decode and aggregate the replies; ``None`` arrays (the global
        model stays) when no update is usable or the rule refuses the round."""
        sent = self._sent
        if sent is None or sent.server_round != server_round:
            log.error("round %d: aggregate_train without configure_train", server_round)
            return None, None
        assert self._compressor is not None
        t0 = time.perf_counter()
        intake = take_replies(
            replies,
            sent,
            self.uplink,
            self._compressor,
            weighted_by_key=self.weighted_by_key,
            max_num_examples=self.max_num_examples,
        )
        for r in intake.rejected:
            log.warning(
                "round %d: rejected node %d: %s", server_round, r.node_id, r.reason
            )
        outcome = self._aggregate(intake)
        result, failure = outcome.result, outcome.failure
        arrays = None
        decisions: tuple[NodeDecision, ...] = ()
        if result is not None:
            new = sent.global_vec + result.aggregate.to(torch.float32)
            if all_finite(new):
                arrays = vector_to_arrays(new, sent.layout, sent.template)
                decisions = tuple(
                    NodeDecision.of(intake.accepted[d.index].node_id, d)
                    for d in result.decisions
                )
            else:
                failure = "the new model holds non-finite values"
        elapsed = time.perf_counter() - t0
        if failure is not None:
            log.warning("round %d failed: %s", server_round, failure)
        extra: dict[str, float] = {}
        if arrays is not None and self.contribution is not None:
            assert result is not None
            decisions, extra = self._score(server_round, outcome, result, decisions)
        extra.update(self._account(intake))
        report = RoundReport(
            server_round=server_round,
            decisions=decisions,
            rejected=tuple(intake.rejected),
            failure=failure,
            aggregation_s=elapsed,
            rule_s=outcome.rule_s,
            uplink_bytes=sum(a.nbytes for a in intake.accepted),
            dense_bytes=4 * sent.layout.numel * len(intake.accepted),
            extra=extra,
        )
        self.reports[server_round] = report
        return arrays, self._metrics(intake, report)

    def _aggregate(self, intake: Intake) -> _Outcome:
        """The rule's result over the accepted rows, or the reason there is none."""
        stack = intake.stack
        if not intake.accepted:
            return _Outcome(stack, None, None, "no usable update")
        weights = None
        if self.aggregator_config.is_weighted:
            weights = torch.tensor([a.num_examples for a in intake.accepted])
        t0 = time.perf_counter()
        try:
            result = self.aggregator(stack, weights)
        except AggregationError as exc:
            return _Outcome(stack, weights, None, f"aggregation failed: {exc}")
        return _Outcome(stack, weights, result, None, time.perf_counter() - t0)

    def _score(
        self,
        server_round: int,
        outcome: _Outcome,
        result: AggregationResult,
        decisions: tuple[NodeDecision, ...],
    ) -> tuple[tuple[NodeDecision, ...], dict[str, float]]:
        sent = self._sent
        assert self.contribution is not None and sent is not None
        scores = self.contribution.score(
            server_round,
            outcome.stack,
            outcome.weights,
            sent.global_vec,
            result.aggregate.to(torch.float32),
            lambda vec: vector_to_arrays(vec, sent.layout, sent.template),
        )
        if scores is None:
            return decisions, {}
        out = tuple(
            NodeDecision(
                d.node_id,
                d.weight,
                d.selected,
                d.score,
                d.flags,
                {name: float(v[i]) for name, v in scores.values.items()},
            )
            for i, d in enumerate(decisions)
        )
        info = {
            "contribution-evaluations": float(scores.evaluations),
            "contribution-seconds": scores.seconds,
        }
        return out, info

    def _account(self, intake: Intake) -> dict[str, float]:
        """Local DP: every accepted upload is one release of its client."""
        p = self.uplink.privacy
        if self._accountant is None or not intake.accepted:
            return {}
        assert p.noise_multiplier is not None
        # Sample rate 1: the worst case of a client that is always selected.
        self._accountant.step(noise_multiplier=p.noise_multiplier, sample_rate=1.0)
        return {
            "privacy.epsilon": self._accountant.get_epsilon(p.delta),
            "privacy.delta": p.delta,
            "privacy.noise-multiplier": p.noise_multiplier,
        }

    def _metrics(self, intake: Intake, report: RoundReport) -> MetricRecord:
        """The clients' own metrics (Flower's aggregation) plus the report."""
        metrics = MetricRecord()
        if intake.accepted:
            try:
                metrics = self.train_metrics_aggr_fn(
                    [a.content for a in intake.accepted], self.weighted_by_key
                )
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("clients' metrics not aggregated: %s", exc)
        # The fedplat.* keys are the strategy's: a client must not be able to
        # plant decisions (a flag list, a score) in the round's record.
        out = MetricRecord(
            {k: v for k, v in metrics.items() if not k.startswith(PREFIX)}
        )
        for key, value in report.to_metrics().items():
            out[key] = value
        return out

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Flower's evaluation metrics; inconsistent replies skip them (logged)
        instead of ending the run."""
        try:
            return super().aggregate_evaluate(server_round, replies)
        except InconsistentMessageReplies as exc:
            log.warning("round %d: evaluation metrics skipped: %s", server_round, exc)
            return None
