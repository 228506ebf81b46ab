"""The uplink codec: the one encode path of an update and its one decode path.

:func:`encode_payload` is the client half: compress a ``[d]`` update with the
task's compressor and, under local DP, clip and noise what leaves the device
(the SDK's ``fedplat.client.uplink.UplinkLayer`` and the Flower mod both call
it). The rest is the coordinator's half.

:class:`PayloadSink` takes the bytes of one ``fedplat-payload-v1`` upload in
whatever pieces the transport delivers and writes the decoded ``[d]`` float32
update into a row the caller owns (a row of the round's ``[n, d]`` buffer, or a
scratch row). A dense float32 payload is copied straight from the received
chunks into the row; any other payload (sparse, sketch, float16) is at most as
large as the dense one, is collected into one buffer of exactly its declared
length and decoded by the run's compressor into the same row. Nothing is ever
unpickled, and nothing sized by the sender is allocated before the header that
declares it has been checked against the run.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from fedplat.compression import Compressor
from fedplat.compression.wire import (
    HEADER_SIZE,
    Payload,
    PayloadError,
    PayloadHeader,
    parse_header,
)
from fedplat.privacy import GaussianMechanism, privatize_payload

Decoder = Callable[[Payload], torch.Tensor]


def encode_payload(
    compressor: Compressor,
    update: torch.Tensor,
    *,
    round: int,
    seed: int,
    mechanism: GaussianMechanism | None = None,
    generator: torch.Generator,
) -> Payload:
    """Compress ``update`` ``[d]`` float32 and, with a local DP ``mechanism``,
    clip and noise the payload's values (``generator``: the client's own noise).

    ``compressor`` keeps its state (error feedback, DGC momentum) across calls;
    ``seed`` is the run's public sketch seed. Errors are the compressor's and
    :class:`~fedplat.privacy.PrivacyError`.
    """
    payload = compressor.encode(update, round=round, seed=seed)
    if mechanism is not None:
        payload = privatize_payload(payload, mechanism, generator=generator)
    return payload


def max_payload_bytes(d: int) -> int:
    """The largest acceptable upload for a model of ``d`` parameters.

    Every encoding is at most as large as the dense float32 payload (sparse
    payloads fall back to dense when they would not be smaller, sketches are
    smaller by construction), so the dense size bounds them all.
    """
    return HEADER_SIZE + 4 * d


def check_payload_size(total: int, d: int) -> None:
    """Raise :class:`PayloadError` unless ``total`` bytes can be an upload
    payload for a model of ``d`` parameters."""
    if not HEADER_SIZE <= total <= max_payload_bytes(d):
        raise PayloadError(
            f"an update of {total} bytes cannot be a payload for {d} "
            f"parameters (at most {max_payload_bytes(d)})"
        )


class PayloadSink:
    """Decode one upload into ``out`` (``[d]`` float32) as its bytes arrive.

    Parameters
    ----------
    out : torch.Tensor
        ``[d]`` float32, contiguous; overwritten.
    total : int
        The payload length the upload's header declared (checked against the
        payload's own header, and at :meth:`finish`).
    decoder : callable
        The run's compressor ``decode`` for non-dense payloads.
    seed, round : int
        What a sketch payload must carry (public sketch seed, current round).
    d : int, optional
        The model's parameter count when ``out`` is not ``[d]`` (a round that
        sums sketches decodes each payload into its ``[b]`` sketch values; a
        dense payload is then refused by the decoder).
    """

    def __init__(
        self,
        out: torch.Tensor,
        total: int,
        decoder: Decoder,
        *,
        seed: int,
        round: int,
        d: int | None = None,
    ) -> None:
        if out.dtype != torch.float32 or out.dim() != 1 or not out.is_contiguous():
            raise ValueError("out must be a contiguous float32 vector")
        d = out.numel() if d is None else d
        check_payload_size(total, d)
        self.out = out
        self.d = d
        self.total = total
        self._decoder = decoder
        self._seed, self._round = seed, round
        self._head = bytearray()
        self.header: PayloadHeader | None = None
        self._dense: np.ndarray | None = None  # out's bytes, dense float32 path
        self._buf: bytearray | None = None  # everything else
        self.received = 0

    def write(self, data: memoryview | bytes) -> None:
        """Take the next piece of the payload."""
        view = memoryview(data).cast("B")
        if self.received + len(view) > self.total:
            raise PayloadError(f"upload longer than its declared {self.total} bytes")
        self.received += len(view)
        if self.header is None:
            need = HEADER_SIZE - len(self._head)
            self._head += view[:need]
            view = view[need:]
            if len(self._head) < HEADER_SIZE:
                return
            self._start()
        if self._dense is not None:
            at = self.received - len(view) - HEADER_SIZE
            self._dense[at : at + len(view)] = np.frombuffer(view, dtype=np.uint8)
        else:
            assert self._buf is not None
            self._buf += view

    def _start(self) -> None:
        h = parse_header(
            bytes(self._head),
            expected_d=self.d,
            expected_seed=self._seed,
            expected_round=self._round,
        )
        if h.length != self.total:
            raise PayloadError(
                f"payload header implies {h.length} bytes, the upload declared "
                f"{self.total}"
            )
        self.header = h
        if h.kind == "dense" and h.dtype == torch.float32 and self.out.numel() == h.d:
            self._dense = self.out.view(torch.uint8).numpy()
        else:
            self._buf = bytearray(self._head)

    def finish(self) -> torch.Tensor:
        """The decoded update (``out``); raises if bytes are missing."""
        if self.received != self.total or self.header is None:
            raise PayloadError(
                f"upload truncated: {self.received} of {self.total} bytes"
            )
        if self._buf is not None:
            payload = Payload.from_bytes(
                self._buf,
                expected_d=self.d,
                expected_seed=self._seed,
                expected_round=self._round,
            )
            self._buf = None
            values = self._decoder(payload)
            if values.numel() != self.out.numel():
                raise PayloadError(
                    f"decoded {values.numel()} values, expected {self.out.numel()}"
                )
            self.out.copy_(values.to(torch.float32))
        return self.out


__all__ = [
    "Decoder",
    "PayloadSink",
    "check_payload_size",
    "encode_payload",
    "max_payload_bytes",
]
