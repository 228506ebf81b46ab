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

from bench.docs import ROOT, replace_blocks, sourced
from bench.robustness import ATTACKS, PAPER, RULES

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
        f"{a}: {b['rule']}{' + bucketing' if b['bucketing'] else ''} "
        f"({pct(b['accuracy_mean'])})"
        for a, b in best.items()
    )


def results_block(summary: dict[str, Any]) -> str:
    """The grid's table, best rules and goal (what ``bench.robustness`` writes
    into the page after a run)."""
    rows, setup = summary["rows"], summary["setup"]
    table = _table(summary)
    attacks = [a for a in ATTACKS if any(r["attack"] == a for r in rows)]
    rules = [k for k in RULES if any(r["rule"] == k for r in rows)]
    lines = [
        "| rule | " + " | ".join(attacks) + " |",
        "|---|" + "---|" * len(attacks),
    ]
    for rule in rules:
        cells = []
        for a in attacks:
            lo, hi = table.get((rule, a, False)), table.get((rule, a, True))
            cell = f"{_cell(lo)} -> {_cell(hi)}"
            if (rule, a) in PAPER:
                p0, p1 = PAPER[(rule, a)]
                cell += f" (paper {p0} -> {p1})"
            cells.append(cell)
        lines.append(f"| {rule} | " + " | ".join(cells) + " |")
    base = summary["no_attack_fedavg"]
    cc = {
        r["attack"]: base - r["accuracy_mean"]
        for r in rows
        if r["rule"] == "centered_clipping" and r["bucketing"]
    }
    cc_line = ", ".join(f"{a} {100 * gap:+.1f}" for a, gap in cc.items())
    goal = summary["goal_cclip_bucketing_within_2_points"]
    verdict = "n/a" if goal is None else "met" if goal else "not met"
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
            *lines,
            "",
            f"Best rule per attack: {_best_line(summary['best_per_attack'])}.",
            "",
            "Best robust rule (the plain mean left out): "
            f"{_best_line(summary['best_robust_per_attack'])}.",
            "",
            "Goal (centered clipping + bucketing within 2 points of the no-attack "
            f"baseline under every attack): {verdict}"
            + (f" (points below the baseline: {cc_line})." if cc else "."),
            "",
            f"The grid ({len(summary['rows']) * len(setup['seeds'])} runs plus "
            f"{len(setup['seeds'])} baselines of {setup['rounds']} rounds) took "
            f"{summary['seconds'] / 60:.0f} minutes.",
        ]
    )


def findings_block(summary: dict[str, Any]) -> str:
    """The numbers the page's discussion of the table rests on."""
    table, base = _table(summary), summary["no_attack_fedavg"]

    def acc(rule: str, attack: str, b: bool) -> float:
        return table[(rule, attack, b)]["accuracy_mean"]

    robust = summary["best_robust_per_attack"]
    cc_best = [
        a
        for a, b in robust.items()
        if b["rule"] == "centered_clipping" and b["bucketing"]
    ]
    near = {
        a: 100 * (robust[a]["accuracy_mean"] - acc("centered_clipping", a, True))
        for a in robust
        if a not in cc_best
    }
    mimic = table[("centered_clipping", "mimic", True)]["accuracies"]
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
    flag_plain = [acc("flag", a, False) for a in ATTACKS if a != "alie"]
    flag_buck = [acc("flag", a, True) for a in ATTACKS if a != "alie"]
    return "\n".join(
        [
            "- Centered clipping + bucketing is the best robust rule under "
            f"{', '.join(cc_best)}; elsewhere it is "
            + ", ".join(f"{v:.1f} points under the best ({a})" for a, v in near.items())
            + ". Its seeds under mimic: "
            + " / ".join(pct(x) for x in mimic)
            + ".",
            f"- ALIE: the best cell is {alie_best['rule']}"
            f"{' + bucketing' if alie_best['bucketing'] else ''} "
            f"({pct(alie_best['accuracy_mean'])}%, "
            f"{100 * (base - alie_best['accuracy_mean']):.1f} points under the "
            f"baseline); the plain mean loses "
            f"{100 * (base - acc('mean', 'alie', False)):.1f} points "
            f"({pct(acc('mean', 'alie', False))}%).",
            f"- Mimic costs the plain mean {100 * (base - mimic_mean):.1f} points "
            f"({pct(mimic_mean)}%).",
            f"- The plain mean is the best rule under {len(mean_best)} of "
            f"{len(ATTACKS)} attacks ({', '.join(mean_best)}).",
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
            f"- Flag Aggregator under sign flip, label flip, mimic and IPM: "
            f"{pct(min(flag_plain))}-{pct(max(flag_plain))}% without bucketing, "
            f"{pct(min(flag_buck))}-{pct(max(flag_buck))}% with it; under ALIE "
            f"{pct(acc('flag', 'alie', False))}% -> {pct(acc('flag', 'alie', True))}%.",
        ]
    )


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


def write_results_block(summary: dict[str, Any], path: Path) -> None:
    """After a grid run: rewrite its block in ``path`` (a fresh page if missing)."""
    block = {"robustness-results": results_block(summary)}
    if not path.exists():
        path.write_text(
            "# Robustness\n\n<!-- robustness-results:begin -->\n"
            "<!-- robustness-results:end -->\n"
        )
    path.write_text(replace_blocks(path.read_text(), block))
