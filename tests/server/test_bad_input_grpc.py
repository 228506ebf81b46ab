"""Bad input over real gRPC: each is refused with INVALID_ARGUMENT and a reason, the
round goes on with the honest client, and an event is stored."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from fedplat.server.app import Coordinator
from fedplat.server.config import parse_config

from fedplat.proto import fedplat_pb2 as pb
from fedplat.proto import fedplat_pb2_grpc as pb_grpc
from fedplat.proto import serde
from fedplat.vectors import Layout, TensorSpec
from tests.support import run_config, wait_for


class RawClient:
    """Speaks the wire protocol by hand, so tests can send anything."""

    def __init__(self, address: str, name: str, layout: Layout) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        self.layout = layout
        resp = self.stub.Enroll(
            pb.EnrollRequest(
                name=name, num_examples=10, layout=serde.layout_to_proto(layout)
            ),
            timeout=10,
        )
        self.md = (
            ("x-fedplat-client", resp.client_id),
            ("x-fedplat-token", resp.token),
        )

    def task(self) -> pb.Task:
        while True:
            t = self.stub.GetTask(
                pb.GetTaskRequest(wait_seconds=2), metadata=self.md, timeout=10
            )
            if t.kind == pb.Task.TRAIN:
                return t

    def upload(self, chunks: list[pb.UpdateChunk]) -> pb.UploadAck:
        return self.stub.UploadUpdate(iter(chunks), metadata=self.md, timeout=10)


def header(task: pb.Task, data: bytes, layout: Layout, **kw: object) -> pb.UpdateChunk:
    h = pb.UpdateHeader(
        task_id=task.task_id,
        round=task.round,
        num_examples=10,
        layout=serde.layout_to_proto(layout),
        encoding="dense-f32le",
        total_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )
    for k, v in kw.items():
        setattr(h, k, v)
    return pb.UpdateChunk(header=h)


def body(data: bytes) -> list[pb.UpdateChunk]:
    return [
        pb.UpdateChunk(data=data[i : i + 65536]) for i in range(0, len(data), 65536)
    ]


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    cfg = parse_config(
        run_config(
            tmp_path,
            rounds=1,
            clients=2,
            quorum=1,
            server={"max_update_bytes": 200_000},
        )
    )
    coord = Coordinator(cfg)
    coord.start()
    yield coord
    coord.stop(grace=0)


def _zeros(layout: Layout) -> bytes:
    return np.zeros(layout.numel, dtype="<f4").tobytes()


def _nan(layout: Layout) -> bytes:
    a = np.zeros(layout.numel, dtype="<f4")
    a[7] = np.nan
    return a.tobytes()


def _wrong_layout(layout: Layout) -> Layout:
    s0 = layout.specs[0]
    bad = TensorSpec(s0.name, (s0.shape[0] + 1, *s0.shape[1:]), s0.dtype)
    return Layout((bad, *layout.specs[1:]))


CASES = {
    "no header": lambda t, L: body(_zeros(L)),
    "checksum mismatch": lambda t, L: [
        header(t, _zeros(L), L, sha256="0" * 64),
        *body(_zeros(L)),
    ],
    "truncated stream": lambda t, L: [header(t, _zeros(L), L), *body(_zeros(L)[:-4])],
    "second header": lambda t, L: [header(t, _zeros(L), L), header(t, _zeros(L), L)],
    "oversize declared": lambda t, L: [header(t, _zeros(L), L, total_bytes=10**9)],
    "wrong byte count": lambda t, L: [
        header(t, _zeros(L)[:-8], L),
        *body(_zeros(L)[:-8]),
    ],
    "wrong layout": lambda t, L: [
        header(t, _zeros(L), _wrong_layout(L)),
        *body(_zeros(L)),
    ],
    "nan values": lambda t, L: [header(t, _nan(L), L), *body(_nan(L))],
    "unknown encoding": lambda t, L: [
        header(t, _zeros(L), L, encoding="pickle"),
        *body(_zeros(L)),
    ],
    "negative examples": lambda t, L: [
        header(t, _zeros(L), L, num_examples=-1),
        *body(_zeros(L)),
    ],
}
REASONS = {
    "no header": "must start with a header",
    "checksum mismatch": "checksum",
    "truncated stream": "declared",
    "second header": "second header",
    "oversize declared": "exceeds the limit",
    "wrong byte count": "bytes",
    "wrong layout": "layout",
    "nan values": "non-finite",
    "unknown encoding": "unknown encoding",
    "negative examples": "num_examples",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_update_rejected_round_goes_on(coordinator: Coordinator, case: str) -> None:
    layout = coordinator.engine.layout
    address = f"127.0.0.1:{coordinator.port}"
    bad, good = RawClient(address, "bad", layout), RawClient(address, "good", layout)
    t_bad = bad.task()
    with pytest.raises(grpc.RpcError) as info:
        bad.upload(CASES[case](t_bad, layout))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert REASONS[case] in info.value.details(), info.value.details()

    # The honest client completes the round; the coordinator is unharmed.
    t_good = good.task()
    data = np.full(layout.numel, 1e-3, dtype="<f4").tobytes()
    ack = good.upload([header(t_good, data, layout), *body(data)])
    assert ack.accepted
    store, run_id = coordinator.store, coordinator.engine.run_id
    wait_for(lambda: coordinator.engine.finished, 60, "the round to close")
    rnd = store.get_round(run_id, 1)
    assert rnd is not None and rnd.status == "completed" and rnd.num_succeeded == 1
    events = store.list_events(run_id, kind="update_rejected")
    assert len(events) == 1 and REASONS[case] in events[0].message
    statuses = {p.client_id: p.status for p in store.list_participations(run_id, 1)}
    assert sorted(statuses.values()) == ["rejected", "succeeded"]


def test_duplicate_and_late_updates(coordinator: Coordinator) -> None:
    layout = coordinator.engine.layout
    address = f"127.0.0.1:{coordinator.port}"
    a, b = RawClient(address, "a", layout), RawClient(address, "b", layout)
    ta, tb = a.task(), b.task()
    data = _zeros(layout)
    assert a.upload([header(ta, data, layout), *body(data)]).accepted
    with pytest.raises(grpc.RpcError) as info:
        a.upload([header(ta, data, layout), *body(data)])
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert b.upload([header(tb, data, layout), *body(data)]).accepted
    wait_for(lambda: coordinator.engine.finished, 60, "the round to close")
    with pytest.raises(grpc.RpcError) as info:  # round 1 is over now
        b.upload([header(tb, data, layout), *body(data)])
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "closed" in info.value.details()


def test_unknown_client_and_bad_token(coordinator: Coordinator) -> None:
    stub = pb_grpc.CoordinatorStub(
        grpc.insecure_channel(f"127.0.0.1:{coordinator.port}")
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.GetTask(
            pb.GetTaskRequest(),
            metadata=(("x-fedplat-client", "nobody"), ("x-fedplat-token", "x")),
            timeout=5,
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    c = RawClient(f"127.0.0.1:{coordinator.port}", "c", coordinator.engine.layout)
    with pytest.raises(grpc.RpcError) as info:
        stub.GetTask(
            pb.GetTaskRequest(),
            metadata=(c.md[0], ("x-fedplat-token", "forged")),
            timeout=5,
        )
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_enrolment_with_wrong_model_is_refused(coordinator: Coordinator) -> None:
    stub = pb_grpc.CoordinatorStub(
        grpc.insecure_channel(f"127.0.0.1:{coordinator.port}")
    )
    wrong = _wrong_layout(coordinator.engine.layout)
    with pytest.raises(grpc.RpcError) as info:
        stub.Enroll(
            pb.EnrollRequest(
                name="x", num_examples=1, layout=serde.layout_to_proto(wrong)
            ),
            timeout=5,
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "layout does not match" in info.value.details()
    assert "shape" in info.value.details()


def test_garbage_bytes_at_the_socket_do_not_crash(coordinator: Coordinator) -> None:
    import socket

    with socket.create_connection(("127.0.0.1", coordinator.port)) as s:
        s.sendall(b"\x00" * 9 + struct.pack(">I", 12345) + b"garbage" * 100)
    RawClient(f"127.0.0.1:{coordinator.port}", "after", coordinator.engine.layout)
