"""bench/robustness_summary.py on hand-checkable cells: worst cases, the plain
mean in disguise, and the goals."""

from __future__ import annotations

from bench.robustness_summary import Cell, cells_of, summarize_cells

CELLS = {
    ("mean", "a", False): Cell([0.5, 0.7]),
    ("mean", "b", False): Cell([0.1, 0.1]),
    # Robust rule r: the mean's exact seeds under a (tuned into the mean there).
    ("r", "a", False): Cell([0.5, 0.7], [0.0, 0.0], [0.0, 0.0]),
    ("r", "b", False): Cell([0.6, 0.8], [0.25, 0.75], [1.0, 1.0]),
    # Rule s with bucketing: better worst case than r.
    ("s", "a", True): Cell([0.75, 0.75], [0.5, 0.5], [0.5, 0.5]),
    ("s", "b", True): Cell([0.8, 0.8], [0.0, 0.0], [1.0, 1.0]),
}


def test_worst_cases_goals_and_the_mean_in_disguise() -> None:
    out = summarize_cells(CELLS, baseline=[0.76, 0.76])
    rows = {(r["rule"], r["attack"], r["bucketing"]): r for r in out["rows"]}
    assert rows[("r", "a", False)]["same_as_mean"] is True
    assert rows[("r", "b", False)]["same_as_mean"] is False
    assert rows[("mean", "a", False)]["same_as_mean"] is False
    assert rows[("r", "b", False)]["honest_flagged"] == 0.5
    assert rows[("mean", "a", False)]["honest_flagged"] is None
    assert out["robust_cells_same_as_mean"] == [
        {"rule": "r", "attack": "a", "bucketing": False}
    ]
    assert out["goal_no_robust_cell_is_the_mean"] is False
    # Worst cases: s + bucketing 0.75 (a), r 0.6 (a: 0.6 < b's 0.7), mean 0.1 (b).
    worst = [(w["rule"], w["bucketing"], w["worst_attack"]) for w in out["worst_case"]]
    assert worst == [("s", True, "a"), ("r", False, "a"), ("mean", False, "b")]
    assert out["best_robust_worst_case"]["rule"] == "s"
    assert out["goal_best_robust_worst_case_within_2_points"] is True  # 0.76-0.75
    assert out["best_robust_per_attack"]["b"]["rule"] == "s"
    assert not summarize_cells(CELLS, [0.8, 0.8])[
        "goal_best_robust_worst_case_within_2_points"
    ]  # 0.05 below


def test_rows_read_back_as_cells_give_the_same_summary() -> None:
    out = summarize_cells(CELLS, [0.76, 0.76])
    again = summarize_cells(cells_of(out["rows"]), [0.76, 0.76])
    assert again == out


def test_without_mean_rows_the_disguise_goal_is_not_judged() -> None:
    only_s = {k: v for k, v in CELLS.items() if k[0] == "s"}
    assert summarize_cells(only_s, [0.7])["goal_no_robust_cell_is_the_mean"] is None
