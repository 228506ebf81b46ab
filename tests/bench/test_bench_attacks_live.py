"""Tiny mode of bench/attacks_live.py: against a live coordinator under the
default secure configuration, a sybil flood, huge-magnitude rows and calls with
blank or unknown client ids are blocked
(decided from the store and the attacker's refused requests), the honest
clients complete every round with the accuracy of the run without attack, and
the store grows by less than 1 MB; gossip poisoning of three peer processes is
refused and the peers finish with no less accuracy than the run without attack; and
docs/security.md quotes the committed attacks_live.json."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support import REPO, run_bench


# The sybil_flood row is the regression test of honest enrolment under a flood:
# before challenges were stateless and the admission budget was spent only by
# admissible enrolments, the flood drained the one budget and a 4-client run
# never reached min_available.
@pytest.mark.integration  # starts real processes
@pytest.mark.timeout(1800)  # a loaded host takes minutes per run
def test_tiny_attacks_are_blocked_and_honest_clients_unaffected(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    out = tmp_path_factory.mktemp("attacks") / "attacks.json"
    res = run_bench("bench.attacks_live", out, timeout=1800)
    assert res["tiny"] is True
    assert [r["attack"] for r in res["rows"]] == [
        "sybil_flood",
        "huge_magnitude_rows",
        "empty_client_id",
    ]
    rounds = res["setup"]["rounds"]
    assert res["no_attack"]["honest_rounds_completed"] == rounds
    for row in res["rows"]:
        ev = row["evidence"]
        assert row["blocked"] is True, (row["attack"], ev)
        assert ev["accepted_requests"] == 0 and ev["updates_aggregated"] == 0
        assert sum(ev["requests"].values()) > 0  # it did attack
        assert row["honest_rounds_completed"] == rounds
        assert abs(row["final_accuracy"] - res["no_attack_accuracy"]) <= 0.01
        assert row["store_growth_mb"] < 1.0
        assert row["store_check"] == "ok"
        assert row["run_status"] == "completed"
        assert row["coordinator_peak_fds"] > 0
    sybil = res["rows"][0]["evidence"]
    assert sybil["clients_in_store"] == res["setup"]["clients"]
    # Blank ids: refused as UNAUTHENTICATED (metadata) or INVALID_ARGUMENT (a
    # request's id), never an identity, never named by a stored event.
    blank = res["rows"][2]["evidence"]
    assert blank["requests"].get("UNAUTHENTICATED", 0) > 0
    assert blank["events_naming_blank_or_unknown_ids"] == {}
    assert blank["blank_client_ids_in_store"] == 0
    assert blank["clients_in_store"] == res["setup"]["clients"]
    # Gossip: the poisoner's every call refused, peers finish and learn.
    gossip = res["gossip"]
    assert [r["attack"] for r in gossip["rows"]] == ["gossip_poisoning"]
    (poison,) = gossip["rows"]
    ev = poison["evidence"]
    assert poison["blocked"] is True, ev
    assert ev["accepted_requests"] == 0 and sum(ev["requests"].values()) > 0
    assert ev["peers_refused"].get("push:permission_denied", 0) > 0
    assert not any(ev["non_member_neighbours"].values())
    assert poison["honest_rounds_completed"] == res["setup"]["gossip_rounds"]
    # One-sided: the attack must cost no accuracy. Under CI load the attacked
    # ring has twice ended at 0.8444 against the reference's 0.825, every
    # attacker call refused; the timing that makes the three peers land on a
    # different (higher) consensus is not found yet.
    assert poison["final_accuracy"] >= gossip["no_attack_accuracy"] - 0.01


def test_docs_quote_the_committed_results(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # bench/ is not an installed package
    from bench.attacks_live import RESULTS, render_markdown

    doc = (REPO / "docs" / "security.md").read_text()
    begin, end = "<!-- attacks-table:begin -->\n", "<!-- attacks-table:end -->"
    quoted = doc[doc.index(begin) + len(begin) : doc.index(end)]
    assert quoted == render_markdown(json.loads(RESULTS.read_text()))


def _peer(node_id: str, rounds: int, neighbours: dict[str, str]) -> Any:
    from fedplat.protocol.peer import NeighbourView, PeerStatus

    views = tuple(
        NeighbourView(i, a, True, False, rounds, 0.1, 0, 0)
        for i, a in neighbours.items()
    )
    return PeerStatus(node_id, rounds, True, 0.9, 100, "", 0, "", 0, 0, None, views)


def test_gossip_verdict_is_not_blocked_when_the_attack_shows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gossip rows' ``blocked`` turns False on any sign of success: an
    accepted call, a stranger among the neighbours, member 1 at another
    address, or a peer short of its rounds."""
    monkeypatch.syspath_prepend(str(REPO))
    from bench.attacks_gossip import ROGUE_ADDRESS, GossipAttacker

    addr = {"0": "127.0.0.1:1", "1": "127.0.0.1:2", "2": "127.0.0.1:3"}
    ring = SimpleNamespace(rounds=5, address=addr.__getitem__)
    attacker = GossipAttacker(ring, 0)  # type: ignore[arg-type]

    def verdict(codes: dict[str, int], **over: dict[str, str] | int) -> bool:
        attacker.codes = Counter(codes)
        final = {
            "0": _peer("0", 5, {"1": addr["1"], "2": addr["2"]}),
            "1": _peer("1", 5, {"0": addr["0"], "2": addr["2"]}),
            "2": _peer("2", 5, {"0": addr["0"], "1": addr["1"]}),
        }
        if "neighbours" in over:
            final["0"] = _peer("0", 5, over["neighbours"])  # type: ignore[arg-type]
        if "rounds" in over:
            final["2"] = _peer("2", over["rounds"], {"1": addr["1"]})  # type: ignore[arg-type]
        return bool(attacker.evidence(final)["blocked"])

    assert verdict({"PERMISSION_DENIED": 3}) is True
    assert verdict({}) is False  # no attack made
    assert verdict({"PERMISSION_DENIED": 3, "OK": 1}) is False
    stranger = {"1": addr["1"], "2": addr["2"], "outsider": "127.0.0.1:9"}
    assert verdict({"PERMISSION_DENIED": 3}, neighbours=stranger) is False
    moved = {"1": ROGUE_ADDRESS, "2": addr["2"]}
    assert verdict({"PERMISSION_DENIED": 3}, neighbours=moved) is False
    assert verdict({"PERMISSION_DENIED": 3}, rounds=4) is False


def _row(attack: str, blocked: bool | None, acc: float, ref: float) -> dict:
    return {
        "attack": attack,
        "blocked": blocked,
        "final_accuracy": acc,
        "reference_accuracy": ref,
        "store_growth_mb": 0.1,
        "coordinator_peak_rss_mb": 460.0,
        "run_status": "completed",
    }


def test_merged_invocations_keep_order_references_and_failures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows measured side by side (--only, --merge) come back in the full
    benchmark's order, each judged against its own reference; one row not
    blocked (or not run as designed) fails the goal."""
    monkeypatch.syspath_prepend(str(REPO))
    from bench.attacks_live import _goal_met, merge

    def part(rows: list[dict], gossip: list[dict], ref: float | None) -> dict:
        return {
            "no_attack_accuracy": ref,
            "no_attack": None if ref is None else {"final_accuracy": ref},
            "rows": rows,
            "gossip": {
                "no_attack_accuracy": 0.9 if gossip else None,
                "no_attack": {"final_accuracy": 0.9} if gossip else None,
                "rows": gossip,
            },
        }

    a = part([_row("replay", True, 0.8, 0.8)], [], 0.8)
    b = part([_row("sybil_flood", True, 0.81, 0.805)], [], 0.805)
    g = part([], [_row("gossip_freeze", True, 0.9, 0.9)], None)
    body = merge([a, b, g])
    assert [r["attack"] for r in body["rows"]] == ["sybil_flood", "replay"]
    assert body["no_attack_accuracy"] == 0.8
    assert body["gossip"]["no_attack_accuracy"] == 0.9
    assert _goal_met(body) is True
    body["rows"][1]["blocked"] = None  # the attacker failed: not a success
    assert _goal_met(body) is False
    body["rows"][1]["blocked"] = True
    body["gossip"]["rows"][0]["final_accuracy"] = 0.85  # peers harmed
    assert _goal_met(body) is False
    body["gossip"]["rows"][0]["final_accuracy"] = 0.9
    body["rows"][0]["coordinator_peak_rss_mb"] = 2000.0  # over the goal's bound
    assert _goal_met(body) is False
    body["rows"][0]["coordinator_peak_rss_mb"] = 460.0
    body["rows"][0]["run_status"] = "failed"
    assert _goal_met(body) is False


def test_rows_judged_on_accuracy_need_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An insider whose updates are accepted by design (norm_insider) is blocked
    only when the run kept the accuracy of the run without attack; without a
    reference its verdict stays open (None), never True."""
    monkeypatch.syspath_prepend(str(REPO))
    from bench.attacks_live import _compare

    def row(acc: float) -> dict:
        r = _row("norm_insider", True, acc, 0.8)
        r.update(blocked_by_evidence=True, store_mb=1.1, reference_accuracy=None)
        return r

    kept, harmed, open_ = row(0.805), row(0.7), row(0.8)
    _compare(kept, {"final_accuracy": 0.8, "store_mb": 1.0})
    _compare(harmed, {"final_accuracy": 0.8, "store_mb": 1.0})
    _compare(open_, {"final_accuracy": None, "store_mb": None})
    assert kept["blocked"] is True and kept["store_growth_mb"] == 0.1
    assert harmed["blocked"] is False
    assert open_["blocked"] is None and open_["store_growth_mb"] is None
    # A PostgreSQL row's store is compared with its own reference there.
    pg = row(0.8) | {"store_mb": 8.2, "store_reference": {"store_mb": 8.0}}
    _compare(pg, {"final_accuracy": 0.8, "store_mb": 1.0})
    assert pg["store_growth_mb"] == 0.2


def test_the_run_facts_and_a_skipped_row_never_pass_as_blocked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Attacker.judge`` can only take a verdict away (an exception is an open
    verdict); a row that could not run (no PostgreSQL) is skipped, not blocked."""
    monkeypatch.syspath_prepend(str(REPO))
    from bench.attackers_bounds import BOUNDS_ATTACKS
    from bench.attacks_live import _judge, _skipped

    class Judge:
        def __init__(self, verdict: object) -> None:
            self.verdict = verdict

        def judge(self, row: dict) -> dict:
            if isinstance(self.verdict, Exception):
                raise self.verdict
            return {"blocked": self.verdict, "fact": 1}

    def judged(before: bool | None, verdict: object) -> bool | None:
        row = {"blocked": before, "evidence": {}}
        _judge(Judge(verdict), row)  # type: ignore[arg-type]
        return row["blocked"]

    assert judged(True, True) is True
    assert judged(True, False) is False
    assert judged(False, True) is False
    assert judged(None, True) is None
    assert judged(True, RuntimeError("no log")) is None
    skipped = _skipped("pg_int_overflow", BOUNDS_ATTACKS["pg_int_overflow"], "none")
    assert skipped["blocked"] is None and skipped["skipped"] == "none"


def test_slot_hoarding_counts_uploads_held_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Streams that held a slot overlap by less than the margin when one ends
    as the next begins; two held together count as two."""
    monkeypatch.syspath_prepend(str(REPO))
    from bench.attackers_bounds import max_overlap

    assert max_overlap([]) == 0
    assert max_overlap([(0.0, 10.0), (9.8, 20.0), (19.9, 30.0)]) == 1
    assert max_overlap([(0.0, 10.0), (2.0, 12.0)]) == 2
    assert max_overlap([(0.0, 0.5), (0.1, 0.6)]) == 0  # too short to have held
