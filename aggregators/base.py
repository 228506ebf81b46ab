"""The aggregator interface: pure callables over an ``[n, d]`` stack of client updates.

An aggregator receives the round's decoded updates as one float tensor ``updates`` of
shape ``[n, d]`` (row ``i`` is client ``i``'s update, typically ``new - global``) and
optional non-negative per-client ``weights`` of shape ``[n]`` (e.g. example counts).
It returns an :class:`AggregationResult`: the aggregate ``[d]`` and one
:class:`ClientDecision` per row saying what the rule did with that client, so the
coordinator can store per-client flags for contribution accounting and the monitor.

Stateful rules (centered clipping's reference point, ...) keep tensors in
``state_dict()`` so the coordinator checkpoints them with the model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from fedplat.vectors import all_finite

# Computed in float32 by every rule (Rule.__call__), returned in the input dtype.
HALF_DTYPES = (torch.float16, torch.bfloat16)


class AggregationError(ValueError):
    """Invalid settings or inputs for an aggregation rule (e.g. ``2f >= n``)."""


@dataclass(frozen=True)
class ClientDecision:
    """What a rule did with one client's row.

    ``weight`` is the effective weight of the row in the output (0 when excluded),
    ``selected`` whether the row contributed at all, ``score`` a rule-specific
    number (distance, Krum score, ...) or ``None``, ``flags`` short labels such as
    ``"excluded"``, ``"clipped"``, ``"down-weighted"``.
    """

    index: int
    weight: float
    selected: bool = True
    score: float | None = None
    flags: tuple[str, ...] = ()


# Round-level facts a rule reports beside its per-row decisions, e.g.
# ``{"converged": False, "iterations": 100}`` from an iterative rule that hit its
# cap; the coordinator records them with the round.
Diagnostics = Mapping[str, bool | int | float]


@dataclass(frozen=True)
class AggregationResult:
    aggregate: torch.Tensor  # [d]
    decisions: list[ClientDecision] = field(default_factory=list)
    diagnostics: Diagnostics = field(default_factory=dict)


@runtime_checkable
class Aggregator(Protocol):
    """A rule ``(updates [n, d], weights [n] | None) -> AggregationResult``."""

    name: str

    def __call__(
        self, updates: torch.Tensor, weights: torch.Tensor | None = None
    ) -> AggregationResult: ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...


class StatelessAggregator:
    """Base class for rules without cross-round state."""

    name = "stateless"

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if state:
            raise AggregationError(
                f"{self.name} has no state; got keys {sorted(state)}"
            )


def require_finite_rows(updates: torch.Tensor) -> None:
    """Raise :class:`AggregationError` naming the rows of ``updates`` ``[n, d]``
    that hold NaN or Inf (one plain sum when there are none)."""
    if all_finite(updates):
        return
    rows = (~torch.isfinite(updates)).any(dim=1).nonzero().flatten().tolist()
    shown = ", ".join(map(str, rows[:10])) + (", ..." if len(rows) > 10 else "")
    raise AggregationError(
        f"updates hold NaN or Inf in row(s) [{shown}]; "
        "drop non-finite rows before aggregating"
    )


def check_updates(
    updates: torch.Tensor,
    weights: torch.Tensor | None = None,
    *,
    finite: bool = True,
) -> torch.Tensor:
    """Validate the ``[n, d]`` stack; return weights ``[n]`` normalised to sum 1.

    Rows holding NaN or Inf are refused (:func:`require_finite_rows`): a rule
    handed one can answer silently wrong (Krum's scores all become NaN and it
    returned row 0), and the coordinator drops such uploads before they reach
    a rule. ``finite=False`` leaves that check to the caller.

    Examples
    --------
    >>> check_updates(torch.zeros(2, 3), torch.tensor([1.0, 3.0]))
    tensor([0.2500, 0.7500], dtype=torch.float64)
    >>> check_updates(torch.tensor([[0.0], [float("nan")]]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fedplat.aggregators.base.AggregationError: updates hold NaN or Inf in row(s) [1]...
    """
    if updates.dim() != 2:
        raise AggregationError(
            f"updates must be [n, d], got shape {list(updates.shape)}"
        )
    n = updates.shape[0]
    if n == 0:
        raise AggregationError("no updates to aggregate")
    if not torch.is_floating_point(updates):
        raise AggregationError(f"updates must be floating point, got {updates.dtype}")
    if finite:
        require_finite_rows(updates)
    if weights is None:
        return torch.full((n,), 1.0 / n, dtype=torch.float64)
    if weights.shape != (n,):
        raise AggregationError(
            f"weights must be [{n}], got shape {list(weights.shape)}"
        )
    w = weights.to(torch.float64)
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise AggregationError("weights must be finite and non-negative")
    total = float(w.sum())
    if total <= 0:
        raise AggregationError("weights sum to zero")
    return w / total


# --------------------------------------------------------------------------- #
# Parameter checks shared by every rule, pre-aggregator and attack.


def check_int(
    name: str,
    value: Any,
    *,
    minimum: int = 0,
    error: type[Exception] = AggregationError,
) -> int:
    """Validate an integer setting (``bool`` is rejected) in ``__init__``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise error(f"{name} must be >= {minimum}, got {value}")
    return value


def check_float(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    strict: bool = False,
    maximum: float | None = None,
    error: type[Exception] = AggregationError,
) -> float:
    """Validate a finite real setting; ``strict`` makes ``minimum`` exclusive."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise error(f"{name} must be finite, got {value!r}")
    if minimum is not None and (v <= minimum if strict else v < minimum):
        op = ">" if strict else ">="
        raise error(f"{name} must be {op} {minimum}, got {value}")
    if maximum is not None and v > maximum:
        raise error(f"{name} must be <= {maximum}, got {value}")
    return v


def require(ok: bool, rule: str, bound: str, **values: int) -> None:
    """Raise :class:`AggregationError` naming the violated bound, e.g. ``2f < n``."""
    if not ok:
        got = ", ".join(f"{k}={v}" for k, v in values.items())
        raise AggregationError(f"{rule} needs {bound}, got {got}")


# --------------------------------------------------------------------------- #
# Tensor-form per-row reports and the shared skeleton of every rule.


@dataclass(frozen=True)
class RowReport:
    """What a rule did with each of its ``n`` input rows, as tensors.

    Attributes
    ----------
    weight : torch.Tensor
        ``[n]`` float64, effective weight of the row in the output: its averaging
        weight for averaging rules (sums to 1), its share of the kept entries for
        coordinate-wise rules.
    selected : torch.Tensor
        ``[n]`` bool, whether the row contributed at all.
    score : torch.Tensor or None
        ``[n]`` float64 rule-specific number (Krum score, distance, ...).
    flags : mapping of str to torch.Tensor
        flag name -> ``[n]`` bool mask (``"excluded"``, ``"clipped"``, ...).
    """

    weight: torch.Tensor
    selected: torch.Tensor
    score: torch.Tensor | None = None
    flags: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def decisions(self) -> list[ClientDecision]:
        """One :class:`ClientDecision` per row (index = row number)."""
        weights = self.weight.tolist()
        selected = self.selected.tolist()
        scores = self.score.tolist() if self.score is not None else None
        masks = {name: m.tolist() for name, m in self.flags.items()}
        return [
            ClientDecision(
                index=i,
                weight=float(weights[i]),
                selected=bool(selected[i]),
                score=None if scores is None else float(scores[i]),
                flags=tuple(name for name, m in masks.items() if m[i]),
            )
            for i in range(len(weights))
        ]


def uniform_report(weights: torch.Tensor) -> RowReport:
    """Every row selected with its own weight (plain averaging)."""
    return RowReport(
        weight=weights, selected=torch.ones_like(weights, dtype=torch.bool)
    )


def participation_report(kept: torch.Tensor, low_share: float = 0.5) -> RowReport:
    """Report for coordinate-wise rules from per-row kept fractions ``[n]``.

    ``kept[i]`` is the fraction of coordinates where row ``i``'s value entered the
    output.

    ``weight`` is the row's share of all kept entries, ``score`` is ``kept``.
    ``"down-weighted"`` marks rows kept less
    than ``low_share`` times as often as the average row: a mild flag, since on
    non-IID data honest clients are often unusual (Karimireddy et al. 2022).
    """
    kept = kept.to(torch.float64)
    total = float(kept.sum())
    n = kept.numel()
    weight = kept / total if total > 0 else torch.full_like(kept, 1.0 / n)
    return RowReport(
        weight=weight,
        selected=kept > 0,
        score=kept,
        flags={"down-weighted": weight < low_share / n},
    )


@dataclass(frozen=True)
class RuleOutput:
    """A rule's aggregate ``[d]``, its :class:`RowReport` over the input rows and
    its round-level ``diagnostics``."""

    aggregate: torch.Tensor
    report: RowReport
    diagnostics: Diagnostics = field(default_factory=dict)


class Rule:
    """Skeleton shared by every rule: validation, precision, decisions.

    Subclasses implement :meth:`aggregate_rows` over already-validated, finite
    inputs in float32 or float64 and must not mutate their state there; a
    stateful rule updates it in :meth:`commit`, called once per successful
    round, so a rule can run inside a :class:`Pipeline` safely.
    """

    name = "rule"

    # True for rules whose aggregate is non-finite whenever an input row of
    # positive weight is (a weighted sum): with every weight positive they skip
    # the input pass and check their output instead (BLAS may skip 0 * inf).
    propagates_non_finite = False

    def aggregate_rows(
        self, updates: torch.Tensor, weights: torch.Tensor
    ) -> RuleOutput:
        """Aggregate ``updates`` ``[n, d]`` with normalised ``weights`` ``[n]``
        (float64, summing to 1)."""
        raise NotImplementedError

    def commit(self, aggregate: torch.Tensor) -> None:
        """Update cross-round state from the round's ``aggregate`` ``[d]``
        (default: no state)."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if state:
            raise AggregationError(
                f"{self.name} has no state; got keys {sorted(state)}"
            )

    def __call__(
        self, updates: torch.Tensor, weights: torch.Tensor | None = None
    ) -> AggregationResult:
        w = check_updates(updates, weights, finite=False)
        if not (self.propagates_non_finite and bool((w > 0).all())):
            require_finite_rows(updates)
        # float16/bfloat16 round at 1e-3 and overflow at 65504 (bfloat16: 3e38
        # but 8 mantissa bits): squared norms, Gram matrices and window sums
        # are wrong or inf there, so every rule computes in float32 and returns
        # the input dtype.
        work = updates.float() if updates.dtype in HALF_DTYPES else updates
        out = self.aggregate_rows(work, w)
        aggregate = out.aggregate.to(updates.dtype)
        if not all_finite(aggregate):
            require_finite_rows(updates)
            raise AggregationError(
                f"{self.name} produced a non-finite aggregate from finite updates "
                f"(values too large for {updates.dtype}?)"
            )
        self.commit(aggregate)
        return AggregationResult(
            aggregate=aggregate,
            decisions=out.report.decisions(),
            diagnostics=dict(out.diagnostics),
        )

    def __repr__(self) -> str:
        params = ", ".join(
            f"{k}={v!r}" for k, v in sorted(vars(self).items()) if not k.startswith("_")
        )
        return f"{type(self).__name__}({params})"


# --------------------------------------------------------------------------- #
# Pre-aggregators: [n, d] -> [m, d] transforms applied before a rule.


@dataclass(frozen=True)
class PreOutput:
    """Result of a pre-aggregator over ``n`` input rows.

    Attributes
    ----------
    updates : torch.Tensor
        ``[m, d]`` transformed rows.
    weights : torch.Tensor
        ``[m]`` float64, normalised weights of the new rows.
    share : torch.Tensor
        ``[m, n]`` float64; row ``j`` says which inputs output row ``j`` is made of
        (rows sum to 1: a bucket's members, a row's nearest neighbours, or the
        identity for per-row transforms such as clipping).
    owner : torch.Tensor
        ``[n]`` int64, the output row that stands for each input row (its bucket,
        or itself); a client's score and flags are read from its owner row.
    flags : mapping of str to torch.Tensor
        flag name -> ``[n]`` bool mask over the input rows (``"clipped"``).
    """

    updates: torch.Tensor
    weights: torch.Tensor
    share: torch.Tensor
    owner: torch.Tensor
    flags: Mapping[str, torch.Tensor] = field(default_factory=dict)


class PreAggregator:
    """Base of pre-aggregators: ``(updates [n, d], weights [n]) -> PreOutput``.

    ``weights`` are normalised float64 (as from :func:`check_updates`). A
    pre-aggregator with randomness keeps it in :meth:`state_dict` so a resumed run
    draws the same buckets.
    """

    name = "pre"

    def __call__(self, updates: torch.Tensor, weights: torch.Tensor) -> PreOutput:
        raise NotImplementedError

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if state:
            raise AggregationError(
                f"{self.name} has no state; got keys {sorted(state)}"
            )

    def __repr__(self) -> str:
        params = ", ".join(
            f"{k}={v!r}" for k, v in sorted(vars(self).items()) if not k.startswith("_")
        )
        return f"{type(self).__name__}({params})"
