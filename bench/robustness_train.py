"""One run of bench/robustness.py's grid (a federated loop in one process:
per-client gradients in one batched pass, worker momentum, the rule under
attack), and the pool that runs many."""

from __future__ import annotations

import multiprocessing
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from fedplat.aggregators import build_aggregator
from fedplat.aggregators.attacks import create_attack, flip_labels
from torch import nn
from torch.func import functional_call, grad, vmap

from bench.robustness_setup import (
    ATTACK_SPECS,
    CUT_FLAGS,
    VALIDATION_SEED,
    Setup,
    rule_params,
    rule_pre,
)
from fedplat.data import Dataset, load_dataset
from fedplat.data.partition import iid, label_sorted
from fedplat.models import create_model, evaluate


@dataclass
class Data:
    train: Dataset
    test: Dataset
    honest_parts: list[torch.Tensor]
    byz_parts: list[torch.Tensor]


def load_data(setup: Setup) -> Data:
    train = load_dataset(setup.dataset, "train")
    test = load_dataset(setup.dataset, "test")
    if setup.train_limit is not None:
        train = train.subset(np.arange(min(setup.train_limit, len(train))))
    if setup.test_limit is not None:
        test = test.subset(np.arange(min(setup.test_limit, len(test))))
    if setup.validation:
        perm = np.random.default_rng(VALIDATION_SEED).permutation(len(train))
        test = train.subset(np.sort(perm[: setup.validation]))
        train = train.subset(np.sort(perm[setup.validation :]))
    labels = train.y.numpy()
    honest = [torch.from_numpy(p) for p in label_sorted(labels, setup.honest)]
    byz = [torch.from_numpy(p) for p in iid(len(train), setup.honest, seed=1234)]
    return Data(train, test, honest, byz[: setup.f])


class FlatModel:
    """A model whose parameters live in one flat vector ``w`` ``[d]``."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.names = [k for k, _ in model.named_parameters()]
        self.shapes = [p.shape for _, p in model.named_parameters()]
        self.sizes = [p.numel() for _, p in model.named_parameters()]
        self.w = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def params(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        chunks = w.split(self.sizes)
        return {
            k: c.view(s)
            for k, c, s in zip(self.names, chunks, self.shapes, strict=True)
        }

    def load_into_model(self) -> nn.Module:
        with torch.no_grad():
            for p, c in zip(
                self.model.parameters(), self.w.split(self.sizes), strict=True
            ):
                p.copy_(c.view_as(p))
        return self.model


def client_gradients(fm: FlatModel, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    """Per-client gradients ``[c, d]`` of the global model, batches ``[c, B, ...]``."""

    def loss(
        p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        return F.cross_entropy(functional_call(fm.model, p, (x,)), y)

    grads = vmap(grad(loss), in_dims=(None, 0, 0))(fm.params(fm.w), xb, yb)
    return torch.cat([grads[k].reshape(xb.shape[0], -1) for k in fm.names], dim=1)


@dataclass
class RunResult:
    accuracy: float  # mean of the last evaluations
    final_accuracy: float
    seconds: float
    rounds: int
    aggregate_seconds: float = 0.0
    flags: dict[str, int] = field(default_factory=dict)
    # Fractions of (row, round) pairs the rule clipped, excluded or down-weighted.
    honest_flagged: float = 0.0
    byzantine_flagged: float = 0.0
    # The round at which the rows became non-finite (the model diverged).
    diverged_round: int | None = None


def run_one(
    setup: Setup,
    data: Data,
    rule: str | None,
    attack: str | None,
    bucketing: bool,
    seed: int,
    rounds: int | None = None,
) -> RunResult:
    """Train for ``rounds`` rounds; ``attack=None`` drops the Byzantine clients and
    ``rule=None`` means plain FedAvg."""
    rounds = setup.rounds if rounds is None else rounds
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    model = create_model(
        "mlp",
        data.train.input_shape,
        data.train.num_classes,
        seed=seed,
        hidden=setup.hidden,
    )
    fm = FlatModel(model)
    f = 0 if attack is None else setup.f
    name, params = rule_params(setup, rule or "mean")
    aggregator = build_aggregator(
        name, params, rule_pre(setup, rule or "mean", bucketing, seed) or None
    )
    spec = None if attack is None else ATTACK_SPECS[attack]
    vector_attack = None if spec is None else create_attack(spec[0], **spec[1])
    # Clients that compute gradients: honest, plus label flippers.
    parts = list(data.honest_parts) + (data.byz_parts if attack == "label_flip" else [])
    n_train = len(parts)
    buf = torch.zeros(n_train, fm.w.numel())
    agg_time = 0.0
    flag_counts: dict[str, int] = {}
    cut = [0, 0]  # honest, Byzantine (row, round) pairs cut
    x_all, y_all = data.train.x, data.train.y
    evals: list[float] = []
    diverged: int | None = None
    first_eval = rounds - setup.eval_every * (setup.eval_last - 1)
    for t in range(1, rounds + 1):
        idx = torch.stack(
            [
                p[torch.randint(len(p), (setup.batch_size,), generator=gen)]
                for p in parts
            ]
        )
        xb, yb = x_all[idx], y_all[idx]
        if attack == "label_flip":
            yb[setup.honest :] = flip_labels(yb[setup.honest :], data.train.num_classes)
        g = client_gradients(fm, xb, yb)
        buf.mul_(setup.momentum).add_(g)  # worker momentum (MomentumWorker)
        honest = buf[: setup.honest]
        if vector_attack is not None:
            rows = torch.cat([honest, vector_attack(honest, f)])
        elif attack == "label_flip":
            rows = buf
        else:
            rows = honest
        if not bool(torch.isfinite(rows).all()):
            diverged = t  # the model blew up: nothing left to aggregate
            break
        tic = time.perf_counter()
        result = aggregator(rows)
        agg_time += time.perf_counter() - tic
        for i, d in enumerate(result.decisions):
            cut[i >= setup.honest] += bool(CUT_FLAGS.intersection(d.flags))
            if i >= setup.honest:
                for flag in d.flags:
                    flag_counts[flag] = flag_counts.get(flag, 0) + 1
        fm.w -= setup.lr * result.aggregate
        if t >= first_eval and (rounds - t) % setup.eval_every == 0:
            evals.append(float(evaluate(fm.load_into_model(), data.test).accuracy))
    ran = rounds if diverged is None else diverged - 1
    if diverged is not None:
        # Every evaluation left gets the diverged model's accuracy (what a
        # deployment would be left with), counted once per missing point.
        acc = float(evaluate(fm.load_into_model(), data.test).accuracy)
        evals += [acc] * (setup.eval_last - len(evals))
    return RunResult(
        accuracy=statistics.fmean(evals),
        final_accuracy=evals[-1],
        seconds=time.perf_counter() - t0,
        rounds=ran,
        aggregate_seconds=agg_time,
        flags=flag_counts,
        honest_flagged=cut[0] / (setup.honest * ran) if ran else 0.0,
        byzantine_flagged=cut[1] / (f * ran) if f and ran else 0.0,
        diverged_round=diverged,
    )


Job = tuple[str | None, str | None, bool, int]  # rule, attack, bucketing, seed

_WORKER: dict[str, Any] = {}


def _init_worker(setup: Setup, threads: int) -> None:
    torch.set_num_threads(threads)
    _WORKER["setup"] = setup
    _WORKER["data"] = load_data(setup)


def _run_job(job: Job) -> tuple[Job, RunResult]:
    rule, attack, b, seed = job
    return job, run_one(_WORKER["setup"], _WORKER["data"], rule, attack, b, seed)


def run_jobs(
    setup: Setup, data: Data | None, jobs: list[Job], workers: int
) -> Iterator[tuple[Job, RunResult]]:
    """Run ``jobs``, in ``workers`` processes with one torch thread each.

    Many small ops per round (a 25 x 50k stack) scale badly across OpenMP threads,
    and OpenMP stalls whenever another process holds a core; independent runs in
    separate single-threaded processes use both cores fully.
    """
    if workers <= 1:
        assert data is not None
        for job in jobs:
            rule, attack, b, seed = job
            yield job, run_one(setup, data, rule, attack, b, seed)
        return
    # SIGTERM would kill only this process and orphan the workers: exit cleanly
    # so the pool's context manager terminates them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers, _init_worker, (setup, torch.get_num_threads())) as pool:
        yield from pool.imap_unordered(_run_job, jobs)
