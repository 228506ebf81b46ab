"""Reference clients for simulations, cheap enough for tens of thousands.

:class:`ReferencePopulation` builds client ``i`` of ``N``: partition ``i`` of a
bundled dataset, or the app's data for client ``i`` when the run names a
``data.clients`` plug-in (:mod:`fedplat.sim.client_data`), trained with the
reference train function, under the run's model. Two things keep a client that
is never selected nearly free:

- **One model per process.** Clients of one process (the in-process simulator,
  or one Ray host) train one at a time, and the SDK loads the global model into
  the model before every round, so they share a single model object.
- **Data on first use.** A client knows its example count from the partition's
  indices (computed once for all clients) and copies its share of the train split
  only when it first trains. An app's ``data.clients`` function is called when
  the client is built: its example count is declared at enrolment (the
  coordinator's weight bound reads it), so the app decides what a client's data
  costs to hold (views of one table, as examples/tabular's, cost little).

What stays per client: its :class:`~fedplat.client.Client` (identity key,
session, uplink state) and, once it has trained, one model-sized vector and its
data share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from fedplat.client import Client, FitResult
from fedplat.reference.clients import (
    ReferenceSpec,
    partition_indices,
    reference_data,
    train_reference,
)
from fedplat.server.config import ConfigError, RunConfig, parse_config
from fedplat.sim.client_data import check_simulation, load_client_data
from fedplat.transport.base import Connection


class _LazyShare:
    """One client's data, loaded by ``load()`` when it first trains."""

    def __init__(self, load: Callable[[], Any]) -> None:
        self.load = load
        self.data: Any = None

    def train(self, model: torch.nn.Module, config: Mapping[str, Any]) -> FitResult:
        if self.data is None:
            self.data = self.load()
        return train_reference(model, self.data, config)


@dataclass
class ReferencePopulation:
    """``num_clients`` reference clients of the run ``config`` (a run file's
    mapping, so a population crosses process boundaries as plain data).

    ``partition`` and ``partition_params`` split the dataset (``fedplat list
    partitioners``); ``label_flip`` lists clients that train on flipped labels
    (evaluation only). Both apply to the bundled dataset only: with
    ``data.clients`` the app's function decides each client's data.
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

    def check(self) -> None:
        """Refuse (one line of :class:`ConfigError`) a run these clients cannot
        train; see :func:`fedplat.sim.client_data.check_simulation`."""
        if self.cfg.data.clients is not None and (
            self.partition != "iid" or self.partition_params or self.label_flip
        ):
            raise ConfigError(
                f"data.clients {self.cfg.data.clients!r} gives each client its "
                "data; --partition and label flips apply to the bundled dataset"
            )
        check_simulation(self.cfg, self.num_clients)

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
        if self.cfg.data.clients is not None:
            data = load_client_data(self.cfg, i, self.num_clients)
            share = _LazyShare(lambda: data)
            examples = len(data)
        else:
            spec = self.spec(i)
            share = _LazyShare(partial(self._reference_data, spec))
            examples = len(partition_indices(spec))
        return Client(
            None,
            self.model(),
            share.train,
            num_examples=examples,
            name=f"sim-{i}",
            connection_factory=factory,
            **client_kw,
        )

    __call__ = build

    def _reference_data(self, spec: ReferenceSpec) -> Any:
        return reference_data(spec, self.train_split())

    def __getstate__(self) -> dict[str, Any]:
        # Shipped to other processes as its settings; each builds its own model.
        return {**self.__dict__, "_cfg": None, "_model": None, "_train": None}


__all__ = ["ReferencePopulation"]
