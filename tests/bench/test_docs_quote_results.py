"""Every doc block generated from a benchmark's committed JSON is what the
benchmark renders now (``python -m bench.X --write-docs`` rewrites a stale one),
and the block machinery itself (markers, replacement, the t-interval) is right."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import REPO

#: Modules that render a page's blocks: ``DOC`` and ``doc_blocks()``.
RENDERERS = (
    "bench.docs_compression",
    "bench.docs_fleet",
    "bench.docs_robustness",
    "bench.security_doc",
    "bench.gossip_disruption",
    "bench.vs_flower_sim",
    "bench.demo",
)


def _renderer(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO))  # bench/ is not an installed package
    return importlib.import_module(name)


@pytest.mark.parametrize("name", RENDERERS)
def test_docs_quote_the_committed_results(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = _renderer(name, monkeypatch)
    from bench.docs import block_text, read_blocks

    quoted = read_blocks(mod.DOC.read_text())
    rendered = mod.doc_blocks()
    assert rendered, name
    for block, body in rendered.items():
        assert block in quoted, f"{mod.DOC.name} has no markers for {block}"
        assert quoted[block] == block_text(body), (
            f"{mod.DOC.name}: block {block} differs from the JSON; run "
            f"`python -m {name} --write-docs` (or the benchmark's --write-docs)"
        )


def test_every_block_in_the_docs_has_a_renderer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owned: dict[str, set[str]] = {}
    for name in RENDERERS:
        mod = _renderer(name, monkeypatch)
        owned.setdefault(mod.DOC.name, set()).update(mod.doc_blocks())
    from bench.docs import read_blocks

    # Blocks with a renderer and a test of their own elsewhere.
    owned.setdefault("privacy.md", set()).update({"secagg-table", "dp-fedavg-table"})
    pages = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
    for page in pages:
        blocks = set(read_blocks(page.read_text()))
        assert blocks <= owned.get(page.name, set()), (page.name, blocks)


def test_blocks_are_replaced_between_their_markers_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    from bench.docs import read_blocks, replace_blocks

    text = (
        "a\n<!-- x:begin -->\nold\n<!-- x:end -->\n"
        "b\n<!-- y:begin -->\nkeep\n<!-- y:end -->\n"
    )
    out = replace_blocks(text, {"x": "new 1\nnew 2"})
    assert read_blocks(out) == {"x": "new 1\nnew 2\n", "y": "keep\n"}
    assert out.startswith("a\n") and "\nb\n" in out
    with pytest.raises(KeyError, match="z"):
        replace_blocks(text, {"z": "?"})


def test_mean_interval_is_the_student_t_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    from bench.docs_compression import mean_interval

    # Gaps of the 5,000-round runs: mean 0.8967, sd 0.4966, t(2) = 4.303.
    m, lo, hi = mean_interval([0.36, 1.34, 0.99])
    assert m == pytest.approx(0.8967, abs=1e-4)
    assert (lo, hi) == pytest.approx((-0.3369, 2.1302), abs=1e-3)
    scipy_stats = pytest.importorskip("scipy.stats")
    half = scipy_stats.t.ppf(0.975, 2) * 0.49662 / 3**0.5
    assert hi - m == pytest.approx(half, rel=1e-3)


def test_a_block_names_its_results_and_their_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    from bench.docs import source_note, source_note_of, sourced

    stamped = tmp_path / "a.json"
    stamped.write_text(
        json.dumps({"environment": {"commit": "0123456789abcdef", "tree_dirty": False}})
    )
    nested = tmp_path / "runs"
    nested.mkdir()
    for i, commit in enumerate(("aaaaaaa1", "bbbbbbb2", "aaaaaaa1")):
        (nested / f"seed{i}.json").write_text(
            json.dumps(
                {"rows": [{"environment": {"commit": commit, "tree_dirty": i == 1}}]}
            )
        )
    bare = tmp_path / "old.json"
    bare.write_text("{}")
    assert source_note(stamped) == f"Source: `{stamped}` (commit 0123456)."
    assert source_note(nested, bare) == (
        f"Source: `{nested}` (commits aaaaaaa, bbbbbbb, from a dirty tree); "
        f"`{bare}` (commit not recorded)."
    )
    assert source_note_of(bare, {"environment": {"commit": "feedbeef0"}}) == (
        f"Source: `{bare}` (commit feedbee)."
    )
    assert sourced("| a |\n", stamped).endswith(
        "| a |\n\nSource: " + f"`{stamped}` (commit 0123456)."
    )
