"""Package layout and architectural boundaries."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import networkx as nx
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


# -- import boundaries ------------------------------------------------------------
#
# Checked on the source, transitively: a module's imports (module-level or inside
# functions: a lazy import is still a dependency), the imports of every fedplat
# module those reach, and the ``__init__`` of every package on the way (importing
# ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__``).

#: fedplat.* module name -> source file, over the mapped component folders.
MODULES: dict[str, Path] = {}
for _top in ["fedplat", *MAPPED]:
    for _f in (REPO / _top).rglob("*.py"):
        _pkg = _package_of(_f) if _f.name == "__init__.py" else None
        MODULES[_pkg or f"{_package_of(_f)}.{_f.stem}"] = _f


def _imports(path: Path, module: str) -> set[str]:
    """Absolute names of what ``path`` (module ``module``) imports, relative
    imports resolved; ``from a import b`` also yields ``a.b`` (b may be a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                head = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{head}.{base}" if base else head
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def import_closure(modules: list[str]) -> dict[str, str]:
    """Every module reachable from ``modules`` -> the fedplat module that imports
    it first (for the failure message)."""
    seen: dict[str, str] = {}
    todo = [(m, m) for m in modules]
    while todo:
        name, via = todo.pop()
        for full in _with_parents(name):
            if full in seen:
                continue
            seen[full] = via
            if full in MODULES:
                todo.extend((i, full) for i in _imports(MODULES[full], full))
    return seen


def _modules_under(rel: str) -> list[str]:
    root = REPO / rel
    return [m for m, f in MODULES.items() if f == root or root in f.parents]


def _violations(rel: str, forbidden: tuple[str, ...]) -> list[str]:
    reached = import_closure(_modules_under(rel))
    return sorted(
        f"{mod} (imported by {via})"
        for mod, via in reached.items()
        if any(mod == b or mod.startswith(b + ".") for b in forbidden)
    )


ALGORITHM_PACKAGES = [
    "aggregators",
    "fedplat/compression",
    "fedplat/privacy",
    "fedplat/secagg",
    "fedplat/contribution",
    "fedplat/gossip/mixing",
    "fedplat/gossip/topology.py",
    "fedplat/vectors.py",
    "fedplat/metrics.py",
]
#: What algorithm code never reaches: the wire (transport, protobuf, gRPC), the
#: store, the UI, the coordinator and the SDK, and pickle.
ALGORITHM_FORBIDDEN = (
    "grpc",
    "google.protobuf",
    "fedplat.proto",
    "fedplat.transport",
    "sqlalchemy",
    "alembic",
    "fedplat.store",
    "streamlit",
    "fedplat.ui",
    "fedplat.server",
    "fedplat.client",
    "pickle",
)
#: What the SDK an edge app embeds never reaches: server-side rules and attacks,
#: the evaluation-only reference clients, the coordinator, the store and the UI.
SDK_FORBIDDEN = (
    "fedplat.aggregators",
    "fedplat.reference",
    "fedplat.server",
    "fedplat.store",
    "sqlalchemy",
    "alembic",
    "fedplat.ui",
    "streamlit",
)


@pytest.mark.parametrize("pkg", ALGORITHM_PACKAGES)
def test_algorithm_packages_stay_pure(pkg: str) -> None:
    assert _modules_under(pkg), f"{pkg} has no modules"
    assert _violations(pkg, ALGORITHM_FORBIDDEN) == []


def test_sdk_imports_no_server_side_code() -> None:
    assert "fedplat.client.client" in _modules_under("client")
    assert _violations("client", SDK_FORBIDDEN) == []


# -- the package graph ------------------------------------------------------------
#
# fedplat's packages (``fedplat.X``: a subpackage, a mapped folder or a top-level
# module) and which imports which, from every import in their modules (lazy and
# ``TYPE_CHECKING`` ones included: a cycle through them is still a cycle).

#: The roles: the bottom package (fedplat.protocol) reaches none of them.
ROLES = (
    "fedplat.server",
    "fedplat.client",
    "fedplat.gossip",
    "fedplat.sim",
    "fedplat.ui",
    "fedplat.flower",
    "fedplat.transport",
    "fedplat.proto",
)
#: All fedplat.protocol may reach besides itself: shared maths and security.
PROTOCOL_MAY_REACH = (
    "fedplat.protocol",
    "fedplat.vectors",
    "fedplat.compression",
    "fedplat.privacy",
    "fedplat.security",
    "fedplat.registry",
    "fedplat.config",
)


def _package(module: str) -> str | None:
    """``fedplat.X`` of a fedplat module (None for the ``fedplat`` root)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "fedplat" and len(parts) > 1 else None


def package_graph() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> the module imports behind it."""
    packages = {_package(m) for m in MODULES} - {None}
    edges: dict[tuple[str, str], list[str]] = {}
    for mod, path in sorted(MODULES.items()):
        src = _package(mod)
        for name in sorted(_imports(path, mod)):
            dst = _package(name)
            if src is not None and dst in packages and dst != src:
                edges.setdefault((src, dst), []).append(f"{mod} imports {name}")
    return edges


def package_cycles(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    """One named cycle per strongly connected group of packages, with the
    module imports behind each step."""
    graph = nx.DiGraph(list(edges))
    out = []
    for scc in nx.strongly_connected_components(graph):
        if len(scc) > 1:
            cycle = nx.find_cycle(graph.subgraph(scc))
            out.append(
                " -> ".join([*(a for a, _ in cycle), cycle[0][0]])
                + " ("
                + "; ".join(edges[e][0] for e in cycle)
                + f"); all of {sorted(scc)} reach each other"
            )
    return sorted(out)


def test_the_packages_import_each_other_without_a_cycle() -> None:
    edges = package_graph()
    assert ("fedplat.server", "fedplat.protocol") in edges
    cycles = package_cycles(edges)
    assert cycles == [], "import cycles among packages:\n" + "\n".join(cycles)


def test_the_cycle_check_names_a_cycle() -> None:
    edges = {
        ("a", "b"): ["a.x imports b.y"],
        ("b", "a"): ["b.y imports a.z"],
        ("b", "c"): ["b.y imports c"],
    }
    (cycle,) = package_cycles(edges)
    assert cycle.startswith(("a -> b -> a (a.x imports b.y; b.y imports a.z)", "b"))
    assert "['a', 'b']" in cycle
    del edges[("b", "a")]
    assert package_cycles(edges) == []


def test_protocol_is_the_bottom_and_imports_no_role() -> None:
    assert "fedplat.protocol.messages" in _modules_under("fedplat/protocol")
    assert _violations("fedplat/protocol", ROLES) == []
    reached = import_closure(_modules_under("fedplat/protocol"))
    assert sorted({_package(m) for m in reached} - {None, *PROTOCOL_MAY_REACH}) == []


#: The only server/ modules that import fedplat.store (issue 21); every other part
#: writes through the recorder and reads through its read port.
STORE_IMPORTERS = [
    "fedplat.server.app",  # the composition root: opens the store, builds the recorder
    "fedplat.server.reads",  # the recorder's read port, a module of its own
    "fedplat.server.recorder",  # the only writer
]


def _server_store_importers() -> list[str]:
    return sorted(
        mod
        for mod in _modules_under("server")
        if any(
            _package(name) == "fedplat.store" for name in _imports(MODULES[mod], mod)
        )
    )


def test_in_server_only_the_recorder_and_the_root_import_the_store() -> None:
    """Exactly these: no other module, and each of them (so the check cannot
    pass by seeing no import at all)."""
    assert _server_store_importers() == STORE_IMPORTERS


def test_the_boundary_check_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    mod = tmp_path / "mod.py"
    mod.write_text(
        "from . import sibling\nfrom ..store import records\n"
        "def f():\n    import grpc\n"
    )
    assert _imports(mod, "fedplat.pkg.mod") >= {
        "fedplat.pkg.sibling",
        "fedplat.store.records",
        "grpc",
    }
    reached = import_closure(["fedplat.client.uplink"])
    assert "fedplat.protocol" in reached and "fedplat.compression" in reached


def test_no_test_module_imports_another() -> None:
    """Tests share code through ``tests/support`` (and plug-in apps in
    ``tests/apps``), never by importing a test module or a conftest."""
    tests = REPO / "tests"
    bad = []
    for f in tests.rglob("*.py"):
        rel = f.relative_to(REPO).with_suffix("")
        for mod in _imports(f, ".".join(rel.parts)):
            leaf = mod.rpartition(".")[2]
            if leaf == "conftest" or (
                mod.startswith("tests.") and leaf.startswith("test_")
            ):
                bad.append(f"{rel}: {mod}")
    assert bad == []


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
