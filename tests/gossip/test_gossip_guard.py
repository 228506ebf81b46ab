"""Admission of peer calls, piece by piece: membership files, signatures,
freshness, certificates, limits and rate-limited refusal logs (no network)."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from fedplat.gossip.guard import Admission
from fedplat.gossip.membership import (
    Member,
    Membership,
    MembershipError,
    load_membership,
    parse_membership,
)
from fedplat.gossip.pki import ClusterFiles
from fedplat.gossip.security import SecurityError, load_peer_security
from fedplat.gossip.signing import (
    ReplayGuard,
    Signer,
    call_signed_by,
    hello_reply_signed_by,
    hello_signed_by,
    model_signed_by,
)
from fedplat.protocol.errors import PermissionDenied, ResourceExhausted, StaleUpdate
from fedplat.protocol.peer import Hello, HelloReply, ModelHeader, PeerAddress
from fedplat.security.certs import (
    PEER_DNS_SUFFIX,
    inspect_certificate,
    issue,
    issue_peer,
)
from fedplat.security.identity import Identity
from fedplat.transport.limits import RefusalLog, StreamSlots
from fedplat.vectors import Layout, TensorSpec
from tests.support.gossip import SPARE, peer_files

KEY = "ab" * 32


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> ClusterFiles:
    return peer_files(tmp_path_factory.mktemp("pki"), ["a", "b"])


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# ------------------------------------------------------------ membership


def test_membership_file_is_validated_and_round_trips(tmp_path: Path) -> None:
    m = parse_membership(
        {
            "members": [
                {"id": "a", "public_key": KEY, "address": "127.0.0.1:5000"},
                {"id": "b-2", "public_key": KEY, "cert_sha256": "cd" * 32},
            ],
            "observers": [{"id": "launcher", "public_key": KEY}],
        }
    )
    assert m.peer("a") is not None and m.peer("launcher") is None
    assert m.get("launcher").observer  # type: ignore[union-attr]
    assert m.by_address("127.0.0.1:5000").node_id == "a"  # type: ignore[union-attr]
    assert sorted(x.node_id for x in m.restricted_to(["a"])) == ["a", "launcher"]
    back = load_membership(m.write(tmp_path / "m.yaml"))
    assert [vars(x) for x in back] == [vars(x) for x in m]
    bad = {
        "members": [
            {"id": "a_b", "public_key": KEY},
            {"id": "c", "public_key": "xyz"},
            {"id": "d", "public_key": KEY, "address": "nowhere"},
            {"id": "e", "public_key": KEY, "colour": "red"},
        ]
    }
    with pytest.raises(MembershipError) as info:
        parse_membership(bad, "m.yaml")
    text = str(info.value)
    for needle in (
        "invalid membership m.yaml:",
        "members.0.id: node id 'a_b'",
        "members.1.public_key: String should match pattern",
        "members.2.address: address 'nowhere' is not host:port",
        "members.3.colour: Extra inputs are not permitted",
    ):
        assert needle in text, text
    twice = {"members": [{"id": "a", "public_key": KEY}] * 2}
    with pytest.raises(MembershipError, match=r"ids listed twice: \['a'\]"):
        parse_membership(twice)
    with pytest.raises(MembershipError, match="does not exist"):
        load_membership(tmp_path / "none.yaml")


# ------------------------------------------------------------ signatures


def _layout() -> Layout:
    return Layout((TensorSpec("w", (2, 3)),))


def test_every_signed_field_matters_and_domains_do_not_mix() -> None:
    s = Signer("a", Identity.generate())
    pub = s.identity.public_key
    h = s.hello(Hello(PeerAddress("a", "127.0.0.1:1"), 3, "f" * 64, True, "b"))
    assert hello_signed_by(pub, h)
    for change in (
        {"sender": PeerAddress("a", "10.0.0.9:1")},  # another address
        {"sender": PeerAddress("c", "127.0.0.1:1")},
        {"receiver_id": "c"},
        {"round": 4},
        {"want_link": False},
        {"timestamp_ms": h.timestamp_ms + 1},
        {"nonce": bytes(16)},
    ):
        assert not hello_signed_by(pub, replace(h, **change)), change  # type: ignore[arg-type]
    assert not hello_signed_by(Identity.generate().public_key, h)

    r = s.hello_reply(
        HelloReply(PeerAddress("a", "h:1"), 1, "f" * 64, True, ()), h.nonce
    )
    assert hello_reply_signed_by(pub, r)
    assert not hello_reply_signed_by(
        pub, replace(r, known=(PeerAddress("x", "evil:1"),))
    )
    assert not hello_reply_signed_by(pub, replace(r, request_nonce=bytes(16)))

    m = s.model(
        ModelHeader("a", 2, _layout(), 5, 1, 0.5, "", "e:1", 10, "0" * 64, "b"),
        "fp",
    )
    assert model_signed_by(pub, m, "fp")
    for change in (
        {"receiver_id": "c"},
        {"round": 1},
        {"num_examples": 10**9},
        {"push_weight": 0.25},
        {"sha256": "1" * 64},
        {"version": "e:2"},
    ):
        assert not model_signed_by(pub, replace(m, **change), "fp"), change  # type: ignore[arg-type]
    assert not model_signed_by(pub, m, "another layout")

    c = s.call("ping", "b", 7)
    assert call_signed_by(pub, "ping", c)
    assert not call_signed_by(pub, "pull", c)  # a ping cannot pass as a pull


def test_replay_guard_admits_once_and_only_while_fresh() -> None:
    clock = Clock()
    g = ReplayGuard(10.0, per_sender=3, clock=clock)
    now = int(clock.t * 1000)
    assert g.admit("a", now, b"1" * 16) is None
    assert "replayed" in (g.admit("a", now, b"1" * 16) or "")
    assert g.admit("b", now, b"1" * 16) is None  # nonces are per sender
    assert "outside the 10 s window" in (g.admit("a", now - 11_000, b"2" * 16) or "")
    assert "outside" in (g.admit("a", now + 11_000, b"3" * 16) or "")
    for i in range(4):  # the fourth evicts the oldest nonce, raising the floor
        assert g.admit("a", now + i + 1, bytes([i]) * 16) is None
    assert "forgotten" in (g.admit("a", now, b"9" * 16) or "")
    clock.t += 30  # everything expired: fresh messages pass again
    assert g.admit("a", int(clock.t * 1000), b"1" * 16) is None


# ------------------------------------------------------------ admission


def _members(**keys: Identity) -> Membership:
    return Membership(Member(k, v.public_key) for k, v in keys.items())


def test_admission_without_tls_rests_on_signatures() -> None:
    a, b, me = Identity.generate(), Identity.generate(), Identity.generate()
    clock = Clock()
    adm = Admission("me", _members(a=a, b=b, me=me), tls=False, clock=clock)
    sa = Signer("a", a, clock)
    fp = _layout().fingerprint()

    def model(round: int, signer: Signer = sa, to: str = "me") -> ModelHeader:
        h = ModelHeader(signer.node_id, round, _layout(), 1, 1, 0.0, "", "v", 4, "0")
        return signer.model(replace(h, receiver_id=to), fp)

    assert adm.model(model(3), None, fp).node_id == "a"
    adm.accepted_model("a", 3)
    with pytest.raises(StaleUpdate, match="round 2 is older than round 3"):
        adm.model(model(2), None, fp)
    with pytest.raises(PermissionDenied, match="'x' is not a member"):
        adm.model(model(3, Signer("x", Identity.generate(), clock)), None, fp)
    with pytest.raises(PermissionDenied, match="bad model signature for 'a'"):
        adm.model(model(3, Signer("a", b, clock)), None, fp)  # forged by b
    with pytest.raises(PermissionDenied, match="signed for peer 'b'"):
        adm.model(model(3, to="b"), None, fp)
    h = model(4)
    adm.model(h, None, fp)
    with pytest.raises(StaleUpdate, match="replayed"):
        adm.model(h, None, fp)
    # A fresh Hello from a restarted peer restarts its round count.
    adm.hello(sa.hello(Hello(PeerAddress("a", "h:1"), 0, fp, True, "me")), None)
    adm.model(model(1), None, fp)
    c = Signer("b", b, clock).call("status", "me", 0)
    assert adm.call("status", c, None).node_id == "b"
    with pytest.raises(PermissionDenied, match="bad pull signature"):
        adm.call("pull", replace(c, nonce=bytes(16)), None)


def test_admission_with_tls_binds_ids_to_peer_certificates(
    files: ClusterFiles, tmp_path: Path
) -> None:
    members = files.load_membership()
    adm = Admission("a", members, tls=True)
    cert_b = inspect_certificate(files.cert("b").read_bytes())
    assert adm.connection(cert_b).node_id == "b"  # type: ignore[union-attr]
    assert adm.claimant("b", cert_b, observers=False).node_id == "b"
    with pytest.raises(PermissionDenied, match="certificate of 'b' cannot speak as"):
        adm.claimant(SPARE, cert_b, observers=False)
    with pytest.raises(PermissionDenied, match="no client certificate"):
        adm.connection(None)
    launcher = inspect_certificate(files.cert("launcher").read_bytes())
    with pytest.raises(PermissionDenied, match="observer, not a peer"):
        adm.claimant("launcher", launcher, observers=False)
    # A coordinator client certificate from the same CA, named like a member:
    # not a peer certificate (no peer DNS name, no server usage).
    (tmp_path / "ca").mkdir()
    for f in ("ca.pem", "ca.key"):
        (tmp_path / "ca" / f).write_bytes((files.pki / f).read_bytes())
    fake = issue(tmp_path / "ca", "b", server=False)
    with pytest.raises(PermissionDenied, match="'b' is not a peer certificate"):
        adm.connection(inspect_certificate(fake.cert_path.read_bytes()))
    # A genuine peer certificate for 'b', but not the one the membership pins.
    (tmp_path / "ca" / "b.pem").unlink()
    (tmp_path / "ca" / "b.key").unlink()
    other = issue_peer(tmp_path / "ca", "b")
    info = inspect_certificate(other.cert_path.read_bytes())
    assert f"b.{PEER_DNS_SUFFIX}" in info.dns_names
    assert info.server_auth and info.client_auth
    with pytest.raises(PermissionDenied, match="not the one the membership pins"):
        adm.connection(info)


def test_peer_security_files_must_fit_the_node(files: ClusterFiles) -> None:
    files.security("a").check_for("a")
    with pytest.raises(SecurityError, match="certificate is for 'a', not node 'b'"):
        load_peer_security(
            "b",
            membership=files.membership,
            state_dir=files.state_dir("b"),
            ca=files.ca,
            cert=files.cert("a"),
            key=files.key("a"),
        )
    with pytest.raises(SecurityError, match="pins another public key for node 'b'"):
        load_peer_security(
            "b",
            membership=files.membership,
            state_dir=files.state_dir("a"),
            insecure=True,
        )
    with pytest.raises(SecurityError, match="needs --ca, --cert and --key"):
        load_peer_security(
            "a", membership=files.membership, state_dir=files.state_dir("a")
        )
    with pytest.raises(SecurityError, match="'zed' is not a peer"):
        load_peer_security(
            "zed",
            membership=files.membership,
            state_dir=files.state_dir("a"),
            insecure=True,
        )
    with pytest.raises(SecurityError, match="cannot read the CA certificate"):
        load_peer_security(
            "a",
            membership=files.membership,
            state_dir=files.state_dir("a"),
            ca=files.pki / "nothing.pem",
            cert=files.cert("a"),
            key=files.key("a"),
        )


# ------------------------------------------------------------ limits


def test_stream_slots_bound_each_caller_and_the_total() -> None:
    slots = StreamSlots(per_caller=2, total=3)
    with slots.hold("a"), slots.hold("a"):
        with (
            pytest.raises(ResourceExhausted, match="a already has 2 calls"),
            slots.hold("a"),
        ):
            pass
        with (
            slots.hold("b"),
            pytest.raises(ResourceExhausted, match="3 calls in flight"),
            slots.hold("c"),
        ):
            pass
        assert slots.in_flight() == 2
    assert slots.in_flight() == 0


def test_refusals_are_counted_and_logged_once_per_kind_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock(0.0)
    log = logging.getLogger("test.refusals")
    refusals = RefusalLog(log, interval_s=10.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        for i in range(50):
            refusals.refuse("push:permission_denied", f"reason {i}", "evil")
        refusals.refuse("hello:permission_denied", "no", "evil")
        clock.t = 11.0
        refusals.refuse("push:permission_denied", "later", "evil")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "refused push:permission_denied from evil: reason 0",
        "refused hello:permission_denied from evil: no",
        "refused push:permission_denied from evil: later "
        "(+49 more of this kind in the last interval)",
    ]
    assert refusals.counts() == {
        "push:permission_denied": 51,
        "hello:permission_denied": 1,
    }
