"""Generated blocks: how the docs quote benchmark results.

A page quotes a benchmark through blocks that the benchmark renders from its
committed JSON; nothing between the markers is written by hand::

    <!-- compression-results:begin -->
    ...the text ``render`` returns for "compression-results"...
    <!-- compression-results:end -->

Each benchmark module with doc blocks has ``DOC`` (the page) and
``doc_blocks() -> dict[str, str]`` (block name -> text, rendered from the
committed results), and takes ``--markdown`` (print the blocks) and
``--write-docs`` (rewrite them in ``DOC``) through :func:`add_doc_args` and
:func:`handle_doc_args`. ``tests/bench/test_docs_quote_results.py`` checks every
page against its benchmark, so a doc number cannot drift from its JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "RESULTS",
    "ROOT",
    "add_doc_args",
    "block_text",
    "handle_doc_args",
    "read_blocks",
    "replace_blocks",
    "source_note",
    "source_note_of",
    "sourced",
    "stamps",
    "t_quantile_975",
    "with_source",
]

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(
    r"<!-- (?P<name>[a-z0-9-]+):begin -->\n(?P<body>.*?)<!-- (?P=name):end -->",
    re.S,
)

#: Two-sided 95% quantiles of Student's t by degrees of freedom (t_{0.975, df}),
#: for the confidence interval of a mean over a handful of seeds.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365}


def t_quantile_975(df: int) -> float:
    """``t_{0.975}`` with ``df`` degrees of freedom (1-7 seeds' worth)."""
    if df not in _T975:
        raise ValueError(f"no t quantile tabulated for {df} degrees of freedom")
    return _T975[df]


RESULTS = ROOT / "bench" / "results"


def stamps(doc: Any) -> Iterator[dict[str, Any]]:
    """Every ``environment`` block with a ``commit`` key in a results document,
    at any depth (a before/after comparison holds one per run)."""
    if isinstance(doc, dict):
        env = doc.get("environment")
        if isinstance(env, dict) and "commit" in env:
            yield env
        for v in doc.values():
            yield from stamps(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from stamps(v)


def _commits(doc: Any) -> list[tuple[str, bool]]:
    """Every stamped commit (non-empty) and whether its tree was dirty."""
    return [
        (str(env["commit"]), bool(env.get("tree_dirty")))
        for env in stamps(doc)
        if env["commit"]
    ]


def _part(path: Path, docs: list[Any]) -> str:
    stamps = [st for d in docs for st in _commits(d)]
    commits = list(dict.fromkeys(c[:7] for c, _ in stamps))
    where = f"`{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}`"
    if not commits:
        return f"{where} (commit not recorded)"
    what = "commit" if len(commits) == 1 else "commits"
    dirty = ", from a dirty tree" if any(d for _, d in stamps) else ""
    return f"{where} ({what} {', '.join(commits)}{dirty})"


def source_note(*paths: Path) -> str:
    """The line a generated block ends with: the results it was rendered from
    and the commit (or commits) they were written at."""
    parts = []
    for path in paths:
        files = sorted(path.glob("*.json")) if path.is_dir() else [path]
        parts.append(_part(path, [json.loads(f.read_text()) for f in files]))
    return "Source: " + "; ".join(parts) + "."


def source_note_of(path: Path, doc: Any) -> str:
    """:func:`source_note` of results ``doc``, read from ``path``."""
    return f"Source: {_part(path, [doc])}."


def with_source(
    path: Path,
) -> Callable[[Callable[[Any], str]], Callable[[Any], str]]:
    """Make a ``render(results) -> markdown`` end with the results'
    :func:`source_note_of` (``path``: where they are committed)."""

    def wrap(render: Callable[[Any], str]) -> Callable[[Any], str]:
        @functools.wraps(render)
        def rendered(results: Any) -> str:
            body = render(results).rstrip("\n")
            return f"{body}\n\n{source_note_of(path, results)}\n"

        return rendered

    return wrap


def sourced(body: str, *paths: Path) -> str:
    """``body`` with its :func:`source_note` as a last paragraph."""
    return f"{body.rstrip()}\n\n{source_note(*paths)}"


def block_text(body: str) -> str:
    """A block's body as it stands between its markers (ends with a newline)."""
    return body if body.endswith("\n") else body + "\n"


def read_blocks(text: str) -> dict[str, str]:
    """Block name -> the text between its markers."""
    return {m["name"]: m["body"] for m in _BLOCK.finditer(text)}


def replace_blocks(text: str, blocks: Mapping[str, str]) -> str:
    """``text`` with each named block's body replaced; every block must exist."""
    missing = sorted(set(blocks) - set(read_blocks(text)))
    if missing:
        raise KeyError(f"no markers for blocks {missing}")

    def sub(m: re.Match[str]) -> str:
        name = m["name"]
        if name not in blocks:
            return m[0]
        return f"<!-- {name}:begin -->\n{block_text(blocks[name])}<!-- {name}:end -->"

    return _BLOCK.sub(sub, text)


def add_doc_args(ap: argparse.ArgumentParser, doc: Path) -> None:
    """``--markdown`` and ``--write-docs`` (both run nothing)."""
    ap.add_argument(
        "--markdown",
        action="store_true",
        help="print the docs' blocks rendered from the committed results and exit",
    )
    ap.add_argument(
        "--write-docs",
        action="store_true",
        help=f"rewrite the generated blocks of {doc.relative_to(ROOT)} and exit",
    )


def handle_doc_args(
    args: argparse.Namespace, doc: Path, blocks: Callable[[], dict[str, str]]
) -> bool:
    """Do what ``--markdown`` / ``--write-docs`` ask; ``True`` if one was given."""
    if not (args.markdown or args.write_docs):
        return False
    rendered = blocks()
    if args.write_docs:
        doc.write_text(replace_blocks(doc.read_text(), rendered))
        print(f"rewrote {len(rendered)} blocks of {doc.relative_to(ROOT)}")
    else:
        for name, body in rendered.items():
            print(f"<!-- {name}:begin -->\n{block_text(body)}<!-- {name}:end -->\n")
    return True
