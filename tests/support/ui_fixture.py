"""A monitor fixture database, written only through the Store API.

It holds one run in every state the pages must handle: completed (with
stragglers, a rejected update, aggregator verdicts, epsilon, compression,
contribution rows and a signed contribution ledger with a suspect client),
running with an open round (its first round's contribution scores as plain
metrics, no ledger), waiting for clients after one of them was lost, interrupted
(its coordinator's heartbeat stopped mid-round), failed, pending with nothing
yet, and a gossip run with node loss, a cut link and a heal. Rounds are written
as the coordinator writes them: opened, then closed once with everything they
record. Other UI tests import :func:`build_fixture_db`, and call
:func:`keep_alive` before looking at it: the live runs' heartbeats and clients'
last contact are stamped relative to now. The test beside it checks the fixture
says what they assume and holds every store invariant.
"""

from __future__ import annotations

import hashlib
import re
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedplat.contribution.ledger import (
    GENESIS_HASH,
    LedgerEntry,
    LedgerHead,
    chain_entries,
    sign_head,
)
from fedplat.store import (
    ContributionRow,
    EventRow,
    ParticipationRow,
    Store,
    Verdict,
)
from tests.support.configs import free_port
from tests.support.procs import Procs, wait_for
from tests.support.store import deadline, play_round

# A code span as fedplat.ui.markup.code writes it, or one backslash escape.
_SHOWN = re.compile(r"(`+) (.*?) \1|\\([!-/:-@\[-`{-~])")


def shown(markdown: str) -> str:
    """The text a reader sees of the monitor's Markdown, near enough for
    asserts: code spans and backslash escapes resolved, word joiners dropped;
    emphasis markers and badges are left as written."""
    text = _SHOWN.sub(lambda m: m.group(2) if m.group(1) else m.group(3), markdown)
    return text.replace("\u2060", "")


CLIENTS = ["c0", "c1", "c2", "c3"]
WAITING_CLIENTS = ["w0", "w1", "w2"]
INTERRUPTED_CLIENTS = ["x0", "x1"]
ACCURACY = [0.52, 0.71, 0.83]
GOSSIP_NODES = [0, 1, 2, 3, 4, 5]
GOSSIP_EDGES = [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 0], [0, 3]]


def _config(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "run": {"name": name, "rounds": 3},
        "model": {"name": "mlp"},
        "data": {"dataset": "digits"},
        "aggregator": {"name": "multikrum"},
        **extra,
    }


def _enroll(store: Store, run_id: str, ids: list[str]) -> None:
    for i, cid in enumerate(ids):
        store.upsert_client(
            run_id, cid, name=f"client-{cid}", num_examples=100 + 10 * i
        )


def _checkpoint(run: str, r: int) -> dict[str, str]:
    path = f"/checkpoints/{run}/round-{r:05d}.safetensors"
    return {
        "checkpoint_path": path,
        "checkpoint_sha256": hashlib.sha256(path.encode()).hexdigest(),
    }


def _done_participation(r: int, i: int, cid: str) -> ParticipationRow:
    """Round ``r`` of the completed run: c3 straggles in round 2, c2's update is
    rejected in round 3, Multi-Krum excludes c3 in round 3 and clips c1 in 2."""
    status = "succeeded"
    if r == 2 and cid == "c3":
        status = "late"
    if r == 3 and cid == "c2":
        status = "rejected"
    verdict = Verdict()
    if status == "succeeded":
        verdict = Verdict(weight=0.25, selected=True, score=0.1 * i)
        if r == 3 and cid == "c3":
            verdict = Verdict(0.0, False, 9.5, ("krum_excluded",))
        if r == 2 and cid == "c1":
            verdict = Verdict(0.25, True, 1.2, ("clipped",))
    return ParticipationRow(
        cid,
        status,
        bytes_up=1000 + i,
        bytes_down=4000,
        num_examples=100,
        duration_s=1.5,
        train_loss=1.0 / r,
        verdict=verdict,
        reason="update shape mismatch" if status == "rejected" else None,
    )


class _Accountant:
    """Contribution accounting as the coordinator's accountant writes it: client
    ``c<i>`` earns ``0.1 * (i + 1)`` per round, except c2, a suspect free-rider
    in round 2 (credit 0). One contribution row and one signed, hash-chained
    ledger entry per client and round."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.key = Ed25519PrivateKey.generate()
        self.cumulative = dict.fromkeys(CLIENTS, 0.0)
        self.seq, self.prev = 0, GENESIS_HASH

    def round(
        self, r: int
    ) -> tuple[tuple[ContributionRow, ...], tuple[tuple[LedgerEntry, ...], LedgerHead]]:
        contents: list[dict[str, Any]] = []
        for i, cid in enumerate(CLIENTS):
            suspect = r == 2 and cid == "c2"
            credit = 0.0 if suspect else 0.1 * (i + 1)
            self.cumulative[cid] += credit
            contents.append(
                {
                    "round": r,
                    "client_id": cid,
                    "scores": {"gtg": credit},
                    "credit": credit,
                    "flags": ["zero-update"] if suspect else [],
                    "suspect": suspect,
                    "cumulative": self.cumulative[cid],
                }
            )
        total = sum(self.cumulative.values())
        for c in contents:
            c["reward_share"] = self.cumulative[c["client_id"]] / total
        entries = chain_entries(
            self.run_id,
            contents,
            start_seq=self.seq + 1,
            prev_hash=self.prev,
            signing_key=self.key,
        )
        head = sign_head(self.run_id, entries[-1].seq, entries[-1].entry_hash, self.key)
        self.seq, self.prev = head.seq, head.head_hash
        rows = tuple(
            ContributionRow(
                c["client_id"],
                c["credit"],
                dict(c["scores"]),
                c["suspect"],
                tuple(c["flags"]),
            )
            for c in contents
        )
        return rows, (tuple(entries), head)


def _started_run(store: Store, name: str, clients: list[str], rounds: int) -> str:
    run = store.create_run(name, _config(name), {}, total_rounds=rounds)
    store.update_run(run.id, status="running", started_at=datetime.now(UTC))
    _enroll(store, run.id, clients)
    return run.id


def _completed_run(store: Store) -> str:
    run_id = _started_run(store, "digits-done", CLIENTS, 3)
    accountant = _Accountant(run_id)
    for r, acc in enumerate(ACCURACY, start=1):
        contributions, ledger = accountant.round(r)
        play_round(
            store,
            run_id,
            r,
            tuple(_done_participation(r, i, cid) for i, cid in enumerate(CLIENTS)),
            accuracy=acc,
            loss=2.0 - acc,
            **_checkpoint("digits-done", r),
            metrics={"privacy.epsilon": 0.5 * r, "compression.ratio": 20.0 + r},
            contributions=contributions,
            events=(
                EventRow("round_completed", f"round {r} completed", round_number=r),
            ),
            ledger=ledger,
            run_status="completed" if r == len(ACCURACY) else None,
        )
    return run_id


def _running_run(store: Store) -> str:
    run_id = _started_run(store, "digits-live", CLIENTS[:3], 5)
    play_round(
        store,
        run_id,
        1,
        tuple(
            ParticipationRow(
                cid,
                "succeeded",
                bytes_up=500,
                bytes_down=800,
                verdict=Verdict(weight=1 / 3, selected=True),
            )
            for cid in CLIENTS[:3]
        ),
        accuracy=0.4,
        loss=1.6,
        **_checkpoint("digits-live", 1),
        # No ledger in this run: contribution scores come as plain metrics.
        client_metrics={
            cid: {
                "contribution.score": 0.5 - 0.1 * i,
                "contribution.reward_share": [0.5, 0.3, 0.2][i],
            }
            for i, cid in enumerate(CLIENTS[:3])
        },
    )
    # Round 2 is open: nothing of it is recorded until it closes, but the
    # coordinator's heartbeat says what it is doing.
    store.open_round(run_id, 2, num_selected=3, deadline_at=deadline(), model_version=1)
    store.heartbeat(run_id, phase="training", live_clients=3)
    return run_id


def _failed_run(store: Store) -> str:
    run_id = _started_run(store, "digits-failed", CLIENTS[:2], 3)
    dropped = "no update before the round closed"
    play_round(
        store,
        run_id,
        1,
        (
            ParticipationRow("c0", "dropped", reason=dropped),
            # Downloaded the model, never uploaded: dropped at close.
            ParticipationRow("c1", "dropped", bytes_down=800, reason=dropped),
        ),
        status="failed",
        reason="round 1 failed 1 times: quorum not reached: 0 updates, 2 needed",
        events=(
            *(
                EventRow(
                    "client_dropped",
                    f"client 'client-{cid}' sent no update in round 1",
                    "warning",
                    1,
                    cid,
                )
                for cid in CLIENTS[:2]
            ),
            EventRow(
                "round_failed",
                "round 1: quorum not reached: 0 updates, 2 needed",
                "warning",
                1,
            ),
            EventRow("run_failed", "round 1 failed 1 times", "error", 1),
        ),
        run_status="failed",
    )
    return run_id


def _waiting_run(store: Store) -> str:
    """Round 1 done with w0..w2; then w2's device died and the coordinator
    waits for 3 live clients (``wait_for_clients_seconds`` unset: for ever)."""
    run = store.create_run(
        "digits-waiting",
        _config(
            "digits-waiting",
            selection={"min_available": 3, "quorum": 2},
            deadlines={"liveness_seconds": 30},
        ),
        {},
        total_rounds=5,
    )
    store.update_run(run.id, status="running", started_at=datetime.now(UTC))
    _enroll(store, run.id, WAITING_CLIENTS)
    play_round(
        store,
        run.id,
        1,
        tuple(
            ParticipationRow(
                cid, "succeeded", verdict=Verdict(weight=1 / 3, selected=True)
            )
            for cid in WAITING_CLIENTS
        ),
        accuracy=0.35,
        **_checkpoint("digits-waiting", 1),
    )
    return run.id


def _interrupted_run(store: Store) -> str:
    """Round 2 open when the coordinator's heartbeat stopped 10 minutes ago; x1
    had been silent for 5 minutes by then (lost), x0 answered just before."""
    run_id = _started_run(store, "digits-crashed", INTERRUPTED_CLIENTS, 4)
    play_round(
        store,
        run_id,
        1,
        tuple(_ok_row(cid) for cid in INTERRUPTED_CLIENTS),
        accuracy=0.5,
        **_checkpoint("digits-crashed", 1),
    )
    store.open_round(run_id, 2, num_selected=2, deadline_at=deadline(), model_version=1)
    died = datetime.now(UTC) - timedelta(minutes=10)
    store.heartbeat(run_id, phase="training", live_clients=1, when=died)
    store.touch_clients(run_id, ["x0"], when=died - timedelta(seconds=3))
    store.touch_clients(run_id, ["x1"], when=died - timedelta(minutes=5))
    return run_id


def _ok_row(cid: str) -> ParticipationRow:
    return ParticipationRow(
        cid, "succeeded", verdict=Verdict(weight=0.5, selected=True)
    )


def keep_alive(path: Path, ids: dict[str, str]) -> None:
    """Stamp the live runs as a running coordinator would right now: digits-live
    trains with its 3 clients active; digits-waiting waits with w0, w1 live and
    w2 silent for 10 minutes."""
    now = datetime.now(UTC)
    with Store(str(path), migrate=False) as store:
        live = ids["digits-live"]
        store.heartbeat(live, phase="training", live_clients=3)
        store.touch_clients(live, CLIENTS[:3], when=now)
        waiting = ids["digits-waiting"]
        store.heartbeat(waiting, phase="waiting_for_clients", live_clients=2)
        store.touch_clients(waiting, WAITING_CLIENTS[:2], when=now)
        store.touch_clients(
            waiting, WAITING_CLIENTS[2:], when=now - timedelta(minutes=10)
        )


def _pending_run(store: Store) -> str:
    return store.create_run(
        "digits-pending", _config("digits-pending"), {}, total_rounds=10
    ).id


def _gossip_run(store: Store) -> str:
    cfg = _config(
        "gossip-ring",
        mode="gossip",
        topology={"nodes": GOSSIP_NODES, "edges": GOSSIP_EDGES},
    )
    run = store.create_run("gossip-ring", cfg, {}, total_rounds=4)
    store.update_run(run.id, status="running", started_at=datetime.now(UTC))
    for r in range(1, 5):
        for n in GOSSIP_NODES:
            if r >= 3 and n == 3:
                continue  # node 3 is dead from round 3 on
            store.add_metric(
                run.id,
                "gossip.accuracy",
                0.3 + 0.1 * r + 0.01 * n,
                round_number=r,
                client_id=str(n),
            )
        store.add_metrics(
            run.id,
            {
                "gossip.mean_accuracy": 0.33 + 0.1 * r,
                "gossip.min_accuracy": 0.3 + 0.1 * r,
                "gossip.consensus_distance": 1.0 / r,
                "gossip.components": 1.0,
            },
            round_number=r,
        )
        store.update_run(run.id, current_round=r)
    store.add_events(
        run.id,
        [
            EventRow(
                "gossip_node_removed",
                "1 node(s) removed (degree)",
                round_number=2,
                details={"nodes": [3], "edges": []},
            ),
            EventRow(
                "gossip_link_cut",
                "1 link(s) cut",
                round_number=2,
                details={"nodes": [], "edges": [[0, 1]]},
            ),
            EventRow(
                "gossip_link_healed",
                "1 link(s) restored",
                round_number=3,
                details={"nodes": [], "edges": [[0, 1]]},
            ),
        ],
    )
    return run.id


def build_fixture_db(path: Path) -> dict[str, str]:
    """Create the fixture database at ``path``; return run name -> run id."""
    ids: dict[str, str] = {}
    with Store(str(path)) as store:
        ids["digits-done"] = _completed_run(store)
        ids["digits-live"] = _running_run(store)
        ids["digits-waiting"] = _waiting_run(store)
        ids["digits-crashed"] = _interrupted_run(store)
        ids["digits-failed"] = _failed_run(store)
        ids["digits-pending"] = _pending_run(store)
        ids["gossip-ring"] = _gossip_run(store)
    return ids


def build_empty_db(path: Path) -> None:
    """A migrated database with no runs."""
    Store(str(path)).close()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def serve_monitor(procs: Procs, db: Path, *extra: str) -> str:
    """``fedplat monitor --db db *extra`` on a free port (refreshing every
    second); returns its base URL once it answers."""
    port = free_port()
    argv = ["-m", "fedplat.cli", "monitor", "--db", str(db), "--port", str(port)]
    procs.start("monitor", [*argv, "--refresh", "1", *extra])
    base = f"http://127.0.0.1:{port}"
    wait_for(
        lambda: _healthy(f"{base}/_stcore/health"), 180, "the monitor", procs=procs
    )
    return base
