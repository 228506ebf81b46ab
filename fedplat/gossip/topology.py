"""Communication graphs for gossip learning, built with networkx.

Every builder returns an undirected :class:`networkx.Graph` whose nodes are the
integers ``0 .. n-1`` (node ``i`` is peer ``i``; the store and the wire use
``str(i)``). Random graphs are a pure function of their seed.

* ``barabasi_albert`` - scale-free, a few hubs (Palmieri et al.'s topology);
* ``erdos_renyi`` - ``G(n, p)``;
* ``ring`` - a cycle, optionally with ``k`` nearest neighbours on each side;
* ``grid`` - a 2-D lattice;
* ``random_geometric`` - devices dropped uniformly in the unit square, linked
  when closer than a radio ``radius``: the natural model of a disaster area;
* ``edges`` - an explicit edge list.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, get_args

import networkx as nx
import torch

__all__ = [
    "TOPOLOGIES",
    "TopologyError",
    "TopologyKind",
    "adjacency",
    "barabasi_albert",
    "build_topology",
    "components",
    "edge_list",
    "erdos_renyi",
    "from_edges",
    "grid",
    "random_geometric",
    "ring",
]


class TopologyError(ValueError):
    """A topology description is invalid; the message says which field and why."""


def barabasi_albert(n: int, m: int = 2, seed: int = 0) -> nx.Graph:
    """Barabasi-Albert preferential attachment graph (``n`` nodes, ``m`` edges each)."""
    if not 1 <= m < n:
        raise TopologyError(f"barabasi_albert needs 1 <= m < n, got m={m}, n={n}")
    return nx.barabasi_albert_graph(n, m, seed=seed)


def erdos_renyi(n: int, p: float, seed: int = 0) -> nx.Graph:
    """``G(n, p)``: every pair linked independently with probability ``p``."""
    if not 0.0 <= p <= 1.0:
        raise TopologyError(f"erdos_renyi needs 0 <= p <= 1, got {p}")
    _check_n(n)
    return nx.gnp_random_graph(n, p, seed=seed)


def ring(n: int, k: int = 1) -> nx.Graph:
    """A cycle where each node links to its ``k`` nearest neighbours on each side."""
    _check_n(n)
    if k < 1 or (n > 2 and 2 * k >= n):
        raise TopologyError(f"ring needs 1 <= k < n/2, got k={k}, n={n}")
    g = nx.Graph()
    g.add_nodes_from(range(n))
    for i in range(n):
        for j in range(1, k + 1):
            if n > 1:
                g.add_edge(i, (i + j) % n)
    return g


def grid(rows: int, cols: int, periodic: bool = False) -> nx.Graph:
    """A ``rows x cols`` lattice; node ``r * cols + c`` is at row ``r``, col ``c``."""
    if rows < 1 or cols < 1:
        raise TopologyError(f"grid needs rows, cols >= 1, got {rows}x{cols}")
    g = nx.grid_2d_graph(rows, cols, periodic=periodic)
    return nx.relabel_nodes(g, {(r, c): r * cols + c for r, c in g.nodes()})


def random_geometric(n: int, radius: float, seed: int = 0) -> nx.Graph:
    """Nodes uniform in the unit square, linked within ``radius`` (radio range).

    Positions are kept as the node attribute ``pos`` (used by ``partition`` with
    ``method: geometric`` to cut the area in two).
    """
    _check_n(n)
    if radius <= 0:
        raise TopologyError(f"random_geometric needs radius > 0, got {radius}")
    return nx.random_geometric_graph(n, radius, seed=seed)


def from_edges(n: int, edges: Iterable[Sequence[int]]) -> nx.Graph:
    """Graph on ``0 .. n-1`` with the given undirected edges (checked)."""
    _check_n(n)
    g = nx.Graph()
    g.add_nodes_from(range(n))
    for e in edges:
        if len(e) != 2:
            raise TopologyError(f"an edge is a pair of node ids, got {list(e)}")
        u, v = int(e[0]), int(e[1])
        if not (0 <= u < n and 0 <= v < n):
            raise TopologyError(f"edge {[u, v]} names a node outside 0..{n - 1}")
        if u == v:
            raise TopologyError(f"self-loop {[u, v]} is not a link")
        g.add_edge(u, v)
    return g


def _check_n(n: int) -> None:
    if n < 1:
        raise TopologyError(f"a topology needs n >= 1 nodes, got {n}")


TopologyKind = Literal[
    "barabasi_albert", "erdos_renyi", "ring", "grid", "random_geometric", "edges"
]
TOPOLOGIES: tuple[str, ...] = get_args(TopologyKind)


_BUILDERS: dict[str, Callable[..., nx.Graph]] = {
    "barabasi_albert": barabasi_albert,
    "erdos_renyi": erdos_renyi,
    "ring": ring,
    "grid": grid,
    "random_geometric": random_geometric,
    "edges": from_edges,
}


def build_topology(kind: str, *, seed: int = 0, **params: Any) -> nx.Graph:
    """Build a topology by name; unknown names and parameters fail with the valid ones.

    ``seed`` is passed to the random builders only.

    Raises
    ------
    TopologyError
    """
    if kind not in _BUILDERS:
        raise TopologyError(f"unknown topology {kind!r}; valid: {list(TOPOLOGIES)}")
    fn = _BUILDERS[kind]
    names = list(inspect.signature(fn).parameters)
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise TopologyError(
            f"topology {kind!r} does not take {unknown}; it takes {names}"
        )
    if "seed" in names:
        params.setdefault("seed", seed)
    try:
        return fn(**params)
    except TypeError as exc:
        raise TopologyError(f"bad parameters for topology {kind!r}: {exc}") from exc


def adjacency(g: nx.Graph, n: int | None = None) -> torch.Tensor:
    """bool ``[n, n]`` adjacency of a graph on integer nodes ``0 .. n-1``."""
    size = g.number_of_nodes() if n is None else n
    a = torch.zeros(size, size, dtype=torch.bool)
    if g.number_of_edges():
        e = torch.tensor(list(g.edges()), dtype=torch.int64)
        a[e[:, 0], e[:, 1]] = True
        a[e[:, 1], e[:, 0]] = True
    return a


def edge_list(g: nx.Graph) -> list[list[int]]:
    """Sorted ``[[u, v], ...]`` with ``u < v`` (the JSON form stored with a run)."""
    return sorted([min(u, v), max(u, v)] for u, v in g.edges())


def components(g: nx.Graph) -> int:
    """Number of connected components (0 for an empty graph)."""
    return int(nx.number_connected_components(g)) if g.number_of_nodes() else 0
