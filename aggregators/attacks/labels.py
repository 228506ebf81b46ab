"""Label flipping, a data-level attack: its clients train honestly on flipped
labels, so it is not a vector attack and is not in the attack registry."""

from __future__ import annotations

import torch
from fedplat.aggregators.attacks.base import AttackError, check_int


def flip_labels(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Label-flipping data attack: ``y -> num_classes - 1 - y`` (Karimireddy et al.
    2022, ``attacks/labelflipping.py``; Allen-Zhu et al. 2020).

    ``y`` is an integer tensor of labels in ``[0, num_classes)``.

    Examples
    --------
    >>> flip_labels(torch.tensor([0, 1, 9, 4]), 10)
    tensor([9, 8, 0, 5])
    """
    check_int("num_classes", num_classes, minimum=1)
    if y.is_floating_point() or y.is_complex():
        raise AttackError(f"labels must be integers, got {y.dtype}")
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise AttackError(f"labels must lie in [0, {num_classes})")
    return num_classes - 1 - y
