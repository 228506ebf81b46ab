"""What every benchmark writes the same way: the environment block and the JSON
file; and what the process-level benchmarks measure the same way: load average,
peak memory of a process tree, medians."""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "RESULTS_DIR",
    "PeakRss",
    "check_out",
    "environment",
    "loadavg",
    "median",
    "peak_rss_mb",
    "round_progress",
    "shared_machine",
    "source_state",
    "tiny_parser",
    "write_results",
]

MB = 1e6


def source_state() -> dict[str, Any]:
    """The commit the benchmark's code is at and whether tracked files differ
    from it (a result from a dirty tree says so); results files themselves
    (bench/results/) do not count, since a benchmark saves as it goes."""
    repo = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], cwd=repo, capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git(
        "status", "--porcelain", "--untracked-files=no", "--", ".",
        ":(exclude)bench/results",
    )  # fmt: skip
    return {"commit": commit, "tree_dirty": None if status is None else bool(status)}


#: Where committed results live: written only from a clean tree.
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def dirty_destination(path: Path, state: dict[str, Any] | None = None) -> str | None:
    """Why ``path`` may not be written now (``None``: it may).

    A file in bench/results/ is a committed result: it must say which commit
    produced it, so it is written only from a tree whose tracked files match
    that commit. Anywhere else (a test's tmp_path, /tmp) is free.
    """
    if path.resolve().parent != RESULTS_DIR:
        return None
    state = source_state() if state is None else state
    if state["commit"] is None or state["tree_dirty"] is not False:
        return (
            f"refusing to write {path}: bench/results/ takes results of a committed "
            "tree only (commit or stash your changes, or pass --out elsewhere)"
        )
    return None


def check_out(parser: argparse.ArgumentParser, path: Path) -> None:
    """Refuse (the parser's one-line error, exit 2) an ``--out`` in
    bench/results/ from a dirty tree, before a benchmark runs for hours to find
    its result unwritable. Call it after ``--markdown``/``--write-docs`` are
    handled: those only read the committed results."""
    problem = dirty_destination(Path(path))
    if problem is not None:
        parser.error(problem)


def environment(started: float, **versions: str) -> dict[str, Any]:
    """Library versions, machine, the code's commit, and wall time since
    ``started`` (perf_counter)."""
    return {
        "torch": torch.__version__,
        **versions,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        **source_state(),
        "wall_seconds": time.perf_counter() - started,
    }


def write_results(path: Path, results: dict[str, Any], started: float) -> None:
    """Write ``results`` as indented JSON and say where, with the run time.

    The commit and tree state at writing are stamped into ``environment``. If
    the tree became dirty while the benchmark ran, a bench/results/ file is not
    written: the JSON goes to the temporary directory instead, and the process
    exits with status 1 saying where.
    """
    state = source_state()
    env = results.setdefault("environment", {})
    if isinstance(env, dict):
        env.update(state)
    problem = dirty_destination(path, state)
    if problem is not None:
        path = Path(tempfile.gettempdir()) / path.name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {path} in {time.perf_counter() - started:.0f} s")
    if problem is not None:
        raise SystemExit(f"{problem}; the result is in {path}")


def tiny_parser(doc: str | None, default_out: Path) -> argparse.ArgumentParser:
    """The arguments of a process-level benchmark (``--tiny``, ``--out``); it
    also makes SIGTERM unwind like Ctrl-C, so the processes it started are
    stopped by their ``finally`` blocks."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="small and quick (tests)")
    ap.add_argument("--out", type=Path, default=default_out)
    return ap


def shared_machine(load_start: list[float]) -> dict[str, Any]:
    """The setup keys saying how loaded the shared machine was."""
    return {
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
        "nice": "run with nice -n 10 on a shared 2-core machine",
    }


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages (the machine is shared)."""
    return [round(x, 2) for x in os.getloadavg()]


def median(xs: Iterable[float]) -> float:
    return float(statistics.median(list(xs)))


def _status_kb(pid: int, field: str) -> int:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def peak_rss_mb(pid: int) -> float:
    """Peak resident set (VmHWM) of a live process, in MB (1e6 bytes)."""
    return _status_kb(pid, "VmHWM") * 1024 / MB


def _descendants(root: int) -> list[int]:
    """``root`` and every live process below it (by parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # Field 4 (ppid) follows the parenthesised command name.
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


class PeakRss:
    """Samples the peak resident set (VmHWM) of a process and every process
    below it until stopped; :attr:`mb` is the sum of their peaks (each
    process's own high-water mark, seen while it was alive; the sum can exceed
    the tree's simultaneous peak)."""

    def __init__(self, root: int, interval: float = 0.2) -> None:
        self.root = root
        self.interval = interval
        self.peaks: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for pid in _descendants(self.root):
            mb = peak_rss_mb(pid)
            if mb > self.peaks.get(pid, 0.0):
                self.peaks[pid] = mb
            if pid not in self.names:
                try:
                    self.names[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
                except OSError:
                    self.names[pid] = "?"

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def start(self) -> PeakRss:
        self._thread.start()
        return self

    def stop(self) -> float:
        """Take a last sample, stop, and return :attr:`mb`."""
        self._sample()
        self._stop.set()
        self._thread.join(5)
        return self.mb

    @property
    def mb(self) -> float:
        return round(sum(self.peaks.values()), 1)

    def processes(self) -> list[str]:
        return sorted({self.names.get(p, "?") for p in self.peaks})


def round_progress(name: str, rounds: int) -> Callable[[Any], None]:
    """An ``on_round`` callback for ``fedplat.sim.simulate`` that prints each
    evaluated round's accuracy and the seconds since it was made to stderr."""
    t0 = time.perf_counter()

    def progress(outcome: Any) -> None:
        if outcome.accuracy is not None:
            print(
                f"[{name}] round {outcome.number}/{rounds} acc "
                f"{outcome.accuracy:.4f} ({time.perf_counter() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )

    return progress
