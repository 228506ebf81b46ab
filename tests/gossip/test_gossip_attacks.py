"""Attacks on live gossip peers through real gRPC on 127.0.0.1, each refused.

Every attack runs against a ring of three in-process peers (mutual TLS, as
deployed, unless the test is about the explicit insecure mode) while they
train; each test asserts the refusal and its status code, and that the honest
peers still finish every round and learn. The attacker is an outsider (a key of
its own, maybe a certificate from the same CA) or a compromised member (the
spare member's real certificate and key).
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from fedplat.compression import dense_payload
from fedplat.gossip.client import PeerClient
from fedplat.gossip.node import PeerNode
from fedplat.gossip.pki import ClusterFiles
from fedplat.gossip.server import SERVICE
from fedplat.gossip.setup import NodeData
from fedplat.gossip.signing import Signer
from fedplat.gossip.tls import PeerTls
from fedplat.proto import peer_pb2 as pb
from fedplat.proto import peer_serde as serde
from fedplat.protocol.errors import (
    PermissionDenied,
    StaleUpdate,
    Unavailable,
    UnknownClient,
)
from fedplat.protocol.peer import ModelHeader, ModelMessage, PeerAddress
from fedplat.security.certs import issue
from fedplat.security.identity import Identity
from fedplat.testing.peer import (
    PEER_RPCS,
    mutate_messages,
    raw_channel,
    send_raw,
    valid_peer_requests,
)
from tests.support import free_port, wait_for
from tests.support.gossip import (
    SPARE,
    client_as,
    join_peers,
    make_peer,
    make_ring,
    peer_files,
    start_peers,
)

IDS = ["0", "1", "2", "3"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> ClusterFiles:
    """Members 0-3 and a spare; addresses are not pinned (they come from each
    member's own signed Hello)."""
    return peer_files(tmp_path_factory.mktemp("tls"), IDS)


@pytest.fixture(scope="module")
def plain_files(tmp_path_factory: pytest.TempPathFactory) -> ClusterFiles:
    return peer_files(tmp_path_factory.mktemp("plain"), IDS, tls=False)


@contextmanager
def attacked_ring(
    data: NodeData, files: ClusterFiles, rounds: int = 8, **over: Any
) -> Iterator[list[PeerNode]]:
    """A ring of peers 0-2 training while the body attacks it; afterwards every
    peer must have finished all rounds and learned."""
    nodes = make_ring(data, files, 3, rounds=rounds, min_round_s=0.25, **over)
    threads = start_peers(nodes)
    try:
        wait_for(lambda: all(nd.round >= 1 for nd in nodes), 60, "a first round")
        yield nodes
    finally:
        join_peers(threads, 120)
    accs = [nd.accuracy for nd in nodes]
    assert all(nd.finished and nd.round == rounds for nd in nodes)
    assert all(a is not None and a > 0.75 for a in accs), accs


def _outsider_tls(files: ClusterFiles, tmp: Path) -> PeerTls:
    """A client certificate signed by the deployment's CA, for a non-member."""
    (tmp / "ca").mkdir(exist_ok=True)
    for f in ("ca.pem", "ca.key"):
        (tmp / "ca" / f).write_bytes((files.pki / f).read_bytes())
    made = issue(tmp / "ca", "outsider", server=False)
    return PeerTls.load(files.ca, made.cert_path, made.key_path)


def _poison(node: PeerNode, signer: Signer, sender: str) -> list[pb.ModelChunk]:
    """A model that would wreck the receiver's accuracy, signed by ``signer``
    while claiming to come from ``sender``."""
    data = dense_payload(torch.randn(node.dim) * 100.0).to_bytes()
    h = ModelHeader(
        sender,
        node.round + 1,
        node.layout,
        10**6,
        1,
        0.0,
        "",
        "poison:1",
        len(data),
        hashlib.sha256(data).hexdigest(),
        receiver_id=node.id,
    )
    h = signer.model(h, node.fingerprint)
    return list(serde.model_to_chunks(ModelMessage(h, data), 64 * 1024))


def _every_call_refused(cl: PeerClient, node: PeerNode, claim: str) -> list[str]:
    """Hello, ping, pull, status and a poisoned push; each must be refused."""
    me = PeerAddress(claim, "127.0.0.1:9")
    calls = [
        lambda: cl.hello(me, 0, node.fingerprint),
        lambda: cl.ping(0),
        cl.pull,
        cl.status,
        lambda: cl.push_chunks(_poison(node, cl.signer, claim)),
    ]
    reasons = []
    for call in calls:
        with pytest.raises(PermissionDenied) as info:
            call()
        reasons.append(info.value.reason)
    return reasons


# ------------------------------------------------------------ outsiders


def test_outsiders_cannot_pull_join_or_poison_over_mutual_tls(
    data: NodeData, files: ClusterFiles, tmp_path: Path
) -> None:
    outsider = _outsider_tls(files, tmp_path)
    members = files.load_membership()
    with attacked_ring(data, files) as nodes:
        target = nodes[0]
        for claim in ("outsider", "1"):  # its own name, then a member's
            with PeerClient(
                target.address,
                signer=Signer(claim, Identity.generate()),
                membership=members,
                server_id="0",
                tls=outsider,
            ) as cl:
                reasons = _every_call_refused(cl, target, claim)
            assert all("'outsider' is not a member" in r for r in reasons), reasons
        # No client certificate, or no TLS at all: the handshake fails.
        ca_only = grpc.ssl_channel_credentials(root_certificates=files.ca.read_bytes())
        for channel in (
            grpc.secure_channel(
                target.address,
                ca_only,
                [("grpc.ssl_target_name_override", "0.peer.fedplat.invalid")],
            ),
            grpc.insecure_channel(target.address),
        ):
            with channel:
                code, _ = send_raw(channel, "GetStatus", [b""], timeout=3)
            assert code == grpc.StatusCode.UNAVAILABLE
        st = target.status()
    assert "outsider" not in [n.node_id for n in st.neighbours]
    assert st.refused["push:permission_denied"] >= 2
    assert st.rejected >= 2 and target.state.inbox.keys() <= {"1", "2"}


def test_outsiders_and_forgers_are_refused_without_tls(
    data: NodeData, plain_files: ClusterFiles, caplog: pytest.LogCaptureFixture
) -> None:
    members = plain_files.load_membership()
    spare = plain_files.identity(SPARE)
    with caplog.at_level(logging.WARNING), attacked_ring(data, plain_files) as nodes:
        target = nodes[0]
        cases = [
            ("outsider", Identity.generate(), "'outsider' is not a member"),
            ("1", Identity.generate(), "bad .* signature for '1'"),  # forged
            ("1", spare, "bad .* signature for '1'"),  # a member forging another
        ]
        for claim, key, reason in cases:
            with PeerClient(
                target.address,
                signer=Signer(claim, key),
                membership=members,
                server_id="0",
            ) as cl:
                for r in _every_call_refused(cl, target, claim):
                    assert re.search(reason, r), (r, reason)
        assert target.table.get("1").address == nodes[1].address  # type: ignore[union-attr]
    assert any("WITHOUT TLS" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------ members


def test_forged_signatures_and_borrowed_identities_are_refused(
    data: NodeData, files: ClusterFiles
) -> None:
    with attacked_ring(data, files) as nodes:
        target = nodes[0]
        # The spare member's certificate speaking as member 1.
        with client_as(files, SPARE, target.address, "0") as cl:
            forged = Signer("1", files.identity(SPARE))
            with pytest.raises(PermissionDenied, match="'spare' cannot speak as '1'"):
                cl.push_chunks(_poison(target, forged, "1"))
            # Its own id, signed by a key that is not the pinned one.
            thief = Signer(SPARE, Identity.generate())
            with pytest.raises(PermissionDenied, match="bad model signature"):
                cl.push_chunks(_poison(target, thief, SPARE))
            cl.signer = thief
            with pytest.raises(PermissionDenied, match="bad hello signature"):
                cl.hello(PeerAddress(SPARE, "127.0.0.1:9"), 0, target.fingerprint)
    assert target.table.get(SPARE) is None


def test_replayed_and_misdirected_messages_are_refused(
    data: NodeData, files: ClusterFiles
) -> None:
    with attacked_ring(data, files) as nodes:
        target = nodes[0]
        spare = Signer(SPARE, files.identity(SPARE))
        with client_as(files, SPARE, target.address, "0") as cl:
            cl.hello(PeerAddress(SPARE, "127.0.0.1:9"), 0, target.fingerprint)
            model = cl.pull()  # the target's own model: harmless to mix
            body = bytes(model.data)

            def push(round: int, to: str = "0") -> list[pb.ModelChunk]:
                h = ModelHeader(
                    SPARE,
                    round,
                    target.layout,
                    10,
                    1,
                    0.0,
                    "",
                    f"s:{round}",
                    len(body),
                    hashlib.sha256(body).hexdigest(),
                    receiver_id=to,
                )
                h = spare.model(h, target.fingerprint)
                return list(serde.model_to_chunks(ModelMessage(h, body), 65536))

            captured = push(5)
            assert cl.push_chunks(captured).accepted
            with pytest.raises(StaleUpdate, match="replayed"):
                cl.push_chunks(captured)
            with pytest.raises(StaleUpdate, match="round 3 is older than round 5"):
                cl.push_chunks(push(3))
            with pytest.raises(PermissionDenied, match="signed for peer '1'"):
                cl.push_chunks(push(6, to="1"))
            ping = pb.PingRequest(auth=serde.call_to_proto(spare.call("ping", "0", 0)))
            cl.stub.Ping(ping, timeout=5)
            with pytest.raises(grpc.RpcError) as info:
                cl.stub.Ping(ping, timeout=5)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        st = target.status()
    assert st.refused["push:failed_precondition"] == 2
    assert st.refused["ping:failed_precondition"] == 1


def test_a_peer_cannot_redirect_another_peers_address(
    data: NodeData, files: ClusterFiles
) -> None:
    with attacked_ring(data, files) as nodes:
        target = nodes[0]
        true_address = nodes[1].address
        # A Hello claiming to be member 1, at the attacker's address.
        with (
            client_as(files, SPARE, target.address, "0") as cl,
            pytest.raises(PermissionDenied, match="'spare' cannot speak as '1'"),
        ):
            cl.hello(PeerAddress("1", "127.0.0.1:9"), 0, target.fingerprint)
        # A compromised member (3) serves at its own address and tells others
        # that 1 lives there.
        rogue = make_peer(data, files, 3, free_port())
        rogue.table.add("1", rogue.address)
        rogue.start()
        try:
            reply = target.outbound.hello(rogue.address, "3")
            assert reply is not None
            assert PeerAddress("1", rogue.address) in reply.known
            # Dialled as 1, the rogue cannot present 1's certificate.
            assert target.outbound.hello(rogue.address, "1") is None
        finally:
            rogue.stop()
    for nd in (nodes[0], nodes[2]):  # 1's neighbours still reach the real 1
        assert nd.table.get("1").address == true_address  # type: ignore[union-attr]


def test_idle_streams_do_not_freeze_a_peer(
    data: NodeData, files: ClusterFiles, tmp_path: Path
) -> None:
    """A member (admitted, malicious) keeps ten idle model streams open while
    the ring trains, an outsider tries too; the honest peers never notice."""
    stop = threading.Event()
    seen: Counter[str] = Counter()

    def idle(done: threading.Event) -> Iterator[bytes]:
        while not (done.wait(0.1) or stop.is_set()):
            pass
        yield from ()

    def kind(exc: Any) -> str:
        if exc is None:
            return "OK"
        detail = exc.details() or ""
        what = "idle" if "sent nothing" in detail else detail[:60]
        what = "cap" if "calls in flight" in detail else what
        return f"{exc.code().name}:{what}"

    def attack(channel: grpc.Channel) -> None:
        push = channel.stream_unary(f"/{SERVICE}/PushModel", lambda b: b, lambda b: b)
        calls: list[tuple[Any, threading.Event]] = []
        while not stop.is_set():
            for call, done in [c for c in calls if c[0].done()]:
                calls.remove((call, done))
                done.set()
                seen[kind(call.exception())] += 1
            while len(calls) < 10:
                done = threading.Event()
                calls.append((push.future(idle(done), timeout=60), done))
            stop.wait(0.05)
        for call, done in calls:
            done.set()
            call.cancel()

    outsider = _outsider_tls(files, tmp_path)
    with attacked_ring(
        data, files, rounds=12, stream_idle_s=1.0, max_calls_per_caller=4
    ) as nodes:
        target = nodes[0]
        member = raw_channel(files, target.address, as_id=SPARE, server_id="0")
        attacker = threading.Thread(target=attack, args=(member,), daemon=True)
        attacker.start()
        try:
            wait_for(lambda: "RESOURCE_EXHAUSTED:idle" in seen, 30, "an idle cut")
            # Meanwhile an outsider is refused before its stream holds anything.
            with grpc.secure_channel(
                target.address,
                outsider.channel_credentials(),
                [("grpc.ssl_target_name_override", "0.peer.fedplat.invalid")],
            ) as foreign:
                code, detail = send_raw(foreign, "PushModel", [], timeout=5)
            assert code == grpc.StatusCode.PERMISSION_DENIED, detail
            r0 = target.round
            wait_for(lambda: target.round >= r0 + 2, 60, "rounds to go on")
        finally:
            stop.set()
            attacker.join(10)
            member.close()
    # gRPC's client sometimes reports a stream the server refused before
    # reading it as a reset (UNAVAILABLE) instead of the refusal's status.
    refused = {"RESOURCE_EXHAUSTED:idle", "RESOURCE_EXHAUSTED:cap"}
    assert {k for k in seen if not k.startswith("UNAVAILABLE")} <= refused, seen
    assert seen["RESOURCE_EXHAUSTED:cap"] > 0, seen
    st = target.status()
    assert st.refused["push:resource_exhausted"] >= sum(seen[k] for k in refused), (
        st.refused,
        seen,
    )
    assert set(st.refused) <= {
        "push:resource_exhausted",
        "push:permission_denied",  # the outsider
        "push:invalid_argument",  # streams the attacker cancelled at the end
    }, st.refused


# ------------------------------------------------------------ malformed input


def test_malformed_and_mutated_requests_get_a_status_never_a_traceback(
    data: NodeData, files: ClusterFiles, caplog: pytest.LogCaptureFixture
) -> None:
    node = make_peer(data, files, 0, free_port())
    node.start()
    channel = raw_channel(files, node.address, as_id=SPARE, server_id="0")
    try:
        with caplog.at_level(logging.DEBUG):
            for rpc in PEER_RPCS:
                code, detail = send_raw(channel, rpc, [b"\xff\xff\xff\x0f"])
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (rpc, detail)
                assert detail.startswith("malformed "), detail
            valid = valid_peer_requests(files, SPARE, "0", node.layout)
            for rpc, messages in valid.serialized().items():
                assert send_raw(channel, rpc, messages)[0] == grpc.StatusCode.OK, rpc
            rng = random.Random(0)
            codes: Counter[str] = Counter()
            for k in range(150):
                fresh = valid_peer_requests(files, SPARE, "0", node.layout, round=k)
                rpc = rng.choice(list(PEER_RPCS))
                msgs = mutate_messages(fresh.serialized()[rpc], rng)
                codes[send_raw(channel, rpc, msgs)[0].name] += 1
        assert not {"INTERNAL", "UNKNOWN", "DEADLINE_EXCEEDED"} & set(codes), codes
        assert "INVALID_ARGUMENT" in codes and "PERMISSION_DENIED" in codes, codes
        tracebacks = [r for r in caplog.records if r.exc_info or r.levelno >= 40]
        assert tracebacks == [], [r.getMessage() for r in tracebacks]
        # The peer still serves its members.
        with client_as(files, "1", node.address, "0") as ok:
            assert ok.status().node_id == "0"
            with pytest.raises(UnknownClient):  # a member, but not a neighbour
                ok.push_chunks(_poison(node, Signer("1", files.identity("1")), "1"))
    finally:
        channel.close()
        node.stop()
    with pytest.raises(Unavailable):
        client_as(files, "1", node.address, "0", timeout=1).status()


def test_valid_requests_helper_builds_every_call(files: ClusterFiles) -> None:
    from fedplat.vectors import Layout, TensorSpec

    layout = Layout((TensorSpec("w", (3, 4)),))
    req = valid_peer_requests(files, "1", "0", layout, round=2)
    assert req.hello.sender.node_id == "1" and req.hello.receiver_id == "0"
    h = serde.first_model_header(req.push[0])
    assert h.receiver_id == "0" and h.round == 2 and len(req.push) == 2
    assert set(req.serialized()) == set(PEER_RPCS)
    assert serde.call_from_proto(req.pull.auth).receiver_id == "0"
