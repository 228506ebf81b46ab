"""Package layout and architectural boundaries."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support import REPO

MAPPED = {
    "server": "fedplat.server",
    "client": "fedplat.client",
    "aggregators": "fedplat.aggregators",
    "ui": "fedplat.ui",
}


def _declared_packages() -> set[str]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return set(data["tool"]["setuptools"]["packages"])


def _package_of(init: Path) -> str:
    rel = init.parent.relative_to(REPO).parts
    head = MAPPED.get(rel[0], rel[0])
    return ".".join([head, *rel[1:]])


def test_every_package_is_listed_in_pyproject() -> None:
    found = set()
    for top in ["fedplat", *MAPPED]:
        for init in (REPO / top).rglob("__init__.py"):
            found.add(_package_of(init))
    assert found - _declared_packages() == set(), "add these to pyproject packages"
    assert _declared_packages() - found == set(), "pyproject lists missing packages"


ALGORITHM_PACKAGES = [
    "aggregators",
    "fedplat/compression",
    "fedplat/privacy",
    "fedplat/secagg",
    "fedplat/contribution",
    "fedplat/gossip/mixing",
    "fedplat/vectors.py",
    "fedplat/metrics.py",
]
FORBIDDEN = (
    "grpc",
    "fedplat.proto",
    "sqlalchemy",
    "streamlit",
    "fedplat.store",
    "alembic",
    "pickle",
)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


@pytest.mark.parametrize("pkg", ALGORITHM_PACKAGES)
def test_algorithm_packages_stay_pure(pkg: str) -> None:
    root = REPO / pkg
    files = [root] if root.suffix == ".py" else list(root.rglob("*.py"))
    for f in files:
        for mod in _imports(f):
            assert not any(mod == b or mod.startswith(b + ".") for b in FORBIDDEN), (
                f"{f.relative_to(REPO)} imports {mod}"
            )


def test_nothing_unpickles() -> None:
    for top in ["fedplat", *MAPPED]:
        for f in (REPO / top).rglob("*.py"):
            text = f.read_text()
            for bad in ("pickle.load", "torch.load(", "cloudpickle", "marshal.loads"):
                assert bad not in text, f"{f.relative_to(REPO)} uses {bad}"


def test_generated_proto_code_is_up_to_date(tmp_path: Path) -> None:
    subprocess.run(
        ["bash", str(REPO / "scripts/gen_proto.sh"), str(tmp_path)],
        check=True,
        env={"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"},
    )
    generated = sorted(p.name for p in tmp_path.iterdir())
    committed = sorted(
        p.name for p in (REPO / "fedplat/proto").iterdir() if "_pb2" in p.name
    )
    assert generated == committed
    for name in generated:
        assert (tmp_path / name).read_text() == (
            REPO / "fedplat/proto" / name
        ).read_text(), f"{name} is stale: run scripts/gen_proto.sh"


def test_component_folders_import_under_fedplat() -> None:
    import fedplat.aggregators
    import fedplat.client
    import fedplat.server
    import fedplat.ui

    assert Path(fedplat.server.__file__).parent == REPO / "server"
    assert Path(fedplat.client.__file__).parent == REPO / "client"
    assert Path(fedplat.aggregators.__file__).parent == REPO / "aggregators"
    assert Path(fedplat.ui.__file__).parent == REPO / "ui"
