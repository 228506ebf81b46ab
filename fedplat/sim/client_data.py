"""The app's data for simulated clients: the run file's ``data.clients`` plug-in.

A deployed client trains on data it holds; a simulated one has none, so
``fedplat sim`` either splits a bundled dataset (``data.dataset``, the
reference clients) or asks the app: ``data.clients: "app:client_data"`` is
imported with the same resolver as ``model.factory`` and ``data.eval``
(:func:`fedplat.registry.import_path`) and called as
``fn(index, num_clients)`` when client ``index`` is built (its example
count is declared at enrolment). It returns what
``data.eval`` may return (:class:`~fedplat.data.batches.Batches`): a pair
``(x [N, ...], y [N])``, a ``torch.utils.data.Dataset`` or a ``DataLoader``, with
integer class labels (the clients train with cross-entropy through
:func:`fedplat.models.training.train_epochs`). Only the import path travels to
other processes (Ray hosts), as part of the run's plain-data settings.

:func:`check_simulation` refuses, before anything is stored, a run whose model
or evaluation data is the app's but whose clients would train on the bundled
dataset (they would not fit), and a ``data.clients`` whose first client's data
does not fit the run's model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedplat.data.batches import BatchError, Batches
from fedplat.registry import import_path
from fedplat.server.config import ConfigError, RunConfig

#: Examples per forward pass when the plug-in returns a streaming source.
_BATCH = 1024


@dataclass(frozen=True, eq=False)  # eq=False: tensors have no boolean equality
class ClientData:
    """One simulated client's training data (a
    :class:`~fedplat.models.training.TrainData`): ``x [N, ...]`` of any shape,
    ``y`` int64 ``[N]``; ``num_classes`` is ``None`` (a client's labels may not
    cover every class; the model's output width is taken as it is)."""

    x: torch.Tensor
    y: torch.Tensor
    name: str
    num_classes: int | None = None

    def __len__(self) -> int:
        return int(self.x.shape[0])


def _spec(cfg: RunConfig) -> str:
    spec = cfg.data.clients
    if spec is None:
        raise ConfigError("the run names no data.clients")
    return spec


def _tensors(obj: object, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        batches = Batches.of(obj, what)
        if batches.tensors is not None:
            return batches.tensors
        pairs = list(batches.iterate(_BATCH))
    except BatchError as exc:
        raise ConfigError(str(exc)) from None
    if not pairs:
        raise ConfigError(f"{what} is empty")
    return torch.cat([x for x, _ in pairs]), torch.cat([y for _, y in pairs])


def load_client_data(cfg: RunConfig, index: int, num_clients: int) -> ClientData:
    """Client ``index``'s training data from ``data.clients`` (one line of
    :class:`ConfigError` for an import error, a failing call or data that is
    not ``(inputs [N, ...], integer labels [N])``)."""
    spec = _spec(cfg)
    fn = import_path(spec, ConfigError)
    if not callable(fn):
        raise ConfigError(f"data.clients {spec!r} is not callable")
    what = f"data.clients {spec!r} for client {index} of {num_clients}"
    try:
        obj = fn(index, num_clients)
    except Exception as exc:  # the app's code: report it on one line
        raise ConfigError(
            f"{what} failed: {type(exc).__name__}: {' '.join(str(exc).split())}"
        ) from exc
    x, y = _tensors(obj, what)
    if y.dim() != 1 or torch.is_floating_point(y) or y.dtype == torch.bool:
        raise ConfigError(
            f"{what}: the simulated clients train with cross-entropy and need "
            f"integer class labels [N], got {y.dtype} {list(y.shape)}"
        )
    if y.numel() == 0:
        raise ConfigError(f"{what} is empty")
    if int(y.min()) < 0:
        raise ConfigError(f"{what}: class labels must be >= 0, got {int(y.min())}")
    return ClientData(x, y.long(), what)


def _missing_plugin(cfg: RunConfig) -> str | None:
    """Why the run cannot be simulated without ``data.clients`` (or ``None``)."""
    if cfg.data.clients is not None:
        return None
    apps = [
        f"{key} {value!r}"
        for key, value in (
            ("model.factory", cfg.model.factory),
            ("data.eval", cfg.data.eval),
        )
        if value is not None
    ]
    if not apps:
        return None
    return (
        f"the run's {' and '.join(apps)} {'is' if len(apps) == 1 else 'are'} the "
        f"app's, but it names no data.clients for the simulated clients (they would "
        f"train on the bundled {cfg.data.dataset!r}); add data: {{clients: "
        "'package.module:fn'}, called as fn(index, num_clients) and returning that "
        "client's (x, y)"
    )


def check_simulation(cfg: RunConfig, num_clients: int) -> None:
    """Refuse, with one line, a run that ``num_clients`` simulated clients cannot
    train: plug-ins missing for simulation (see :func:`_missing_plugin`), or
    client 0's ``data.clients`` not fitting the run's model (one forward pass)."""
    reason = _missing_plugin(cfg)
    if reason is not None:
        raise ConfigError(reason)
    if cfg.data.clients is None:
        return
    from fedplat.server.evaluation import EvaluationError, build_model, check_fit

    data = load_client_data(cfg, 0, num_clients)
    model = build_model(cfg)
    x, y = (
        data.x[: cfg.client_training.batch_size],
        data.y[: cfg.client_training.batch_size],
    )
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    if param is not None and torch.is_floating_point(x) and x.dtype != param.dtype:
        raise ConfigError(
            f"{data.name}: inputs are {x.dtype} but the model's parameters are "
            f"{param.dtype}: convert them in the plug-in (e.g. x.float())"
        )
    try:
        with torch.no_grad():
            out = model.eval()(x)
        if not isinstance(out, torch.Tensor):
            raise EvaluationError(f"model returned {type(out).__name__}, not a tensor")
        check_fit(out, y, "classification", cfg.model.num_classes)
    except EvaluationError as exc:
        raise ConfigError(f"{data.name}: {exc}") from None
    except Exception as exc:  # the model's own forward: one clear line
        raise ConfigError(
            f"model {cfg.model.label!r} failed on a batch of {data.name} (inputs "
            f"{list(x.shape)}): {type(exc).__name__}: {' '.join(str(exc).split())}"
        ) from exc


__all__ = ["ClientData", "check_simulation", "load_client_data"]
