"""Declarative gossip scenarios: topology, data, training, mixing and disruptions.

A scenario file (YAML ``.yaml``/``.yml`` or TOML ``.toml``) drives both the
in-process simulation (:mod:`fedplat.gossip.sim`) and a real multi-process run
(:mod:`fedplat.gossip.launcher`, where removing a node kills its process). Unknown
keys are rejected and every error names the offending field. Example::

    name: ba-hubs
    rounds: 60
    seed: 0
    topology: {kind: barabasi_albert, n: 100, m: 2}
    data: {dataset: fashion_mnist, partition: iid}
    model: {name: mlp, params: {hidden: [64]}}
    training: {epochs: 1, batch_size: 32, lr: 0.05}
    mixing: {rule: decavg}
    events:
      - {round: 20, action: remove_nodes, target: {by: degree, fraction: 0.1}}
      - {round: 30, action: partition, parts: 2}
      - {round: 40, action: heal}
      - {round: 45, action: rejoin, nodes: removed}

An app of one's own replaces the bundled dataset and model with the run file's
plug-ins (imported from the working directory or ``--app-dir``)::

    model: {factory: "app:model_factory"}
    data: {clients: "app:client_data", eval: "app:eval_data"}

Node ``i`` of ``n`` trains on ``client_data(i, n)``'s ``(x [N, ...], y [N])``
and every node reports its accuracy on ``eval_data()``. A scenario whose model
or test data is the app's but that names no ``data.clients`` is refused.

Timing: rounds are numbered ``1 .. rounds``; an event at ``round: r`` happens
*after* round ``r`` has finished and before round ``r + 1`` starts (``r = 0``:
before the first round). Battery deaths fire at ``round + lifetime``.

Actions:

* ``remove_nodes`` - ``nodes: [..]`` or ``target: {by: degree|betweenness|random,
  fraction|count}`` (top nodes of the graph as it is at that round);
  ``with_data: false`` makes the chosen nodes relay-only *from the start* (they
  never hold data, so the selection uses the initial graph), which separates the
  loss of connectivity from the loss of data (Palmieri et al. 2023);
* ``cut_links`` - ``edges: [[u, v], ..]`` or ``target: {by: random, fraction|count}``;
* ``heal_links`` - ``edges`` (default: every link cut by ``cut_links``);
* ``partition`` - ``groups: [[..], [..]]`` or ``parts: k`` with ``method: ids``
  (contiguous id ranges) or ``geometric`` (vertical strips of a random
  geometric graph); links between groups are cut;
* ``heal`` - restore the links cut by partitions;
* ``battery`` - ``nodes``/``target`` die ``lifetime`` rounds after ``round``;
* ``rejoin`` - ``nodes: [..]`` or ``removed`` (every removed node) come back with
  their data and links and catch up from their neighbours.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

import networkx as nx
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from fedplat.config import Strict, read_mapping, validation_message
from fedplat.gossip.mixing import DEFAULT_RULE, MIXING_RULES
from fedplat.gossip.topology import TopologyError, TopologyKind, build_topology
from fedplat.protocol.task import TrainingSettings
from fedplat.server.config import ModelSection

__all__ = [
    "Event",
    "Scenario",
    "ScenarioError",
    "load_scenario",
    "parse_scenario",
]


class ScenarioError(ValueError):
    """A scenario file is missing, unreadable or invalid; the message says where."""


class TopologySpec(BaseModel):
    """``kind`` plus the builder's parameters (checked by building the graph)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: TopologyKind

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class DataSpec(Strict):
    """A bundled dataset split over the nodes, or the app's own data.

    ``clients`` and ``eval`` are the run file's plug-ins (``data.clients``,
    ``data.eval``, :class:`fedplat.server.config.DataSection`): import paths
    ``"package.module:fn"``; node ``i`` of ``n`` trains on ``clients(i, n)`` and
    every node evaluates on ``eval(**eval_params)``. They replace ``dataset``
    and its split (``partition``, ``alpha``, ``shards_per_client``).
    """

    dataset: str = "digits"
    partition: Literal["iid", "dirichlet", "shards", "label_sorted"] = "iid"
    alpha: float | None = Field(default=None, gt=0)
    shards_per_client: int | None = Field(default=None, ge=1)
    clients: str | None = None
    eval: str | None = None
    eval_params: dict[str, Any] = Field(default_factory=dict)
    # Evaluate each node on this many test examples per round (None: whole split).
    test_examples: int | None = Field(default=None, ge=1)
    # The final evaluation (last round) uses this many (None: whole split).
    final_test_examples: int | None = Field(default=None, ge=1)

    @field_validator("clients", "eval")
    @classmethod
    def _import_path(cls, spec: str | None) -> str | None:
        if spec is None:
            return None
        module, sep, attr = spec.partition(":")
        if not sep or not module.strip() or not attr.strip():
            raise ValueError(f"{spec!r} must look like 'package.module:function'")
        return spec

    @model_validator(mode="after")
    def _app_or_bundled(self) -> DataSpec:
        if self.clients is not None and self.eval is None:
            raise ValueError(
                "data.clients needs data.eval: the nodes evaluate on the app's "
                "held-out data, not on a bundled dataset"
            )
        if self.eval_params and self.eval is None:
            raise ValueError("data.eval_params needs data.eval")
        split = {"dataset", "partition", "alpha", "shards_per_client"}
        given = sorted(split & self.model_fields_set)
        if self.clients is not None and given:
            raise ValueError(
                f"data.{', data.'.join(given)} split a bundled dataset; "
                "data.clients splits the app's data itself"
            )
        return self

    @property
    def is_app(self) -> bool:
        """The nodes train on the app's data (``clients``), not a bundled set."""
        return self.clients is not None


class ModelSpec(ModelSection):
    """The run file's model section (:class:`fedplat.server.config.ModelSection`):
    a registered ``name`` (default ``mlp``) or the app's ``factory``, with
    ``params``."""


class TrainingSpec(TrainingSettings):
    """The run file's training settings (:class:`fedplat.protocol.task.
    TrainingSettings`), plain SGD only: the simulation trains every node at once
    with plain SGD (:mod:`fedplat.gossip.batched`), and a scenario runs the same
    simulated or as real peers."""

    @model_validator(mode="after")
    def _plain_sgd(self) -> TrainingSpec:
        if not self.is_plain_sgd:
            raise ValueError(
                "gossip nodes train with plain SGD: optimizer sgd, momentum 0"
            )
        return self


class MixingSpec(Strict):
    # A fedplat.gossip.mixing.MIXING_RULES name; the default clips what any one
    # neighbour can do (ClippedGossip).
    rule: str = DEFAULT_RULE
    # NoLoCo only: use the paper's outer step (momentum + consensus pull) instead
    # of plain pairwise averaging.
    outer_step: bool = False
    alpha: float = Field(default=0.7, gt=0)
    beta: float = Field(default=0.5, ge=0, lt=1)

    @field_validator("rule")
    @classmethod
    def _known_rule(cls, rule: str) -> str:
        if rule not in MIXING_RULES:
            valid = ", ".join(MIXING_RULES.available())
            raise ValueError(f"unknown mixing rule {rule!r}; available: {valid}")
        return MIXING_RULES.key(rule)


class LinkSpec(Strict):
    """How models travel on links: a :mod:`fedplat.compression` compressor."""

    compressor: str = "identity"
    params: dict[str, Any] = Field(default_factory=dict)


class EvalSpec(Strict):
    every: int = Field(default=1, ge=1)


class Target(Strict):
    """Which nodes or links: the top ``fraction``/``count`` by centrality, or random."""

    by: Literal["degree", "betweenness", "random"]
    fraction: float | None = Field(default=None, gt=0, le=1)
    count: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _one_size(self) -> Target:
        if (self.fraction is None) == (self.count is None):
            raise ValueError("give exactly one of fraction and count")
        return self

    def size(self, population: int) -> int:
        """How many of ``population`` items are chosen (fractions round to nearest)."""
        if self.count is not None:
            return min(self.count, population)
        assert self.fraction is not None
        return min(population, round(self.fraction * population))


Edge = Annotated[list[int], Field(min_length=2, max_length=2)]


class _EventBase(Strict):
    round: int = Field(ge=0)


class _NodeChoice(_EventBase):
    nodes: list[int] | None = None
    target: Target | None = None

    @model_validator(mode="after")
    def _one_choice(self) -> _NodeChoice:
        if (self.nodes is None) == (self.target is None):
            raise ValueError("give exactly one of nodes and target")
        return self


class RemoveNodes(_NodeChoice):
    action: Literal["remove_nodes"]
    with_data: bool = True


class Battery(_NodeChoice):
    action: Literal["battery"]
    lifetime: int = Field(ge=1)


class CutLinks(_EventBase):
    action: Literal["cut_links"]
    edges: list[Edge] | None = None
    target: Target | None = None

    @model_validator(mode="after")
    def _one_choice(self) -> CutLinks:
        if (self.edges is None) == (self.target is None):
            raise ValueError("give exactly one of edges and target")
        if self.target is not None and self.target.by != "random":
            raise ValueError("links can only be targeted at random (by: random)")
        return self


class HealLinks(_EventBase):
    action: Literal["heal_links"]
    edges: list[Edge] | None = None


class Partition(_EventBase):
    action: Literal["partition"]
    groups: list[list[int]] | None = None
    parts: int | None = Field(default=None, ge=2)
    method: Literal["ids", "geometric"] = "ids"

    @model_validator(mode="after")
    def _one_choice(self) -> Partition:
        if (self.groups is None) == (self.parts is None):
            raise ValueError("give exactly one of groups and parts")
        return self


class Heal(_EventBase):
    action: Literal["heal"]


class Rejoin(_EventBase):
    action: Literal["rejoin"]
    nodes: list[int] | Literal["removed"] = "removed"


Event = Annotated[
    RemoveNodes | Battery | CutLinks | HealLinks | Partition | Heal | Rejoin,
    Field(discriminator="action"),
]


class Scenario(Strict):
    """A validated scenario (see the module docstring for the file format)."""

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    rounds: int = Field(ge=1, le=1_000_000)
    seed: int = 0
    topology: TopologySpec
    data: DataSpec = Field(default_factory=DataSpec)
    model: ModelSpec = Field(default_factory=ModelSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    mixing: MixingSpec = Field(default_factory=MixingSpec)
    links: LinkSpec = Field(default_factory=LinkSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    events: list[Event] = Field(default_factory=list)

    def graph(self) -> nx.Graph:
        """The initial communication graph (nodes ``0 .. n-1``)."""
        return build_topology(
            self.topology.kind, seed=self.seed, **self.topology.params
        )

    def to_config(self) -> dict[str, Any]:
        """JSON-able form (what the store keeps as the run's config)."""
        return self.model_dump(mode="json")


def _check_against_graph(s: Scenario, g: nx.Graph) -> list[str]:
    """Errors that need the graph: unknown node ids, edges that do not exist."""
    n = g.number_of_nodes()
    errors: list[str] = []

    def nodes_ok(where: str, nodes: list[int]) -> None:
        bad = sorted({v for v in nodes if not 0 <= v < n})
        if bad:
            errors.append(f"{where}: nodes {bad} do not exist (valid: 0..{n - 1})")
        if len(set(nodes)) != len(nodes):
            errors.append(f"{where}: a node is listed twice")

    for i, ev in enumerate(s.events):
        where = f"events.{i} ({ev.action})"
        if ev.round >= s.rounds:
            errors.append(
                f"{where}: round {ev.round} is not before the last round "
                f"{s.rounds} (events happen after round r, 0 <= r < rounds)"
            )
        if isinstance(ev, RemoveNodes | Battery) and ev.nodes is not None:
            nodes_ok(where, ev.nodes)
        if isinstance(ev, Rejoin) and ev.nodes != "removed":
            nodes_ok(where, list(ev.nodes))
        if isinstance(ev, CutLinks | HealLinks) and ev.edges is not None:
            for u, v in ev.edges:
                if not g.has_edge(u, v):
                    errors.append(f"{where}: link {[u, v]} is not in the topology")
        if isinstance(ev, Partition):
            if ev.groups is not None:
                flat = [v for grp in ev.groups for v in grp]
                nodes_ok(where, flat)
                missing = sorted(set(range(n)) - set(flat))
                if missing:
                    errors.append(
                        f"{where}: groups must cover every node; missing {missing[:10]}"
                    )
            elif ev.parts is not None and ev.parts > n:
                errors.append(f"{where}: {ev.parts} parts for {n} nodes")
            if (
                ev.method == "geometric"
                and ev.parts is not None
                and not all("pos" in g.nodes[v] for v in g.nodes)
            ):
                errors.append(
                    f"{where}: method geometric needs a random_geometric topology"
                )
    return errors


def _missing_plugin(data: DataSpec, model: ModelSpec) -> str | None:
    """Why the nodes cannot train (the model or the test data is the app's but
    no per-node data plug-in is named), or ``None``."""
    if data.clients is not None:
        return None
    apps = [
        f"{key} {value!r}"
        for key, value in (("model.factory", model.factory), ("data.eval", data.eval))
        if value is not None
    ]
    if not apps:
        return None
    return (
        f"the {' and '.join(apps)} {'is' if len(apps) == 1 else 'are'} "
        f"the app's, but it names no data.clients for the nodes (they would train "
        f"on the bundled {data.dataset!r}); add data: {{clients: "
        "'package.module:fn'}, called as fn(index, num_nodes) and returning node "
        "index's (x, y)"
    )


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate a mapping (parsed YAML/TOML) into a :class:`Scenario`.

    Raises
    ------
    ScenarioError
        Listing every invalid field as ``location: message``.
    """
    if not isinstance(data, dict):
        raise ScenarioError(f"scenario {source} must hold a mapping at the top level")
    try:
        s = Scenario.model_validate(data)
    except ValidationError as exc:
        header = f"invalid scenario {source}:"
        raise ScenarioError(validation_message(exc, header)) from None
    missing = _missing_plugin(s.data, s.model)
    if missing is not None:
        raise ScenarioError(f"invalid scenario {source}: data.clients: {missing}")
    try:
        g = s.graph()
    except TopologyError as exc:
        raise ScenarioError(f"invalid scenario {source}:\n  topology: {exc}") from None
    errors = _check_against_graph(s, g)
    if errors:
        raise ScenarioError(
            "\n".join([f"invalid scenario {source}:", *(f"  {e}" for e in errors)])
        )
    return s


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    """Read and validate a ``.yaml``/``.yml``/``.toml`` scenario file."""
    return parse_scenario(read_mapping(path, "scenario", ScenarioError), str(path))


#: Event actions, for help texts.
ACTIONS = (
    "remove_nodes",
    "battery",
    "cut_links",
    "heal_links",
    "partition",
    "heal",
    "rejoin",
)
