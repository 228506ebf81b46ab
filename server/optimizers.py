"""Server optimizers: how the aggregated update moves the global model.

The aggregate ``delta`` is a pseudo-gradient with the sign of a descent step
(``mean(new_i - global)``). FedAvg applies ``w += lr * delta``; FedAvgM adds server
momentum (Hsu et al., 2019); FedAdam / FedYogi / FedAdagrad follow Reddi et al.,
"Adaptive Federated Optimization" (ICLR 2021), Algorithm 2, with ``tau`` as the
adaptivity constant.

The server learning rate may follow a schedule over the run's rounds
(``lr_schedule``): with one local SGD step per round and a client lr of 1, the
update ``mean(new_i - global)`` is minus the mean gradient, and a cosine-scheduled
FedAvgM is exactly momentum SGD with that schedule, the learning rate applied when
an update arrives (as ``torch.optim.SGD`` and DGC's reference optimizer do), not
when it was computed.
"""

from __future__ import annotations

import math

import torch
from fedplat.server.config import ServerOptimizerSection


class ServerOptimizer:
    """Stateful update rule ``(weights [d], delta [d]) -> new weights [d]``."""

    def __init__(
        self, cfg: ServerOptimizerSection, total_rounds: int | None = None
    ) -> None:
        if cfg.lr_schedule != "constant" and (total_rounds is None or total_rounds < 1):
            raise ValueError(f"lr_schedule {cfg.lr_schedule!r} needs the run's rounds")
        self.cfg = cfg
        self.total_rounds = total_rounds
        self.state: dict[str, torch.Tensor] = {}

    def lr_at(self, round_number: int | None) -> float:
        """The server learning rate of round ``round_number`` (1-based)."""
        c = self.cfg
        if c.lr_schedule == "constant":
            return c.lr
        if round_number is None or round_number < 1:
            raise ValueError(
                f"lr_schedule {c.lr_schedule!r} needs a round number >= 1, "
                f"got {round_number!r}"
            )
        assert self.total_rounds is not None
        t = min(round_number - 1, self.total_rounds - 1) / self.total_rounds
        return c.lr_min + (c.lr - c.lr_min) * 0.5 * (1.0 + math.cos(math.pi * t))

    def step(
        self,
        weights: torch.Tensor,
        delta: torch.Tensor,
        round_number: int | None = None,
    ) -> torch.Tensor:
        c = self.cfg
        lr = self.lr_at(round_number)
        if c.name == "fedavg":
            # One pass and one new tensor (``weights + lr * delta`` makes two).
            return torch.add(weights, delta, alpha=lr)
        if c.name == "fedavgm":
            m = self.state.get("m")
            m = delta.clone() if m is None else c.momentum * m + delta
            self.state["m"] = m
            return weights + lr * m
        m = self.state.get("m", torch.zeros_like(delta))
        v = self.state.get("v", torch.full_like(delta, c.tau**2))
        m = c.beta1 * m + (1 - c.beta1) * delta
        d2 = delta * delta
        if c.name == "fedadam":
            v = c.beta2 * v + (1 - c.beta2) * d2
        elif c.name == "fedyogi":
            v = v - (1 - c.beta2) * d2 * torch.sign(v - d2)
        else:  # fedadagrad
            v = v + d2
        self.state["m"], self.state["v"] = m, v
        return weights + lr * m / (v.sqrt() + c.tau)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: t.clone() for k, t in self.state.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.state = {k: t.clone() for k, t in state.items()}
