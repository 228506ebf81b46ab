"""One Byzantine member against the default rule (ClippedGossip), on digits.

In the simulation a ring of 8 with node 3 sending huge or opposite models
learns about as well as without the attack, while Metropolis-Hastings is
wrecked. Between real in-process peers (mutual TLS) an admitted member links
to a ring of 3 as itself and pushes huge or opposite models every round,
declaring 10^9 examples: every push is accepted and mixed, and the honest
peers still learn.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from fedplat.aggregators.attacks import create_attack

from fedplat.compression import dense_payload
from fedplat.gossip.node import PeerNode
from fedplat.gossip.pki import ClusterFiles
from fedplat.gossip.scenario import Scenario, parse_scenario
from fedplat.gossip.setup import NodeData, load_node_data
from fedplat.gossip.sim import Byzantine, GossipSimulation
from fedplat.protocol.peer import ModelHeader, PeerAddress
from tests.support.gossip import SPARE, client_as, make_ring, peer_files, run_peers

# ------------------------------------------------------------------ simulation


def _ring(rule: str) -> Scenario:
    return parse_scenario(
        {
            "name": "byzantine-ring",
            "rounds": 30,
            "seed": 0,
            "topology": {"kind": "ring", "n": 8},
            "data": {"dataset": "digits", "partition": "iid"},
            "model": {"name": "mlp", "params": {"hidden": [32]}},
            "training": {"epochs": 1, "batch_size": 16, "lr": 0.1},
            "mixing": {"rule": rule},
        }
    )


@pytest.fixture(scope="module")
def ring_data() -> NodeData:
    s = _ring("clipped_gossip")
    return load_node_data(s.data, 8, s.seed)


def _accuracy(rule: str, data: NodeData, attack: Any = None) -> float:
    byz = None if attack is None else Byzantine((3,), attack)
    res = GossipSimulation(_ring(rule), data=data, byzantine=byz).run()
    acc = res.final_mean_accuracy
    assert acc is not None
    return acc


ATTACKS = {
    # A model of N(0, 100^2) values: what the live benchmark's poisoner sends.
    "huge": lambda: create_attack("gaussian", sigma=100.0, seed=0),
    # 100 times the opposite of the honest mean, every round.
    "huge_opposite": lambda: create_attack("sign_flip", scale=100.0),
    # The opposite of the honest mean: small enough to hide among honest models.
    "opposite": lambda: create_attack("sign_flip", scale=1.0),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_one_byzantine_node_barely_moves_honest_accuracy(
    ring_data: NodeData, attack: str
) -> None:
    """Measured (30 rounds, whole test split of 360): 0.9309 without attack;
    0.9274 (huge), 0.9254 (huge_opposite), 0.9250 (opposite) under attack;
    Metropolis-Hastings 0.9319 without and 0.16 / 0.10 / 0.59 under attack.
    The simulation is deterministic; the 2-point slack covers float
    differences between machines, and is one-sided: doing better is fine.
    The reference lets node 3 train honestly, so losing its data share counts
    against the attacked run."""
    reference = _accuracy("clipped_gossip", ring_data)
    attacked = _accuracy("clipped_gossip", ring_data, ATTACKS[attack]())
    assert attacked >= reference - 0.02, (attacked, reference)
    # The same attack against the old default does real damage.
    plain = _accuracy("metropolis_hastings", ring_data, ATTACKS[attack]())
    assert plain < reference - 0.25, (plain, reference)


def test_byzantine_nodes_must_exist(ring_data: NodeData) -> None:
    with pytest.raises(ValueError, match=r"Byzantine nodes \[9\] are not 0..7"):
        GossipSimulation(
            _ring("clipped_gossip"),
            data=ring_data,
            byzantine=Byzantine((9,), ATTACKS["huge"]()),
        )


# ------------------------------------------------------------------ real peers


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> ClusterFiles:
    return peer_files(tmp_path_factory.mktemp("byz"), ["0", "1", "2"])


class MemberPoisoner:
    """The spare member, linked to every peer under its own name, pushes
    ``forge(receiver's model)`` for each round each peer is in, declaring
    10^9 examples and degree 1 (what would steer DecAvg and Metropolis-
    Hastings weights)."""

    def __init__(
        self,
        files: ClusterFiles,
        nodes: list[PeerNode],
        forge: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        self.files = files
        self.nodes = nodes
        self.forge = forge
        self.accepted = 0
        self.error: str | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        try:
            self._attack()
        except Exception as exc:  # reported by the test, not lost in a thread
            self.error = f"{type(exc).__name__}: {exc}"

    def _attack(self) -> None:
        clients = {
            nd.id: client_as(self.files, SPARE, nd.address, nd.id) for nd in self.nodes
        }
        try:
            for nd in self.nodes:
                # Nothing listens at the address it gives: peers cannot push
                # to it, but its own pushes keep it a live neighbour.
                clients[nd.id].hello(
                    PeerAddress(SPARE, "127.0.0.1:9"), 0, nd.fingerprint
                )
            pushed = dict.fromkeys(clients, 0)
            while not self.stop.is_set():
                for nd in self.nodes:
                    r = nd.round + 1
                    if r > pushed[nd.id] and r <= nd.config.rounds:
                        self.accepted += self._push(clients[nd.id], nd, r)
                        pushed[nd.id] = r
                self.stop.wait(0.02)
        finally:
            for cl in clients.values():
                cl.close()

    def _push(self, cl: Any, nd: PeerNode, r: int) -> int:
        body = dense_payload(self.forge(nd.x.clone()).to(torch.float32)).to_bytes()
        h = ModelHeader(
            SPARE, r, nd.layout, 10**9, 1, 0.0, "", f"poison:{r}", len(body),
            hashlib.sha256(body).hexdigest(),
        )  # fmt: skip
        return int(cl.push(h, body, nd.fingerprint).accepted)

    def __enter__(self) -> MemberPoisoner:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def _huge(x: torch.Tensor) -> torch.Tensor:
    return torch.randn(x.shape, generator=torch.Generator().manual_seed(0)) * 100.0


def _opposite(x: torch.Tensor) -> torch.Tensor:
    return -10.0 * x


def _ring_of_three(data: NodeData, files: ClusterFiles, **over: Any) -> list[PeerNode]:
    return make_ring(data, files, 3, rounds=8, min_round_s=0.25, **over)


@pytest.fixture(scope="module")
def live_reference(data: NodeData, files: ClusterFiles) -> float:
    """Mean accuracy of the ring of 3 under the default rule, without attack
    (0.8102 here, twice: 0.8083, 0.8083, 0.8139)."""
    nodes = _ring_of_three(data, files)
    run_peers(nodes, 120)
    return _mean_accuracy(nodes)


def _mean_accuracy(nodes: list[PeerNode]) -> float:
    accs = [nd.accuracy for nd in nodes]
    assert None not in accs, accs
    return sum(a for a in accs if a is not None) / len(accs)


@pytest.mark.parametrize(
    ("rule", "forge"),
    [
        ("clipped_gossip", _huge),
        ("clipped_gossip", _opposite),
        ("metropolis_hastings", _huge),
    ],
    ids=["clipped-huge", "clipped-opposite", "metropolis-huge"],
)
def test_an_admitted_member_cannot_wreck_live_peers(
    data: NodeData,
    files: ClusterFiles,
    live_reference: float,
    rule: str,
    forge: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    """Every peer runs ``rule``; the spare's pushes are accepted and mixed.
    Measured here against the reference's 0.810: 0.823 (huge) and 0.810
    (opposite) mean under ClippedGossip, 0.22 under Metropolis-Hastings. Real
    peers mix whatever arrived in time, so a loaded machine may shift a round's
    inputs: the 5-point slack is for that, and is one-sided."""
    nodes = _ring_of_three(data, files, rule=rule)
    with MemberPoisoner(files, nodes, forge) as poisoner:
        run_peers(nodes, 120)
    assert poisoner.error is None, poisoner.error
    assert all(nd.finished and nd.round == 8 for nd in nodes)
    assert poisoner.accepted >= 3 * 6, poisoner.accepted  # it was in the mix
    assert all(SPARE in nd.state.inbox for nd in nodes)
    mean = _mean_accuracy(nodes)
    if rule == "clipped_gossip":
        assert mean >= live_reference - 0.05, (mean, live_reference)
    else:
        assert mean < live_reference - 0.3, (mean, live_reference)
