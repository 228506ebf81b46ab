"""Real peer processes on 127.0.0.1, driven by a scenario: kill two, restart one.

Eight ``fedplat gossip node`` processes on a ring, over mutual TLS (the
launcher makes the CA, certificates, keys and membership), train digits with a
small MLP. After round 5 the launcher SIGKILLs peers 2 and 5 (their neighbours
must notice by heartbeat), after round 7 it restarts peer 2, which must catch up
from its neighbours and finish with them. Meanwhile an outsider holding a
certificate of the same CA is refused, and a compromised member pushes a NaN
model, which the running peer refuses with a reason before carrying on.
Bounded in time: rounds are paced at 0.6 s so the restart (a cold Python +
torch start, slow on a loaded 2-core machine) happens while the others still
train.
"""

from __future__ import annotations

import hashlib
import statistics
import threading
from pathlib import Path

import pytest
import torch
import yaml

from fedplat.compression import dense_payload
from fedplat.gossip.launcher import LaunchResult, ProcessLauncher
from fedplat.gossip.pki import ClusterFiles
from fedplat.gossip.recorder import GossipRecorder
from fedplat.gossip.tls import PeerTls
from fedplat.protocol.errors import FedplatError, InvalidArgument, PermissionDenied
from fedplat.protocol.peer import ModelHeader, PeerAddress
from fedplat.security.certs import issue
from fedplat.store import Store
from tests.support import wait_for
from tests.support.gossip import client_as, observer

pytestmark = pytest.mark.integration  # starts real processes

ROUNDS = 36


def _scenario(tmp: Path) -> Path:
    s = {
        "name": "mp-ring",
        "rounds": ROUNDS,
        "seed": 0,
        "topology": {"kind": "ring", "n": 8},
        "data": {"dataset": "digits", "partition": "iid"},
        "model": {"name": "mlp", "params": {"hidden": [32]}},
        "training": {"epochs": 1, "batch_size": 16, "lr": 0.1},
        "mixing": {"rule": "metropolis_hastings"},
        "events": [
            {"round": 5, "action": "remove_nodes", "nodes": [2, 5]},
            {"round": 7, "action": "rejoin", "nodes": [2]},
        ],
    }
    p = tmp / "ring.yaml"
    p.write_text(yaml.safe_dump(s))
    return p


def _outsider_is_refused(files: ClusterFiles, address: str) -> list[str]:
    """A client certificate from the deployment's CA, but no membership: every
    call is refused (its reasons)."""
    made = issue(files.pki, "outsider", server=False)
    tls = PeerTls.load(files.ca, made.cert_path, made.key_path)
    reasons = []
    with client_as(files, "launcher", address, "0", tls=tls) as cl:
        for call in (
            lambda: cl.hello(PeerAddress("launcher", "127.0.0.1:9"), 0, "f" * 64),
            cl.pull,
            cl.status,
        ):
            with pytest.raises(PermissionDenied) as info:
                call()
            reasons.append(info.value.reason)
    return reasons


def _push_nan(files: ClusterFiles, address: str) -> str:
    """Peer 1's identity (a compromised member) pushes a NaN model to peer 0."""
    with observer(files, address, "0") as obs:
        layout = obs.pull().header.layout
        round = obs.status().round
    with client_as(files, "1", address, "0", timeout=10) as cl:
        x = torch.zeros(layout.numel)
        x[0] = float("nan")
        data = dense_payload(x).to_bytes()
        h = ModelHeader(
            "1",
            round + 1000,
            layout,
            100,
            1,
            0.0,
            "",
            "i:1",
            len(data),
            hashlib.sha256(data).hexdigest(),
        )
        try:
            cl.push(h, data, layout.fingerprint())
        except InvalidArgument as exc:
            return exc.reason
    return "accepted"


@pytest.mark.timeout(420)
def test_eight_peer_processes_survive_kills_and_a_restart_rejoins(
    tmp_path: Path,
) -> None:
    path = _scenario(tmp_path)
    store = Store(str(tmp_path / "gossip.db"))
    launcher = ProcessLauncher(
        path,
        tmp_path / "logs",
        peer_args=[
            "--heartbeat",
            "0.3",
            "--dead-after",
            "2.5",
            "--round-timeout",
            "4",
            "--linger",
            "6",
            "--min-round-s",
            "0.6",
        ],
        recorder=GossipRecorder(store),
    )
    out: dict[str, LaunchResult] = {}
    runner = threading.Thread(target=lambda: out.setdefault("r", launcher.run(360)))
    runner.start()
    try:

        def peer0_round() -> int:
            try:
                return launcher.clients[0].status().round
            except FedplatError:
                return 0

        wait_for(lambda: peer0_round() >= 2, 240, "peer 0 to train two rounds")
        outsider = _outsider_is_refused(launcher.cluster, launcher.address(0))
        reason = _push_nan(launcher.cluster, launcher.address(0))
    finally:
        runner.join(360)
    res = out["r"]
    logs = "\n".join(
        f"--- {f.name}\n{f.read_text()[-2000:]}"
        for f in sorted((tmp_path / "logs").glob("*.log"))
    )

    # Bad input: refused with a reason; the peer went on to finish.
    assert all("'outsider' is not a member" in r for r in outsider), outsider
    assert "non-finite" in reason, reason
    log0 = (tmp_path / "logs" / "node-0.log").read_text()
    assert "refused push:invalid_argument from node 1: bad model payload" in log0
    assert "refused hello:permission_denied from node outsider" in log0
    assert "WITHOUT TLS" not in log0

    # Nobody crashed: the survivors and the restarted peer exited cleanly; only
    # the peer killed for good died by SIGKILL.
    assert res.crashed == [], logs
    assert res.killed == [2, 5] and res.restarted == [2]
    assert res.exit_codes[5] == -9
    assert all(res.exit_codes[i] == 0 for i in (0, 1, 2, 3, 4, 6, 7)), res.exit_codes

    by_round = {m.round: m for m in res.rounds}
    assert sorted(by_round) == list(range(1, ROUNDS + 1)), logs
    assert by_round[6].alive == 6 and by_round[ROUNDS].alive == 7

    # Accuracy keeps rising through the disruption.
    def acc(r: int) -> float:
        a = by_round[r].mean_accuracy
        assert a is not None
        return a

    assert acc(1) < acc(5) < acc(ROUNDS), [acc(r) for r in sorted(by_round)]
    assert acc(ROUNDS) > 0.85
    final = by_round[ROUNDS]

    # The restarted peer rejoined: it reports, learned, and sits as close to its
    # neighbours as the others do to theirs.
    assert 2 in final.node_accuracy, logs
    assert (
        final.node_accuracy[2]
        > min(final.node_accuracy[1], final.node_accuracy[3]) - 0.1
    )
    others = [d for i, d in final.distance_to_neighbours.items() if i != 2]
    assert final.distance_to_neighbours[2] < 3 * statistics.median(others) + 1e-3

    # The store got the run, its graph changes and the per-node curves.
    run = store.get_run_by_name("mp-ring")
    assert run is not None and run.status == "completed"
    kinds = {e.kind for e in store.list_events(run.id)}
    assert {"gossip_node_removed", "gossip_node_rejoined"} <= kinds
    rounds_of_2 = {
        m.round_number
        for m in store.list_metrics(run.id, "gossip.accuracy")
        if m.client_id == "2"
    }
    assert max(rounds_of_2) == ROUNDS
    store.close()
