"""The generated blocks of docs/compression.md (see :mod:`bench.docs`).

Rendered from the committed results only: ``compression.json`` (main table and the
2,000-round ``long_run``), ``compression_5000_rounds/seed*.json``,
``compression_speed.json``, ``leakage.json`` and ``tabular.json``.
``python -m bench.compression --markdown`` (or ``bench.leakage`` /
``bench.tabular``) prints them; ``--write-docs`` rewrites them in the page.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from bench.docs import ROOT, sourced, t_quantile_975

DOC = ROOT / "docs" / "compression.md"
RESULTS = ROOT / "bench" / "results"
LONG_5000 = RESULTS / "compression_5000_rounds"

#: How the byte counts of a result section were taken (its ``byte_count``).
BYTE_COUNT_TEXT = {
    "wire": "every byte of an upload's messages (header message, data chunks, "
    "gRPC's 5-byte framing of each), as the coordinator records `bytes_up`",
    "payload": "the encoded update's payload only, without the upload's header "
    "message and framing (these runs predate the coordinator counting every "
    "byte, and were not re-run)",
}


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def _sig2(x: float) -> str:
    """Two significant digits, no exponent for ordinary sizes (180, 9.5, 0.75)."""
    return f"{float(f'{x:.2g}'):g}"


def _bytes_text(section: dict[str, Any]) -> str:
    return BYTE_COUNT_TEXT[section.get("byte_count", "payload")]


def mean_interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean and two-sided 95% Student-t interval of ``xs`` (at least 2 values)."""
    m = statistics.fmean(xs)
    half = t_quantile_975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


# ----------------------------------------------------------------- main table
def results_block(c: dict[str, Any]) -> str:
    d = c["setup"]["d"]
    rows = {m["method"]: m for m in c["methods"]}
    det = c["details"]
    lines = [
        f"Bytes are {_bytes_text(c)}; ratios divide the raw float32 update, "
        f"4 d = {4 * d:,} bytes per upload, by them, so `dense` itself sits just "
        "under 1.",
        "",
        "| method | final accuracy | mean of last 3 evals | steady ratio | run ratio "
        "| bytes per upload (steady) | uplink MB | epsilon | encode / decode ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in rows.items():
        x = det[name]
        eps = "-" if m["epsilon"] is None else f"{m['epsilon']:.3f}"
        codec = x["codec"]
        lines.append(
            f"| `{name}` | {m['final_accuracy']:.4f} "
            f"| {x['mean_accuracy_last_3_evals']:.4f} "
            f"| {_ratio(m['compression_ratio'])} "
            f"| {_ratio(m['run_compression_ratio'])} "
            f"| {x['steady_bytes_per_upload']:,.0f} | {m['uplink_bytes'] / 1e6:,.1f} "
            f"| {eps} | {codec['encode_ms']:.2f} / {codec['decode_ms']:.2f} |"
        )
    spread = ", ".join(
        f"`{n}` {det[n]['steady_round_ratio_min']:,.1f}-"
        f"{det[n]['steady_round_ratio_max']:,.1f}x"
        for n in ("dgc", "dgc_fp32", "topk_ef")
        if n in det
    )
    env = c["environment"]
    lines += [
        "",
        f"Per-round ratios after warm-up: {spread} (a sparse payload's size varies "
        "with how well its delta-encoded indices compress). The run took "
        f"{env['wall_seconds']:,.0f} s on {env['cpu_count']} shared cores "
        f"({env['processes']} processes, 1 thread each; load average "
        f"{env['load_average_at_start'][0]:.1f} at the start).",
    ]
    return "\n".join(lines)


def curves_block(c: dict[str, Any]) -> str:
    names = [
        n
        for n in (
            "dense",
            "dgc",
            "dgc_no_momentum_correction",
            "topk_ef",
            "countsketch",
        )
        if n in c["details"]
    ]
    curves = {n: dict(map(tuple, c["details"][n]["accuracy_curve"])) for n in names}
    rounds = sorted(curves[names[0]])
    lines = [
        "| round | " + " | ".join(f"{r:,}" for r in rounds) + " |",
        "|---|" + "---|" * len(rounds),
    ]
    for n in names:
        cells = " | ".join(f"{curves[n][r]:.3f}".lstrip("0") for r in rounds)
        lines.append(f"| `{n}` | {cells} |")
    gap = [100 * (curves["dense"][r] - curves["dgc"][r]) for r in rounds]
    marks = ", ".join(
        f"{g:.2f} at round {r:,}" for r, g in zip(rounds, gap, strict=True)
    )
    lines += ["", f"Gap of `dgc` to `dense` (points): {marks}."]
    return "\n".join(lines)


# ------------------------------------------------------------------ long runs
def _seed_table(
    acc: dict[str, list[float]], seeds: list[int], ratios: str
) -> list[str]:
    gaps = [100 * (a - b) for a, b in zip(acc["dense"], acc["dgc"], strict=True)]
    head = " | ".join(f"seed {s}" for s in seeds)
    lines = [
        f"| method | {head} | mean ± std | steady ratio |",
        "|---|" + "---|" * (len(seeds) + 2),
    ]
    for name, label, ratio in (("dense", "`dense`", "-"), ("dgc", "`dgc`", ratios)):
        a = acc[name]
        lines.append(
            f"| {label} | "
            + " | ".join(f"{x:.4f}" for x in a)
            + f" | {statistics.fmean(a):.4f} ± {statistics.stdev(a):.4f} | {ratio} |"
        )
    lines.append(
        "| gap (points) | "
        + " | ".join(f"{g:.2f}" for g in gaps)
        + f" | {statistics.fmean(gaps):.2f} | |"
    )
    return lines


def _gap_verdict(gaps: list[float]) -> str:
    m, lo, hi = mean_interval(gaps)
    within = sum(g <= 1.0 for g in gaps)
    if hi <= 1.0:
        verdict = "the within-1-point goal is met on average"
    elif lo > 1.0:
        verdict = "the within-1-point goal is **not met** (the interval lies above 1)"
    else:
        verdict = (
            "whether DGC is within 1 point of dense on average is **not "
            "established** (the interval holds gaps above 1 point)"
        )
    return (
        f"Mean gap {m:.2f} points, 95% t-interval over the {len(gaps)} seeds "
        f"[{lo:.2f}, {hi:.2f}]; {within} of {len(gaps)} seeds within 1 point: "
        f"{verdict}."
    )


def long_run_block(c: dict[str, Any]) -> str:
    lr = c["long_run"]
    acc, seeds = lr["final_accuracy_per_seed"], lr["seeds"]
    per_seed = lr.get("dgc_steady_ratio_per_seed")
    if per_seed:
        ratios = f"{min(per_seed):,.1f}-{max(per_seed):,.1f}"
    else:  # older sections store the first seed's row and the minimum only
        ratios = f"{lr['goals']['dgc_min_steady_ratio_over_seeds']:,.1f} (lowest seed)"
    lines = [
        f"{lr['rounds']:,} rounds, evaluation every {lr['eval_every']} rounds; bytes "
        f"are {_bytes_text(lr)}.",
        "",
        *_seed_table(acc, seeds, ratios),
        "",
        _gap_verdict(lr["dgc_gap_points_per_seed"]),
    ]
    return "\n".join(lines)


def load_5000() -> list[dict[str, Any]]:
    return [_load(p) for p in sorted(LONG_5000.glob("seed*.json"))]


def five_thousand_block(runs: list[dict[str, Any]]) -> str:
    seeds = [r["setup"]["seed"] for r in runs]
    rows = [{m["method"]: m for m in r["methods"]} for r in runs]
    acc = {n: [r[n]["final_accuracy"] for r in rows] for n in ("dense", "dgc")}
    steady = [r["dgc"]["compression_ratio"] for r in rows]
    whole = [r["dgc"]["run_compression_ratio"] for r in rows]
    gaps = [100 * (a - b) for a, b in zip(acc["dense"], acc["dgc"], strict=True)]
    ratios = (
        f"{min(steady):,.1f}-{max(steady):,.1f} (run {min(whole):,.1f}-"
        f"{max(whole):,.1f})"
    )
    setup = runs[0]["setup"]
    return "\n".join(
        [
            f"{setup['rounds']:,} rounds, evaluation every {setup['eval_every']} "
            f"rounds; bytes are {_bytes_text(runs[0])}.",
            "",
            *_seed_table(acc, seeds, ratios),
            "",
            _gap_verdict(gaps),
        ]
    )


def goals_block(c: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    g, lr = c["goals"], c["long_run"]
    rows = {m["method"]: m for m in c["methods"]}
    fp32 = rows["dgc_fp32"]["compression_ratio"]
    g5 = [
        100 * ({m["method"]: m for m in r["methods"]}["dense"]["final_accuracy"] - d)
        for r in runs
        for d in [{m["method"]: m for m in r["methods"]}["dgc"]["final_accuracy"]]
    ]
    m2, lo2, hi2 = mean_interval(lr["dgc_gap_points_per_seed"])
    m5, lo5, hi5 = mean_interval(g5)

    def yes(ok: bool) -> str:
        return "**yes**" if ok else "**no**"

    ratio_ok = g["dgc_ratio_at_least_270x"]
    return "\n".join(
        [
            "| goal | result | met? |",
            "|---|---|---|",
            f"| DGC steady-state uplink ratio >= 270x (every byte counted) "
            f"| {g['dgc_steady_ratio']:,.1f}x with float16 values; {fp32:,.1f}x "
            f"with float32 values | {yes(ratio_ok)} with fp16 values, "
            f"{'yes' if fp32 >= 270 else 'no'} with fp32 |",
            f"| DGC within 1 point of dense | {c['setup']['rounds']:,} rounds: "
            f"{g['dgc_accuracy_gap_points']:.2f} points; {lr['rounds']:,} rounds, "
            f"{len(lr['seeds'])} seeds: mean {m2:.2f} [{lo2:.2f}, {hi2:.2f}]; "
            f"{runs[0]['setup']['rounds']:,} rounds, {len(runs)} seeds: mean "
            f"{m5:.2f} [{lo5:.2f}, {hi5:.2f}] (95% t-intervals) "
            f"| {yes(g['dgc_within_1_point'])} at {c['setup']['rounds']:,}; "
            f"{'yes' if hi2 <= 1 else 'no'} at {lr['rounds']:,}; "
            f"{'yes' if hi5 <= 1 else 'not established'} at "
            f"{runs[0]['setup']['rounds']:,} |",
            f"| ablation (no momentum correction) visibly worse "
            f"| {g['ablation_gap_points']:.2f} points below DGC at the end "
            f"| {yes(g['ablation_worse'])} |",
        ]
    )


# --------------------------------------------------------------- discussion
def discussion_block(c: dict[str, Any]) -> str:
    rows = {m["method"]: m for m in c["methods"]}
    det = c["details"]
    curve = {n: dict(map(tuple, det[n]["accuracy_curve"])) for n in det}
    d, dgc, abl = rows["dense"], rows["dgc"], rows["dgc_no_momentum_correction"]
    top, cs = rows["topk_ef"], rows["countsketch"]
    r200 = 200 if 200 in curve["dgc"] else min(curve["dgc"])
    early = curve["dgc_no_momentum_correction"][r200]
    lr = c["long_run"]
    long_dgc = {m["method"]: m for m in lr["methods"]}.get("dgc")
    long_text = (
        f"; {long_dgc['run_compression_ratio']:,.1f}x over {lr['rounds']:,} rounds, "
        f"counted as {lr.get('byte_count', 'payload')} bytes"
        if long_dgc
        else ""
    )
    return "\n".join(
        [
            f"- **Momentum correction matters**, as in the paper's Fig. 2a: "
            "accumulating raw updates and applying momentum to the sparse aggregate "
            f"(`dgc_no_momentum_correction`) ends {_pts(dgc, abl)} points below "
            f"`dgc` and is far worse early ({early:.3f} vs "
            f"{curve['dgc'][r200]:.3f} at round {r200}), at about the same bytes. "
            "Top-k with error feedback and server momentum (no warm-up, biases "
            f"sparsified too, {top['compression_ratio']:,.1f}x) ends at "
            f"{top['final_accuracy']:.4f}.",
            f"- **Warm-up** costs bytes early: the whole-run ratio of `dgc` is "
            f"{dgc['run_compression_ratio']:,.1f}x against "
            f"{dgc['compression_ratio']:,.1f}x after warm-up{long_text}.",
            f"- **Count-sketch** (linear, unbiased de-sketch) ends "
            f"{_pts(d, cs)} points under `dense` at {cs['compression_ratio']:,.1f}x "
            "with a 4x smaller global step; it is the only method here on which "
            "local DP noise can be put, since a sparse payload's index set would be "
            "released without noise (`privatize_payload` refuses it).",
        ]
    )


def _pts(a: dict[str, Any], b: dict[str, Any]) -> str:
    return f"{100 * (a['final_accuracy'] - b['final_accuracy']):.2f}"


def precision_block(c: dict[str, Any]) -> str:
    rows = {m["method"]: m for m in c["methods"]}
    det = c["details"]
    h, f = rows["dgc"], rows["dgc_fp32"]
    return (
        f"Measured: float16 values send {det['dgc']['steady_bytes_per_upload']:,.0f} "
        f"bytes per upload after warm-up ({h['compression_ratio']:,.1f}x), float32 "
        f"values {det['dgc_fp32']['steady_bytes_per_upload']:,.0f} "
        f"({f['compression_ratio']:,.1f}x); final accuracy {h['final_accuracy']:.4f} "
        f"with float16 against {f['final_accuracy']:.4f} with float32."
    )


def dp_block(c: dict[str, Any]) -> str:
    det = c["details"]
    names = [n for n in det if det[n]["target_epsilon"] is not None]
    sig = ", ".join(f"{det[n]['noise_multiplier']:.1f}" for n in names)
    eps = ", ".join(f"{det[n]['target_epsilon']:g}" for n in names)
    spent = ", ".join(
        f"{m['epsilon']:.3f}" for m in c["methods"] if m["method"] in names
    )
    accs = [m["final_accuracy"] for m in c["methods"] if m["method"] in names]
    cols = c["setup"]["d"] // c["setup"]["sketch_reduction"] + (
        c["setup"]["d"] % c["setup"]["sketch_reduction"] > 0
    )
    clip = c["setup"]["dp_clip_norm"]
    lo = min(det[n]["noise_multiplier"] for n in names) * clip * math.sqrt(cols)
    hi = max(det[n]["noise_multiplier"] for n in names) * clip * math.sqrt(cols)
    return (
        f"Local DP at epsilon {eps} over {c['setup']['rounds']:,} releases (RDP "
        f"accountant, delta 1e-5) needs sigma = {sig}. Each client's sketch is "
        f"clipped to {clip} and gets noise of norm about sigma x {clip} x "
        f"sqrt({cols:,}) = {lo:,.0f}-{hi:,.0f}, against a signal of norm at most "
        f"{clip}; averaging {c['setup']['clients']} clients divides the noise by "
        f"sqrt({c['setup']['clients']}) only. Final accuracy "
        f"{min(accs):.4f}-{max(accs):.4f}: chance level. Epsilon spent, read from "
        f"the store: {spent}."
    )


def speed_block(speed: dict[str, Any]) -> str:
    sel = {s["distribution"]: s["speedup"] for s in speed["selection"]}
    codecs = {x["compressor"]: x["throughput_GBps"] for x in speed["codecs"]}
    picks = [
        ("dgc 0.1% (after warm-up)", "DGC"),
        ("fp16(dgc 0.1%)", "fp16(DGC)"),
        ("countsketch 5x(d/100) linear", "a 5-row count-sketch"),
    ]
    thr = ", ".join(f"{codecs[k]:.3f} GB/s for {label}" for k, label in picks)
    d = speed["selection"][0]["numel"]
    return (
        f"At {d:,} elements (`compression_speed.json`): sampled threshold "
        f"selection {min(sel.values()):.1f}-{max(sel.values()):.1f}x faster than "
        f"exact `torch.topk`; encode + wire + decode {thr}."
    )


# ------------------------------------------------------------------ leakage
def leakage_block(lk: dict[str, Any]) -> str:
    ref = lk["reference"]
    lines = [
        f"For reference, guessing the training set's mean image gives NMSE "
        f"{ref['mean_image_guess']['nmse']:.3f} "
        f"({ref['mean_image_guess']['psnr_db']:.1f} dB); guessing zeros gives "
        f"{ref['zero_guess']['nmse']:.1f} ({ref['zero_guess']['psnr_db']:.1f} dB). "
        f"The attacker's closed-form update matches the client's real training step "
        f"to {lk['model']['closed_form_max_abs_error']:.0e}.",
        "",
        "| observed update | b | NMSE | PSNR (dB) | label recovered |",
        "|---|---|---|---|---|",
    ]
    names = {
        "uncompressed": "uncompressed",
        "countsketch": "count-sketch d/{r}",
        "gaussian_sketch": "Gaussian sketch d/{r}",
        "countsketch_clipped": "count-sketch d/{r}, clipped to "
        f"{lk['setup']['clip_norm']}, no noise",
    }
    for r in lk["results"]:
        label = names[r["scenario"]].format(r=r.get("reduction"))
        lines.append(
            f"| {label} | {r['b']:,} | {r['nmse']:.2g} | {r['psnr_db']:.1f} "
            f"| {'yes' if r['label_recovered'] else 'no'} |"
        )
    sk = lk["sketch"]
    lines += [
        "",
        f"Local DP on the d/4 count-sketch (clip {sk['clip_norm']}; the sketch's "
        f"norm is {sk['sketch_norm']:.2f}, so it is clipped, and the attacker models "
        "the clipping), sigma calibrated for a **single release** at (epsilon, "
        "1e-5), the attacker's best case: a training run composes many releases "
        f"and needs far more noise. Mean of {lk['setup']['trials']} noise draws:",
        "",
        "| epsilon | sigma | noise norm / clip | NMSE | PSNR (dB) | label recovered |",
        "|---|---|---|---|---|---|",
    ]
    for r in lk["dp"]:
        trials = r["trials"]
        found = sum(t["label_recovered"] for t in trials)
        lines.append(
            f"| {r['epsilon']:g} | {r['noise_multiplier']:.3g} "
            f"| {_sig2(r['noise_norm_over_clip'])} | {r['nmse_mean']:.2f} "
            f"| {r['psnr_db_mean']:.1f} | {found}/{len(trials)} |"
        )
    zero, mean = ref["zero_guess"]["nmse"], ref["mean_image_guess"]["nmse"]
    worse = [r["epsilon"] for r in lk["dp"] if r["nmse_mean"] > zero]
    better = [r["epsilon"] for r in lk["dp"] if r["nmse_mean"] < mean]
    lines += [
        "",
        f"Worse than guessing zeros at epsilon {', '.join(f'{e:g}' for e in worse)}; "
        "better than guessing the mean image only at epsilon "
        f"{', '.join(f'{e:g}' for e in better) or 'none'}.",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------ tabular
def tabular_block(t: dict[str, Any]) -> str:
    s, sel = t["setup"], t["setup"]["selected"]
    no_thr = t["dgc_without_size_threshold"]
    sizes = (
        f"- Bytes per upload after warm-up ({_bytes_text(t)}): "
        f"{t['dgc_bytes_per_upload']:,.0f} with DGC, "
        f"{no_thr['bytes_per_upload']:,.0f} without the threshold, "
        f"{t['dense_bytes_per_upload']:,.0f} dense."
    )
    gap = 100 * (t["federated_accuracy"] - t["dgc_accuracy"])
    fed_ok = t["goals"]["federated_within_1_point_of_central"]
    return "\n".join(
        [
            "| run | test accuracy (last round) | compression (after warm-up) "
            "| drop after warm-up end |",
            "|---|---|---|---|",
            f"| central (pooled rows, same SGD, lr {sel['central_lr']}) "
            f"| {t['central_accuracy']:.4f} | - | - |",
            f"| federated, dense FedAvg (lr {sel['federated_lr']}) "
            f"| {t['federated_accuracy']:.4f} | 1 | - |",
            f"| DGC {s['dgc_ratio']:.1%}, paper warm-up (4 stages x "
            f"{s['warmup_rounds_per_stage']} rounds), threshold "
            f"{s['min_sparse_numel']:,}, server lr {sel['dgc_server_lr']} "
            f"| {t['dgc_accuracy']:.4f} | {t['dgc_compression_ratio']:.1f}x "
            f"| {t['dgc_warmup_end_drop']:.1f} |",
            f"| the same without the threshold (`min_sparse_numel: 1`) "
            f"| {no_thr['accuracy']:.4f} | {no_thr['compression_ratio']:.1f}x "
            f"| {no_thr['warmup_end_drop']:.1f} |",
            "",
            f"- Federated {'matches' if fed_ok else 'misses'} central "
            f"({t['federated_accuracy']:.4f} vs {t['central_accuracy']:.4f}): goal "
            f"{'met' if fed_ok else 'missed'}.",
            f"- DGC ends {gap:.2f} points under dense FedAvg: goal of 1 point "
            f"{'met' if t['goals']['dgc_within_1_point_of_dense'] else '**missed**'}.",
            f"- After warm-up no drop (`dgc_warmup_end_drop` "
            f"{t['dgc_warmup_end_drop']:.1f}); inside warm-up the largest drop "
            f"without the threshold is {no_thr['largest_drop_in_warmup']:.3f} per "
            "round.",
            sizes,
            f"- Server lr for DGC chosen on validation from "
            f"{s['dgc_server_lrs']} (scores: "
            + ", ".join(
                f"{k}: {v:.3f}" for k, v in t["tuning_scores"]["dgc_server_lr"].items()
            )
            + ").",
        ]
    )


# -------------------------------------------------------------------- pages
def compression_blocks() -> dict[str, str]:
    main, five = RESULTS / "compression.json", RESULTS / "compression_5000_rounds"
    speed = RESULTS / "compression_speed.json"
    c = _load(main)
    runs = load_5000()
    return {
        "compression-results": sourced(results_block(c), main),
        "compression-curves": sourced(curves_block(c), main),
        "compression-long-run": sourced(long_run_block(c), main),
        "compression-5000": sourced(five_thousand_block(runs), five),
        "compression-goals": sourced(goals_block(c, runs), main, five),
        "compression-precision": sourced(precision_block(c), main),
        "compression-discussion": sourced(discussion_block(c), main),
        "compression-dp": sourced(dp_block(c), main),
        "compression-speed": sourced(speed_block(_load(speed)), speed),
    }


def leakage_blocks() -> dict[str, str]:
    path = RESULTS / "leakage.json"
    return {"leakage-results": sourced(leakage_block(_load(path)), path)}


def tabular_blocks() -> dict[str, str]:
    path = RESULTS / "tabular.json"
    return {"tabular-results": sourced(tabular_block(_load(path)), path)}


def doc_blocks() -> dict[str, str]:
    """Every generated block of docs/compression.md."""
    return {**compression_blocks(), **leakage_blocks(), **tabular_blocks()}
