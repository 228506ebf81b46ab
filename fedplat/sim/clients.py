"""Reference clients for simulations, cheap enough for tens of thousands.

:class:`ReferencePopulation` builds client ``i`` of ``N``: partition ``i`` of a
bundled dataset, trained with the reference train function, under the run's
model. Two things keep a client that is never selected nearly free:

- **One model per process.** Clients of one process (the in-process simulator,
  or one Ray host) train one at a time, and the SDK loads the global model into
  the model before every round, so they share a single model object.
- **Data on first use.** A client knows its example count from the partition's
  indices (computed once for all clients) and copies its share of the train split
  only when it first trains.

What stays per client: its :class:`~fedplat.client.Client` (identity key,
session, uplink state) and, once it has trained, one model-sized vector and its
data share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fedplat.client import Client, FitResult
from fedplat.reference.clients import (
    ReferenceSpec,
    partition_indices,
    reference_data,
    train_reference,
)
from fedplat.server.config import RunConfig, parse_config
from fedplat.transport.base import Connection


class _LazyShare:
    """One client's data share, copied from the train split on first use."""

    def __init__(self, population: ReferencePopulation, spec: ReferenceSpec) -> None:
        self.population = population
        self.spec = spec
        self.data: Any = None

    def train(self, model: torch.nn.Module, config: Mapping[str, Any]) -> FitResult:
        if self.data is None:
            self.data = reference_data(self.spec, self.population.train_split())
        return train_reference(model, self.data, config)


@dataclass
class ReferencePopulation:
    """``num_clients`` reference clients of the run ``config`` (a run file's
    mapping, so a population crosses process boundaries as plain data).

    ``partition`` and ``partition_params`` split the dataset (``fedplat list
    partitioners``); ``label_flip`` lists clients that train on flipped labels
    (evaluation only).
    """

    config: dict[str, Any]
    num_clients: int
    partition: str = "iid"
    partition_params: dict[str, Any] = field(default_factory=dict)
    label_flip: frozenset[int] = frozenset()
    _cfg: RunConfig | None = field(default=None, init=False, repr=False)
    _model: torch.nn.Module | None = field(default=None, init=False, repr=False)
    _train: Any = field(default=None, init=False, repr=False)

    @classmethod
    def of(cls, cfg: RunConfig, num_clients: int, **kw: Any) -> ReferencePopulation:
        return cls(cfg.model_dump(mode="json"), num_clients, **kw)

    @property
    def cfg(self) -> RunConfig:
        if self._cfg is None:
            self._cfg = parse_config(self.config, "the simulation's run")
        return self._cfg

    def spec(self, i: int) -> ReferenceSpec:
        m = self.cfg.model
        return ReferenceSpec(
            dataset=self.cfg.data.dataset,
            model=m.name or "mlp",
            model_params=m.params if m.name else {},
            num_partitions=self.num_clients,
            partition_id=i,
            partition=self.partition,
            partition_params=self.partition_params,
            seed=self.cfg.run.seed,
            label_flip=i in self.label_flip,
        )

    def model(self) -> torch.nn.Module:
        """The model every client of this process trains (built once)."""
        if self._model is None:
            from fedplat.server.evaluation import build_model

            self._model = build_model(self.cfg)
        return self._model

    def train_split(self) -> Any:
        if self._train is None:
            from fedplat.data import load_dataset

            self._train = load_dataset(self.cfg.data.dataset, "train")
        return self._train

    def build(
        self, i: int, factory: Callable[[], Connection], **client_kw: Any
    ) -> Client:
        """Client ``i`` (named ``sim-i``) connected through ``factory``."""
        spec = self.spec(i)
        share = _LazyShare(self, spec)
        return Client(
            None,
            self.model(),
            share.train,
            num_examples=len(partition_indices(spec)),
            name=f"sim-{i}",
            connection_factory=factory,
            **client_kw,
        )

    __call__ = build

    def __getstate__(self) -> dict[str, Any]:
        # Shipped to other processes as its settings; each builds its own model.
        return {**self.__dict__, "_cfg": None, "_model": None, "_train": None}


__all__ = ["ReferencePopulation"]
