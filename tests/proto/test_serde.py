from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from fedplat.proto import common_pb2 as common
from fedplat.proto import fedplat_pb2 as pb
from fedplat.proto import serde
from fedplat.transport import codec
from fedplat.transport.errors import InvalidArgument
from fedplat.transport.messages import (
    EnrollRequest,
    ModelPayload,
    Task,
    TaskKind,
    UpdateHeader,
)
from fedplat.vectors import Layout, TensorSpec

LAYOUT = Layout((TensorSpec("w", (3, 2)), TensorSpec("b", (2,), "float16")))


def test_layout_and_enroll_roundtrip() -> None:
    assert serde.layout_from_proto(serde.layout_to_proto(LAYOUT)) == LAYOUT
    req = EnrollRequest("c", 5, LAYOUT, "id1", {"os": "linux"})
    assert serde.enroll_request_from_proto(serde.enroll_request_to_proto(req)) == req


def test_task_roundtrip() -> None:
    t = Task(TaskKind.TRAIN, "run", 3, "tid", 2, 123.5, {"lr": 0.1, "epochs": 1}, 0.5)
    assert serde.task_from_proto(serde.task_to_proto(t)) == t


def test_task_with_bad_config_json() -> None:
    with pytest.raises(InvalidArgument, match="not JSON"):
        serde.task_from_proto(pb.Task(kind=pb.Task.TRAIN, config_json="{oops"))


def test_model_chunks_roundtrip_and_checks() -> None:
    data = codec.encode_dense(torch.arange(8, dtype=torch.float32))
    p = ModelPayload(1, 1, LAYOUT, data, codec.sha256_hex(data))
    chunks = list(serde.model_to_chunks(p, chunk_bytes=5))
    assert len(chunks) == 1 + 7  # header + ceil(32 / 5)
    assert serde.model_from_chunks(iter(chunks), max_bytes=1024) == p
    with pytest.raises(InvalidArgument, match="exceeds"):
        serde.model_from_chunks(iter(chunks), max_bytes=16)
    with pytest.raises(InvalidArgument, match="declared"):
        serde.model_from_chunks(iter(chunks[:-1]), max_bytes=1024)


def test_update_chunks_roundtrip() -> None:
    data = np.arange(8, dtype="<f4").tobytes()
    h = UpdateHeader(
        "t",
        1,
        4,
        LAYOUT,
        len(data),
        hashlib.sha256(data).hexdigest(),
        metrics={"train_loss": 0.5},
    )
    h2, d2 = serde.update_from_chunks(serde.update_to_chunks(h, data, 7), max_bytes=100)
    assert h2 == h and d2 == data


def test_update_header_validation() -> None:
    with pytest.raises(InvalidArgument, match="not finite"):
        serde.update_header_from_proto(
            pb.UpdateHeader(task_id="t", metrics={"x": float("inf")})
        )
    with pytest.raises(InvalidArgument, match="task id"):
        serde.update_header_from_proto(pb.UpdateHeader())
    with pytest.raises(InvalidArgument, match="invalid layout"):
        serde.update_header_from_proto(
            pb.UpdateHeader(
                task_id="t",
                layout=common.Layout(tensors=[common.TensorSpec(name="", shape=[1])]),
            )
        )
    with pytest.raises(InvalidArgument, match="longer than"):
        serde.enroll_request_from_proto(pb.EnrollRequest(name="x" * 1000))


def test_codec_rejects_bad_payloads() -> None:
    good = np.ones(4, dtype="<f4").tobytes()
    assert codec.decode("dense-f32le", good, 4).tolist() == [1.0] * 4
    with pytest.raises(InvalidArgument, match="needs 16"):
        codec.decode("dense-f32le", good[:-1], 4)
    with pytest.raises(InvalidArgument, match="non-finite"):
        codec.decode(
            "dense-f32le", np.array([1, np.inf, 0, 0], dtype="<f4").tobytes(), 4
        )
    with pytest.raises(InvalidArgument, match="unknown encoding"):
        codec.decode("pickle", good, 4)


def test_dense_encoding_is_little_endian() -> None:
    assert codec.encode_dense(torch.tensor([1.0])) == b"\x00\x00\x80\x3f"
