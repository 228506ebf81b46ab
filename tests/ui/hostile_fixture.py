"""A store written by an insider: every string a client or peer can choose is
Markdown or HTML that would fetch the attacker's image or draw the attacker's
link if the monitor rendered it as markup.

One federated run (a hostile client name that was flagged, rejected with a
reason quoting its input, then lost; the run failed with that reason) and one
gossip run (a node id and a graph-change message with HTML). Written only
through the Store API, as the coordinator and the gossip recorder write.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fedplat.store import EventRow, ParticipationRow, Store, Verdict
from tests.support.store import play_round

#: The client name an insider enrolled with (issue 23).
HOSTILE_NAME = "![x](http://attacker.example/t.png) [click](http://evil.example)"
#: A refusal reason and event message quoting the client's input.
HOSTILE_MESSAGE = "bad update: <img src=x onerror=alert(1)> **bold**"
#: A peer's message with URLs, which GFM would autolink even when escaped.
HOSTILE_URLS = "cut: see http://evil.example/why, www.evil.example or x@evil.example"
#: A run name (run names reach the store from run files and gossip scenarios).
HOSTILE_RUN = "run <b>x</b> [r](http://evil.example/run) :red[alarm]"
#: A gossip node id.
HOSTILE_NODE = "<img src=http://attacker.example/n.png>"
#: An aggregator flag the client's update earned.
HOSTILE_FLAG = "[flag](http://evil.example/flag)"
#: Hosts that must never appear in an ``src`` or ``href`` on the page.
ATTACKER_HOSTS = ("attacker.example", "evil.example")

#: remark-gfm's literal autolinks, as its transform finds them in text nodes
#: (after escapes are resolved): text matching this is drawn as a link.
GFM_AUTOLINK = re.compile(
    r"(https?://|www(?=\.))[-.\w]+|[-.\w+]+@[-\w]+(\.[-\w]+)+", re.IGNORECASE
)

HOSTILE = "h0"
HONEST = "ok0"


def _federated(store: Store) -> str:
    cfg: dict[str, Any] = {
        "run": {"name": HOSTILE_RUN, "rounds": 3},
        "model": {"name": "mlp"},
        "data": {"dataset": "digits"},
        "aggregator": {"name": "[agg](http://evil.example/agg)"},
    }
    run = store.create_run(HOSTILE_RUN, cfg, {}, total_rounds=3)
    store.update_run(run.id, status="running", started_at=datetime.now(UTC))
    store.upsert_client(run.id, HOSTILE, name=HOSTILE_NAME, num_examples=100)
    store.upsert_client(run.id, HONEST, name="honest-client", num_examples=100)
    play_round(
        store,
        run.id,
        1,
        (
            ParticipationRow(
                HOSTILE,
                "succeeded",
                bytes_up=100,
                verdict=Verdict(0.0, False, 9.5, (HOSTILE_FLAG,)),
            ),
            ParticipationRow(
                HONEST, "succeeded", bytes_up=100, verdict=Verdict(1.0, True, 0.1)
            ),
        ),
        accuracy=0.5,
        client_metrics={
            HOSTILE: {"contribution.score": 0.1, "contribution.reward_share": 0.2},
            HONEST: {"contribution.score": 0.4, "contribution.reward_share": 0.8},
        },
        events=(
            EventRow(
                "client_flagged", f"{HOSTILE_NAME}: {HOSTILE_MESSAGE}", "warning", 1
            ),
        ),
    )
    play_round(
        store,
        run.id,
        2,
        (
            ParticipationRow(HOSTILE, "rejected", reason=HOSTILE_MESSAGE),
            ParticipationRow(HONEST, "dropped", reason="no update"),
        ),
        status="failed",
        reason=HOSTILE_MESSAGE,
        events=(
            EventRow("update_rejected", HOSTILE_MESSAGE, "warning", 2, HOSTILE),
            EventRow("run_failed", HOSTILE_MESSAGE, "error", 2),
        ),
        run_status="failed",
    )
    # The hostile client went silent long before the end: it is listed as lost.
    now = datetime.now(UTC)
    store.touch_clients(run.id, [HOSTILE], when=now - timedelta(minutes=10))
    store.touch_clients(run.id, [HONEST], when=now)
    return run.id


def _gossip(store: Store) -> str:
    nodes = ["a", HOSTILE_NODE, "c"]
    cfg = {
        "run": {"name": "gossip " + HOSTILE_RUN, "rounds": 2},
        "mode": "gossip",
        "topology": {
            "nodes": nodes,
            "edges": [["a", HOSTILE_NODE], [HOSTILE_NODE, "c"]],
        },
    }
    run = store.create_run("gossip " + HOSTILE_RUN, cfg, {}, total_rounds=2)
    store.update_run(run.id, status="running", started_at=datetime.now(UTC))
    for r in (1, 2):
        for i, n in enumerate(nodes):
            store.add_metric(
                run.id, "gossip.accuracy", 0.5 + 0.1 * i, round_number=r, client_id=n
            )
        store.add_metrics(run.id, {"gossip.mean_accuracy": 0.6}, round_number=r)
        store.update_run(run.id, current_round=r)
    store.add_events(
        run.id,
        [
            EventRow(
                "gossip_node_removed",
                HOSTILE_MESSAGE,
                round_number=1,
                details={"nodes": [HOSTILE_NODE], "edges": []},
            ),
            EventRow(
                "gossip_link_cut",
                HOSTILE_URLS,
                round_number=1,
                details={"nodes": [], "edges": [["a", HOSTILE_NODE]]},
            ),
        ],
    )
    return run.id


def build_hostile_db(path: Path) -> dict[str, str]:
    """Create the store at ``path``; returns ``federated`` and ``gossip`` run ids."""
    with Store(str(path)) as store:
        return {"federated": _federated(store), "gossip": _gossip(store)}


__all__ = [
    "ATTACKER_HOSTS",
    "GFM_AUTOLINK",
    "HONEST",
    "HOSTILE",
    "HOSTILE_FLAG",
    "HOSTILE_MESSAGE",
    "HOSTILE_NAME",
    "HOSTILE_NODE",
    "HOSTILE_RUN",
    "HOSTILE_URLS",
    "build_hostile_db",
]
