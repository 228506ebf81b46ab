"""What every node of a scenario starts from: its data share, the model, the test set.

Shared by the simulation and the real peer processes so that node ``i`` of a
scenario trains on the same examples in both. The data is a bundled dataset
split over the nodes, or the app's own (``data.clients``, ``data.eval``): then
node ``i`` of ``n`` trains on what ``clients(i, n)`` returns, loaded by the
simulator's loader (:func:`fedplat.sim.client_data.load_client_data`), and the
nodes evaluate on ``data.eval`` loaded as the coordinator loads it
(:func:`fedplat.server.evaluation.load_eval_data`). Inputs may have any shape
(tabular rows ``[N, F]``, images ``[N, C, H, W]``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from torch import nn

from fedplat.data import Dataset, load_dataset, partition
from fedplat.gossip.scenario import DataSpec, ModelSpec, Scenario, ScenarioError
from fedplat.models import ModelSpecError, build_from_factory, create_model, evaluate
from fedplat.models.training import TrainData
from fedplat.server.config import ConfigError, RunConfig
from fedplat.sim.client_data import ClientData, check_simulation, load_client_data

__all__ = [
    "NodeData",
    "accuracy",
    "build_model",
    "check_app",
    "load_node_data",
    "load_test",
    "model_for",
    "test_subset",
]


@dataclass(frozen=True)
class NodeData:
    """Training shares of all nodes and the shared test set.

    Attributes
    ----------
    train : list of TrainData
        ``n`` local datasets ``x [N_i, ...]``, ``y [N_i]`` (empty for relay-only
        nodes, and for nodes whose data was not asked for).
    test : TrainData
        The dataset's test split, or the app's ``data.eval``.
    """

    train: list[TrainData]
    test: TrainData

    @property
    def sizes(self) -> torch.Tensor:
        """float64 ``[n]`` local dataset sizes (DecAvg weights)."""
        return torch.tensor([len(d) for d in self.train], dtype=torch.float64)


def _app_config(spec: DataSpec, model: ModelSpec | None = None) -> RunConfig:
    """The plug-ins in the run file's shape, for the simulator's and the
    coordinator's loaders (only ``data`` and ``model`` are read)."""
    data = {"clients": spec.clients, "eval": spec.eval, "eval_params": spec.eval_params}
    return RunConfig.model_validate(
        {
            "run": {"name": "gossip", "rounds": 1},
            "data": data,
            "model": (model or ModelSpec()).model_dump(),
        }
    )


def _empty(name: str) -> ClientData:
    return ClientData(torch.zeros(0), torch.zeros(0, dtype=torch.int64), name)


def load_test(spec: DataSpec) -> TrainData:
    """The nodes' test set: the bundled dataset's test split, or ``data.eval``
    (integer labels ``[T]``; :class:`ScenarioError` on one line otherwise)."""
    if spec.eval is None:
        return load_dataset(spec.dataset, "test")
    from fedplat.data.batches import BatchError
    from fedplat.server.evaluation import load_eval_data

    what = f"data.eval {spec.eval!r}"
    try:
        batches = load_eval_data(_app_config(spec))
        x, y = batches.tensors or _concat(list(batches.iterate(1024)))
    except (ConfigError, BatchError) as exc:
        raise ScenarioError(str(exc)) from None
    if y.dim() != 1 or torch.is_floating_point(y) or y.dtype == torch.bool:
        raise ScenarioError(
            f"{what}: the nodes report accuracy and need integer class labels "
            f"[T], got {y.dtype} {list(y.shape)}"
        )
    if y.numel() == 0:
        raise ScenarioError(f"{what} is empty")
    return ClientData(x, y.long(), what)


def _concat(
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor]:
    if not pairs:
        return torch.zeros(0), torch.zeros(0, dtype=torch.int64)
    return torch.cat([x for x, _ in pairs]), torch.cat([y for _, y in pairs])


def _app_train(
    spec: DataSpec, n: int, relay: Collection[int], nodes: Collection[int] | None
) -> list[TrainData]:
    cfg = _app_config(spec)
    out: list[TrainData] = []
    for i in range(n):
        if i in relay or (nodes is not None and i not in nodes):
            out.append(_empty(f"node {i} (no data)"))
            continue
        try:
            out.append(load_client_data(cfg, i, n))
        except ConfigError as exc:
            raise ScenarioError(str(exc)) from None
    return out


def load_node_data(
    spec: DataSpec,
    n: int,
    seed: int,
    relay: set[int] | frozenset[int] = frozenset(),
    nodes: Collection[int] | None = None,
) -> NodeData:
    """Partition the training split among ``n`` nodes; relays get no data.

    With ``data.clients`` node ``i`` gets ``clients(i, n)``; ``nodes`` limits
    the calls to those nodes (a peer process loads its own share only; the
    others are left empty).

    A relay's share is dropped rather than handed to others, so the data the
    other nodes hold does not depend on who is a relay (Palmieri et al. 2023
    compare nodes with and without data at equal shares; not checked against
    the paper's text).
    """
    if spec.is_app:
        return NodeData(_app_train(spec, n, relay, nodes), load_test(spec))
    train = load_dataset(spec.dataset, "train")
    test = load_dataset(spec.dataset, "test")
    params: dict[str, float | int] = {}
    if spec.partition == "dirichlet":
        params["alpha"] = spec.alpha if spec.alpha is not None else 0.5
    if spec.partition == "shards":
        params["shards_per_client"] = spec.shards_per_client or 2
    parts = partition(spec.partition, train.y.numpy(), n, seed, **params)
    empty = np.zeros(0, dtype=np.int64)
    return NodeData(
        [train.subset(empty if i in relay else p) for i, p in enumerate(parts)],
        test,
    )


def test_subset(test: TrainData, size: int | None, seed: int) -> TrainData:
    """A fixed random subset of the test set (the whole set if ``size`` is None)."""
    if size is None or size >= len(test):
        return test
    idx = np.sort(np.random.default_rng(seed).permutation(len(test))[:size])
    if isinstance(test, Dataset):
        return test.subset(idx)
    keep = torch.as_tensor(idx)
    return ClientData(test.x[keep], test.y[keep], test.name, test.num_classes)


def accuracy(model: nn.Module, data: TrainData) -> float:
    """Share of ``data`` the model classifies right (:func:`fedplat.models.
    evaluate`, which reads only ``x``, ``y``, ``num_classes`` and the length)."""
    return evaluate(model, cast(Dataset, data)).accuracy


def build_model(
    spec: ModelSpec, input_shape: tuple[int, ...], num_classes: int, seed: int
) -> nn.Module:
    """The scenario's model; every node starts from the same seeded weights.

    A registered ``name`` or the app's ``factory`` (``fn(**params)``, given
    ``input_shape`` and ``num_classes`` when its signature names them). A common
    initialisation is the usual setting of decentralised learning experiments;
    independent inits average poorly in the first rounds.
    """
    shape = tuple(spec.input_shape or input_shape)
    classes = spec.num_classes or num_classes
    try:
        if spec.factory is not None:
            return build_from_factory(
                spec.factory,
                dict(spec.params),
                seed=seed,
                input_shape=shape,
                num_classes=classes,
            )
    except ModelSpecError as exc:
        raise ScenarioError(f"model.factory: {exc}") from None
    assert spec.name is not None  # one of the two, by validation
    return create_model(spec.name, shape, classes, seed=seed, **spec.params)


def model_for(spec: ModelSpec, test: TrainData, seed: int) -> nn.Module:
    """:func:`build_model` shaped by the test set: one input's shape, and the
    number of classes (the largest test label + 1 when the data does not say)."""
    classes = test.num_classes
    if classes is None:
        classes = int(test.y.max()) + 1 if len(test) else 2
    return build_model(spec, tuple(int(s) for s in test.x.shape[1:]), classes, seed)


def check_app(scenario: Scenario) -> None:
    """Before any peer starts: node 0's ``data.clients`` loads and fits the
    model on one batch (the simulator's check,
    :func:`fedplat.sim.client_data.check_simulation`), so a bad plug-in is one
    line rather than ``n`` crashed processes. Nothing to check without one."""
    if not scenario.data.is_app:
        return
    cfg = _app_config(scenario.data, scenario.model)
    cfg = cfg.model_copy(update={"client_training": scenario.training})
    n = scenario.graph().number_of_nodes()
    try:
        check_simulation(cfg, n)
    except ConfigError as exc:
        raise ScenarioError(str(exc)) from None
