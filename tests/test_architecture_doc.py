"""docs/architecture.md stays true to the tree: every module it names exists, and
every class or function it names after a module (``server/intake.py: Intake``) is
defined there."""

from __future__ import annotations

import ast
import re

from tests.support import REPO

DOC = REPO / "docs" / "architecture.md"
TOPS = ("client", "server", "aggregators", "ui", "fedplat", "bench", "docker")
_TOP = "|".join(TOPS)
PATH = re.compile(rf"\b((?:{_TOP})/[\w/.]*)")
NAMED = re.compile(rf"\b((?:{_TOP})/[\w/]+\.py): ([\w, |()]+)")


def _defined(path: str) -> set[str]:
    tree = ast.parse((REPO / path).read_text())
    return {
        n.name
        for n in tree.body
        if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    }


def test_every_path_in_the_architecture_doc_exists() -> None:
    text = DOC.read_text()
    paths = {p.rstrip(".") for p in PATH.findall(text)}
    assert len(paths) > 40
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert missing == []


def test_every_name_given_for_a_module_is_defined_there() -> None:
    text = DOC.read_text().replace("<br/>", "\n")
    checked = 0
    for path, names in NAMED.findall(text):
        for name in re.findall(r"[A-Za-z_]\w*", names.split("(")[0]):
            assert name in _defined(path), f"{path} defines no {name}"
            checked += 1
    assert checked >= 15


def test_every_package_is_on_the_map() -> None:
    """Each package of the distribution is named in the concept table."""
    text = DOC.read_text()
    for init in sorted(REPO.glob("fedplat/*/__init__.py")):
        pkg = init.parent.relative_to(REPO).as_posix()
        if pkg == "fedplat/testing":  # test helpers, not a README concept
            continue
        assert f"{pkg}/" in text or f"{pkg}." in text, pkg
