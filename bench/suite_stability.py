"""Does the test suite pass on a loaded machine? Several clean clones of this
commit run ``make test`` at the same time, so each suite runs while the others
take the CPU (on a 2-core machine, three suites ask for several times the
cores there are). Any failure is a test that can fail by chance.

Each clone gets its own temporary directory (``TMPDIR``, a short path under
/tmp), so the suites share the CPU, memory and ports of the machine but not
pytest's temporary folders.

    python bench/suite_stability.py                  # 3 suites at once
    python bench/suite_stability.py --runs 2 --hogs 2

Writes bench/results/suite_stability.json: ``runs``, ``failures`` (suites that
did not pass), each suite's wall time, exit status, summary line and failed
tests, and the slowest tests (from ``--durations=25``) of the slowest suite.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    RESULTS_DIR,
    check_out,
    environment,
    loadavg,
    source_state,
    write_results,
)

REPO = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"^=+ (.*(passed|failed|error).*) in [\d.]+s")
DURATION = re.compile(r"^(\d+\.\d+)s (call|setup|teardown)\s+(\S+)")


def _hog(seconds: float) -> subprocess.Popen[bytes]:
    """A process that keeps one core busy until it is stopped or times out."""
    code = (
        f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def _clone(commit: str, where: Path) -> None:
    subprocess.run(["git", "clone", "-q", str(REPO), str(where)], check=True)
    subprocess.run(["git", "-C", str(where), "checkout", "-q", commit], check=True)


def _parse(log: str) -> dict[str, Any]:
    """The suite's summary line, its failed tests and its slowest tests."""
    lines = log.splitlines()
    summary = next((m.group(1) for ln in lines if (m := SUMMARY.match(ln))), None)
    failed = sorted(
        {ln.split()[1] for ln in lines if ln.startswith(("FAILED ", "ERROR "))}
    )
    slowest = [
        {"seconds": float(m.group(1)), "phase": m.group(2), "test": m.group(3)}
        for ln in lines
        if (m := DURATION.match(ln))
    ]
    return {"summary": summary, "failed_tests": failed, "slowest": slowest}


def run(runs: int, hogs: int, workdir: Path, tmps: list[Path]) -> dict[str, Any]:
    state = source_state()
    commit = state["commit"]
    if commit is None:
        raise SystemExit("error: not in a git checkout")
    procs: list[tuple[Path, subprocess.Popen[bytes], float]] = []
    for i in range(runs):
        where = workdir / f"clone-{i}"
        _clone(commit, where)
        # Short: Ray and other sockets live under it (108-byte AF_UNIX paths).
        tmp = Path(tempfile.mkdtemp(prefix=f"ss{i}."))
        tmps.append(tmp)
        env = {**os.environ, "TMPDIR": str(tmp), "CI": "true"}
        log = open(where / "make-test.log", "wb")  # noqa: SIM115 (closed below)
        print(f"suite {i}: make test in {where}", flush=True)
        proc = subprocess.Popen(
            ["make", "test"], cwd=where, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        procs.append((where, proc, time.perf_counter()))
    hog_procs = [_hog(6 * 3600) for _ in range(hogs)]
    rows: list[dict[str, Any]] = []
    try:
        for i, (where, proc, began) in enumerate(procs):
            code = proc.wait()
            wall = time.perf_counter() - began
            parsed = _parse((where / "make-test.log").read_text(errors="replace"))
            print(
                f"suite {i}: exit {code} in {wall:.0f} s: {parsed['summary']}",
                flush=True,
            )
            rows.append({"exit": code, "wall_s": round(wall, 1), **parsed})
    finally:
        for h in hog_procs:
            h.kill()
    slowest_suite = max(rows, key=lambda r: r["wall_s"])
    return {
        "setup": {
            "load": (
                f"{runs} clean clones of the commit ran `make test` at the same time"
                f" on {os.cpu_count()} cores, with {hogs} extra busy-loop processes"
            ),
            "isolation": "each clone has its own TMPDIR; CPU, memory and ports shared",
            "loadavg_end": loadavg(),
        },
        "runs": runs,
        "failures": sum(1 for r in rows if r["exit"] != 0),
        "wall_s": [r["wall_s"] for r in rows],
        "slowest": slowest_suite["slowest"][:10],
        "suites": [{k: v for k, v in r.items() if k != "slowest"} for r in rows],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="suites run at once")
    ap.add_argument("--hogs", type=int, default=0, help="extra busy-loop processes")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "suite_stability.json")
    ap.add_argument("--keep", action="store_true", help="keep the clones")
    args = ap.parse_args()
    if not 1 <= args.runs <= 8 or not 0 <= args.hogs <= 8:
        ap.error("--runs must be 1-8 and --hogs 0-8")
    check_out(ap, args.out)
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="suite-stability."))
    tmps: list[Path] = []
    try:
        results = run(args.runs, args.hogs, workdir, tmps)
        results["environment"] = environment(started)
        write_results(args.out, results, started)
    finally:
        if not args.keep:
            for d in [workdir, *tmps]:
                shutil.rmtree(d, ignore_errors=True)
    if results["failures"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
