"""No single caller stops a run: a property test over the coordinator's handlers.

Hypothesis drives every method of ``fedplat.v1.Coordinator``, over real gRPC on
127.0.0.1, with arbitrary credentials metadata (empty, blank, long, unknown or
another client's id; any token) and arbitrary message fields or raw bytes, from
outsiders and from an enrolled insider. After every example the run must still
be ``running``, the recorder's next batch must write, and no call may have been
answered INTERNAL or UNKNOWN. At the end two honest clients complete a round and
``fedplat store check`` passes.

The first regression it holds: a call whose client-id metadata was empty reached
the event buffer, the store refused the event, the round close failed and the
run was marked ``failed``.
"""

from __future__ import annotations

import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fedplat.server.app import BackgroundServer
from fedplat.server.config import parse_config
from fedplat.server.servicer import SERVICE
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fedplat.proto import fedplat_pb2 as pb
from fedplat.store import Store
from fedplat.store.check import check_store
from fedplat.testing.protocol import RawClient, dense_payload_bytes
from fedplat.transport.grpc import CLIENT_ID_KEY, TOKEN_KEY
from tests.support import issue_tokens, run_config, wait_for

ASCII = "".join(chr(c) for c in range(0x20, 0x7F))
#: What a caller may put in a metadata value (gRPC refuses other characters
#: before sending).
meta_text = st.one_of(
    st.just(""),
    st.just(" "),
    st.text(alphabet=ASCII, max_size=80),
    st.text(alphabet=string.hexdigits, min_size=16, max_size=16),
)
any_int = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0, -1, 2**31 - 1, 2**31, 2**32, 2**63 - 1]),
)
names = st.text(max_size=300)
metrics = st.dictionaries(
    st.text(max_size=80), st.floats(allow_nan=True, allow_infinity=True), max_size=70
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp: Path = tmp_path_factory.mktemp("isolation")
    raw = run_config(
        tmp,
        rounds=2,
        clients=3,  # the insider may be selected too; the honest two are a quorum
        quorum=2,
        min_available=2,
        deadlines={"round_seconds": 600, "close_after_quorum_seconds": 0.5},
        server={"stream_idle_seconds": 2.0, "receive_seconds": 2.0},
        admission={"enrol_per_second": 1000.0, "enrol_burst": 1000},
    )
    srv = BackgroundServer(parse_config(raw)).start()
    address = f"127.0.0.1:{srv.port}"
    honest = []
    for name, token in zip(("a", "b"), issue_tokens(raw, 2), strict=True):
        c = RawClient(address, srv.coord.layout, name=name, token=token)
        c.enroll()
        honest.append(c)
    (token,) = issue_tokens(raw, 1)
    insider = RawClient(address, srv.coord.layout, name="insider", token=token)
    insider.enroll()
    try:
        yield {"srv": srv, "raw": raw, "honest": honest, "insider": insider}
    finally:
        srv.stop()


def _metadata(ctx: dict[str, Any], who: str, cid: str, tok: str) -> Any:
    insider: RawClient = ctx["insider"]
    if who == "insider":
        return insider.md
    if who == "other_id":  # the insider's token with an honest client's id
        return ((CLIENT_ID_KEY, ctx["honest"][0].client_id), (TOKEN_KEY, tok))
    if who == "none":
        return ()
    return ((CLIENT_ID_KEY, cid), (TOKEN_KEY, tok))


def _message(method: str, data: st.DataObject, ctx: dict[str, Any]) -> bytes:
    """Raw request bytes for ``method``: garbage, or a message with any fields."""
    if data.draw(st.booleans(), label="raw bytes"):
        return data.draw(st.binary(max_size=200), label="bytes")
    insider: RawClient = ctx["insider"]
    if method == "Challenge":
        msg: Any = pb.ChallengeRequest(client_id=data.draw(names, label="id"))
    elif method == "Enroll":
        req = insider.enroll_request()
        req.name = data.draw(names, label="name")
        req.num_examples = data.draw(any_int, label="examples")
        req.client_id = data.draw(names, label="id")
        req.info.update(data.draw(st.dictionaries(names, names, max_size=3)))
        msg = req
    elif method == "GetTask":
        msg = pb.GetTaskRequest(
            wait_seconds=data.draw(st.floats(allow_nan=True), label="wait")
        )
    elif method == "ReportMetrics":
        msg = pb.MetricsReport(
            task_id=data.draw(names, label="task"),
            round=data.draw(any_int, label="round"),
        )
        msg.metrics.update(data.draw(metrics, label="metrics"))
    elif method == "DownloadModel":
        msg = pb.DownloadRequest(task_id=data.draw(names, label="task"))
    else:
        msg = pb.SecAggRequest(
            task_id=data.draw(names, label="task"),
            round=data.draw(any_int, label="round"),
            message=data.draw(st.binary(max_size=64)),
        )
    return bytes(msg.SerializeToString())


def _upload_chunks(data: st.DataObject, ctx: dict[str, Any]) -> list[bytes]:
    insider: RawClient = ctx["insider"]
    task = pb.Task(
        task_id=data.draw(names, label="task"), round=data.draw(any_int, label="rnd")
    )
    payload = data.draw(st.binary(max_size=256), label="payload")
    header = insider.header(
        task,
        payload,
        num_examples=data.draw(any_int, label="examples"),
        metrics=data.draw(metrics, label="metrics"),
        total_bytes=data.draw(any_int, label="total"),
    )
    return [
        header.SerializeToString(),
        *(c.SerializeToString() for c in insider.body(payload)),
    ]


def _call(ctx: dict[str, Any], method: str, md: Any, request: Any) -> None:
    ch = ctx["insider"].channel
    ident: Any = lambda b: b  # noqa: E731 - the bytes go out as they are
    path = f"/{SERVICE}/{method}"
    if method == "UploadUpdate":
        ch.stream_unary(path, ident, ident)(iter(request), metadata=md, timeout=10)
    elif method == "DownloadModel":
        list(ch.unary_stream(path, ident, ident)(request, metadata=md, timeout=10))
    else:
        ch.unary_unary(path, ident, ident)(request, metadata=md, timeout=10)


METHODS = [
    "Challenge",
    "Enroll",
    "GetTask",
    "ReportMetrics",
    "DownloadModel",
    "SecAgg",
    "UploadUpdate",
]


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
@example(data=None)  # the regression: an empty client id on every call
def test_no_call_stops_the_run(served: dict[str, Any], data: Any) -> None:
    srv: BackgroundServer = served["srv"]
    codes = []
    if data is None:
        calls = [(m, "fields", "", "x", None) for m in METHODS]
    else:
        calls = []
        for _ in range(data.draw(st.integers(1, 4), label="calls")):
            method = data.draw(st.sampled_from(METHODS), label="method")
            who = data.draw(
                st.sampled_from(["fields", "insider", "other_id", "none"]), label="who"
            )
            cid = data.draw(meta_text, label="client id")
            tok = data.draw(meta_text, label="token")
            calls.append((method, who, cid, tok, data))
    for method, who, cid, tok, d in calls:
        md = _metadata(served, who, cid, tok)
        if method == "UploadUpdate":
            request: Any = _upload_chunks(d, served) if d is not None else [b"\x0a\x00"]
        else:
            request = _message(method, d, served) if d is not None else b""
        try:
            _call(served, method, md, request)
        except grpc.RpcError as exc:
            codes.append(exc.code())
    assert grpc.StatusCode.INTERNAL not in codes
    assert grpc.StatusCode.UNKNOWN not in codes
    srv.coord.ctx.recorder.flush()  # the next batch writes
    run = srv.coord.run_record
    assert run.status in ("pending", "running"), run.reason


def test_after_the_storm_honest_clients_complete_the_run(
    served: dict[str, Any],
) -> None:
    srv: BackgroundServer = served["srv"]
    payload = dense_payload_bytes(np.full(srv.coord.layout.numel, 1e-3, dtype="<f4"))
    for _ in range(2):
        for c in served["honest"]:
            assert c.upload(c.update(c.task(), payload)).accepted
        number = srv.coord.completed_rounds + 1
        wait_for(lambda n=number: srv.coord.completed_rounds >= n, 60, "a round")
    wait_for(lambda: srv.coord.finished, 60, "the run")
    store = Store(served["raw"]["store"]["url"], migrate=False)
    assert store.get_run(srv.coord.run_id).status == "completed"  # type: ignore[union-attr]
    assert check_store(store) == []
