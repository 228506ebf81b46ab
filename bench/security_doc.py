"""The measured tables of docs/security.md, rendered from the committed JSON.

Each table sits between ``<!-- NAME-table:begin -->`` and ``<!-- NAME-table:end
-->`` and is exactly what the benchmark's ``render_markdown`` makes of its
results file (``tests/bench/test_docs_quote_results.py`` checks that the doc
quotes them)::

    python -m bench.security_doc --write-docs
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # allow ``python bench/security_doc.py``
    sys.path.insert(0, str(REPO))

from bench.docs import add_doc_args, handle_doc_args  # noqa: E402

DOC = REPO / "docs" / "security.md"
#: Marker name -> the benchmark module that renders it.
TABLES = {
    "attacks": "bench.attacks_live",
    "faults": "bench.faults",
    "fuzz": "bench.fuzz",
}


def doc_blocks() -> dict[str, str]:
    """Block name -> its table, for every benchmark whose results file exists."""
    out = {}
    for name, module in TABLES.items():
        bench = importlib.import_module(module)
        if bench.RESULTS.exists():
            results = json.loads(bench.RESULTS.read_text())
            out[f"{name}-table"] = bench.render_markdown(results)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_doc_args(ap, DOC)
    if not handle_doc_args(ap.parse_args(argv), DOC, doc_blocks):
        ap.error("give --markdown or --write-docs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
