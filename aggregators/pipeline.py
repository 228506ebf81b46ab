"""Chains of pre-aggregators followed by a rule, built by name from a run config.

A :class:`Pipeline` is itself an aggregator (``(updates, weights) ->
AggregationResult``) and reports per-client decisions for the *original* clients:
a client's weight is its share of the output through the rows it fed (for
bucketing, the bucket's weight times its share of the bucket), its score and the
rule's flags are those of the row that stands for it (its bucket), plus the
pre-aggregators' own flags (``"clipped"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from fedplat.aggregators.base import (
    AggregationError,
    Aggregator,
    PreAggregator,
    RowReport,
    Rule,
    RuleOutput,
)
from fedplat.aggregators.registry import create_aggregator, create_pre_aggregator


class Pipeline(Rule):
    """``pre[0] -> pre[1] -> ... -> rule`` over an ``[n, d]`` stack.

    Parameters
    ----------
    pre : sequence of PreAggregator
        Applied in order; each maps ``[n_k, d] -> [n_{k+1}, d]``.
    rule : Rule
        The final aggregation rule; its bounds (``2f < n``, ...) apply to the
        number of rows it receives (e.g. ``ceil(n / s)`` after bucketing).

    State: ``"pre.<i>.<key>"`` and ``"rule.<key>"`` entries.

    Examples
    --------
    Clip every row to norm 1, then take the coordinate-wise median:

    >>> from fedplat.aggregators import CoordinateMedian, NormClipping
    >>> agg = Pipeline([NormClipping(max_norm=1.0)], CoordinateMedian())
    >>> r = agg(torch.tensor([[0.5], [0.2], [-30.0]]))
    >>> r.aggregate, r.decisions[2].flags
    (tensor([0.2000]), ('down-weighted', 'clipped'))
    """

    def __init__(self, pre: Sequence[PreAggregator], rule: Rule) -> None:
        if not isinstance(rule, Rule):
            raise AggregationError(
                f"{rule!r} cannot follow pre-aggregators: it is not a fedplat Rule "
                "(no aggregate_rows)"
            )
        for p in pre:
            if not isinstance(p, PreAggregator):
                raise AggregationError(f"{p!r} is not a PreAggregator")
        self.pre = list(pre)
        self.rule = rule
        self.name = "+".join([p.name for p in self.pre] + [rule.name])

    def aggregate_rows(
        self, updates: torch.Tensor, weights: torch.Tensor
    ) -> RuleOutput:
        n = updates.shape[0]
        share = torch.eye(n, dtype=torch.float64)  # [rows now, clients]
        owner = torch.arange(n)  # client -> row now
        pre_flags: dict[str, torch.Tensor] = {}
        x, w = updates, weights
        for p in self.pre:
            out = p(x, w)
            for name, mask in out.flags.items():
                client_mask = mask[owner]
                pre_flags[name] = (
                    pre_flags.get(name, torch.zeros_like(client_mask)) | client_mask
                )
            share = out.share @ share
            owner = out.owner[owner]
            x, w = out.updates, out.weights
        try:
            inner = self.rule.aggregate_rows(x, w)
        except AggregationError as exc:
            raise AggregationError(
                f"{exc} (after {', '.join(p.name for p in self.pre)}: "
                f"{n} clients -> {x.shape[0]} rows)"
            ) from exc
        rep = inner.report
        weight = rep.weight.to(torch.float64) @ share
        flags = {name: mask[owner] for name, mask in rep.flags.items()}
        for name, mask in pre_flags.items():
            flags[name] = flags.get(name, torch.zeros_like(mask)) | mask
        report = RowReport(
            weight=weight,
            selected=rep.selected[owner],
            score=None if rep.score is None else rep.score[owner],
            flags=flags,
        )
        return RuleOutput(inner.aggregate, report, inner.diagnostics)

    def commit(self, aggregate: torch.Tensor) -> None:
        self.rule.commit(aggregate)

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = {f"rule.{k}": v for k, v in self.rule.state_dict().items()}
        for i, p in enumerate(self.pre):
            state.update({f"pre.{i}.{k}": v for k, v in p.state_dict().items()})
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        rule_state: dict[str, torch.Tensor] = {}
        pre_state: list[dict[str, torch.Tensor]] = [{} for _ in self.pre]
        for key, value in state.items():
            head, _, rest = key.partition(".")
            if head == "rule" and rest:
                rule_state[rest] = value
                continue
            idx, _, sub = rest.partition(".")
            if head == "pre" and idx.isdigit() and int(idx) < len(self.pre) and sub:
                pre_state[int(idx)][sub] = value
                continue
            raise AggregationError(f"{self.name}: unknown state key {key!r}")
        self.rule.load_state_dict(rule_state)
        for p, s in zip(self.pre, pre_state, strict=True):
            p.load_state_dict(s)

    def __repr__(self) -> str:
        return f"Pipeline(pre={self.pre!r}, rule={self.rule!r})"


def build_aggregator(
    name: str,
    params: Mapping[str, Any] | None = None,
    pre: Sequence[Mapping[str, Any]] | None = None,
) -> Aggregator:
    """Build a rule, optionally preceded by pre-aggregators, from config values.

    Parameters
    ----------
    name : str
        Registered rule name (``"krum"``).
    params : mapping, optional
        Keyword arguments of the rule (``{"f": 2}``).
    pre : sequence of mapping, optional
        ``[{"name": "bucketing", "params": {"bucket_size": 2}}, ...]``, applied in
        order. Only the keys ``name`` and ``params`` are accepted.

    Returns
    -------
    Aggregator
        The rule itself when ``pre`` is empty, else a :class:`Pipeline`.

    Examples
    --------
    >>> agg = build_aggregator("krum", {"f": 1}, [{"name": "bucketing"}])
    >>> agg.name
    'bucketing+krum'
    """
    rule = create_aggregator(name, **dict(params or {}))
    if not pre:
        return rule
    stages: list[PreAggregator] = []
    for i, spec in enumerate(pre):
        if not isinstance(spec, Mapping):
            raise AggregationError(f"pre[{i}] must be a mapping, got {spec!r}")
        unknown = sorted(set(spec) - {"name", "params"})
        if unknown:
            raise AggregationError(
                f"pre[{i}] has unknown key(s) {unknown}; expected 'name' and 'params'"
            )
        if "name" not in spec:
            raise AggregationError(f"pre[{i}] has no 'name'")
        stage_params = spec.get("params") or {}
        if not isinstance(stage_params, Mapping):
            raise AggregationError(f"pre[{i}].params must be a mapping")
        stages.append(create_pre_aggregator(str(spec["name"]), **dict(stage_params)))
    if not isinstance(rule, Rule):
        raise AggregationError(
            f"aggregator {name!r} cannot be used with pre-aggregators"
        )
    return Pipeline(stages, rule)
