"""Peer protocol and peer node in one process: validation, exchange, bootstrap
(over mutual TLS, as deployed)."""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

import pytest
import torch

from fedplat.compression import Payload, create_compressor, dense_payload
from fedplat.gossip.links import LinkDecoder, LinkEncoder, ReferenceMismatch
from fedplat.gossip.neighbours import NeighbourTable
from fedplat.gossip.node import PeerNode
from fedplat.gossip.pki import ClusterFiles
from fedplat.gossip.setup import NodeData, build_model
from fedplat.gossip.signing import Signer
from fedplat.proto import peer_pb2 as pb
from fedplat.proto import peer_serde as serde
from fedplat.protocol.errors import (
    InvalidArgument,
    ResourceExhausted,
    StaleUpdate,
    UnknownClient,
)
from fedplat.protocol.peer import Hello, ModelHeader, ModelMessage, PeerAddress
from fedplat.vectors import Layout, TensorSpec, flatten
from tests.support import free_port, wait_for
from tests.support.gossip import (
    MODEL,
    SPARE,
    client_as,
    make_peer,
    make_ring,
    observer,
    peer_files,
    run_peers,
)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> ClusterFiles:
    """CA, certificates, keys and membership of peers 0-3 (and a spare member)."""
    return peer_files(tmp_path_factory.mktemp("pki"), [str(i) for i in range(4)])


# ------------------------------------------------------------------ pure parts


def test_serde_round_trips_and_refuses_bad_streams() -> None:
    layout = Layout((TensorSpec("w", (2, 3)),))
    data = b"x" * 10
    h = ModelHeader(
        "a",
        3,
        layout,
        7,
        2,
        0.5,
        "e:1",
        "e:2",
        len(data),
        hashlib.sha256(data).hexdigest(),
        "b",
        123,
        b"n" * 16,
        b"s" * 64,
    )
    msg = ModelMessage(h, data)
    back = serde.model_from_chunks(list(serde.model_to_chunks(msg, 4)), 100)
    assert back == msg
    with pytest.raises(ResourceExhausted, match="oversize"):
        serde.model_from_chunks(serde.model_to_chunks(msg, 4), 9)
    chunks = list(serde.model_to_chunks(msg, 4))
    with pytest.raises(InvalidArgument, match="truncated"):
        serde.model_from_chunks(chunks[:-1], 100)
    with pytest.raises(InvalidArgument, match="start with a header"):
        serde.model_from_chunks(chunks[1:], 100)
    with pytest.raises(InvalidArgument, match="second header"):
        serde.model_from_chunks([chunks[0], chunks[0]], 100)
    bad = pb.ModelChunk(header=serde.model_header_to_proto(h))
    bad.header.push_weight = float("nan")
    with pytest.raises(InvalidArgument, match="push weight"):
        serde.model_from_chunks([bad], 100)
    bad = pb.ModelChunk(header=serde.model_header_to_proto(h))
    bad.header.nonce = b"short"
    with pytest.raises(InvalidArgument, match="nonce must be 16 bytes"):
        serde.model_from_chunks([bad], 100)
    hello = Hello(PeerAddress("a", "127.0.0.1:1"), 2, "f" * 64, True, "", 5, b"n" * 16)
    assert serde.hello_from_proto(serde.hello_to_proto(hello)) == hello


def test_neighbour_table_detects_silence() -> None:
    now = [0.0]
    t = NeighbourTable(dead_after=2.0, clock=lambda: now[0])
    t.add("a", "h:1")
    t.add("b", "h:2")
    assert t.live() == []  # nobody heard from yet
    assert t.heard_from("a", round=3).state == "alive"  # type: ignore[union-attr]
    assert t.heard_from("a") is None  # no transition while alive
    now[0] = 1.5
    t.heard_from("b")
    assert [n.node_id for n in t.live()] == ["a", "b"]
    now[0] = 2.6  # a silent for 2.6 s, b for 1.1 s
    assert [(x.node_id, x.state) for x in t.refresh()] == [("a", "dead")]
    assert [n.node_id for n in t.live()] == ["b"]
    t.set_blocked({"b"})
    assert t.live() == [] and t.is_blocked("b")
    assert t.heard_from("a").state == "alive"  # type: ignore[union-attr]
    assert t.get("a").round == 3  # type: ignore[union-attr]


def test_link_codec_tracks_the_model_and_recovers_from_lost_references() -> None:
    comp = create_compressor("topk", ratio=0.25, error_feedback=False)
    enc, dec = LinkEncoder(comp, 8), LinkDecoder(comp, 8)
    x = torch.arange(8, dtype=torch.float32)
    for r in range(6):  # CHOCO: the public copy converges to a fixed model
        msg = enc.encode(x, r)
        x_hat, ver = dec.decode("s", msg.data, msg.base_version, msg.version)
        dec.commit("s", x_hat, ver)
        enc.commit(msg)
        torch.testing.assert_close(x_hat, enc.ref)
    torch.testing.assert_close(enc.ref, x)
    dec.forget("s")  # the receiver restarted
    msg = enc.encode(x + 1, 7)
    with pytest.raises(ReferenceMismatch):
        dec.decode("s", msg.data, msg.base_version, msg.version)
    enc.reset()
    msg = enc.encode(x + 1, 7)
    assert msg.base_version == ""
    x_hat, _ = dec.decode("s", msg.data, msg.base_version, msg.version)
    assert x_hat.count_nonzero() == 2  # top-25% of a fresh full model


# ------------------------------------------------------------------ bad input


def _evil_message(
    node: PeerNode,
    files: ClusterFiles,
    vec: torch.Tensor | None = None,
    *,
    layout: Layout | None = None,
    data: bytes | None = None,
    total: int | None = None,
    sha: str | None = None,
    base_version: str = "",
    sender: str = SPARE,
) -> list[pb.ModelChunk]:
    """A model from a compromised member (its real key): well signed, bad inside."""
    if data is None:
        v = vec if vec is not None else torch.zeros(node.dim)
        data = dense_payload(v).to_bytes()
    layout = layout or node.layout
    h = ModelHeader(
        sender,
        1,
        layout,
        10,
        1,
        0.0,
        base_version,
        "evil:1",
        len(data) if total is None else total,
        sha or hashlib.sha256(data).hexdigest(),
        receiver_id=node.id,
    )
    h = Signer(sender, files.identity(sender)).model(h, layout.fingerprint())
    return list(serde.model_to_chunks(ModelMessage(h, data), 64 * 1024))


def test_bad_models_are_rejected_with_a_reason_and_the_peer_keeps_its_model(
    data: NodeData, files: ClusterFiles
) -> None:
    node = make_peer(data, files, 0, free_port())
    node.start()
    try:
        before = node.status().model_sha256
        with client_as(files, SPARE, node.address, node.id) as evil:
            # A member that is not a neighbour is refused before the body.
            with pytest.raises(UnknownClient, match="not a neighbour"):
                evil.push_chunks(_evil_message(node, files))
            reply = evil.hello(PeerAddress(SPARE, "127.0.0.1:1"), 0, node.fingerprint)
            assert reply.linked
            nan = torch.zeros(node.dim)
            nan[5] = float("nan")
            wrong = Layout(
                (TensorSpec("net.1.weight", (16, 65)), *node.layout.specs[1:])
            )
            cases: list[tuple[list[pb.ModelChunk], type[Exception], str]] = [
                (
                    [pb.ModelChunk(data=b"\x00" * 10)],
                    InvalidArgument,
                    "must start with a header",
                ),
                (
                    _evil_message(node, files, data=b"garbage" * 20),
                    InvalidArgument,
                    "bad magic",
                ),
                (
                    _evil_message(node, files, layout=wrong),
                    InvalidArgument,
                    "wrong model shape: tensor 'net.1.weight' has shape \\[16, 65\\]",
                ),
                (_evil_message(node, files, nan), InvalidArgument, "non-finite"),
                (
                    _evil_message(node, files, torch.zeros(node.dim - 3)),
                    InvalidArgument,
                    "declared dimension",
                ),
                (
                    _evil_message(node, files, data=b"x" * 2_000_000),
                    ResourceExhausted,
                    "oversize model",
                ),
                (
                    _evil_message(node, files, total=10**12),
                    ResourceExhausted,
                    "oversize model",
                ),
                (
                    _evil_message(node, files, sha="0" * 64),
                    InvalidArgument,
                    "checksum mismatch",
                ),
                (
                    [*_evil_message(node, files)[:-1], pb.ModelChunk(data=b"")],
                    InvalidArgument,
                    "truncated",
                ),
            ]
            for chunks, error, reason in cases:
                with pytest.raises(error, match=reason):
                    evil.push_chunks(chunks)
            # A delta against a reference the peer never had.
            with pytest.raises(StaleUpdate, match="unknown here"):
                evil.push_chunks(_evil_message(node, files, base_version="other:7"))
            st = evil.status()
        assert st.rejected == len(cases) + 2
        assert "unknown here" in st.last_rejection
        assert st.refused["push:invalid_argument"] == 7
        assert st.model_sha256 == before
        assert SPARE not in node.state.inbox
        # A well-formed model from the same sender is accepted afterwards.
        with client_as(files, SPARE, node.address, node.id) as ok:
            ok.push_chunks(_evil_message(node, files, torch.ones(node.dim)))
        got = node.state.latest(SPARE)
        assert got is not None
        torch.testing.assert_close(got.x, torch.ones(node.dim))
        assert node.status().model_sha256 == before  # mixing happens in rounds
    finally:
        node.stop()


# ------------------------------------------------------------------ rounds


def test_ring_of_peers_learns(data: NodeData, files: ClusterFiles) -> None:
    nodes = make_ring(data, files, 4, rounds=6)
    run_peers(nodes)
    accs = [nd.accuracy for nd in nodes]
    assert all(a is not None and a > 0.75 for a in accs), accs
    assert all(nd.round == 6 and nd.finished for nd in nodes)
    assert all(nd.state.bytes_sent > 0 and nd.state.rejected == 0 for nd in nodes)
    assert all(nd.status().refused == {} for nd in nodes)
    # Neighbours mixed: models are close to each other compared with their size.
    xs = torch.stack([nd.x for nd in nodes])
    spread = float((xs - xs.mean(0)).norm(dim=1).max())
    assert spread < 0.2 * float(xs.norm(dim=1).min())


@pytest.mark.parametrize(
    "over",
    [
        {"rule": "metropolis_hastings"},
        {"rule": "push_sum"},
        {"rule": "noloco", "outer_step": True},
        {"rule": "decavg", "compressor": "topk", "compressor_params": {"ratio": 0.2}},
        {"compressor": "topk", "compressor_params": {"ratio": 0.2}},  # default rule
    ],
)
def test_other_rules_and_compressed_links(
    data: NodeData, files: ClusterFiles, over: dict[str, Any]
) -> None:
    nodes = make_ring(data, files, 3, rounds=5, **over)
    run_peers(nodes)
    accs = [nd.accuracy for nd in nodes]
    assert all(a is not None and a > 0.5 for a in accs), accs
    if over.get("rule") == "push_sum":
        # Mass is conserved when no message was lost.
        assert sum(nd.push_weight for nd in nodes) == pytest.approx(3.0)
    if "compressor" in over:
        dense = 4 * nodes[0].dim
        assert all(nd.state.bytes_sent < 0.6 * dense * 2 * 5 for nd in nodes)


def test_emergent_topology_from_one_seed(data: NodeData, files: ClusterFiles) -> None:
    port0 = free_port()
    hub = make_peer(data, files, 0, port0)
    hub.start()
    others = [
        make_peer(data, files, i, free_port(), (f"127.0.0.1:{port0}",), target_degree=2)
        for i in (1, 2, 3)
    ]
    try:
        for nd in others:  # one after another: later ones learn earlier ones
            nd.start()
            time.sleep(0.2)
        wait_for(
            lambda: all(len(nd.table) >= 2 for nd in others),
            15,
            "peers to find a second neighbour through the seed",
        )
        assert len(hub.table) == 3
        assert all("0" in nd.table for nd in others)
    finally:
        for nd in [hub, *others]:
            nd.stop()


@pytest.mark.integration
def test_dead_neighbour_is_detected_and_a_restarted_peer_catches_up(
    data: NodeData, files: ClusterFiles
) -> None:
    ports = [free_port() for _ in range(3)]

    def make(i: int, **over: Any) -> PeerNode:
        seeds = tuple(f"{j}@127.0.0.1:{ports[j]}" for j in range(3) if j != i)
        return make_peer(
            data, files, i, ports[i], seeds, rounds=60, min_round_s=0.05, **over
        )

    a, b, c = make(0), make(1), make(2)
    threads = [threading.Thread(target=nd.run, daemon=True) for nd in (a, b, c)]
    for t in threads:
        t.start()
    wait_for(lambda: a.round >= 3, 30, "three rounds")
    c.stop()  # dies without a goodbye
    wait_for(
        lambda: not any(n.node_id == "2" for n in a.table.live()),
        10,
        "peer 0 to notice that peer 2 is dead",
    )
    r_dead = a.round
    wait_for(lambda: a.round >= r_dead + 3, 30, "peer 0 to keep training without 2")
    c2 = make(2, bootstrap_timeout_s=5.0)
    t2 = threading.Thread(target=c2.run, daemon=True)
    t2.start()
    wait_for(lambda: c2.round >= a.round - 1 > r_dead, 30, "the restart to catch up")
    fresh = flatten(build_model(MODEL, (1, 8, 8), 10, 0))
    ref = 0.5 * (a.x + b.x)
    assert float((c2.x - ref).norm()) < 0.5 * float((fresh - ref).norm())
    for nd in (a, b, c2):
        nd.request_stop()
    for t in [*threads, t2]:
        t.join(20)


def test_pulled_model_is_the_published_one(data: NodeData, files: ClusterFiles) -> None:
    node = make_peer(data, files, 0, free_port())
    node.start()
    try:
        with observer(files, node.address, node.id) as cl:
            msg = cl.pull()
        vals = Payload.from_bytes(msg.data).values
        torch.testing.assert_close(vals, node.x)
        assert msg.header.layout == node.layout
    finally:
        node.stop()


def test_a_peer_server_that_does_not_start_in_time_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A loaded host once took over 10 s to start a peer's gRPC server, and the
    # node died with a bare TimeoutError traceback.
    import asyncio

    from fedplat.gossip import server as mod

    async def slow_bind(self: object, *args: object) -> int:
        await asyncio.sleep(5)
        return 1

    monkeypatch.setattr(mod.PeerServer, "_bind", slow_bind)
    monkeypatch.setattr(mod, "START_SECONDS", 0.2)
    with pytest.raises(OSError, match=r"did not answer within 0.2 s"):
        mod.PeerServer(None, "127.0.0.1:0", None, [])  # type: ignore[arg-type]
