"""Gradient leakage: reconstruct a training image from an update, with and without DP.

The attack of Song, Wang, Yu & Zhang, "Sketching for First Order Method: Efficient
Algorithm for Low-Bandwidth Channel and Vulnerability" (ICML 2023, arXiv
2210.08371), which shows that sketching alone does not stop gradient leakage: an
adversary who knows the model ``w_t`` and the round's sketch ``R_t``
(both are public in the protocol: the sketch seed is in every task) observes a
client's upload and solves, by gradient matching,

    min_x || R_t * Delta(w_t; x, y) - observed ||^2,   Delta = -lr * grad l(w_t; x, y)

for the input ``x`` (L-BFGS), trying every label ``y`` and keeping the best match.
The client trains multinomial logistic regression (fedplat's ``logreg``) on one real
image (batch 1, one SGD step of the real training loop), so for the uncompressed
update (``R_t = I``) the problem has an exact solution and recovery is near perfect.

Scenarios (one image, the same ``w_t``):

* ``uncompressed``: the dense update.
* ``countsketch``: fedplat's :class:`~fedplat.compression.CountSketch` (linear,
  rows x cols buckets) at ``d/4`` and ``d/20``; ``gaussian_sketch`` at ``d/4``. The
  attacker differentiates through the sketch using only its public API: ``encode``
  is ``R s`` and the linear ``desketch`` is ``R^T s``.
* ``countsketch_clipped``: the ``d/4`` sketch clipped to ``clip_norm`` without
  noise (clipping alone does not protect).
* ``countsketch_dp``: the ``d/4`` count-sketch with local DP as the client SDK
  applies it (:func:`fedplat.privacy.privatize_payload`: clip the sketch to
  ``clip_norm``, add Gaussian noise). Sigma is calibrated by Opacus's RDP
  accountant (:class:`fedplat.privacy.GaussianMechanism`) for ONE release at
  ``(epsilon, 1e-5)`` -- the attacker's best case: a whole training run composes
  many releases and needs more noise. The attacker knows the clip norm and models
  the clipping. Each epsilon is attacked ``--trials`` times with fresh noise.

Reconstruction error: normalized MSE ``||x_hat - x||^2 / ||x||^2`` and PSNR (pixel
range 1) of the reconstruction clamped to the known pixel range ``[0, 1]`` (the
unclamped error is ``nmse_raw``); the error of guessing the training set's mean
image is given for reference.

Writes ``bench/results/leakage.json``. Usage::

    python -m bench.leakage            # Fashion-MNIST, about a minute
    python -m bench.leakage --tiny     # digits (8x8), a few seconds
    python -m bench.leakage --markdown # its block of docs/compression.md
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bench.common import check_out, environment, write_results
from bench.docs import add_doc_args, handle_doc_args
from bench.docs_compression import DOC, leakage_blocks
from fedplat.compression import Compressor, CountSketch, GaussianSketch
from fedplat.data import load_dataset
from fedplat.models import create_model
from fedplat.models.training import train_epochs
from fedplat.privacy import (
    GaussianMechanism,
    make_noise_generator,
    privatize_payload,
)
from fedplat.vectors import flatten

RESULTS = Path(__file__).resolve().parent / "results" / "leakage.json"
SCHEMA_VERSION = 1
DELTA = 1e-5
SKETCH_SEED = 12345  # public: the coordinator sends it in every task
SKETCH_ROUND = 1


@dataclass(frozen=True)
class Setup:
    dataset: str = "fashion_mnist"
    image_index: int = 0  # of the training split
    lr: float = 0.1
    clip_norm: float = 1.0
    epsilons: tuple[float, ...] = (1.0, 4.0, 8.0, 32.0, 128.0, 512.0, 2048.0)
    trials: int = 3
    max_iter: int = 400
    seed: int = 0


FULL = Setup()
TINY = Setup(dataset="digits", epsilons=(1.0, 2048.0), trials=1, max_iter=150)


class _Sketched(torch.autograd.Function):
    """``R s`` with gradient ``R^T g``, from a linear sketch's public API."""

    @staticmethod
    def forward(ctx: Any, vec: torch.Tensor, sketch: Any) -> torch.Tensor:
        ctx.sketch = sketch
        ctx.d = vec.numel()
        return sketch.encode(
            vec.detach(), round=SKETCH_ROUND, seed=SKETCH_SEED
        ).values.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        back = ctx.sketch.desketch(
            grad.detach(), ctx.d, round=SKETCH_ROUND, seed=SKETCH_SEED
        )
        return back, None


def sketched(
    vec: torch.Tensor, sketch: Compressor | torch.Tensor | None
) -> torch.Tensor:
    """Differentiable ``R vec``: ``vec`` for ``None``, a matrix product for an
    explicit ``R`` ``[b, d]``, else through the sketch's encode/desketch."""
    if sketch is None:
        return vec
    if isinstance(sketch, torch.Tensor):
        return sketch @ vec
    out = _Sketched.apply(vec, sketch)
    assert isinstance(out, torch.Tensor)
    return out


def predicted_update(
    x: torch.Tensor, label: int, weight: torch.Tensor, bias: torch.Tensor, lr: float
) -> torch.Tensor:
    """``-lr * grad`` of the cross-entropy of logistic regression at one example.

    Closed form, differentiable in ``x`` ``[p]``: with ``q = softmax(W x + b)``,
    ``dW = (q - e_y) x^T`` ``[k, p]`` and ``db = q - e_y`` ``[k]``; flattened in the
    model's layout order (weight, then bias).
    """
    q = torch.softmax(weight @ x + bias, dim=0)
    err = q - F.one_hot(torch.tensor(label), q.numel()).to(q.dtype)
    return -lr * torch.cat([torch.outer(err, x).reshape(-1), err])


def _clip(s: torch.Tensor, clip_norm: float | None) -> torch.Tensor:
    if clip_norm is None:
        return s
    # Same rule as fedplat.privacy.clip_l2 (the 1e-6 guard included).
    scale = torch.clamp(clip_norm / (torch.linalg.vector_norm(s) + 1e-6), max=1.0)
    return s * scale


@dataclass(frozen=True)
class Attack:
    x_hat: torch.Tensor
    label: int
    loss: float
    iterations: int


def _match(
    observed: torch.Tensor,
    label: int,
    weight: torch.Tensor,
    bias: torch.Tensor,
    lr: float,
    sketch: Compressor | torch.Tensor | None,
    clip_norm: float | None,
    max_iter: int,
    seed: int,
) -> Attack:
    """L-BFGS on ``x`` for a fixed label; returns the final matching loss."""
    gen = torch.Generator().manual_seed(seed + label)
    x = (
        0.5 + 0.1 * torch.randn(weight.shape[1], generator=gen, dtype=torch.float64)
    ).requires_grad_(True)
    scale = float(observed.square().sum()) or 1.0  # conditions L-BFGS's tolerances

    def loss_of(x: torch.Tensor) -> torch.Tensor:
        upd = predicted_update(x, label, weight, bias, lr)
        pred = _clip(sketched(upd.to(torch.float32), sketch).double(), clip_norm)
        return (pred - observed).square().sum() / scale

    opt = torch.optim.LBFGS(
        [x],
        lr=1.0,
        max_iter=max_iter,
        tolerance_grad=1e-12,
        tolerance_change=1e-15,
        history_size=50,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = loss_of(x)
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        loss = float(loss_of(x))
    iters = int(opt.state[x].get("n_iter", 0))
    return Attack(x.detach().clone(), label, loss, iters)


def gradient_matching(
    observed: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    lr: float,
    sketch: Compressor | torch.Tensor | None,
    clip_norm: float | None,
    max_iter: int,
    seed: int,
    probe_iter: int = 25,
) -> Attack:
    """Best ``(x, y)`` minimising the squared matching error.

    Label search in two stages to keep it cheap: a short run (``probe_iter``
    L-BFGS iterations) for every label, then the full run for the label that
    matched best.
    """
    probes = [
        _match(observed, y, weight, bias, lr, sketch, clip_norm, probe_iter, seed)
        for y in range(weight.shape[0])
    ]
    label = min(probes, key=lambda a: a.loss).label
    return _match(observed, label, weight, bias, lr, sketch, clip_norm, max_iter, seed)


def errors(x_hat: torch.Tensor, x: torch.Tensor) -> dict[str, float]:
    """Normalized MSE and PSNR (pixel range 1) of ``x_hat`` vs ``x`` (both ``[p]``).

    The attacker knows pixels lie in ``[0, 1]`` and clamps its estimate (free, and
    it only helps); ``nmse_raw`` is the error before clamping.
    """
    x = x.double()
    err = x_hat.double().clamp(0.0, 1.0) - x
    mse = float(err.square().mean())
    return {
        "nmse": float(err.square().sum() / x.square().sum()),
        "psnr_db": math.inf if mse == 0 else 10.0 * math.log10(1.0 / mse),
        "mse": mse,
        "nmse_raw": float((x_hat.double() - x).square().sum() / x.square().sum()),
    }


def client_update(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float, dataset: Any
) -> torch.Tensor:
    """The client's real update ``w_new - w_t`` after one SGD step on ``(x, y)``."""
    from fedplat.data.datasets import Dataset

    before = flatten(model)
    one = Dataset(x[None], y[None], dataset.name, dataset.num_classes)
    train_epochs(model, one, epochs=1, batch_size=1, lr=lr, seed=0)
    return flatten(model) - before


def run(setup: Setup, log: Callable[[str], None]) -> dict[str, Any]:
    torch.manual_seed(setup.seed)
    ds = load_dataset(setup.dataset, "train", fallback=False)
    x_img, y_true = ds.x[setup.image_index], ds.y[setup.image_index]
    x_true = x_img.reshape(-1).double()
    model = create_model("logreg", ds.input_shape, ds.num_classes, seed=setup.seed)
    params = dict(model.named_parameters())  # w_t, known to everyone
    weight = params["linear.weight"].detach().double().clone()  # [k, p]
    bias = params["linear.bias"].detach().double().clone()  # [k]
    delta = client_update(model, x_img, y_true, setup.lr, ds)
    d = delta.numel()
    # The closed form the attacker uses agrees with the real training step.
    check = predicted_update(x_true, int(y_true), weight, bias, setup.lr)
    closed_form_error = float((check.float() - delta).abs().max())
    mean_image = ds.x.reshape(len(ds), -1).mean(0).double()
    reference = {
        "mean_image_guess": errors(mean_image, x_true),
        "zero_guess": errors(torch.zeros_like(x_true), x_true),
    }

    results: list[dict[str, Any]] = []

    def attack(
        name: str,
        observed: torch.Tensor,
        sketch: Compressor | torch.Tensor | None,
        clip: float | None,
        **extra: Any,
    ) -> dict[str, Any]:
        t0 = time.perf_counter()
        a = gradient_matching(
            observed.double(),
            weight,
            bias,
            setup.lr,
            sketch,
            clip,
            setup.max_iter,
            setup.seed,
        )
        row = {
            "scenario": name,
            **extra,
            **errors(a.x_hat, x_true),
            "label_recovered": a.label == int(y_true),
            "matching_loss": a.loss,
            "attack_seconds": time.perf_counter() - t0,
        }
        log(
            f"{name:18s} {extra}  nmse {row['nmse']:.3e}  psnr "
            f"{row['psnr_db']:6.1f} dB  label ok {row['label_recovered']}"
        )
        return row

    results.append(attack("uncompressed", delta, None, None, b=d, epsilon=None))
    sketches: list[tuple[str, int, Compressor]] = [
        ("countsketch", 4, CountSketch(rows=1, cols=math.ceil(d / 4))),
        ("countsketch", 20, CountSketch(rows=1, cols=math.ceil(d / 20))),
        ("gaussian_sketch", 4, GaussianSketch(b=math.ceil(d / 4))),
    ]
    for name, red, sk in sketches:
        s = sk.encode(delta, round=SKETCH_ROUND, seed=SKETCH_SEED).values
        op: Compressor | torch.Tensor = sk
        if isinstance(sk, GaussianSketch):
            # Rebuilding a dense R on every call would dominate: build it once
            # (public API) and check it is the matrix the client applied.
            op = sk.matrix(d, round=SKETCH_ROUND, seed=SKETCH_SEED)
            assert torch.allclose(op @ delta, s, rtol=1e-4, atol=1e-7)
        results.append(
            attack(name, s, op, None, b=s.numel(), reduction=red, epsilon=None)
        )

    cs = sketches[0][2]
    payload = cs.encode(delta, round=SKETCH_ROUND, seed=SKETCH_SEED)
    sketch_norm = float(torch.linalg.vector_norm(payload.values))
    # Clipping alone (noise_multiplier 0): the attacker models the clip.
    clipped = privatize_payload(
        payload,
        GaussianMechanism(0.0, setup.clip_norm),
        generator=make_noise_generator(setup.seed),
    ).values
    results.append(
        attack(
            "countsketch_clipped",
            clipped,
            cs,
            setup.clip_norm,
            b=clipped.numel(),
            reduction=4,
            epsilon=None,
            noise_multiplier=0.0,
        )
    )
    dp_rows = []
    for eps in setup.epsilons:
        mech = GaussianMechanism.calibrated(
            epsilon=eps,
            delta=DELTA,
            steps=1,
            sample_rate=1.0,
            clip_norm=setup.clip_norm,
        )
        trials = []
        for t in range(setup.trials):
            gen = make_noise_generator(setup.seed * 1000 + t)
            noised = privatize_payload(payload, mech, generator=gen).values
            trials.append(
                attack(
                    "countsketch_dp",
                    noised,
                    cs,
                    setup.clip_norm,
                    b=noised.numel(),
                    reduction=4,
                    epsilon=eps,
                    noise_multiplier=mech.noise_multiplier,
                    trial=t,
                )
            )
        dp_rows.append(
            {
                "epsilon": eps,
                "delta": DELTA,
                "noise_multiplier": mech.noise_multiplier,
                "noise_std": mech.std,
                "noise_norm_over_clip": mech.noise_multiplier
                * math.sqrt(payload.values.numel()),
                "nmse_mean": statistics.fmean(r["nmse"] for r in trials),
                "psnr_db_mean": statistics.fmean(r["psnr_db"] for r in trials),
                "label_recovered_fraction": statistics.fmean(
                    float(r["label_recovered"]) for r in trials
                ),
                "trials": trials,
            }
        )
    return {
        "image": {
            "dataset": ds.name,
            "split": "train",
            "index": setup.image_index,
            "label": int(y_true),
            "pixels": x_true.numel(),
            "norm": float(x_true.norm()),
        },
        "model": {
            "name": "logreg",
            "d": d,
            "lr": setup.lr,
            "batch_size": 1,
            "closed_form_max_abs_error": closed_form_error,
        },
        "sketch": {
            "seed": SKETCH_SEED,
            "round": SKETCH_ROUND,
            "dp_sketch": "countsketch 1 x ceil(d/4)",
            "update_norm": float(delta.norm()),
            "sketch_norm": sketch_norm,
            "clip_norm": setup.clip_norm,
        },
        "reference": reference,
        "results": results,
        "dp": dp_rows,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="digits, fewer epsilons")
    ap.add_argument("--out", type=Path, default=str(RESULTS))
    add_doc_args(ap, DOC)
    args = ap.parse_args(argv)
    if handle_doc_args(args, DOC, leakage_blocks):
        return 0
    check_out(ap, args.out)
    torch.set_num_threads(1)
    setup = TINY if args.tiny else FULL
    t0 = time.perf_counter()
    out = {
        "benchmark": "leakage",
        "schema_version": SCHEMA_VERSION,
        "tiny": args.tiny,
        "setup": asdict(setup),
        **run(setup, lambda s: print(s, file=sys.stderr, flush=True)),
        "environment": environment(t0),
    }
    write_results(args.out, out, t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
