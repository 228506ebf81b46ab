"""The run file's ``privacy`` section (validated by pydantic, unknown keys
rejected): local DP, user-level DP-FedAvg with adaptive clipping, and secure
aggregation. Read by the coordinator (``fedplat.server.config.RunConfig``) and by
the Flower strategy."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fedplat.config import Strict


class AdaptiveClipSection(Strict):
    """Adaptive clipping (Andrew et al., NeurIPS 2021): the clip norm follows the
    ``target_quantile`` of the update norms, starting at ``privacy.clip_norm``.
    ``count_noise_std`` is ``sigma_b`` of the noised count of unclipped updates
    (default: expected clients / 20, the paper's recommendation)."""

    target_quantile: float = Field(default=0.5, ge=0.0, le=1.0)
    learning_rate: float = Field(default=0.2, gt=0)
    count_noise_std: float | None = Field(default=None, gt=0)


class SecureAggregationSection(Strict):
    """Secure aggregation (Bonawitz et al. 2017; SecAgg+ of Bell et al. 2020) of
    the clipped updates under central DP: the coordinator only learns their sum.

    ``sparse``: SecAgg+ (a Harary graph of ``k`` neighbours sized for
    ``dropout_rate`` and ``corrupt_rate``) instead of every pair; ``rotate``: the
    randomized Hadamard rotation before quantization; ``min_fraction``: the round
    aborts (and releases noise only) when fewer of the selected clients remain;
    ``phase_seconds``: deadline of each phase after the keys are advertised
    (advertising waits for training, until ``deadlines.round_seconds``).
    """

    sparse: bool = True
    dropout_rate: float = Field(default=0.1, ge=0.0, lt=1.0)
    corrupt_rate: float = Field(default=0.05, ge=0.0, lt=1.0)
    rotate: bool = True
    min_fraction: float = Field(default=0.5, gt=0.0, le=1.0)
    phase_seconds: float = Field(default=30.0, gt=0)


class PrivacySection(Strict):
    """Differential privacy of client updates.

    ``local``: each client clips what it sends (e.g. its sketch) to ``clip_norm``
    and adds Gaussian noise itself; the accountant counts one release per round per
    client (sampling rate 1, the worst case for a client that is always selected).
    ``central``: user-level DP-FedAvg (McMahan et al., ICLR 2018) with Poisson
    sampling (``selection.sampling: poisson``): the coordinator clips each update
    (or its sketch) to ``clip_norm``, adds Gaussian noise once to the sum and
    divides by the fixed ``rate * population``; the accountant composes one
    sampled Gaussian mechanism ``(noise_multiplier, rate)`` per round.
    ``population`` is ``N``, the number of clients the rate is defined on; by
    default the clients enrolled when the first round opens (kept on restart).
    Sigma comes from ``noise_multiplier`` or is calibrated by the accountant library
    so that ``run.rounds`` rounds spend ``(epsilon, delta)``. ``max_epsilon``
    (default: ``epsilon``) is a ceiling: a round whose release would pass it is not
    run, and the run completes with that reason.
    """

    mode: Literal["none", "local", "central"] = "none"
    epsilon: float | None = Field(default=None, gt=0)
    delta: float = Field(default=1e-5, gt=0, lt=1)
    clip_norm: float = Field(default=1.0, gt=0)
    noise_multiplier: float | None = Field(default=None, gt=0)
    accountant: Literal["rdp", "prv"] = "rdp"
    max_epsilon: float | None = Field(default=None, gt=0)
    population: int | None = Field(default=None, ge=1)
    adaptive_clip: AdaptiveClipSection | None = None
    secure_aggregation: SecureAggregationSection | None = None

    @model_validator(mode="after")
    def _check(self) -> PrivacySection:
        if (
            self.mode != "none"
            and self.epsilon is None
            and self.noise_multiplier is None
        ):
            raise ValueError("privacy: give epsilon (to calibrate) or noise_multiplier")
        if self.mode != "central" and (
            self.adaptive_clip is not None
            or self.population is not None
            or self.secure_aggregation is not None
        ):
            raise ValueError(
                "privacy.adaptive_clip, population and secure_aggregation need "
                "mode: central"
            )
        if self.mode == "none" and self.max_epsilon is not None:
            raise ValueError("privacy.max_epsilon needs mode local or central")
        return self

    @property
    def ceiling(self) -> float | None:
        """The epsilon the run may not pass (None: no ceiling)."""
        return self.max_epsilon if self.max_epsilon is not None else self.epsilon


__all__ = ["AdaptiveClipSection", "PrivacySection", "SecureAggregationSection"]
