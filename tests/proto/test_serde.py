"""Protobuf conversion: round trips, validation of hostile input, exact byte counts."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from fedplat.proto import common_pb2 as common
from fedplat.proto import fedplat_pb2 as pb
from fedplat.proto import serde, streams
from fedplat.proto.streams import GRPC_FRAME_BYTES, Malformed
from fedplat.protocol.body import EncodedBody, dense_body
from fedplat.protocol.errors import InvalidArgument
from fedplat.protocol.messages import (
    EnrollRequest,
    ModelPayload,
    Task,
    TaskKind,
    UpdateHeader,
)
from fedplat.protocol.task import CompressionSpec, TaskConfig, TrainingSettings
from fedplat.vectors import Layout, TensorSpec

LAYOUT = Layout((TensorSpec("w", (3, 2)), TensorSpec("b", (2,), "float16")))


def test_layout_and_enroll_roundtrip() -> None:
    assert serde.layout_from_proto(serde.layout_to_proto(LAYOUT)) == LAYOUT
    req = EnrollRequest(
        "c", 5, LAYOUT, "id1", {"os": "linux"}, b"k" * 32, b"n" * 32, b"s" * 64, "tok"
    )
    assert serde.enroll_request_from_proto(serde.enroll_request_to_proto(req)) == req


def test_task_roundtrip() -> None:
    cfg = TaskConfig(
        training=TrainingSettings(epochs=2, lr=0.1),
        compression=CompressionSpec("topk", {"ratio": 0.1}),
        compression_seed=7,
        seed=3,
    )
    t = Task(TaskKind.TRAIN, "run", 3, "tid", 2, 123.5, cfg, 0.5, b"nonce")
    assert serde.task_from_proto(serde.task_to_proto(t)) == t
    assert cfg.train_config() == {
        "epochs": 2, "batch_size": 32, "lr": 0.1, "optimizer": "sgd",
        "momentum": 0.0, "max_steps": None, "seed": 3,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("config_json", "match"),
    [
        ("{oops", "not JSON"),
        ("[1]", "JSON object"),
        ('{"training": {"epochs": "many"}}', "epochs: Input should be a valid integer"),
        ('{"training": {"lr": NaN}}', "finite"),
        ('{"privacy": {"mode": "huh", "clip_norm": 1, "noise_multiplier": 1}}', "mode"),
    ],
)
def test_task_with_bad_config(config_json: str, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        serde.task_from_proto(pb.Task(kind=pb.Task.TRAIN, config_json=config_json))


def test_model_stream_into_a_buffer_with_exact_byte_count() -> None:
    v = torch.arange(8, dtype=torch.float32)
    data = v.numpy().tobytes()
    layout = Layout((TensorSpec("w", (8,)),))
    p = ModelPayload(1, 1, layout, data, hashlib.sha256(data).hexdigest())
    messages = streams.model_messages(p, chunk_bytes=5)
    assert len(messages) == 1 + 7  # header + ceil(32 / 5)
    # The hand-built chunk messages are exactly protobuf's serialization.
    assert messages[1:] == [
        pb.ModelChunk(data=data[i : i + 5]).SerializeToString() for i in range(0, 32, 5)
    ]
    assert streams.model_wire_bytes(p, 5) == sum(
        len(m) + GRPC_FRAME_BYTES for m in messages
    )
    chunks = [pb.ModelChunk.FromString(m) for m in messages]
    out = torch.empty(8)
    info = streams.receive_model(iter(chunks), out, max_bytes=1024)
    assert torch.equal(out, v) and info.layout == layout and info.model_version == 1
    with pytest.raises(InvalidArgument, match="needs 36"):
        streams.receive_model(iter(chunks), torch.empty(9), max_bytes=1024)
    with pytest.raises(InvalidArgument, match="truncated"):
        streams.receive_model(iter(chunks[:-1]), out, max_bytes=1024)
    tampered = [*chunks[:-1], pb.ModelChunk(data=b"\x00\x00")]
    with pytest.raises(InvalidArgument, match="checksum"):
        streams.receive_model(iter(tampered), out, max_bytes=1024)
    with pytest.raises(InvalidArgument, match="second header"):
        streams.receive_model(iter([chunks[0], chunks[0]]), out, max_bytes=1024)


def _header(body: EncodedBody) -> UpdateHeader:
    return UpdateHeader(
        "t", 1, 4, LAYOUT, body.nbytes, body.sha256, metrics={"train_loss": 0.5},
        signature=b"s" * 64,
    )  # fmt: skip


def test_update_stream_round_trip_and_exact_byte_count() -> None:
    body = dense_body(torch.arange(8, dtype=torch.float32))
    h = _header(body)
    msgs = list(streams.update_to_chunks(h, body, 7))
    raw = [m.SerializeToString() for m in msgs]
    assert streams.update_wire_bytes(h, body.nbytes, 7) == sum(
        len(r) + GRPC_FRAME_BYTES for r in raw
    )
    parsed = [streams.parse_update_chunk(r) for r in raw]
    first = parsed[0]
    assert isinstance(first, pb.UpdateChunk)
    assert streams.update_header_from_proto(first.header) == h
    # Data chunks come back as views of the received bytes, not copies.
    assert all(isinstance(p, memoryview) for p in parsed[1:])
    assert b"".join(bytes(p) for p in parsed[1:]) == body.tobytes()


def test_garbage_parses_as_malformed_not_an_exception() -> None:
    for raw in (b"\xff\xff\xff", b"\x12\x05ab", b"\x0a\x80"):
        out = streams.parse_update_chunk(raw)
        assert isinstance(out, Malformed), raw
    assert isinstance(
        streams.parse_or_malformed(pb.EnrollRequest, b"\x0a\xff"), Malformed
    )


def test_update_header_validation() -> None:
    with pytest.raises(InvalidArgument, match="not finite"):
        streams.update_header_from_proto(
            pb.UpdateHeader(task_id="t", metrics={"x": float("inf")})
        )
    with pytest.raises(InvalidArgument, match="keys must be"):
        streams.update_header_from_proto(
            pb.UpdateHeader(task_id="t", metrics={"k" * 65: 1.0})
        )
    with pytest.raises(InvalidArgument, match="task id"):
        streams.update_header_from_proto(pb.UpdateHeader())
    with pytest.raises(InvalidArgument, match="invalid layout"):
        streams.update_header_from_proto(
            pb.UpdateHeader(
                task_id="t",
                layout=common.Layout(tensors=[common.TensorSpec(name="", shape=[1])]),
            )
        )
    many = common.Layout(tensors=[common.TensorSpec(name=f"t{i}") for i in range(3)])
    with pytest.raises(InvalidArgument, match="3 tensors"):
        streams.update_header_from_proto(pb.UpdateHeader(task_id="t", layout=many), 2)
    with pytest.raises(InvalidArgument, match="at most 128 characters"):
        serde.enroll_request_from_proto(pb.EnrollRequest(name="x" * 129))
    with pytest.raises(InvalidArgument, match="non-blank"):
        serde.enroll_request_from_proto(pb.EnrollRequest(name="   "))
    with pytest.raises(InvalidArgument, match="printable"):
        serde.enroll_request_from_proto(pb.EnrollRequest(name="a\x00b"))
    for bad in ("", " ", "a b", "x" * 65, "é"):
        if bad:
            with pytest.raises(InvalidArgument, match="malformed client id"):
                serde.enroll_request_from_proto(
                    pb.EnrollRequest(name="n", client_id=bad)
                )
    with pytest.raises(InvalidArgument, match="num_examples"):
        serde.enroll_request_from_proto(pb.EnrollRequest(name="n", num_examples=2**31))
    with pytest.raises(InvalidArgument, match="num_examples"):
        streams.update_header_from_proto(pb.UpdateHeader(task_id="t", num_examples=-1))
    with pytest.raises(InvalidArgument, match="round must be"):
        serde.metrics_from_proto(pb.MetricsReport(task_id="t", round=-1))


def test_dense_body_is_little_endian_and_views_the_tensor() -> None:
    v = torch.tensor([1.0, 2.0])
    body = dense_body(v)
    assert body.tobytes()[-8:] == np.array([1.0, 2.0], dtype="<f4").tobytes()
    v[0] = 3.0  # the body is a view of the vector's memory
    assert body.parts[1].tobytes()[:4] == np.array([3.0], dtype="<f4").tobytes()
