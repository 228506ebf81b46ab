"""Compression on gossip links: send the change of a model against a shared reference.

A compressed model is useless as-is (top-k of a model drops most weights), so a
link carries ``C(x - x_hat)``, where ``x_hat`` is a reference copy both ends hold,
and both ends then set ``x_hat <- x_hat + decode(C(x - x_hat))``: the scheme of
CHOCO-SGD (Koloskova, Stich & Jaggi, ICML 2019, Algorithm 1, the "public copies"
``x_hat``). The receiver mixes with ``x_hat``, which tracks the sender's model;
with :class:`~fedplat.compression.Identity` it is exact after every message.

Links fail, so each message names the reference version it was built on. A
receiver whose version differs (it restarted, or a message or ack was lost)
refuses it with :class:`ReferenceMismatch`; the sender resets the link to the
zero reference and sends again. Every received payload goes through
:meth:`fedplat.compression.Payload.from_bytes` (size, kind, dimension and
finiteness checks) before it touches a reference.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fedplat.compression import (
    Compressor,
    Payload,
    PayloadError,
    create_compressor,
)

__all__ = [
    "LinkDecoder",
    "LinkEncoder",
    "LinkMessage",
    "ReferenceMismatch",
    "make_compressor",
]


class ReferenceMismatch(ValueError):
    """The receiver's reference for this sender is not the one the message used."""


def make_compressor(name: str, params: Mapping[str, Any] | None = None) -> Compressor:
    """A registered compressor for a link (error feedback off for ``topk``).

    ``fp16`` alone means float16 values of the plain (identity) delta.

    CHOCO's reference already keeps what was not sent (``x - x_hat`` is the
    residual), so top-k's own error-feedback memory would count it twice.
    """
    p = dict(params or {})
    if name == "topk":
        p.setdefault("error_feedback", False)
    if name == "fp16":
        p.setdefault("inner", "identity")  # plain half-precision models
    return create_compressor(name, **p)


@dataclass(frozen=True)
class LinkMessage:
    """One encoded model on a link.

    Attributes
    ----------
    data : bytes
        ``Payload.to_bytes()`` of ``C(x - x_hat)``.
    base_version : str
        Reference the delta is against (``""``: the zero vector).
    version : str
        Reference version after applying this message.
    decoded : torch.Tensor
        ``[d]`` what the receiver will add to its reference (sender side only).
    """

    data: bytes
    base_version: str
    version: str
    decoded: torch.Tensor


class LinkEncoder:
    """Sender end of one link: owns the reference the receiver is believed to hold.

    Parameters
    ----------
    compressor : Compressor
    dim : int
        Model length ``d``.
    """

    def __init__(self, compressor: Compressor, dim: int) -> None:
        self.compressor = compressor
        self.dim = dim
        # A fresh epoch per encoder, so a restarted sender never reuses versions.
        self._epoch = secrets.token_hex(4)
        self.reset()

    def reset(self) -> None:
        """Forget the shared reference: the next message is against zeros."""
        self.ref = torch.zeros(self.dim, dtype=torch.float32)
        self._counter = 0
        self.version = ""

    def encode(self, x: torch.Tensor, round: int, seed: int = 0) -> LinkMessage:
        """Encode ``x`` ``[d]`` against the current reference (no state change)."""
        payload = self.compressor.encode(
            (x - self.ref).to(torch.float32), round=max(0, round), seed=seed
        )
        decoded = self.compressor.decode(payload)
        new = f"{self._epoch}:{self._counter + 1}"
        return LinkMessage(payload.to_bytes(), self.version, new, decoded)

    def commit(self, msg: LinkMessage) -> None:
        """The receiver accepted ``msg``: advance the reference with it."""
        self.ref = self.ref + msg.decoded
        self._counter += 1
        self.version = msg.version


class LinkDecoder:
    """Receiver side: one reference per sender.

    Parameters
    ----------
    compressor : Compressor
        Decoder for the payloads (needs no sender state).
    dim : int
        Model length ``d``; payloads declaring another length are refused.
    """

    def __init__(self, compressor: Compressor, dim: int) -> None:
        self.compressor = compressor
        self.dim = dim
        self._refs: dict[str, tuple[str, torch.Tensor]] = {}

    def decode(
        self, sender: str, data: bytes | bytearray, base_version: str, version: str
    ) -> tuple[torch.Tensor, str]:
        """Reconstruct the sender's model; returns ``(x_hat [d], version)``.

        Nothing is stored: call :meth:`commit` once the whole message is accepted.

        Raises
        ------
        ReferenceMismatch
            ``base_version`` is not this receiver's reference for ``sender``.
        PayloadError
            Malformed, wrong-length or non-finite payload.
        """
        if not version:
            raise PayloadError("a link message must name its new reference version")
        if base_version:
            held = self._refs.get(sender)
            if held is None or held[0] != base_version:
                raise ReferenceMismatch(
                    f"reference {base_version!r} from {sender!r} unknown here "
                    f"(holding {held[0] if held else 'none'!r}); resend from zero"
                )
            ref = held[1]
        else:
            ref = torch.zeros(self.dim, dtype=torch.float32)
        payload = Payload.from_bytes(data, expected_d=self.dim)
        delta = self.compressor.decode(payload).to(torch.float32)
        if delta.shape != (self.dim,):
            raise PayloadError(f"decoded {list(delta.shape)}, expected [{self.dim}]")
        out = ref + delta
        if not bool(torch.isfinite(out).all()):
            raise PayloadError("reconstructed model holds non-finite values")
        return out, version

    def commit(self, sender: str, x_hat: torch.Tensor, version: str) -> None:
        self._refs[sender] = (version, x_hat)

    def forget(self, sender: str) -> None:
        self._refs.pop(sender, None)
