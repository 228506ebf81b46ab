"""docs/scale.md's fleet blocks, rendered from the committed JSON of
bench/vs_flower.py, bench/load.py, bench/round_overhead.py and
bench/stream_window.py (issue 15).

Usage::

    python -m bench.docs_fleet --markdown      # print the blocks
    python -m bench.docs_fleet --write-docs    # rewrite them in docs/scale.md
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # allow ``python bench/docs_fleet.py``
    sys.path.insert(0, str(REPO))

from bench.docs import add_doc_args, handle_doc_args, sourced  # noqa: E402

DOC = REPO / "docs" / "scale.md"
RESULTS = REPO / "bench" / "results"
PAYLOAD_OPS = ("upload_encode", "upload_decode", "download_encode", "download_decode")


def _s(x: float) -> str:
    """Seconds, 3 significant digits (milliseconds below 10 ms)."""
    return f"{x:.3g} s" if x >= 0.01 else f"{x * 1000:.2g} ms"


def _or_none(x: object) -> str:
    return "not measured" if x is None else str(x)


def _met(goals: dict[str, Any]) -> list[str]:
    return [
        f"- {name.removesuffix('_met').replace('_', ' ')}: "
        f"{'met' if ok else '**missed**'}"
        for name, ok in goals.items()
        if name.endswith("_met")
    ]


def _machine(setup: dict[str, Any]) -> str:
    return (
        f"load average {setup['loadavg_start'][0]} at the start, "
        f"{setup['loadavg_end'][0]} at the end (2 shared cores, `nice -n 10`)"
    )


def vs_flower_block(data: dict[str, Any]) -> str:
    """The five systems side by side, the goals per row and in all."""
    s = data["setup"]
    lines = [
        f"`bench/results/vs_flower.json`: median of rounds 2-{s['rounds']}, then "
        f"median over {data.get('repetitions_completed', s['repetitions'])} "
        "interleaved repetition(s); "
        f"{_machine(s)}.",
        "",
        "| clients x params | fedplat | Flower embedded | Flower deployment "
        "| loopback floor | gRPC floor | fedplat / floor | deployment / fedplat "
        "| embedded / fedplat | server RSS fedplat / embedded / deployment |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        g = r["goals"]
        lines.append(
            f"| {r['clients']} x {r['params'] / 1e6:g}M "
            f"| {_s(r['fedplat_round_s'])} | {_s(r['flower_embedded_round_s'])} "
            f"| {_s(r['flower_deployment_round_s'])} | {_s(r['loopback_floor_s'])} "
            f"| {_s(r['grpc_floor_s'])} "
            f"| {g['floor_ratio']}x | {g['speedup_vs_deployment']}x "
            f"| {g['speedup_vs_embedded']}x "
            f"| {r['fedplat_peak_rss_mb']:.0f} / "
            f"{r['flower_embedded_peak_rss_mb']:.0f} / "
            f"{r['flower_deployment_peak_rss_mb']:.0f} MB |"
        )
    lines += ["", "Goals of issue 15 on every row:", *_met(data["goals"])]
    lines += [f"- deviation: {d}" for d in s.get("deviations", [])]
    lines += [
        "",
        "How the loopback ratio splits (the gRPC floor: the same bytes "
        "through bare `grpc.aio` streams, nothing else):",
        "",
    ]
    lines += [
        f"- {r['clients']} x {r['params'] / 1e6:g}M: gRPC floor / loopback "
        f"{r['goals']['grpc_floor_ratio_vs_loopback']}x, fedplat / gRPC floor "
        f"{r['goals']['fedplat_ratio_vs_grpc_floor']}x"
        for r in data["rows"]
    ]
    return "\n".join(lines)


def load_block(data: dict[str, Any]) -> str:
    """The 1,000-client fleet against one coordinator."""
    s = data["setup"]
    lines = [
        f"`bench/results/load.json`: {s['clients']} clients in "
        f"{s['client_procs']} processes, {s['per_round']} selected per round, "
        f"{s['rounds']} rounds, {s['params']:,} parameters; {_machine(s)}.",
        "",
        "| connected | rounds | failures | task hand-out p50 / p99 | updates/s "
        "| coordinator peak RSS | coordinator threads (all connected / peak) |",
        "|---|---|---|---|---|---|---|",
        f"| {data['connected']} ({data['max_established_connections']} TCP "
        f"connections) | {data['rounds_completed']} | {data['failures']} "
        f"| {_s(data['task_latency_p50_s'])} / {_s(data['task_latency_p99_s'])} "
        f"| {data['updates_per_s']} | {data['coordinator_peak_rss_mb']:.0f} MB "
        f"| {data['coordinator_threads_at_max_connections']} / "
        f"{data['coordinator_peak_threads']} |",
        "",
        "Goals:",
        *_met(data["goals"]),
    ]
    return "\n".join(lines)


def round_overhead_block(data: dict[str, Any]) -> str:
    """Round time, throughput and memory against the memory model."""
    s = data["setup"]
    lines = [
        f"`bench/results/round_overhead.json`: {s['rounds']} rounds per case "
        f"(the first discarded), {s['repetitions']} repetition(s); "
        f"{_machine(s)}. Server settings: {_settings(data)}.",
        "",
        "| rule | clients x params | median round | effective GB/s "
        "| coordinator peak RSS | model predicts | model-sized buffers "
        "| client buffers |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rounds"]:
        light = " (light clients)" if r.get("clients_kind") == "light" else ""
        case = f"| {r['rule']} | {r['clients']} x {r['params'] / 1e6:g}M{light} |"
        if "skipped" in r:
            lines.append(f"{case} not run: {r['skipped']} | | | | | |")
            continue
        lines.append(
            f"{case} {_s(r['median_round_s'])} | {r['effective_gbps']} "
            f"| {r['server_peak_rss_mb']:.0f} MB "
            f"| {r['server_predicted_peak_mb']:.0f} MB "
            f"| {r['server_model_sized_buffers']} "
            f"| {_or_none(r['client_model_sized_buffers'])} |"
        )
    p = data["payload"]
    lines += [
        "",
        "Payload path against a memory copy of the same bytes "
        f"({p['params']:,} parameters): "
        + ", ".join(
            f"{op.replace('_', ' ')} {p[f'{op}_ratio_to_memcpy']}x"
            for op in PAYLOAD_OPS
        )
        + ".",
        "",
        "Goals:",
        *_met(data["goals"]),
    ]
    judged = data["goals"].get("clients_within_3_buffers_judged_at")
    if judged:
        sizes = ", ".join(f"{n / 1e6:g}M" for n in judged)
        small = sorted(
            {
                f"{r['params'] / 1e6:g}M"
                for r in data["rounds"]
                if r.get("params") not in judged
                and r.get("client_model_sized_buffers") is not None
            }
        )
        lines.append(
            f"  (judged at {sizes} parameters only"
            + (
                f"; at {', '.join(small)} the memory a client uses whatever the model "
                "size (message buffers, allocator arenas) is several model sizes, so "
                "its buffers column is above 3 there"
                if small
                else ""
            )
            + ")"
        )
    return "\n".join(lines)


def _settings(data: dict[str, Any]) -> str:
    """The server settings a round_overhead JSON ran with, named and sized."""
    srv = data["setup"]["server"]
    return (
        f"{data['setup']['server_settings']} ("
        f"{srv['max_concurrent_uploads']} decoding slots, "
        f"{srv['chunk_bytes'] / 2**20:g} MiB chunks in "
        f"{srv['max_message_bytes'] / 2**20:g} MiB messages)"
    )


def round_overhead_settings_block(*runs: tuple[str, dict[str, Any]]) -> str:
    """FedAvg at 100 x 10M under each server setting (one row per JSON)."""
    lines = [
        "| server settings | case | median round | coordinator peak RSS "
        "| model predicts |",
        "|---|---|---|---|---|",
    ]
    for name, data in runs:
        label = _settings(data)
        for r in data["rounds"]:
            case = (r["rule"], r["clients"], r["params"])
            if "skipped" in r or case != ("fedavg", 100, 10_000_000):
                continue
            lines.append(
                f"| {label}, `{name}` | {r['rule']} {r['clients']} x "
                f"{r['params'] / 1e6:g}M | {_s(r['median_round_s'])} "
                f"| {r['server_peak_rss_mb']:.0f} MB "
                f"| {r['server_predicted_peak_mb']:.0f} MB |"
            )
    return "\n".join(lines)


def stream_window_block(data: dict[str, Any]) -> str:
    """Uploads waiting for a slot: the coordinator's window against gRPC's."""
    s, rows = data["setup"], data["rows"]
    lines = [
        f"`bench/results/stream_window.json`: {s['streams']} streams of "
        f"{s['stream_mb']} MiB ({data['bytes_waiting_mb']} MB) behind one slot, "
        f"{s['repetitions']} interleaved repetition(s); load average "
        f"{s['load_average']['start'][0]} at the start, "
        f"{s['load_average']['end'][0]} at the end.",
        "",
        "| server options | peak RSS growth | all streams done |",
        "|---|---|---|",
    ]
    for name, label in (
        ("coordinator", "the coordinator's (fixed window, BDP probing off)"),
        ("grpc_auto_tuning", "gRPC's defaults (BDP probing)"),
    ):
        r = rows[name]
        lines.append(
            f"| {label} | {r['peak_growth_mb']} MB | {_s(r['median_seconds'])} |"
        )
    lines += [
        "",
        f"gRPC's defaults held {data['memory_ratio_auto_tuning_vs_coordinator']}x "
        "the memory; the coordinator's options took "
        f"{data['time_ratio_coordinator_vs_auto_tuning']}x the time.",
    ]
    return "\n".join(lines)


def doc_blocks() -> dict[str, str]:
    """docs/scale.md's generated blocks, from the committed results."""

    def read(name: str) -> dict[str, Any]:
        out: dict[str, Any] = json.loads((RESULTS / name).read_text())
        return out

    settings = ("round_overhead.json", "round_overhead_fleet.json")
    return {
        "fleet-vs-flower": sourced(
            vs_flower_block(read("vs_flower.json")), RESULTS / "vs_flower.json"
        ),
        "fleet-load": sourced(load_block(read("load.json")), RESULTS / "load.json"),
        "fleet-round-overhead": sourced(
            round_overhead_block(read("round_overhead.json")),
            RESULTS / "round_overhead.json",
        ),
        "fleet-round-overhead-settings": sourced(
            round_overhead_settings_block(*((n, read(n)) for n in settings)),
            *(RESULTS / n for n in settings),
        ),
        "fleet-stream-window": sourced(
            stream_window_block(read("stream_window.json")),
            RESULTS / "stream_window.json",
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_doc_args(ap, DOC)
    args = ap.parse_args(argv)
    if not handle_doc_args(args, DOC, doc_blocks):
        ap.error("give --markdown or --write-docs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
