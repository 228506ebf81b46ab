"""Central DP in sketch space: noise the *aggregate* sketch, then de-sketch.

Count-sketch compression (Song, Wang, Yu & Zhang, ICML 2023;
:mod:`fedplat.compression.sketch`) is linear: the sum of the clients' sketches
``sum_c R_t Delta_c`` is the sketch of the sum. DP-FedAvg composes with it by
adding the Gaussian noise once to that aggregate sketch (``b`` numbers instead of
``d``) and de-sketching the noised sum; de-sketching is post-processing, so the
release is exactly as private as the noised sketch sum. Under secure aggregation
the server only ever sees that sum.

**Sensitivity.** The noise must be calibrated to how much one client can move the
sketch sum, ``max ||R_t Delta_c||_2``. Song et al. make the sketched update
private by Gaussian noise on the sketch, with the sensitivity bounded through the
update's norm and a bound on the sketch's norm. fedplat uses one of two bounds,
both holding for every update, with no failure probability to add to delta:

1. **Clip the sketch** (``norm_bound=1``, recommended; what local DP in fedplat
   already does): the client clips ``s_c = R_t Delta_c`` itself to ``S``, so one
   client changes the sum by at most ``S`` whatever ``R_t`` is. Since
   ``E ||R_t h||^2 = ||h||^2``, clipping the sketch at ``S`` clips about as
   often as clipping the update would.
2. **Clip the update** (``norm_bound = L`` from :func:`count_sketch_norm_bound`):
   the client clips ``Delta_c`` to ``S``; then ``||R_t Delta_c|| <= L S`` with
   ``L = ||R_t||_op``. For fedplat's count-sketch (``r`` rows of fully random
   hashes, scaled by ``r^-1/2``), ``||R h||^2 = (1/r) sum_j ||R_j h||^2`` and each
   row's ``R_j R_j^T`` is the diagonal of its bucket loads, so by Cauchy-Schwarz
   within each bucket ``L^2 <= (1/r) sum_j max_a load_{j,a}``: computable from the
   round's public hashes, about ``sqrt(2 d / b)`` (6.3 at ``b = d/20``), which
   multiplies the noise. A with-high-probability bound (Johnson-Lindenstrauss
   style) is not used: for the count-sketch two large coordinates of one update
   collide in a bucket with probability about ``1/b``, far above ``delta``.
"""

from __future__ import annotations

import math

import torch

from fedplat.compression.sketch import AMSSketch, CountSketch, GaussianSketch
from fedplat.compression.wire import Payload, sketch_payload
from fedplat.privacy.clipping import PrivacyError
from fedplat.privacy.dpfedavg import DPRelease
from fedplat.privacy.gaussian import GaussianMechanism

__all__ = ["count_sketch_norm_bound", "dp_sketch_release", "noise_sketch_sum"]

Sketcher = CountSketch | GaussianSketch | AMSSketch


def count_sketch_norm_bound(
    sketch: CountSketch, d: int, *, round: int, seed: int
) -> float:
    """``L >= ||R_t||_op``: ``||R_t h|| <= L ||h||`` for every ``h`` ``[d]``."""
    loads = sketch.bucket_loads(d, round=round, seed=seed)
    return math.sqrt(float(loads.max(dim=1).values.double().mean()))


def noise_sketch_sum(
    sketch_sum: Payload,
    *,
    clip_norm: float,
    noise_multiplier: float,
    generator: torch.Generator,
    norm_bound: float = 1.0,
) -> Payload:
    """The aggregate sketch plus ``N(0, (z S L)^2)`` on each of its values.

    Parameters
    ----------
    sketch_sum : Payload
        Sum of the round's client sketches ``[rows * cols]`` (one spec, one ``d``).
    clip_norm : float
        ``S``: what each client clipped (its sketch, or its update; see above).
    noise_multiplier : float
        ``z``, as told to the accountant.
    generator : torch.Generator
        The server's noise generator.
    norm_bound : float
        ``L``: 1 when clients clip their sketches, else
        :func:`count_sketch_norm_bound`.
    """
    if sketch_sum.kind != "sketch" or sketch_sum.sketch is None:
        raise PrivacyError("sketch-space noise needs a sketch payload")
    if not 1.0 <= norm_bound < math.inf:
        raise PrivacyError(f"norm_bound must be finite and >= 1, got {norm_bound}")
    mech = GaussianMechanism(noise_multiplier, clip_norm * norm_bound)
    noised = mech.add_noise(sketch_sum.values.to(torch.float32), generator=generator)
    return sketch_payload(sketch_sum.sketch, sketch_sum.d, noised)


def dp_sketch_release(
    sketch_sum: Payload,
    count: int,
    *,
    sketcher: Sketcher,
    expected: float,
    clip_norm: float,
    noise_multiplier: float,
    generator: torch.Generator,
    norm_bound: float = 1.0,
) -> DPRelease:
    """DP-FedAvg's fixed-denominator release, noised in sketch space.

    ``mean = R_t^T (sketch_sum + noise) / expected``, float32 ``[d]``.
    """
    if count < 0 or not 0.0 < expected < math.inf:
        raise PrivacyError("need count >= 0 and a finite expected count > 0")
    noised = noise_sketch_sum(
        sketch_sum,
        clip_norm=clip_norm,
        noise_multiplier=noise_multiplier,
        generator=generator,
        norm_bound=norm_bound,
    )
    spec = noised.sketch
    assert spec is not None
    mean = sketcher.desketch(
        noised.values / expected, noised.d, round=spec.round, seed=spec.seed
    )
    std = noise_multiplier * clip_norm * norm_bound
    return DPRelease(mean.to(torch.float32), std, float(expected), count)
