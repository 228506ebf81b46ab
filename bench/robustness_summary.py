"""What bench/robustness.py's grid says, computed from its rows: the best rule per
attack, each rule's worst case over the attacks, which robust cells are the plain
mean in disguise, and the goals.

A row is one (rule, attack, bucketing) cell over every seed::

    {"rule", "bucketing", "attack", "accuracy_mean", "accuracy_std",
     "accuracies", "honest_flagged", "byzantine_flagged", "diverged_seeds",
     "same_as_mean"}

``diverged_seeds`` counts the seeds whose model blew up (the rows became
non-finite; the run stops there and its remaining evaluations take the
diverged model's accuracy). ``honest_flagged`` is the fraction of (honest row,
round) pairs the rule clipped, excluded or down-weighted (mean over seeds);
``byzantine_flagged`` the same for the attackers' rows; ``same_as_mean``
whether every seed's accuracy equals the plain mean's in the same attack and
bucketing (a rule tuned into the mean).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: How far under the no-attack baseline the best robust rule's worst case may be.
GOAL_POINTS = 0.02

Key = tuple[str, str, bool]  # rule, attack, bucketing


@dataclass(frozen=True)
class Cell:
    """One cell's seeds: accuracies and flagged fractions (``None``: not
    recorded, a row kept from a grid that did not record them)."""

    accuracies: list[float]
    honest_flagged: list[float] | None = None
    byzantine_flagged: list[float] | None = None
    diverged_seeds: int = 0  # seeds whose model blew up (non-finite rows)


def _mean(xs: Sequence[float] | None) -> float | None:
    return None if not xs else statistics.fmean(xs)


def make_rows(cells: Mapping[Key, Cell]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for (rule, attack, b), cell in cells.items():
        accs = cell.accuracies
        mean_cell = cells.get(("mean", attack, b))
        rows.append(
            {
                "rule": rule,
                "bucketing": b,
                "attack": attack,
                "accuracy_mean": statistics.fmean(accs),
                "accuracy_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                "accuracies": accs,
                "honest_flagged": _mean(cell.honest_flagged),
                "byzantine_flagged": _mean(cell.byzantine_flagged),
                "diverged_seeds": cell.diverged_seeds,
                "same_as_mean": (
                    rule != "mean"
                    and mean_cell is not None
                    and list(mean_cell.accuracies) == list(accs)
                ),
            }
        )
    return rows


def cells_of(rows: Sequence[Mapping[str, Any]]) -> dict[Key, Cell]:
    """A summary's rows back as cells (seeds' flagged fractions are not kept
    in the JSON, only their mean: it stands for every seed)."""
    out: dict[Key, Cell] = {}
    for r in rows:
        n = len(r["accuracies"])
        hf, bf = r.get("honest_flagged"), r.get("byzantine_flagged")
        out[(r["rule"], r["attack"], r["bucketing"])] = Cell(
            list(r["accuracies"]),
            None if hf is None else [hf] * n,
            None if bf is None else [bf] * n,
            int(r.get("diverged_seeds", 0)),
        )
    return out


def label(rule: str, bucketing: bool) -> str:
    return f"{rule}{' + bucketing' if bucketing else ''}"


def best_per_attack(
    rows: Sequence[Mapping[str, Any]], exclude: Sequence[str] = ()
) -> dict[str, dict[str, Any]]:
    """The row with the highest mean accuracy per attack (rules in ``exclude``
    left out)."""
    best: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        if row["rule"] in exclude:
            continue
        cur = best.get(row["attack"])
        if cur is None or row["accuracy_mean"] > cur["accuracy_mean"]:
            best[row["attack"]] = row
    return {
        a: {
            "rule": r["rule"],
            "bucketing": r["bucketing"],
            "accuracy_mean": r["accuracy_mean"],
        }
        for a, r in best.items()
    }


def worst_cases(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each (rule, bucketing) configuration's lowest mean accuracy over the
    attacks, best configuration first."""
    configs: dict[tuple[str, bool], Mapping[str, Any]] = {}
    for row in rows:
        key = (row["rule"], row["bucketing"])
        cur = configs.get(key)
        if cur is None or row["accuracy_mean"] < cur["accuracy_mean"]:
            configs[key] = row
    out = [
        {
            "rule": rule,
            "bucketing": b,
            "worst_attack": r["attack"],
            "accuracy_mean": r["accuracy_mean"],
        }
        for (rule, b), r in configs.items()
    ]
    return sorted(out, key=lambda w: -w["accuracy_mean"])


def goals(rows: Sequence[Mapping[str, Any]], base: float) -> dict[str, Any]:
    """The grid's goals: no robust cell equal to the plain mean, and the best
    robust rule's worst case within :data:`GOAL_POINTS` of the baseline."""
    same = [
        {"rule": r["rule"], "attack": r["attack"], "bucketing": r["bucketing"]}
        for r in rows
        if r.get("same_as_mean")
    ]
    robust = [w for w in worst_cases(rows) if w["rule"] != "mean"]
    best = robust[0] if robust else None
    has_mean = any(r["rule"] == "mean" for r in rows)
    return {
        "robust_cells_same_as_mean": same,
        "goal_no_robust_cell_is_the_mean": (not same) if has_mean else None,
        "best_robust_worst_case": best,
        "goal_best_robust_worst_case_within_2_points": (
            None if best is None else base - best["accuracy_mean"] <= GOAL_POINTS
        ),
    }


def summarize_cells(cells: Mapping[Key, Cell], baseline: list[float]) -> dict[str, Any]:
    """The summary body (no setup) of a grid's cells and baseline seeds."""
    rows = make_rows(cells)
    base = statistics.fmean(baseline)
    return {
        "no_attack_fedavg": base,
        "no_attack_fedavg_accuracies": baseline,
        "rows": rows,
        "best_per_attack": best_per_attack(rows),
        # The plain mean is no defence in general (one unbounded row moves it);
        # which robust rule does best is the question the table answers.
        "best_robust_per_attack": best_per_attack(rows, exclude=("mean",)),
        "worst_case": worst_cases(rows),
        **goals(rows, base),
    }
