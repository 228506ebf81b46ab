"""Every document a command, a docstring or another document cites exists: a
page under docs/ named anywhere in the repository's tracked text files is a
file of the repository (a reader sent to a missing page has been lost)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CITED = re.compile(r"(?<![\w/.-])((?:docs|docker|examples)/[\w./-]+\.md)\b")
TEXT = (".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".cfg", ".txt", "Makefile")


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return [REPO / f for f in out if f.endswith(TEXT) and (REPO / f).is_file()]


def test_every_cited_document_exists() -> None:
    missing = set()
    for path in _tracked_text_files():
        for m in CITED.finditer(path.read_text(errors="replace")):
            if not (REPO / m.group(1)).is_file():
                missing.add(f"{path.relative_to(REPO)} cites {m.group(1)}")
    assert sorted(missing) == []


def test_the_check_sees_a_missing_page(tmp_path: Path) -> None:
    # Built at run time, so this file does not itself cite a missing page.
    missing = "docs/" + "no-such-page.md"
    text = f"see {missing} and docs/scale.md, not mydocs/x.md"
    assert [m.group(1) for m in CITED.finditer(text)] == [missing, "docs/scale.md"]
