"""Real multi-process gossip runs driven by a scenario file.

:class:`ProcessLauncher` starts one ``fedplat gossip node`` process per node of
the scenario's topology on 127.0.0.1 (each seeded with its topology neighbours),
then watches them through ``GetStatus``. When the slowest live peer has finished
round ``r`` it replays the scenario's events for ``r``: removing a node kills its
process (``SIGKILL``, a crash as far as its neighbours can tell: they must notice
by heartbeat), a rejoin restarts it (it catches up from its neighbours). Link
cuts and partitions are enacted by the peers themselves, which replay the same
scenario file. Each round's accuracies, components and spread of the models
(pulled from the peers) go to an optional store with the same contract as the
simulation (:mod:`fedplat.gossip.recorder`).

The peers run over mutual TLS by default: the launcher makes a CA, one peer
certificate and identity key per node, and the membership pinning them in its
work folder (:func:`fedplat.gossip.pki.make_cluster`), and watches the peers as
the observer ``launcher`` (status and model pulls only).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fedplat.compression import Payload
from fedplat.gossip import mixing as mx
from fedplat.gossip.client import PeerClient
from fedplat.gossip.network import GraphChange, NetworkState
from fedplat.gossip.pki import OBSERVER, make_cluster
from fedplat.gossip.recorder import GossipRecorder
from fedplat.gossip.scenario import load_scenario
from fedplat.gossip.setup import check_app, load_test, model_for
from fedplat.gossip.signing import Signer
from fedplat.gossip.sim import RoundMetrics
from fedplat.gossip.topology import components, edge_list
from fedplat.protocol.peer import PeerStatus
from fedplat.vectors import layout_of

__all__ = ["LaunchResult", "LaunchRound", "ProcessLauncher"]

log = logging.getLogger("fedplat.gossip.launcher")


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class LaunchRound:
    """What the launcher saw when the slowest live peer finished ``round``.

    Attributes
    ----------
    node_accuracy : dict
        Node -> its last reported accuracy.
    distance_to_neighbours : dict
        Node -> ``||x_i - mean of its live neighbours' models||`` (pulled).
    """

    round: int
    alive: int
    components: int
    consensus_distance: float
    mean_accuracy: float | None
    min_accuracy: float | None
    node_accuracy: dict[int, float] = field(default_factory=dict)
    distance_to_neighbours: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchResult:
    """Outcome of :meth:`ProcessLauncher.run`.

    Attributes
    ----------
    exit_codes : dict
        Node -> exit code of its last process (negative: killed by a signal).
    killed : list of int
        Nodes the scenario removed (their ``SIGKILL`` is expected).
    crashed : list of int
        Nodes whose last process exited with an error it was not killed for.
    """

    rounds: list[LaunchRound]
    changes: list[GraphChange]
    exit_codes: dict[int, int | None]
    killed: list[int]
    restarted: list[int]
    crashed: list[int]
    seconds: float


class ProcessLauncher:
    """Run a scenario as real peer processes on one host.

    Parameters
    ----------
    scenario_path : path
        The scenario file (every process reads it too).
    workdir : path
        Logs go to ``workdir/node-<i>.log``; certificates, identity keys and the
        membership to ``workdir/pki``, ``workdir/state``, ``workdir/membership.yaml``.
    host : str
        Interface to bind (127.0.0.1 in tests).
    peer_args : list of str
        Extra ``fedplat gossip node`` flags for every process (timeouts, pacing).
    recorder : GossipRecorder, optional
        Store sink.
    env : dict, optional
        Environment of the processes (``OMP_NUM_THREADS=1`` is always set).
    insecure : bool
        Plaintext peers (no TLS; signatures still checked): the explicit,
        logged choice for a test host.
    app_dir : path, optional
        Folder the scenario's plug-ins (``model.factory``, ``data.clients``,
        ``data.eval``) are imported from, in this process and in every peer's
        (``--app-dir``). They are checked once here, on node 0's data, before
        any peer starts.
    """

    def __init__(
        self,
        scenario_path: str | os.PathLike[str],
        workdir: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        peer_args: list[str] | None = None,
        recorder: GossipRecorder | None = None,
        env: dict[str, str] | None = None,
        poll_s: float = 0.25,
        insecure: bool = False,
        app_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.path = Path(scenario_path).resolve()
        self.scenario = load_scenario(self.path)
        self.app_dir = None if app_dir is None else Path(app_dir).resolve()
        if self.app_dir is not None and str(self.app_dir) not in sys.path:
            sys.path.insert(0, str(self.app_dir))
        check_app(self.scenario)
        self.network = NetworkState(self.scenario)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.peer_args = list(peer_args or [])
        self.recorder = recorder
        self.poll_s = poll_s
        self.env = {
            "GRPC_VERBOSITY": "ERROR",  # no C-core line per failed handshake
            **(env or os.environ),
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        n = self.network.n
        self.ports = [_free_port(host) for _ in range(n)]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        if insecure:
            log.warning("launching peers WITHOUT TLS (--insecure)")
        self.cluster = make_cluster(
            self.workdir,
            [str(i) for i in range(n)],
            tls=not insecure,
            addresses={str(i): self.address(i) for i in range(n)},
            sans=(host,),
        )
        members = self.cluster.load_membership()
        signer = Signer(OBSERVER, self.cluster.identity(OBSERVER))
        tls = self.cluster.observer_tls()
        self.clients = {
            i: PeerClient(
                self.address(i),
                signer=signer,
                membership=members,
                server_id=str(i),
                tls=tls,
                timeout=2.0,
            )
            for i in range(n)
        }
        self.killed: list[int] = []
        self.restarted: list[int] = []

    def address(self, i: int) -> str:
        return f"{self.host}:{self.ports[i]}"

    def _spawn(self, i: int, extra: list[str]) -> None:
        seeds = ",".join(
            f"{j}@{self.address(j)}" for j in sorted(self.network.base.neighbors(i))
        )
        args = [
            sys.executable,
            "-m",
            "fedplat.cli",
            "gossip",
            "node",
            "--scenario",
            str(self.path),
            "--id",
            str(i),
            "--listen",
            self.address(i),
            *(["--seeds", seeds] if seeds else []),
            *self.cluster.node_args(str(i)),
            *(["--app-dir", str(self.app_dir)] if self.app_dir else []),
            *self.peer_args,
            *extra,
        ]
        with (self.workdir / f"node-{i}.log").open("ab") as logf:
            self.procs[i] = subprocess.Popen(
                args, stdout=logf, stderr=subprocess.STDOUT, env=self.env
            )

    def _kill(self, i: int) -> None:
        p = self.procs.get(i)
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)
        self.killed.append(i)

    def _statuses(self) -> dict[int, PeerStatus]:
        out = {}
        for i in sorted(self.network.alive):
            p = self.procs.get(i)
            if p is None or p.poll() is not None:
                continue
            with contextlib.suppress(Exception):
                out[i] = self.clients[i].status()
        return out

    def _models(self, nodes: list[int]) -> dict[int, torch.Tensor]:
        out = {}
        for i in nodes:
            with contextlib.suppress(Exception):
                msg = self.clients[i].pull()
                out[i] = Payload.from_bytes(msg.data).values.to(torch.float32)
        return out

    def _measure(self, r: int, st: dict[int, PeerStatus]) -> LaunchRound:
        g = self.network.graph()
        live = sorted(i for i in self.network.alive if i in st)
        models = self._models(live)
        acc = {i: st[i].accuracy for i in live if st[i].accuracy is not None}
        dist: dict[int, float] = {}
        for i, x in models.items():
            nb = [models[j] for j in g.neighbors(i) if j in models]
            if nb:
                dist[i] = float((x - torch.stack(nb).mean(0)).norm())
        cd = (
            mx.consensus_distance(torch.stack(list(models.values())))
            if models
            else float("nan")
        )
        vals = [a for a in acc.values() if a is not None]
        return LaunchRound(
            r,
            len(self.network.alive),
            components(g),
            cd,
            sum(vals) / len(vals) if vals else None,
            min(vals) if vals else None,
            {i: float(a) for i, a in acc.items() if a is not None},
            dist,
        )

    def run(self, timeout: float = 600.0) -> LaunchResult:
        """Start every peer, replay the scenario, wait for the end; kill everything."""
        t0 = time.monotonic()
        self._start_record()
        changes = list(self.network.advance(0))
        for i in sorted(self.network.alive):
            self._spawn(i, ["--no-data"] if not self.network.has_data(i) else [])
        rounds: list[LaunchRound] = []
        seen: dict[int, PeerStatus] = {}
        try:
            self._watch(t0 + timeout, rounds, changes, seen)
        finally:
            codes = self._shutdown()
        gone = set(range(self.network.n)) - self.network.alive
        crashed = [
            i
            for i, c in codes.items()
            if c not in (0, -signal.SIGTERM)
            and not (i in gone and c == -signal.SIGKILL)
        ]
        if self.recorder is not None:
            done = len(rounds) >= self.scenario.rounds
            self.recorder.finish(
                _link_bytes(seen),
                status="completed" if not crashed and done else "failed",
            )
        return LaunchResult(
            rounds,
            changes,
            codes,
            sorted(set(self.killed)),
            self.restarted,
            sorted(set(crashed)),
            time.monotonic() - t0,
        )

    def _start_record(self) -> None:
        if self.recorder is None:
            return
        s = self.scenario
        template = model_for(s.model, load_test(s.data), s.seed)
        self.recorder.start(
            s,
            layout_of(template).to_dict(),
            edge_list(self.network.base),
            self.network.relay,
        )

    def _watch(
        self,
        end: float,
        rounds: list[LaunchRound],
        changes: list[GraphChange],
        seen: dict[int, PeerStatus],
    ) -> None:
        """Poll the peers until all finished (or ``end``); replay the scenario
        as the slowest live peer completes each round."""
        total = self.scenario.rounds
        last_bytes: dict[int, int] = {}
        while time.monotonic() < end:
            time.sleep(self.poll_s)
            st = self._statuses()
            seen.update(st)
            live = [i for i in self.network.alive if self.procs[i].poll() is None]
            if not live:
                return
            if not st:
                continue
            # Peers still (re)starting do not report yet and do not hold the
            # others back.
            low = min(p.round for p in st.values())
            while len(rounds) < min(low, total):
                m = self._measure(len(rounds) + 1, st)
                rounds.append(m)
                self._record_round(m, st, last_bytes)
                if m.round < total:
                    for ch in self.network.advance(m.round):
                        changes.append(ch)
                        self._enact(ch)
                        if self.recorder is not None:
                            self.recorder.change(ch)
            if len(rounds) >= total and all(i in st and st[i].finished for i in live):
                return

    def _record_round(
        self, m: LaunchRound, st: dict[int, PeerStatus], last_bytes: dict[int, int]
    ) -> None:
        if self.recorder is None:
            return
        sent = {i: st[i].bytes_sent - last_bytes.get(i, 0) for i in st}
        last_bytes.update({i: st[i].bytes_sent for i in st})
        self.recorder.round(
            RoundMetrics(
                m.round,
                m.alive,
                m.components,
                m.consensus_distance,
                sum(sent.values()),
                m.mean_accuracy,
                m.min_accuracy,
                m.node_accuracy,
                sent,
            )
        )

    def _enact(self, ch: GraphChange) -> None:
        if ch.kind == "gossip_node_removed":
            for i in ch.nodes:
                log.info("killing node %d (%s)", i, ch.details.get("reason"))
                self._kill(i)
        elif ch.kind == "gossip_node_rejoined":
            for i in ch.nodes:
                log.info("restarting node %d", i)
                extra = ["--bootstrap-timeout", "5"]
                if not self.network.has_data(i):
                    extra.append("--no-data")
                self._spawn(i, extra)
                self.restarted.append(i)

    def _shutdown(self) -> dict[int, int | None]:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes: dict[int, int | None] = {}
        end = time.monotonic() + 60  # all stop in parallel; slow on a busy host
        for i, p in self.procs.items():
            try:
                codes[i] = p.wait(timeout=max(1.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("node %d did not stop within 60 s; killing it", i)
                p.kill()
                codes[i] = p.wait(timeout=5)
        for c in self.clients.values():
            c.close()
        return codes


def _link_bytes(seen: dict[int, PeerStatus]) -> dict[tuple[int, int], int]:
    """Bytes each scenario link carried, from the peers' last statuses."""
    out: dict[tuple[int, int], int] = {}
    for i, p in seen.items():
        for nb in p.neighbours:
            if not nb.node_id.isdigit():
                continue  # not a scenario node (an intruder, a tool)
            j = int(nb.node_id)
            e = (min(i, j), max(i, j))
            out[e] = out.get(e, 0) + nb.bytes_sent
    return out
