"""Local DP on a compressed payload: clip and noise what actually leaves the client."""

from __future__ import annotations

import torch

from fedplat.compression.wire import Payload
from fedplat.privacy.clipping import PrivacyError
from fedplat.privacy.gaussian import GaussianMechanism

__all__ = ["privatize_payload"]


def privatize_payload(
    payload: Payload, mechanism: GaussianMechanism, *, generator: torch.Generator
) -> Payload:
    """Clip the payload's values to ``clip_norm`` and add Gaussian noise.

    Only dense and sketch payloads: every coordinate of the released vector is
    noised. A sparse payload would reveal its index set (chosen from the data)
    noise-free, so it is refused rather than silently made non-private.

    Parameters
    ----------
    payload : Payload
        Dense ``[d]`` or sketch ``[rows * cols]`` values.
    mechanism : GaussianMechanism
        Clip norm and noise multiplier.
    generator : torch.Generator
        The client's own noise generator.

    Returns
    -------
    Payload
        Same kind and spec, float32 noised values.
    """
    if payload.kind == "sparse":
        raise PrivacyError(
            "local DP needs a dense or sketch payload: a sparse "
            "payload's indices would be released without noise"
        )
    noised = mechanism.privatize(payload.values.to(torch.float32), generator=generator)
    return payload.with_values(noised)
