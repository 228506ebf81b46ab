"""Throughput of the coordinator protocol's payload path against a memory copy.

Each operation runs on one ``d``-parameter float32 update (or model), timed
round-robin with ``numpy.copyto`` of the same bytes into a preallocated buffer,
after one warm-up each; ``*_ratio_to_memcpy`` is the median over repetitions of
``memcpy seconds / operation seconds`` (1.0: as fast as the copy).

* ``upload_encode`` (SDK, per upload): ``dense_body`` (SHA-256 over the
  vector's own memory) and ``update_messages`` (the serialized chunk messages);
* ``upload_decode`` (coordinator, per upload): ``parse_update_chunk`` per
  message (header parsed, data as views), the header's checks, an incremental
  SHA-256, ``PayloadSink`` into a preallocated row, the finiteness-and-norm
  check of :mod:`fedplat.server.intake`;
* ``download_encode`` (coordinator, once per model version):
  ``model_messages``;
* ``download_decode`` (SDK, per download): ``receive_model`` into the client's
  vector (chunks as views, SHA-256 checked).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch

MiB = 1024 * 1024


def _timed(
    ops: dict[str, Callable[[], object]], repeats: int
) -> dict[str, list[float]]:
    for op in ops.values():
        op()
    out: dict[str, list[float]] = {k: [] for k in ops}
    for _ in range(repeats):
        for name, op in ops.items():
            t0 = time.perf_counter()
            op()
            out[name].append(time.perf_counter() - t0)
    return out


def payload_ops(numel: int, chunk: int) -> dict[str, Callable[[], object]]:
    """The four operations and the memory copy, over one random vector."""
    from fedplat.server.intake import checked_norm

    from bench.fleet import flat_model
    from fedplat.proto import fedplat_pb2 as pb
    from fedplat.proto import streams
    from fedplat.protocol.body import dense_body
    from fedplat.protocol.codec import PayloadSink
    from fedplat.protocol.messages import ModelPayload, UpdateHeader
    from fedplat.vectors import layout_of

    layout = layout_of(flat_model((1, 8, 8), 10, numel))
    vec = torch.randn(numel, generator=torch.Generator().manual_seed(0)) * 1e-3
    head = UpdateHeader("task", 1, 10, layout, 0, "")

    def upload_encode() -> list[bytes]:
        body = dense_body(vec)
        h = replace(head, total_bytes=body.nbytes, sha256=body.sha256)
        return list(streams.update_messages(h, body, chunk))

    messages = upload_encode()
    row = torch.empty(numel, dtype=torch.float32)

    def refuse(payload: Any) -> torch.Tensor:
        raise AssertionError("a dense payload never reaches the decoder")

    def upload_decode() -> float:
        first = streams.parse_update_chunk(messages[0])
        assert isinstance(first, pb.UpdateChunk)
        h = streams.update_header_from_proto(first.header)
        digest = hashlib.sha256()
        sink = PayloadSink(row, h.total_bytes, refuse, seed=0, round=1)
        for raw in messages[1:]:
            view = streams.parse_update_chunk(raw)
            assert isinstance(view, memoryview)
            digest.update(view)
            sink.write(view)
        assert digest.hexdigest() == h.sha256
        return checked_norm(sink.finish())

    data = vec.numpy().view(np.uint8)
    model = ModelPayload(1, 1, layout, data.data, hashlib.sha256(data.data).hexdigest())
    model_msgs = streams.model_messages(model, chunk)
    received = torch.empty(numel, dtype=torch.float32)

    def download_decode() -> object:
        parts = (streams.parse_model_chunk(m) for m in model_msgs)
        return streams.receive_model(parts, received, 8 * numel)

    dst = np.empty_like(data)
    return {
        "memcpy": lambda: np.copyto(dst, data),
        "upload_encode": upload_encode,
        "upload_decode": upload_decode,
        "download_encode": lambda: streams.model_messages(model, chunk),
        "download_decode": download_decode,
    }


def payload_speed(numel: int, repeats: int, chunk: int = 4 * MiB) -> dict[str, Any]:
    """GB/s of each operation and its ratio to the memory copy (module doc)."""
    torch.set_num_threads(1)
    times = _timed(payload_ops(numel, chunk), repeats)
    nbytes = 4 * numel
    out: dict[str, Any] = {
        "params": numel,
        "bytes": nbytes,
        "chunk_bytes": chunk,
        "repeats": repeats,
        "threads": 1,
        "statistic": "median over interleaved repetitions after one warm-up",
    }
    copy = times["memcpy"]
    for name, ts in times.items():
        out[f"{name}_gbps"] = round(nbytes / float(np.median(ts)) / 1e9, 3)
        if name != "memcpy":
            ratios = [c / t for c, t in zip(copy, ts, strict=True)]
            out[f"{name}_ratio_to_memcpy"] = round(float(np.median(ratios)), 3)
    return out


__all__ = ["payload_ops", "payload_speed"]
