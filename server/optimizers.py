"""Server optimizers: how the aggregated update moves the global model.

The aggregate ``delta`` is a pseudo-gradient with the sign of a descent step
(``mean(new_i - global)``). FedAvg applies ``w += lr * delta``; FedAvgM adds server
momentum (Hsu et al., 2019); FedAdam / FedYogi / FedAdagrad follow Reddi et al.,
"Adaptive Federated Optimization" (ICLR 2021), Algorithm 2, with ``tau`` as the
adaptivity constant.
"""

from __future__ import annotations

import torch
from fedplat.server.config import ServerOptimizerSection


class ServerOptimizer:
    """Stateful update rule ``(weights [d], delta [d]) -> new weights [d]``."""

    def __init__(self, cfg: ServerOptimizerSection) -> None:
        self.cfg = cfg
        self.state: dict[str, torch.Tensor] = {}

    def step(self, weights: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        if c.name == "fedavg":
            return weights + c.lr * delta
        if c.name == "fedavgm":
            m = self.state.get("m")
            m = delta.clone() if m is None else c.momentum * m + delta
            self.state["m"] = m
            return weights + c.lr * m
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
        return weights + c.lr * m / (v.sqrt() + c.tau)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: t.clone() for k, t in self.state.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.state = {k: t.clone() for k, t in state.items()}
