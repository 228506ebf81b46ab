"""The uplink contract between :func:`~fedplat.flower.mods.uplink_mod` and
:class:`~fedplat.flower.strategy.FedplatStrategy`: both halves in one module.

The strategy decides what clients do with their round update (compressor,
local DP) and sends it in every training message's ConfigRecord under
:data:`CONFIG_KEY`, as fedplat's coordinator sends it in every task; the mod
encodes with :func:`encode_update`, the strategy decodes with
:func:`decode_update`. The compression and privacy sections are those of a
fedplat run file (:class:`~fedplat.server.config.CompressionSection`,
:class:`~fedplat.privacy.config.PrivacySection`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from pydantic import Field, ValidationError, model_validator

from fedplat.compression import (
    CompressionError,
    Compressor,
    Payload,
    PayloadError,
    create_compressor,
)
from fedplat.config import Strict, validation_message
from fedplat.privacy import GaussianMechanism, PrivacyError
from fedplat.privacy.config import PrivacySection
from fedplat.protocol.codec import encode_payload
from fedplat.server.config import CompressionSection
from fedplat.vectors import Layout

__all__ = ["CONFIG_KEY", "UplinkError", "UplinkSpec", "decode_update", "encode_update"]

#: Key of the JSON-encoded :class:`UplinkSpec` in the train ConfigRecord.
CONFIG_KEY = "fedplat.uplink"
# A spec is a few hundred bytes; refuse to parse anything near a model's size.
_MAX_SPEC_BYTES = 64 * 1024


class UplinkError(ValueError):
    """An unusable uplink spec or update; the message says why."""


class UplinkSpec(Strict):
    """Compressor, local DP and sketch seed of every client's round update.

    ``privacy.mode`` is ``"none"`` or ``"local"`` (each client clips and noises
    what it sends, e.g. its count-sketch); local DP needs an explicit
    ``noise_multiplier``: calibrating one from ``epsilon`` needs the run's
    number of rounds, which a Flower strategy is not given.
    """

    compression: CompressionSection = Field(default_factory=CompressionSection)
    privacy: PrivacySection = Field(default_factory=PrivacySection)
    # Sketch matrices are rebuilt from (seed, round) on the server: public.
    seed: int = Field(default=0, ge=0, lt=1 << 63)

    @model_validator(mode="after")
    def _check_privacy(self) -> UplinkSpec:
        mode = self.privacy.mode
        if mode == "central":
            raise ValueError(
                "privacy.mode 'central' is not supported by the Flower strategy; "
                "use 'local' (each client noises its own update)"
            )
        if mode == "local" and self.privacy.noise_multiplier is None:
            raise ValueError("privacy.mode 'local' needs privacy.noise_multiplier")
        return self

    @classmethod
    def parse(cls, data: Any) -> UplinkSpec:
        """Validate a mapping (or an existing spec); errors are :class:`UplinkError`."""
        if isinstance(data, UplinkSpec):
            return data
        try:
            return cls.model_validate(data or {})
        except ValidationError as exc:
            raise UplinkError(validation_message(exc, "bad uplink spec:")) from exc

    @classmethod
    def from_config(cls, value: object) -> UplinkSpec:
        """Parse the ConfigRecord value written by :meth:`to_config`."""
        if not isinstance(value, str) or len(value) > _MAX_SPEC_BYTES:
            raise UplinkError(f"{CONFIG_KEY} must be a JSON string under 64 KiB")
        try:
            return cls.model_validate_json(value)
        except ValidationError as exc:
            raise UplinkError(validation_message(exc, "bad uplink spec:")) from exc

    def to_config(self) -> str:
        return self.model_dump_json()

    @property
    def key(self) -> str:
        """Short digest naming this spec (the client's compressor state key)."""
        return hashlib.sha256(self.to_config().encode()).hexdigest()[:16]

    @property
    def is_dense(self) -> bool:
        """Whether updates travel uncompressed and un-noised."""
        return self.compression.name == "identity" and self.privacy.mode == "none"

    def compressor(self, layout: Layout) -> Compressor:
        """A fresh compressor for a model of this ``layout``."""
        c = self.compression
        try:
            return create_compressor(c.name, layout=layout, **dict(c.params))
        except (CompressionError, ValueError) as exc:
            raise UplinkError(f"compression: {exc}") from exc

    def mechanism(self) -> GaussianMechanism | None:
        """The local Gaussian mechanism, or ``None`` without local DP."""
        p = self.privacy
        if p.mode != "local":
            return None
        assert p.noise_multiplier is not None  # checked by the validator
        return GaussianMechanism(p.noise_multiplier, p.clip_norm)


def encode_update(
    spec: UplinkSpec,
    compressor: Compressor,
    update: torch.Tensor,
    *,
    round: int,
    noise: torch.Generator,
) -> bytes:
    """Client half: compress (and, for local DP, clip and noise) ``update`` ``[d]``
    (:func:`fedplat.protocol.codec.encode_payload`, as the SDK encodes).

        ``compressor`` keeps its state (error feedback, DGC momentum) across calls;
        ``noise`` is the client's own DP generator.
    """
    try:
        payload = encode_payload(
            compressor,
            update,
            round=round,
            seed=spec.seed,
            mechanism=spec.mechanism(),
            generator=noise,
        )
    except (CompressionError, PayloadError, PrivacyError) as exc:
        raise UplinkError(f"cannot encode the update: {exc}") from exc
    return payload.to_bytes()


def decode_update(
    spec: UplinkSpec, compressor: Compressor, data: bytes, *, d: int, round: int
) -> torch.Tensor:
    """Server half: untrusted payload bytes -> float32 ``[d]``, validated.

    Sketches must carry this run's seed and this round (a sketch replayed from
    another round would be de-sketched with the wrong hashes).
    """
    try:
        payload = Payload.from_bytes(
            data, expected_d=d, expected_seed=spec.seed, expected_round=round
        )
        vec = compressor.decode(payload).to(torch.float32)
    except (PayloadError, CompressionError) as exc:
        raise UplinkError(f"bad payload: {exc}") from exc
    if vec.shape != (d,):
        raise UplinkError(f"payload decodes to {list(vec.shape)}, expected [{d}]")
    return vec
