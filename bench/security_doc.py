"""Write the measured tables of docs/security.md from the committed JSON.

Each table sits between ``<!-- NAME-table:begin -->`` and ``<!-- NAME-table:end
-->`` and is exactly what the benchmark's ``render_markdown`` makes of its
results file (``tests/bench/test_bench_*.py`` check that the doc quotes them)::

    python -m bench.security_doc
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # allow ``python bench/security_doc.py``
    sys.path.insert(0, str(REPO))

DOC = REPO / "docs" / "security.md"
#: Marker name -> the benchmark module that renders it.
TABLES = {
    "attacks": "bench.attacks_live",
    "faults": "bench.faults",
    "fuzz": "bench.fuzz",
}


def render(doc: str) -> str:
    """``doc`` with every table replaced by its benchmark's rendering."""
    for name, module in TABLES.items():
        bench = importlib.import_module(module)
        if not bench.RESULTS.exists():
            print(f"{bench.RESULTS} missing: its table left as it is", file=sys.stderr)
            continue
        begin, end = f"<!-- {name}-table:begin -->\n", f"<!-- {name}-table:end -->"
        head, _, rest = doc.partition(begin)
        _, _, tail = rest.partition(end)
        table = bench.render_markdown(json.loads(bench.RESULTS.read_text()))
        doc = head + begin + table + end + tail
    return doc


def main() -> int:
    DOC.write_text(render(DOC.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
