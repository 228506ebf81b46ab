"""Every committed result says which code produced it, and that code stands.

A JSON in bench/results/ records ``environment.commit`` and
``environment.tree_dirty`` (bench/common.py stamps them, and refuses to write
there from a dirty tree). Here every such commit must be an ancestor of HEAD (a
result from a branch that never landed, or from rewritten history, fails) and
its tree clean. Results written before benchmarks recorded their commit are
listed in :data:`UNSTAMPED`, by name: the list may only shrink (a listed file
that gains a commit fails until it is removed from the list).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.docs import stamps
from tests.support import REPO

RESULTS = REPO / "bench" / "results"

#: Written before the benchmarks stamped their commit (to be re-run).
UNSTAMPED = frozenset({
    "aggregators_speed.json", "compression.json", "compression_speed.json",
    "contribution.json", "contribution_dirichlet.json",
    "contribution_free_rider_random.json", "contribution_free_rider_stale.json",
    "dp_fedavg.json", "dp_fedavg_tuning.json", "faults.json",
    "gossip_disruption.json", "leakage.json", "load.json",
    "round_overhead.json", "round_overhead_fleet.json",
    "scale.json", "secagg.json", "stream_window.json", "tabular.json",
    "vs_flower.json", "vs_flower_sim.json",
})  # fmt: skip


def problems(doc: Any, is_ancestor: Callable[[str], bool]) -> list[str]:
    """What is wrong with one result's provenance (empty: nothing)."""
    found = list(stamps(doc))
    if not found:
        return ["records no commit"]
    out = []
    for env in found:
        commit = env.get("commit")
        if not isinstance(commit, str) or not commit:
            out.append("commit is empty")
        elif not is_ancestor(commit):
            out.append(f"commit {commit[:10]} is not an ancestor of HEAD")
        if env.get("tree_dirty") is not False:
            out.append(
                f"written from a dirty tree (tree_dirty={env.get('tree_dirty')})"
            )
    return out


def _git_ancestor(commit: str) -> bool:
    r = subprocess.run(
        ["git", "merge-base", "--is-ancestor", commit, "HEAD"],
        cwd=REPO,
        capture_output=True,
        timeout=60,
    )
    return r.returncode == 0


def _in_git_checkout() -> bool:
    if shutil.which("git") is None:
        return False
    r = subprocess.run(
        ["git", "rev-parse", "--is-inside-work-tree"], cwd=REPO, capture_output=True
    )
    return r.returncode == 0


def test_the_checker_by_hand() -> None:
    good = {"environment": {"commit": "abc", "tree_dirty": False}}
    assert problems(good, lambda c: True) == []
    assert problems(good, lambda c: False) == ["commit abc is not an ancestor of HEAD"]
    dirty = {"environment": {"commit": "abc", "tree_dirty": True}}
    assert problems(dirty, lambda c: True) == [
        "written from a dirty tree (tree_dirty=True)"
    ]
    assert problems({"rows": []}, lambda c: True) == ["records no commit"]
    nested = {"before": [good], "after": [dirty]}
    assert len(problems(nested, lambda c: True)) == 1


@pytest.mark.skipif(not _in_git_checkout(), reason="needs the git history")
def test_every_committed_result_comes_from_code_that_stands() -> None:
    bad = {}
    for path in sorted(RESULTS.glob("*.json")):
        found = problems(json.loads(path.read_text()), _git_ancestor)
        if path.name in UNSTAMPED:
            if found != ["records no commit"]:
                bad[path.name] = (
                    found if found else "now stamped: remove it from UNSTAMPED"
                )
        elif found:
            bad[path.name] = found
    assert bad == {}


def test_the_unstamped_list_names_existing_files() -> None:
    assert sorted(n for n in UNSTAMPED if not (RESULTS / n).exists()) == []


def test_bench_refuses_to_write_results_from_a_dirty_tree(tmp_path: Path) -> None:
    from bench.common import dirty_destination

    dirty = {"commit": "abc", "tree_dirty": True}
    clean = {"commit": "abc", "tree_dirty": False}
    target = RESULTS / "x.json"
    assert dirty_destination(target, dirty) is not None
    assert dirty_destination(target, {"commit": None, "tree_dirty": None}) is not None
    assert dirty_destination(target, clean) is None
    assert dirty_destination(tmp_path / "x.json", dirty) is None  # elsewhere: free
