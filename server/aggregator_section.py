"""The ``aggregator`` section of a run file (validated, unknown keys rejected).

Example (YAML)::

    aggregator:
      name: fedavg
      weighted: null                   # fedavg: weighted; robust rules: not
      max_examples_per_client: 100000
      norm_bound: {multiplier: 3.0}    # default "auto": fedavg only; null/off
      weight_bound: {multiplier: 3.0}  # weighted rules; null/off

``norm_bound`` and ``weight_bound`` are the robust defaults of issue 23
(:mod:`fedplat.server.bounds`, maths in :mod:`fedplat.aggregators.bounds`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from fedplat.config import Strict

if TYPE_CHECKING:
    from fedplat.aggregators import Aggregator


class PreAggregatorSpec(Strict):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class NormBound(Strict):
    """Scale every accepted update ``u_i`` by ``min(1, B / ||u_i||)``, ``B =
    multiplier * median`` of a reference set of update norms
    (:mod:`fedplat.server.bounds`); ``prefix``: the rows a round without
    reference holds until their median is known.

    The default multiplier, 3, scaled no honest update on the demo-like splits
    of docs/robustness.md ("Norm and weight bounds"), whose largest honest norm
    was 2.1 times a median; under 100x quantity skew with whole local epochs it
    was 7.8 times, and 3 scales the largest clients (raise it there). The
    default prefix, 5, holds up to 5 model-sized rows in a run's first round.
    """

    multiplier: float = Field(default=3.0, ge=1.0, allow_inf_nan=False)
    prefix: int = Field(default=5, ge=1, le=64)


class WeightBound(Strict):
    """A client's weight is at most ``multiplier`` times the median declared
    example count (at enrolment) of the round's selected clients; one attacker
    among ``n`` then holds at most ``k / (k + floor(n/2))`` of the weight
    (:func:`fedplat.aggregators.bounds.max_attacker_share`)."""

    multiplier: float = Field(default=3.0, ge=1.0, allow_inf_nan=False)


class AggregatorSection(Strict):
    name: str = "fedavg"
    params: dict[str, Any] = Field(default_factory=dict)
    pre: list[PreAggregatorSpec] = Field(default_factory=list)
    # Pass example counts as weights to the rule. Default: yes for fedavg, no for
    # the robust rules (their guarantees assume unweighted rows, and a weight is
    # a number the client declares).
    weighted: bool | None = None
    # The weight of a client is min(declared examples, this cap, the cap its
    # enrolment token carries, the round's weight_bound): no client can buy
    # influence by declaring more.
    max_examples_per_client: int = Field(default=100_000, ge=1)
    # "auto": NormBound() for fedavg, none for the robust rules (which bound a
    # minority by themselves); a mapping asks for it with any rule.
    norm_bound: NormBound | Literal["auto"] | None = "auto"
    weight_bound: WeightBound | None = WeightBound()

    @field_validator("norm_bound", "weight_bound", mode="before")
    @classmethod
    def _off(cls, value: Any) -> Any:
        # YAML 1.1 reads an unquoted ``off`` as false.
        return None if value is False or value == "off" else value

    @model_validator(mode="after")
    def _builds(self) -> AggregatorSection:
        # A wrong rule name or parameter is a run-file error, found when the
        # file is read, not after the model is built.
        try:
            self.build()
        except (ValueError, KeyError, TypeError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            raise ValueError(str(msg)) from None
        return self

    @property
    def is_weighted(self) -> bool:
        return self.name == "fedavg" if self.weighted is None else self.weighted

    @property
    def norm_bounding(self) -> NormBound | None:
        """The norm bound this section asks for (None: off)."""
        if self.norm_bound == "auto":
            return NormBound() if self.name == "fedavg" else None
        return self.norm_bound

    @property
    def weight_bounding(self) -> WeightBound | None:
        """The weight bound (None: off, or an unweighted rule)."""
        return self.weight_bound if self.is_weighted else None

    def build(self) -> Aggregator:
        """The rule with its pre-aggregators, as the coordinator runs it (the one
        place a section becomes an aggregator: the coordinator, the Flower
        strategy and the benchmarks call this). The bounds are applied by the
        coordinator's accumulators, not by the rule."""
        from fedplat.aggregators import build_aggregator

        return build_aggregator(
            self.name,
            dict(self.params),
            [{"name": p.name, "params": dict(p.params)} for p in self.pre],
        )


__all__ = ["AggregatorSection", "NormBound", "PreAggregatorSpec", "WeightBound"]
