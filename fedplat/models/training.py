"""Plain-torch local training and evaluation on an in-memory :class:`Dataset`.

:func:`train_epochs` takes any :class:`TrainData` (inputs ``[N, ...]`` of any
shape, integer labels ``[N]``): a bundled :class:`Dataset` or an app's own
tensors (the simulated clients' ``data.clients``).

Batches are taken by indexing the dataset's tensors with slices of a
``randperm``: for the small models used in FL simulations this is several times
faster on CPU than a ``DataLoader`` (no per-item collation, no workers).

These helpers never change torch's global thread count. For the small models
here, intra-op threads mostly add contention: on a shared 2-core machine
``torch.set_num_threads(1)`` made an MLP epoch on Fashion-MNIST ~10x faster, so
a process running many simulated clients should usually set it once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from fedplat.data.datasets import Dataset

OPTIMIZERS = ("sgd", "adam")


class TrainData(Protocol):
    """What :func:`train_epochs` reads: ``x [N, ...]`` inputs, ``y`` int64 ``[N]``
    labels, a name for messages, and the number of classes when known (``None``:
    the model's output width is taken as it is)."""

    @property
    def x(self) -> torch.Tensor: ...

    @property
    def y(self) -> torch.Tensor: ...

    @property
    def name(self) -> str: ...

    @property
    def num_classes(self) -> int | None: ...

    def __len__(self) -> int: ...


@dataclass(frozen=True)
class TrainResult:
    """Outcome of :func:`train_epochs`.

    Attributes
    ----------
    num_examples : int
        Size of the local dataset (the usual FedAvg aggregation weight).
    steps : int
        Optimizer steps taken.
    mean_loss : float
        Mean training cross-entropy over all examples seen (per-batch losses
        weighted by batch size), measured before each step.
    examples_seen : int
        Examples processed, counting repeats over epochs (less than
        ``epochs * num_examples`` when ``max_steps`` stops early).
    """

    num_examples: int
    steps: int
    mean_loss: float
    examples_seen: int = 0


@dataclass(frozen=True)
class EvalResult:
    """Outcome of :func:`evaluate`.

    Attributes
    ----------
    loss : float
        Mean cross-entropy per example.
    accuracy : float
        Fraction of examples whose arg-max logit equals the label, in ``[0, 1]``.
    num_examples : int
    """

    loss: float
    accuracy: float
    num_examples: int


def _device_of(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _check_logits(logits: torch.Tensor, batch: int, num_classes: int | None) -> None:
    width = num_classes if num_classes is not None else "C"
    if (
        logits.dim() != 2
        or logits.shape[0] != batch
        or (num_classes is not None and logits.shape[1] != num_classes)
    ):
        raise ValueError(
            f"model output has shape {tuple(logits.shape)}, expected logits "
            f"[{batch}, {width}] (does the model match the dataset?)"
        )


def make_optimizer(
    model: nn.Module,
    optimizer: str = "sgd",
    lr: float = 0.01,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
) -> torch.optim.Optimizer:
    """Build an ``"sgd"`` or ``"adam"`` optimizer over ``model``'s parameters.

    Raises
    ------
    ValueError
        Unknown optimizer, non-positive ``lr``, negative ``momentum`` or
        ``weight_decay``, or ``momentum`` with Adam (which has no such knob).
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; valid: {list(OPTIMIZERS)}")
    if not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a finite number > 0, got {lr}")
    if momentum < 0 or weight_decay < 0:
        raise ValueError(
            f"momentum and weight_decay must be >= 0, got {momentum}, {weight_decay}"
        )
    if optimizer == "sgd":
        return torch.optim.SGD(
            model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay
        )
    if momentum != 0:
        raise ValueError("momentum applies to 'sgd' only; Adam uses its betas")
    return torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)


def train_epochs(
    model: nn.Module,
    data: TrainData,
    epochs: int = 1,
    batch_size: int = 32,
    lr: float = 0.01,
    optimizer: str = "sgd",
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    seed: int | None = None,
    max_steps: int | None = None,
) -> TrainResult:
    """Train ``model`` in place with cross-entropy on ``data``.

    A fresh optimizer is built on every call (no state carries over between
    federated rounds). Each epoch visits the data in a new random order; the
    last batch of an epoch may be smaller.

    Parameters
    ----------
    model : nn.Module
        Maps a batch of ``data.x`` ``[B, ...]`` to logits ``[B, C]``
        (``C = data.num_classes`` when that is known).
    data : TrainData
        Non-empty; ``x`` ``[N, ...]`` (``[N, C, H, W]`` for a bundled
        :class:`Dataset`), ``y`` ``[N]``.
    epochs : int
        Passes over the data, ``>= 1``.
    batch_size : int
    lr : float
    optimizer : {"sgd", "adam"}
    momentum : float
        SGD momentum (must be 0 for Adam).
    weight_decay : float
    seed : int, optional
        Seeds the shuffling (a private ``torch.Generator``) so runs repeat
        exactly; ``None`` uses the global RNG.
    max_steps : int, optional
        Stop after this many optimizer steps, even mid-epoch.

    Returns
    -------
    TrainResult
    """
    n = len(data)
    _check_train_args(data, epochs, batch_size, max_steps)
    opt = make_optimizer(model, optimizer, lr, momentum, weight_decay)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    device = _device_of(model)
    was_training = model.training
    model.train()
    # Accumulate on-device so the loop never syncs on .item() per step.
    total_loss = torch.zeros((), dtype=torch.float64, device=device)
    budget = max_steps if max_steps is not None else math.inf
    steps = seen = 0
    try:
        for _ in range(epochs):
            perm = torch.randperm(n, generator=gen)
            for start in range(0, n, batch_size):
                if steps >= budget:
                    break
                idx = perm[start : start + batch_size]
                total_loss += _step(model, opt, data, idx, device) * idx.numel()
                steps += 1
                seen += idx.numel()
            if steps >= budget:
                break
    finally:
        model.train(was_training)
    return TrainResult(
        num_examples=n,
        steps=steps,
        mean_loss=float(total_loss) / seen,
        examples_seen=seen,
    )


def _check_train_args(
    data: TrainData, epochs: int, batch_size: int, max_steps: int | None
) -> None:
    if len(data) == 0:
        raise ValueError(f"cannot train on an empty dataset ({data.name!r})")
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be None or >= 1, got {max_steps}")


def _step(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    data: TrainData,
    idx: torch.Tensor,
    device: torch.device,
) -> torch.Tensor:
    """One optimizer step on the batch ``idx``; returns the loss before it."""
    xb = data.x[idx].to(device, non_blocking=True)
    yb = data.y[idx].to(device, non_blocking=True)
    logits = model(xb)
    _check_logits(logits, idx.numel(), data.num_classes)
    loss = F.cross_entropy(logits, yb)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach().double()


def evaluate(model: nn.Module, data: Dataset, batch_size: int = 1024) -> EvalResult:
    """Cross-entropy and accuracy of ``model`` on ``data``.

    Runs under ``torch.no_grad()`` in eval mode and restores the model's
    previous train/eval mode afterwards.

    Parameters
    ----------
    model : nn.Module
        Maps ``float32 [B, C, H, W]`` to logits ``[B, data.num_classes]``.
    data : Dataset
    batch_size : int

    Returns
    -------
    EvalResult
        ``loss`` and ``accuracy`` are NaN for an empty dataset.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = len(data)
    if n == 0:
        return EvalResult(loss=math.nan, accuracy=math.nan, num_examples=0)
    device = _device_of(model)
    was_training = model.training
    model.eval()
    total_loss = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    try:
        with torch.no_grad():
            for start in range(0, n, batch_size):
                xb = data.x[start : start + batch_size].to(device, non_blocking=True)
                yb = data.y[start : start + batch_size].to(device, non_blocking=True)
                logits = model(xb)
                _check_logits(logits, yb.numel(), data.num_classes)
                total_loss += F.cross_entropy(logits, yb, reduction="sum").double()
                correct += (logits.argmax(dim=1) == yb).sum()
    finally:
        model.train(was_training)
    return EvalResult(
        loss=float(total_loss) / n, accuracy=int(correct) / n, num_examples=n
    )
