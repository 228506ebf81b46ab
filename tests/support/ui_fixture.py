"""A monitor fixture database, written only through the Store API.

It holds one run in every state the pages must handle: completed (with
stragglers, a rejected update, aggregator flags, epsilon, compression and a
signed contribution ledger with a suspect client), running with an open round
(and contribution scores as plain metrics), failed, pending with nothing yet, and
a gossip run with node loss, a cut link and a heal. Other UI tests import
:func:`build_fixture_db`; the test here checks the fixture says what they assume.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedplat.contribution.ledger import GENESIS_HASH, chain_entries, sign_head
from fedplat.store import Store

CLIENTS = ["c0", "c1", "c2", "c3"]
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


def _completed_run(store: Store) -> str:
    run = store.create_run("digits-done", _config("digits-done"), {}, total_rounds=3)
    store.update_run(run.id, status="running", started_at=datetime.now(UTC))
    _enroll(store, run.id, CLIENTS)
    deadline = datetime.now(UTC) + timedelta(minutes=5)
    for r, acc in enumerate(ACCURACY, start=1):
        store.start_round(
            run.id, r, selected=CLIENTS, deadline_at=deadline, model_version=r - 1
        )
        for i, cid in enumerate(CLIENTS):
            status = "succeeded"
            if r == 2 and cid == "c3":
                status = "late"  # a straggler
            if r == 3 and cid == "c2":
                status = "rejected"
            store.update_participation(
                run.id,
                r,
                cid,
                status=status,
                bytes_down=4000,
                bytes_up=1000 + i,
                num_examples=100,
                duration_s=1.5,
                train_loss=1.0 / r,
                reason="update shape mismatch" if status == "rejected" else None,
            )
            if status != "succeeded":
                continue
            flags: dict[str, Any] = {"selected": True, "score": 0.1 * i, "flags": []}
            if r == 3 and cid == "c3":
                flags = {"selected": False, "score": 9.5, "flags": ["krum_excluded"]}
            if r == 2 and cid == "c1":
                flags = {"selected": True, "score": 1.2, "flags": ["clipped"]}
            store.update_participation(run.id, r, cid, weight=0.25, flags=flags)
        store.finish_round(run.id, r, status="completed", accuracy=acc, loss=2.0 - acc)
        store.add_metrics(
            run.id,
            {"privacy.epsilon": 0.5 * r, "compression.ratio": 20.0 + r},
            round_number=r,
        )
        store.add_event(
            run.id, "round_completed", f"round {r} completed", round_number=r
        )
    _ledger(store, run.id)
    store.update_run(run.id, status="completed", finished_at=datetime.now(UTC))
    return run.id


def _ledger(store: Store, run_id: str) -> None:
    """A signed ledger as the contribution accountant writes it: client ``c<i>``
    earns ``0.1 * (i + 1)`` per round, except c2, a suspect free-rider in round
    2 (credit 0)."""
    key = Ed25519PrivateKey.generate()
    cumulative = dict.fromkeys(CLIENTS, 0.0)
    seq, prev = 0, GENESIS_HASH
    for r in range(1, len(ACCURACY) + 1):
        contents: list[dict[str, Any]] = []
        for i, cid in enumerate(CLIENTS):
            suspect = r == 2 and cid == "c2"
            credit = 0.0 if suspect else 0.1 * (i + 1)
            cumulative[cid] += credit
            contents.append(
                {
                    "round": r,
                    "client_id": cid,
                    "scores": {"gtg": credit},
                    "credit": credit,
                    "flags": ["zero-update"] if suspect else [],
                    "suspect": suspect,
                    "cumulative": cumulative[cid],
                }
            )
        total = sum(cumulative.values())
        for c in contents:
            c["reward_share"] = cumulative[c["client_id"]] / total
        entries = chain_entries(
            run_id, contents, start_seq=seq + 1, prev_hash=prev, signing_key=key
        )
        head = sign_head(run_id, entries[-1].seq, entries[-1].entry_hash, key)
        store.append_ledger(run_id, entries, head)
        seq, prev = head.seq, head.head_hash
    # The accountant also merges its verdict into the participation's flags.
    store.update_participation(
        run_id,
        2,
        "c2",
        flags={
            "selected": True,
            "score": 0.2,
            "flags": [],
            "contribution": {"flags": ["zero-update"], "suspect": True, "score": 0.0},
        },
    )


def _running_run(store: Store) -> str:
    run = store.create_run("digits-live", _config("digits-live"), {}, total_rounds=5)
    store.update_run(run.id, status="running", started_at=datetime.now(UTC))
    _enroll(store, run.id, CLIENTS[:3])
    deadline = datetime.now(UTC) + timedelta(minutes=5)
    store.start_round(
        run.id, 1, selected=CLIENTS[:3], deadline_at=deadline, model_version=0
    )
    for i, cid in enumerate(CLIENTS[:3]):
        store.update_participation(
            run.id, 1, cid, status="succeeded", bytes_up=500, bytes_down=800
        )
        # No ledger in this run: contribution scores come as plain metrics.
        store.add_metrics(
            run.id,
            {
                "contribution.score": 0.5 - 0.1 * i,
                "contribution.reward_share": [0.5, 0.3, 0.2][i],
            },
            round_number=1,
            client_id=cid,
        )
    store.finish_round(run.id, 1, status="completed", accuracy=0.4, loss=1.6)
    store.start_round(
        run.id, 2, selected=CLIENTS[:3], deadline_at=deadline, model_version=1
    )
    store.update_participation(
        run.id, 2, "c0", status="succeeded", bytes_up=500, bytes_down=800
    )
    store.update_participation(run.id, 2, "c1", status="downloaded", bytes_down=800)
    return run.id


def _failed_run(store: Store) -> str:
    run = store.create_run(
        "digits-failed", _config("digits-failed"), {}, total_rounds=3
    )
    store.update_run(run.id, status="running", started_at=datetime.now(UTC))
    _enroll(store, run.id, CLIENTS[:2])
    deadline = datetime.now(UTC) + timedelta(minutes=5)
    store.start_round(
        run.id, 1, selected=CLIENTS[:2], deadline_at=deadline, model_version=0
    )
    store.update_participation(
        run.id, 1, "c0", status="dropped", reason="no update before the round closed"
    )
    store.update_participation(
        run.id, 1, "c1", status="dropped", reason="no update before the round closed"
    )
    store.finish_round(
        run.id, 1, status="failed", reason="quorum not reached: 0 updates, 2 needed"
    )
    store.add_event(
        run.id,
        "round_failed",
        "round 1: quorum not reached: 0 updates, 2 needed",
        level="warning",
        round_number=1,
    )
    store.add_event(
        run.id, "run_failed", "round 1 failed 1 times", level="error", round_number=1
    )
    store.update_run(run.id, status="failed", finished_at=datetime.now(UTC))
    return run.id


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
    store.add_event(
        run.id,
        "gossip_node_removed",
        "1 node(s) removed (degree)",
        round_number=2,
        details={"nodes": [3], "edges": []},
    )
    store.add_event(
        run.id,
        "gossip_link_cut",
        "1 link(s) cut",
        round_number=2,
        details={"nodes": [], "edges": [[0, 1]]},
    )
    store.add_event(
        run.id,
        "gossip_link_healed",
        "1 link(s) restored",
        round_number=3,
        details={"nodes": [], "edges": [[0, 1]]},
    )
    return run.id


def build_fixture_db(path: Path) -> dict[str, str]:
    """Create the fixture database at ``path``; return run name -> run id."""
    ids: dict[str, str] = {}
    with Store(str(path)) as store:
        ids["digits-done"] = _completed_run(store)
        ids["digits-live"] = _running_run(store)
        ids["digits-failed"] = _failed_run(store)
        ids["digits-pending"] = _pending_run(store)
        ids["gossip-ring"] = _gossip_run(store)
    return ids


def build_empty_db(path: Path) -> None:
    """A migrated database with no runs."""
    Store(str(path)).close()
