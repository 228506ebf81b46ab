"""The generated blocks of docs/robustness.md (see :mod:`bench.docs`).

Rendered from ``robustness.json`` (the Karimireddy et al. grid),
``robustness_tau.json`` (centered clipping's tau, chosen on validation data) and
``aggregators_speed.json``. ``python -m bench.robustness --markdown`` and
``python -m bench.aggregators_speed --markdown`` print them, ``--write-docs``
rewrites them in the page.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.docs import ROOT, replace_blocks, source_note_of, sourced
from bench.robustness_setup import ATTACKS, PAPER, RULES
from bench.robustness_summary import label

DOC = ROOT / "docs" / "robustness.md"
RESULTS = ROOT / "bench" / "results"

#: Rule names as the page writes them (speed table).
RULE_TITLES = {
    "fedavg": "FedAvg",
    "median": "median",
    "trimmed_mean": "trimmed mean",
    "meamed": "MeaMed",
    "krum": "Krum",
    "multi_krum": "Multi-Krum",
    "bulyan": "Bulyan",
    "geometric_median": "geometric median",
    "centered_clipping": "centered clipping",
    "flag": "Flag Aggregator",
}


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    return f"{pct(row['accuracy_mean'])}±{pct(row['accuracy_std'])}"


def _table(summary: dict[str, Any]) -> dict[tuple[str, str, bool], dict[str, Any]]:
    return {(r["rule"], r["attack"], r["bucketing"]): r for r in summary["rows"]}


def _best_line(best: dict[str, dict[str, Any]]) -> str:
    return "; ".join(
        f"{a}: {label(b['rule'], b['bucketing'])} ({pct(b['accuracy_mean'])})"
        for a, b in best.items()
    )


def _flagged(row: dict[str, Any] | None) -> str:
    if row is None or row.get("honest_flagged") is None:
        return "-"
    return f"{pct(row['honest_flagged'])} / {pct(row['byzantine_flagged'])}"


def _pairs(
    table: dict[tuple[str, str, bool], dict[str, Any]],
    rule: str,
    attacks: list[str],
    cell: Any,
) -> list[str]:
    out = []
    for a in attacks:
        lo, hi = table.get((rule, a, False)), table.get((rule, a, True))
        text = cell(lo) if hi is None else f"{cell(lo)} -> {cell(hi)}"
        if cell is _cell and (rule, a) in PAPER:
            p0, p1 = PAPER[(rule, a)]
            text += f" (paper {p0} -> {p1})"
        out.append(text)
    return out


def _grid_tables(summary: dict[str, Any]) -> list[str]:
    rows = summary["rows"]
    table = _table(summary)
    attacks = [a for a in ATTACKS if any(r["attack"] == a for r in rows)]
    rules = [k for k in RULES if any(r["rule"] == k for r in rows)]
    head = ["| rule | " + " | ".join(attacks) + " |", "|---|" + "---|" * len(attacks)]
    acc = [
        f"| {r} | " + " | ".join(_pairs(table, r, attacks, _cell)) + " |" for r in rules
    ]
    cut = [
        f"| {r} | " + " | ".join(_pairs(table, r, attacks, _flagged)) + " |"
        for r in rules
        if r != "mean"
    ]
    return [
        *head,
        *acc,
        "",
        "Rows the rule clipped, excluded or down-weighted (% of (row, round) "
        "pairs, mean over seeds), honest / Byzantine; without -> with bucketing:",
        "",
        *head,
        *cut,
    ]


def _goal_lines(summary: dict[str, Any]) -> list[str]:
    base = summary["no_attack_fedavg"]
    best = summary["best_robust_worst_case"]
    same = summary["robust_cells_same_as_mean"]
    worst = "; ".join(
        f"{label(w['rule'], w['bucketing'])} {pct(w['accuracy_mean'])} "
        f"({w['worst_attack']})"
        for w in summary["worst_case"]
    )
    met = summary["goal_best_robust_worst_case_within_2_points"]
    gap = 100 * (base - best["accuracy_mean"])
    same_text = (
        "n/a (no plain-mean rows)"
        if summary["goal_no_robust_cell_is_the_mean"] is None
        else "met: no robust cell has the plain mean's accuracies"
        if not same
        else "not met: "
        + ", ".join(
            label(c["rule"], c["bucketing"]) + f" under {c['attack']}" for c in same
        )
    )
    return [
        f"Worst case over the attacks, best first: {worst}.",
        "",
        "Goal (the best robust rule's worst case within 2 points of the no-attack "
        f"baseline): {'met' if met else 'not met'} "
        f"({label(best['rule'], best['bucketing'])}, worst under "
        f"{best['worst_attack']}: {pct(best['accuracy_mean'])}%, "
        f"{gap:.1f} points below the baseline).",
        "",
        f"Goal (no robust rule is the plain mean in disguise): {same_text}.",
    ]


def results_block(summary: dict[str, Any]) -> str:
    """The grid's tables, best rules and goals (what ``bench.robustness`` writes
    into the page after a run)."""
    setup = summary["setup"]
    base = summary["no_attack_fedavg"]
    cclip = setup["rules"].get("centered_clipping")
    tau = f"; centered clipping at tau = {cclip['params']['tau']:g}" if cclip else ""
    return "\n".join(
        [
            f"No-attack FedAvg baseline: **{pct(base)}%** ({setup['dataset']}, "
            f"{len(setup['seeds'])} seeds).",
            "",
            f"Test accuracy (%): the {setup['accuracy']}, mean ± std over "
            f"{len(setup['seeds'])} seeds; without -> with bucketing "
            f"(s = {setup['bucket_size']}); rows aggregated unweighted{tau}. In "
            "parentheses the paper's MNIST numbers (the last validation accuracy "
            "of each seed, mean of 3 seeds).",
            "",
            *_grid_tables(summary),
            "",
            f"Best rule per attack: {_best_line(summary['best_per_attack'])}.",
            "",
            "Best robust rule (the plain mean left out): "
            f"{_best_line(summary['best_robust_per_attack'])}.",
            "",
            *_goal_lines(summary),
            "",
            f"The grid ({len(summary['rows']) * len(setup['seeds'])} runs plus "
            f"{len(setup['seeds'])} baselines of {setup['rounds']} rounds) took "
            f"{summary['seconds'] / 60:.0f} minutes.",
        ]
    )


def findings_block(summary: dict[str, Any]) -> str:
    """The numbers the page's discussion of the table rests on."""
    table, base = _table(summary), summary["no_attack_fedavg"]
    attacks = list(dict.fromkeys(r["attack"] for r in summary["rows"]))

    def acc(rule: str, attack: str, b: bool) -> float:
        return table[(rule, attack, b)]["accuracy_mean"]

    def cut(rule: str, attack: str, b: bool) -> str:
        return pct(table[(rule, attack, b)]["honest_flagged"] or 0.0)

    alie = {k: r for k, r in table.items() if k[1] == "alie"}
    alie_best = max(alie.values(), key=lambda r: r["accuracy_mean"])
    mean_best = [
        a for a, b in summary["best_per_attack"].items() if b["rule"] == "mean"
    ]

    def move(rule: str, attack: str) -> str:
        return f"{rule} under {attack} {pct(acc(rule, attack, False))} -> " + pct(
            acc(rule, attack, True)
        )

    mimic_mean = acc("mean", "mimic", False)
    bounded = [a for a in attacks if a not in ("alie", "ipm_large")]
    flag_plain = [acc("flag", a, False) for a in bounded]
    flag_buck = [acc("flag", a, True) for a in bounded]
    lines = [
        f"- The unbounded attack (ipm_large) takes the plain mean to "
        f"{pct(acc('mean', 'ipm_large', False))}%; centered clipping holds "
        f"{pct(acc('centered_clipping', 'ipm_large', False))}% -> "
        f"{pct(acc('centered_clipping', 'ipm_large', True))}% and cuts "
        f"{cut('centered_clipping', 'ipm_large', False)}% of the honest rows "
        f"there (bounded attacks: "
        + ", ".join(f"{a} {cut('centered_clipping', a, False)}%" for a in bounded)
        + ").",
        f"- ALIE: the best cell is {label(alie_best['rule'], alie_best['bucketing'])} "
        f"({pct(alie_best['accuracy_mean'])}%, "
        f"{100 * (base - alie_best['accuracy_mean']):.1f} points under the "
        f"baseline); the plain mean loses "
        f"{100 * (base - acc('mean', 'alie', False)):.1f} points "
        f"({pct(acc('mean', 'alie', False))}%).",
        f"- Mimic costs the plain mean {100 * (base - mimic_mean):.1f} points "
        f"({pct(mimic_mean)}%).",
        f"- The plain mean is the best rule under {len(mean_best)} of "
        f"{len(attacks)} attacks ({', '.join(mean_best) or 'none'}).",
    ]
    if ("nnm_centered_clipping", "alie", False) in table:
        lines.append(
            "- NNM before centered clipping, against centered clipping alone: "
            + "; ".join(
                f"{a} {pct(acc('centered_clipping', a, False))} -> "
                f"{pct(acc('nnm_centered_clipping', a, False))}"
                for a in attacks
            )
            + "."
        )
    lines += [
        f"- Median under sign flip: {pct(acc('median', 'sign_flip', False))}% "
        f"(paper {PAPER[('median', 'sign_flip')][0]}%). Bucketing lifts "
        + "; ".join(
            move(r, a)
            for r, a in (
                ("median", "ipm"),
                ("geometric_median", "label_flip"),
                ("flag", "sign_flip"),
                ("krum", "sign_flip"),
            )
        )
        + "; under ALIE it costs "
        + "; ".join(
            f"{r} {pct(acc(r, 'alie', False))} -> {pct(acc(r, 'alie', True))}"
            for r in ("trimmed_mean", "geometric_median")
        )
        + ".",
        f"- Flag Aggregator under {', '.join(bounded)}: "
        f"{pct(min(flag_plain))}-{pct(max(flag_plain))}% without bucketing, "
        f"{pct(min(flag_buck))}-{pct(max(flag_buck))}% with it; under ALIE "
        f"{pct(acc('flag', 'alie', False))}% -> {pct(acc('flag', 'alie', True))}%.",
    ]
    return "\n".join(lines)


def tau_block(tau: dict[str, Any]) -> str:
    s = tau["setup"]
    lines = [
        f"Validation: {s['validation_examples']:,} training examples held out "
        f"(seeded draw), the grid trained on the rest; {s['accuracy']}; seed"
        f"{'s' if len(s['seeds']) > 1 else ''} {', '.join(map(str, s['seeds']))}; "
        f"{s['rounds']} rounds. Criterion: {tau['criterion']}.",
        "",
        "| tau | "
        + " | ".join(f"{a} (plain / bucketing)" for a in s["attacks"])
        + " | mean |",
        "|---|" + "---|" * (len(s["attacks"]) + 1),
    ]
    by = {(x["tau"], x["attack"], x["bucketing"]): x["accuracy"] for x in tau["scores"]}
    for t in tau["taus"]:
        cells = [
            " / ".join(pct(by[(t, a, b)]) for b in s["bucketing"]) for a in s["attacks"]
        ]
        mark = "**" if t == tau["chosen_tau"] else ""
        lines.append(
            f"| {mark}{t:g}{mark} | "
            + " | ".join(cells)
            + f" | {mark}{pct(tau['mean_by_tau'][f'{t:g}'])}{mark} |"
        )
    prev = tau["previous"]
    lines += [
        "",
        f"Chosen: **tau = {tau['chosen_tau']:g}** (validation, "
        f"{tau['seconds'] / 60:.0f} minutes). Before, tau = {prev['tau']:g} was "
        f"chosen on the {prev['how']}.",
    ]
    return "\n".join(lines)


def speed_block(speed: dict[str, Any]) -> str:
    m = speed["machine"]
    lines = [
        f"Measured (`bench/results/aggregators_speed.json`), n = {speed['n']}, "
        f"d = {speed['d']:,}, f = {speed['f']}, {m['threads']} threads, load "
        f"average {m['loadavg_before'][0]:.1f} at the start; the plain mean took "
        f"{1000 * speed['mean_s']:.1f} ms. Medians of the runs listed in the JSON:",
        "",
        "| rule | fedplat | x mean | Flower | speed-up |",
        "|---|---|---|---|---|",
    ]
    for name, r in speed["rules"].items():
        fl = "-" if r["flower_s"] is None else f"{r['flower_s']:.2f} s"
        up = "-" if r["speedup_vs_flower"] is None else f"{r['speedup_vs_flower']:.0f}x"
        lines.append(
            f"| {RULE_TITLES.get(name, name)} | {1000 * r['fedplat_s']:.0f} ms "
            f"| {r['ratio_to_mean']:.1f} | {fl} | {up} |"
        )
    goals = speed["goals"]
    met = [k for k, v in goals.items() if v]
    missed = [k for k, v in goals.items() if not v]
    lines += [
        "",
        f"Goals met: {', '.join(met) or 'none'}. "
        f"Missed: {', '.join(missed) or 'none'}.",
    ]
    return "\n".join(lines)


def _load(name: str) -> Any:
    return json.loads((RESULTS / name).read_text())


def robustness_blocks(summary: dict[str, Any] | None = None) -> dict[str, str]:
    summary = summary if summary is not None else _load("robustness.json")
    grid, tau = RESULTS / "robustness.json", RESULTS / "robustness_tau.json"
    out = {
        "robustness-results": sourced(results_block(summary), grid),
        "robustness-findings": sourced(findings_block(summary), grid),
    }
    if tau.is_file():
        out["robustness-tau"] = sourced(tau_block(_load(tau.name)), tau)
    return out


def speed_blocks() -> dict[str, str]:
    path = RESULTS / "aggregators_speed.json"
    return {"aggregators-speed": sourced(speed_block(_load(path.name)), path)}


def doc_blocks() -> dict[str, str]:
    """Every generated block of docs/robustness.md."""
    return {**robustness_blocks(), **speed_blocks()}


def write_results_block(summary: dict[str, Any], path: Path, out: Path) -> None:
    """After a grid run (its results written to ``out``): rewrite its block in
    ``path`` (a fresh page if missing)."""
    body = f"{results_block(summary)}\n\n{source_note_of(out, summary)}"
    block = {"robustness-results": body}
    if not path.exists():
        path.write_text(
            "# Robustness\n\n<!-- robustness-results:begin -->\n"
            "<!-- robustness-results:end -->\n"
        )
    path.write_text(replace_blocks(path.read_text(), block))
