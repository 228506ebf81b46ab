"""Size limits of the product code (issue 12): no file over 500 lines and no
function over 80 lines in server/, client/, aggregators/, ui/ and fedplat/
(generated protobuf code aside). Split by concern when one grows past them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import REPO

ROOTS = ("server", "client", "aggregators", "ui", "fedplat")
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    return sorted(
        p
        for root in ROOTS
        for p in (REPO / root).rglob("*.py")
        if "_pb2" not in p.name and "migrations" not in p.parts
    )


def test_no_file_over_the_limit() -> None:
    long = {
        str(p.relative_to(REPO)): n
        for p in _sources()
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert long == {}, f"split these files by concern: {long}"


@pytest.mark.parametrize("root", ROOTS)
def test_no_function_over_the_limit(root: str) -> None:
    long = {}
    for p in _sources():
        if p.relative_to(REPO).parts[0] != root:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(REPO)}:{node.name}"] = n
    assert long == {}, f"split these functions: {long}"
