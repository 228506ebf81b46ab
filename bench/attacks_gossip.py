"""The gossip rows of ``bench/attacks_live.py``: issue 11's attacks on peers.

Three ``fedplat gossip node`` processes (members 0, 1, 2, linked to each other
through their seeds) train digits under the default secure configuration:
mutual TLS with certificates from one CA, a membership file of pinned
Ed25519 keys and certificate fingerprints, signed calls and models, default
stream limits. The membership also lists ``spare``, a member that never runs:
its certificate and key are what a compromised device would hold. A certificate
from the same CA for a non-member (``outsider``) is what anyone who can get
one would hold.

Each attack runs in a run of its own while the peers train; one more run
without attack is the reference. An attacker speaks the peer protocol by hand
(:mod:`fedplat.testing.peer`), counts the status of every call, and the row's
``blocked`` is decided from those statuses and from every peer's own status
(``GetStatus`` as the observer): the attacker is no peer's neighbour, each
peer still knows member 1 at its real address, and every peer finishes every
round.

* **gossip_poisoning**: pushes of a model of N(0, 100^2) values, pulls and
  link requests from the outsider (under its own name and as member 1), from a
  forger (the spare's certificate, claiming member 1 with a fresh key) and from
  the spare's certificate and key speaking as member 1; and the same over
  plaintext.
* **gossip_redirect**: signed Hellos that announce member 1 at the attacker's
  address (127.0.0.1:9), from the spare (as 1), the outsider and a forger.
* **gossip_freeze**: ten idle model streams held open at a time by the spare
  (an admitted member) and two by the outsider, for the whole run.

* **gossip_member_poisoning**: the spare, an admitted member, links to every
  peer under its own name (at 127.0.0.1:9) and pushes a N(0, 100^2) model for
  every round, declaring 10^9 examples and degree 1. Admission lets a member
  in; what its models can do is bounded by the mixing rule (by default
  ClippedGossip, docs/gossip.md). ``blocked``: its pushes were accepted, every
  peer finished, and the mean accuracy is at most 1 point below the run
  without attack of the same seed, rounds and rule (``run_gossip(rule=...)``
  picks another rule than the peers' default).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import grpc
import torch

from bench.deploy import (
    MODEL,
    Processes,
    free_port,
    peak_rss_mb,
    peer_status,
    wait_until,
)
from fedplat.compression import dense_payload
from fedplat.gossip.client import PeerClient, channel_options
from fedplat.gossip.pki import ClusterFiles, make_cluster
from fedplat.gossip.scenario import ModelSpec
from fedplat.gossip.server import SERVICE
from fedplat.gossip.setup import build_model
from fedplat.gossip.signing import Signer
from fedplat.gossip.tls import PeerTls, open_channel
from fedplat.protocol.errors import FedplatError
from fedplat.protocol.peer import ModelHeader, PeerAddress, PeerStatus
from fedplat.security.certs import issue
from fedplat.security.identity import Identity
from fedplat.testing.peer import (
    PEER_RPCS,
    member_tls,
    raw_channel,
    send_raw,
    valid_peer_requests,
)
from fedplat.vectors import Layout, layout_of

IDS = ("0", "1", "2")
SPARE = "spare"
#: Where the redirect attack says member 1 lives (nothing listens there).
ROGUE_ADDRESS = "127.0.0.1:9"


class PeerStartError(RuntimeError):
    """A peer process ended before it served (not an effect of any attack:
    the attacker starts once every peer serves)."""


class PeerRing:
    """Peers 0-2 as processes, their cluster files and an outsider's
    certificate; :meth:`status` reads a peer's status as the observer."""

    def __init__(
        self, root: Path, rounds: int, seed: int, rule: str | None = None
    ) -> None:
        self.root = root
        self.rounds = rounds
        self.seed = seed
        self.rule = rule  # None: the peers' default mixing rule
        self.procs = Processes(root / "logs")
        self.files: ClusterFiles = make_cluster(root, [*IDS, SPARE])
        self.outsider = issue(self.files.pki, "outsider", server=False)
        model = build_model(
            ModelSpec(name=MODEL["name"], params=MODEL["params"]), (1, 8, 8), 10, seed
        )
        self.layout: Layout = layout_of(model)
        self.ports = {i: free_port() for i in IDS}

    def address(self, node_id: str) -> str:
        return f"127.0.0.1:{self.ports[node_id]}"

    def start(self) -> None:
        for i in IDS:
            seeds = ",".join(f"{j}@{self.address(j)}" for j in IDS if j != i)
            self.procs.start(
                f"peer-{i}",
                [
                    "gossip", "node", "--id", i, "--listen", self.address(i),
                    "--seeds", seeds, "--dataset", "digits",
                    "--num-nodes", str(len(IDS)), "--seed", str(self.seed),
                    "--model", MODEL["name"], "--model-params", '{"hidden": [32]}',
                    "--rounds", str(self.rounds), "--min-round-s", "0.5",
                    "--linger", "120", "--threads", "1",
                    *(["--rule", self.rule] if self.rule else []),
                    *self.files.node_args(i),
                ],
            )  # fmt: skip
        for i in IDS:
            wait_until(functools.partial(self.serving, i), 600, f"peer {i}")

    def serving(self, node_id: str) -> bool:
        """Whether the peer serves; raises if its process has ended."""
        proc = self.procs.procs[f"peer-{node_id}"]
        if proc.poll() is not None:
            tail = self.procs.log(f"peer-{node_id}").strip().splitlines()[-1:]
            raise PeerStartError(f"peer {node_id} exited: {' '.join(tail)}")
        return self.status(node_id) is not None

    def status(self, node_id: str) -> PeerStatus | None:
        status: PeerStatus | None = peer_status(
            self.files, self.address(node_id), node_id
        )
        return status

    def finished(self) -> dict[str, PeerStatus] | None:
        """Every peer's status once all have finished their rounds."""
        out = {i: self.status(i) for i in IDS}
        if all(s is not None and s.finished for s in out.values()):
            return out  # type: ignore[return-value]
        return None

    def outsider_channel(self, server_id: str = "0") -> grpc.Channel:
        tls = PeerTls.load(
            self.files.ca, self.outsider.cert_path, self.outsider.key_path
        )
        return open_channel(
            self.address(server_id), tls, server_id, channel_options(64 << 20)
        )

    def member_channel(self, as_id: str, server_id: str = "0") -> grpc.Channel:
        return raw_channel(
            self.files, self.address(server_id), as_id=as_id, server_id=server_id
        )

    def close(self) -> None:
        self.procs.close()


# ------------------------------------------------------------ attackers


def _ident(b: bytes) -> bytes:
    return b


class GossipAttacker:
    """Counts the status of each call; ``run`` loops ``step`` until stopped."""

    name: ClassVar[str]
    criterion: ClassVar[str]
    #: Judged against the run without attack (see :func:`run_gossip`), whose
    #: accuracy ``run_gossip`` sets here before the attack starts.
    needs_reference: ClassVar[bool] = False
    reference_accuracy: float | None = None

    def __init__(self, ring: PeerRing, seed: int) -> None:
        self.ring = ring
        self.codes: Counter[str] = Counter()
        self.gen = torch.Generator().manual_seed(seed)
        self.round = 0
        self.error: str | None = None

    def run(self, stop: threading.Event) -> None:
        try:
            self.attack(stop)
        except Exception as exc:  # a bug of the attacker, not a defence: reported
            self.error = f"{type(exc).__name__}: {exc}"

    def attack(self, stop: threading.Event) -> None:
        while not stop.is_set():
            st = self.ring.status("0")
            self.round = st.round if st is not None else self.round
            self.step(stop)
            stop.wait(0.2)

    def step(self, stop: threading.Event) -> None:
        raise NotImplementedError

    def send(self, channel: grpc.Channel, rpc: str, messages: list[bytes]) -> None:
        code, _ = send_raw(channel, rpc, messages, timeout=10)
        self.codes[code.name] += 1

    def requests(
        self, claim: str, signer: Signer | None, to: str = "0", **kw: Any
    ) -> dict[str, list[bytes]]:
        return valid_peer_requests(
            self.ring.files, claim, to, self.ring.layout, round=self.round + 1,
            sender_address=kw.pop("address", ROGUE_ADDRESS), signer=signer, **kw,
        ).serialized()  # fmt: skip

    def evidence(self, final: dict[str, PeerStatus]) -> dict[str, Any]:
        """The facts ``blocked`` is decided on (see the module docstring)."""
        members = set(IDS)
        strangers = {
            i: sorted(n.node_id for n in st.neighbours if n.node_id not in members)
            for i, st in final.items()
        }
        where = {
            i: nb.address
            for i, st in final.items()
            if i != "1" and (nb := st.neighbour("1")) is not None
        }
        refused: Counter[str] = Counter()
        for st in final.values():
            refused.update(st.refused)
        accepted = self.codes["OK"]
        facts: dict[str, Any] = {
            "attacker_error": self.error,
            "requests": dict(self.codes),
            "accepted_requests": accepted,
            "non_member_neighbours": strangers,
            "member_1_address_seen_by": where,
            "member_1_address_true": all(
                a == self.ring.address("1") for a in where.values()
            )
            and len(where) == len(IDS) - 1,
            "rounds_finished": {i: st.round for i, st in final.items()},
            "peers_refused": dict(refused),
        }
        facts["blocked"] = (
            accepted == 0
            and sum(self.codes.values()) > 0
            and not any(strangers.values())
            and facts["member_1_address_true"]
            and all(st.round == self.ring.rounds for st in final.values())
        )
        if self.error:
            facts["blocked"] = None  # the attack did not run as designed
        return facts


class GossipPoisoning(GossipAttacker):
    name = "gossip_poisoning"
    criterion = (
        "every push of a N(0, 100^2) model, pull and link request from an "
        "outsider (a certificate from the CA, not a member), a forger (a "
        "member's id, another key) and a member speaking as another, over "
        "mutual TLS or plaintext, refused; no outsider among any peer's "
        "neighbours; every peer finishes every round"
    )

    def step(self, stop: threading.Event) -> None:
        r = self.ring
        poison = torch.randn(r.layout.numel, generator=self.gen) * 100.0
        spare = Signer(SPARE, r.files.identity(SPARE))
        forger = Signer("1", Identity.generate())
        attempts: list[tuple[Callable[[], grpc.Channel], str, Signer]] = [
            (r.outsider_channel, "outsider", Signer("outsider", Identity.generate())),
            (r.outsider_channel, "1", forger),
            (lambda: r.member_channel(SPARE), "1", forger),
            (lambda: r.member_channel(SPARE), "1", Signer("1", spare.identity)),
        ]
        for open_, claim, signer in attempts:
            req = self.requests(claim, signer, vec=poison)
            with open_() as ch:
                for rpc in PEER_RPCS:
                    self.send(ch, rpc, req[rpc])
        with grpc.insecure_channel(r.address("0")) as plain:
            req = self.requests("1", forger, vec=poison)
            for rpc in ("PushModel", "PullModel"):
                self.send(plain, rpc, req[rpc])


class GossipRedirect(GossipAttacker):
    name = "gossip_redirect"
    criterion = (
        f"every signed Hello announcing member 1 at {ROGUE_ADDRESS} (from the "
        "spare speaking as 1, an outsider, a forger) refused; every peer still "
        "has member 1 at its real address; every peer finishes every round"
    )

    def step(self, stop: threading.Event) -> None:
        r = self.ring
        spare = r.files.identity(SPARE)
        for to in ("0", "2"):
            as_1 = self.requests("1", Signer("1", spare), to=to)
            forged = self.requests("1", Signer("1", Identity.generate()), to=to)
            with r.member_channel(SPARE, to) as ch:
                self.send(ch, "Hello", as_1["Hello"])
                self.send(ch, "Hello", forged["Hello"])
            with r.outsider_channel(to) as ch:
                self.send(ch, "Hello", forged["Hello"])


class GossipFreeze(GossipAttacker):
    name = "gossip_freeze"
    criterion = (
        "idle model streams (ten at a time from an admitted member, two from "
        "an outsider, for the whole run) all cut or refused; every peer "
        "finishes every round"
    )

    def attack(self, stop: threading.Event) -> None:
        r = self.ring
        holders = [(lambda: r.member_channel(SPARE), 10), (r.outsider_channel, 2)]
        threads = [
            threading.Thread(target=self._hold, args=(opener, stop), daemon=True)
            for opener, n in holders
            for _ in range(n)
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    def _hold(self, opener: Callable[[], grpc.Channel], stop: threading.Event) -> None:
        def idle() -> Iterator[bytes]:
            stop.wait(600)  # send nothing until the run ends
            yield from ()

        with opener() as ch:
            push = ch.stream_unary(f"/{SERVICE}/PushModel", _ident, _ident)
            while not stop.is_set():
                try:
                    push(idle(), timeout=600)
                    self.codes["OK"] += 1
                except grpc.RpcError as exc:
                    if not stop.is_set():
                        self.codes[exc.code().name] += 1
                stop.wait(0.1)


class GossipMemberPoisoning(GossipAttacker):
    """The spare as itself: admitted, linked, its poisoned pushes accepted."""

    name = "gossip_member_poisoning"
    criterion = (
        "the spare (an admitted member) links to every peer under its own name "
        "and pushes a N(0, 100^2) model for every round, declaring 10^9 "
        "examples and degree 1; its pushes are accepted and mixed, every peer "
        "finishes every round, and the peers' mean accuracy is at most 1 point "
        "below the run without attack (same seed, rounds and rule)"
    )
    needs_reference = True

    def attack(self, stop: threading.Event) -> None:
        r, files = self.ring, self.ring.files
        client = functools.partial(
            PeerClient, signer=Signer(SPARE, files.identity(SPARE)),
            membership=files.load_membership(), tls=member_tls(files, SPARE),
        )  # fmt: skip
        clients = {i: client(r.address(i), server_id=i, timeout=10) for i in IDS}
        pushed = dict.fromkeys(IDS, 0)
        try:
            for cl in clients.values():  # a link under its own name
                cl.hello(PeerAddress(SPARE, ROGUE_ADDRESS), 0, r.layout.fingerprint())
            while not stop.wait(0.1):
                for i, cl in clients.items():
                    st = r.status(i)
                    next_round = -1 if st is None else st.round + 1
                    if pushed[i] < next_round <= r.rounds:
                        self._push(cl, next_round)
                        pushed[i] = next_round
        finally:
            for cl in clients.values():
                cl.close()

    def _push(self, cl: PeerClient, round_: int) -> None:
        layout = self.ring.layout
        vec = torch.randn(layout.numel, generator=self.gen) * 100.0
        body = dense_payload(vec).to_bytes()
        h = ModelHeader(
            SPARE, round_, layout, 10**9, 1, 0.0, "", f"{SPARE}:{round_}",
            len(body), hashlib.sha256(body).hexdigest(),
        )  # fmt: skip
        try:
            accepted = cl.push(h, body, layout.fingerprint()).accepted
            self.codes["OK" if accepted else "REFUSED"] += 1
        except FedplatError as exc:
            self.codes[type(exc).__name__] += 1

    def evidence(self, final: dict[str, PeerStatus]) -> dict[str, Any]:
        accs = [st.accuracy for st in final.values() if st.accuracy is not None]
        mean = sum(accs) / len(accs) if len(accs) == len(final) else None
        ref = self.reference_accuracy
        drop = None if mean is None or ref is None else ref - mean
        ran = self.codes["OK"] > 0 and not self.error
        finished = all(st.round == self.ring.rounds for st in final.values())
        return {
            "attacker_error": self.error,
            "pushes": dict(self.codes),
            "spare_neighbour_of": [i for i, st in final.items() if st.neighbour(SPARE)],
            "rounds_finished": {i: st.round for i, st in final.items()},
            "mean_accuracy": mean,
            "reference_accuracy": ref,
            "accuracy_drop": drop,
            # None: the attack did not run as designed (or nothing to compare).
            "blocked": (finished and drop <= 0.01)
            if ran and drop is not None
            else None,
        }


GOSSIP_ATTACKS: dict[str, type[GossipAttacker]] = {
    a.name: a
    for a in (GossipPoisoning, GossipRedirect, GossipFreeze, GossipMemberPoisoning)
}

#: Mean accuracy of the runs without attack so far, by (rounds, seed, rule):
#: the rows judged against one (``needs_reference``) reuse the reference run
#: ``bench.attacks_live`` makes first instead of running their own.
_REFERENCES: dict[tuple[int, int, str | None], float | None] = {}


def run_gossip(
    attack: str | None,
    workdir: Path,
    rounds: int,
    seed: int,
    *,
    rule: str | None = None,
) -> dict[str, Any]:
    """One run of the ring with ``attack`` (``None``: the reference) under
    ``rule`` (``None``: the peers' default); a ring whose peers fail to start
    is started afresh, up to three times. A row judged against the run without
    attack runs that reference first if this process has not."""
    key = (rounds, seed, rule)
    kind = GOSSIP_ATTACKS[attack] if attack else None
    if kind is not None and kind.needs_reference and key not in _REFERENCES:
        run_gossip(None, workdir / "reference", rounds, seed, rule=rule)
    failures: list[str] = []
    for attempt in range(3):
        try:
            row = _run_ring(
                attack, workdir / f"try-{attempt}", rounds, seed, rule,
                _REFERENCES.get(key),
            )  # fmt: skip
        except PeerStartError as exc:
            failures.append(str(exc))
            continue
        if attack is None:
            _REFERENCES[key] = row["final_accuracy"]
        return {**row, "rule": rule or "default", "start_failures": failures}
    raise PeerStartError("; ".join(failures))


def _run_ring(
    attack: str | None,
    workdir: Path,
    rounds: int,
    seed: int,
    rule: str | None = None,
    reference: float | None = None,
) -> dict[str, Any]:
    ring = PeerRing(workdir, rounds, seed, rule)
    stop = threading.Event()
    kind = GOSSIP_ATTACKS[attack] if attack else None
    attacker = kind(ring, seed) if kind else None
    if attacker is not None:
        attacker.reference_accuracy = reference
    t0 = time.perf_counter()
    peak = 0.0
    try:
        ring.start()
        thread = None
        if attacker is not None:
            thread = threading.Thread(target=attacker.run, args=(stop,), daemon=True)
            thread.start()

        def done() -> dict[str, PeerStatus] | None:
            nonlocal peak
            for p in ring.procs.procs.values():
                with contextlib.suppress(OSError):
                    peak = max(peak, peak_rss_mb(p.pid))
            return ring.finished()

        final = wait_until(done, 1800, "every peer to finish")
        stop.set()
        if thread is not None:
            thread.join(60)
        seconds = time.perf_counter() - t0
        evidence = attacker.evidence(final) if attacker else {}
    finally:
        stop.set()
        ring.close()
    accs = [st.accuracy for st in final.values() if st.accuracy is not None]
    return {
        "attack": attack or "none",
        "blocked": evidence.get("blocked"),
        "honest_rounds_completed": min(st.round for st in final.values()),
        "final_accuracy": round(sum(accs) / len(accs), 4) if accs else None,
        "peer_peak_rss_mb": round(peak, 1),
        "criterion": kind.criterion if kind else None,
        "evidence": evidence,
        "peer_accuracies": {i: st.accuracy for i, st in final.items()},
        "seconds": seconds,
    }


__all__ = ["GOSSIP_ATTACKS", "PeerRing", "run_gossip"]
