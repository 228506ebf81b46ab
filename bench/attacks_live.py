"""The attacks of issues 11 and 23 against a live coordinator with 8 honest clients.

Each attack runs in a run of its own, against a fresh store, with the same seed
and the default secure configuration: TLS with certificates from ``fedplat
certs init``, admission by enrolment tokens (``fedplat tokens create``), a
coordinator process (``fedplat coordinator``) and 8 ``fedplat client``
processes (digits split IID over 8 clients, an MLP 64-32-10, FedAvg). One
more run without any attack gives the reference accuracy and store size.

The attackers of issue 11 (:mod:`bench.attackers`) are sybil flood, identity
takeover, replay, weight inflation, huge-magnitude rows, idle streams,
oversized uploads and store flooding; issue 23's (:mod:`bench.attackers_bounds`)
are blank client ids, huge enrolments, idle connections (the coordinator under
a 1,024 open-file limit, ``server.max_connections`` 700), int4 overflows (on a
throwaway PostgreSQL, with a run without attack of its own there), upload slot
hoarding, insiders at the norm and weight limits, and a Markdown client name
looked at on the monitor. Those that hold a token (a compromised device) are
clients of the run: every client is selected every round (``clients_per_round``
9, quorum 8 = the honest clients) and a round closes 2 s after its quorum
(``close_after_quorum_seconds``), so an attacker that never answers does not
hold rounds to their deadline. Each row reports:

* ``blocked``: decided from the store and the attacker's own request log
  (each attacker's ``criterion``; ``evidence`` holds the facts);
* ``honest_rounds_completed`` and ``final_accuracy`` of the run;
* ``coordinator_peak_rss_mb`` and ``coordinator_peak_fds``: the
  coordinator's peak resident set (``VmHWM``) and most open descriptors,
  sampled until it exits;
* ``store_growth_mb``: the store's size after the run minus the size after the
  run without attack; ``run_status``.

Operators register each client's weight cap with its token (``fedplat tokens
create --max-examples 180``, the size of a client's data) in every run; the
row ``weight_inflation_run_cap_only`` repeats that attack with tokens that
carry no cap, leaving only the run's ``aggregator.max_examples_per_client``
(default 100,000).

The gossip rows (``gossip`` in the JSON) are issue 11's attacks on gossip
peers: poisoning, address redirection and freezing by idle streams, against
three ``fedplat gossip node`` processes under mutual TLS
(:mod:`bench.attacks_gossip` describes them and their evidence).

Usage::

    nice -n 10 python -m bench.attacks_live          # ~50 minutes
    python -m bench.attacks_live --tiny --out /tmp/a.json
    python -m bench.attacks_live --markdown          # the table in docs/security.md
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # allow ``python bench/attacks_live.py``
    sys.path.insert(0, str(REPO))

from bench.attackers import ATTACKS as ISSUE_11_ATTACKS  # noqa: E402
from bench.attackers import Attacker  # noqa: E402
from bench.attackers_bounds import BOUNDS_ATTACKS, RSS_LIMIT_MB  # noqa: E402
from bench.attacks_gossip import GOSSIP_ATTACKS, run_gossip  # noqa: E402
from bench.common import check_out, environment, write_results  # noqa: E402
from bench.deploy import (  # noqa: E402
    MODEL,
    Deployment,
    PostgresUnavailable,
    ProcessWatch,
    free_port,
    postgres_database,
    run_file,
    store_mb,
    throwaway_postgres,
    wait_until,
)
from bench.docs import with_source  # noqa: E402
from fedplat.vectors import Layout  # noqa: E402

RESULTS = REPO / "bench" / "results" / "attacks_live.json"
SCHEMA_VERSION = 1
#: The extra row: weight inflation with tokens that carry no per-client cap.
RUN_CAP_ONLY = "weight_inflation_run_cap_only"


def _registry(*parts: dict[str, type[Attacker]]) -> dict[str, type[Attacker]]:
    """The attacks of issues 11 and 23 by name (a name used twice is an error)."""
    out: dict[str, type[Attacker]] = {}
    for part in parts:
        for name, kind in part.items():
            if name in out or name == RUN_CAP_ONLY:
                raise ValueError(f"attack {name!r} registered twice")
            out[name] = kind
    return out


ATTACKS = _registry(ISSUE_11_ATTACKS, BOUNDS_ATTACKS)
#: Stopping an attacker waits this long for its thread (a flood of 1,000
#: connections closes them first).
JOIN_SECONDS = 180


@dataclass(frozen=True)
class Setup:
    clients: int
    rounds: int
    seed: int
    token_max_examples: int  # what the operator registers per client
    attacks: tuple[str, ...]
    gossip_rounds: int
    gossip_attacks: tuple[str, ...]


FULL = Setup(
    8, 10, 0, 180,
    (*ISSUE_11_ATTACKS, RUN_CAP_ONLY, *BOUNDS_ATTACKS), 20, tuple(GOSSIP_ATTACKS),
)  # fmt: skip
TINY = Setup(
    4, 3, 0, 180,
    ("sybil_flood", "huge_magnitude_rows", "empty_client_id"), 4,
    ("gossip_poisoning",),
)  # fmt: skip


def _kind(attack: str | None) -> type[Attacker] | None:
    if attack is None:
        return None
    return ATTACKS["weight_inflation" if attack == RUN_CAP_ONLY else attack]


def run_one(
    setup: Setup, workdir: Path, attack: str | None, say: Any
) -> dict[str, Any]:
    """One run under ``attack`` (None: without); an attack on PostgreSQL
    runs on a throwaway cluster, with a run without attack of its own there
    (``store_reference``) for its store growth."""
    kind = _kind(attack)
    if kind is not None and kind.nofile and shutil.which("prlimit") is None:
        return _skipped(attack or "", kind, "no prlimit (util-linux) to set nofile")
    if kind is None or not kind.postgres:
        return _run_one(setup, workdir, attack, say, None)
    try:
        with throwaway_postgres() as url:
            say("  its run without attack on PostgreSQL")
            ref_url = postgres_database(url, "reference")
            ref = _run_one(setup, workdir / "pg-reference", None, say, ref_url)
            row = _run_one(setup, workdir, attack, say, postgres_database(url, "run"))
    except PostgresUnavailable as exc:
        return _skipped(attack or "", kind, str(exc))
    keys = ("final_accuracy", "honest_rounds_completed", "store_mb", "run_status")
    row["store_reference"] = {k: ref[k] for k in keys}
    return row


def _skipped(attack: str, kind: type[Attacker], why: str) -> dict[str, Any]:
    """A row that could not run: reported with the reason, never as blocked."""
    return {
        "attack": attack, "blocked": None, "skipped": why,
        "honest_rounds_completed": 0, "final_accuracy": None,
        "first_round_after_s": None,
        "coordinator_peak_rss_mb": None, "coordinator_peak_fds": None,
        "store_mb": None, "criterion": kind.criterion, "evidence": {},
        "run_status": "skipped", "store_check": None,
    }  # fmt: skip


def _config(
    setup: Setup, workdir: Path, kind: type[Attacker] | None, store: str | None
) -> dict[str, Any]:
    n = setup.clients
    extra: dict[str, Any] = {"store": {"url": store}} if store else {}
    return run_file(
        workdir,
        f"127.0.0.1:{free_port()}",
        rounds=setup.rounds,
        clients=n,
        selection={"clients_per_round": n + 1, "min_available": n, "quorum": n},
        deadlines={
            "round_seconds": 120,
            "close_after_quorum_seconds": 2,
            "max_round_attempts": 20,
        },
        server=dict(kind.server) if kind else {},
        **extra,
    )


def _run_one(
    setup: Setup, workdir: Path, attack: str | None, say: Any, store: str | None
) -> dict[str, Any]:
    n, kind = setup.clients, _kind(attack)
    cfg = _config(setup, workdir, kind, store)
    dep = Deployment(workdir, cfg)
    uncapped = attack == RUN_CAP_ONLY or (kind is not None and kind.uncapped)
    cap = None if uncapped else setup.token_max_examples
    nofile = kind.nofile if kind else None
    prefix = ("prlimit", f"--nofile={nofile}:{nofile}") if nofile else ()
    stop = threading.Event()
    attacker: Attacker | None = None
    thread = None
    t0 = time.perf_counter()
    try:
        coord = dep.coordinator(prefix=prefix)
        dep.wait_serving()
        watch = ProcessWatch(coord.pid)
        tokens = dep.tokens(n + 1, cap)
        with dep.store() as st:
            run = st.get_run_by_name(cfg["run"]["name"])
            assert run is not None
            run_id, layout = run.id, Layout.from_dict(run.layout)
        if kind is not None:
            token = tokens[n] if kind.admitted or kind.has_token else None
            attacker = kind(dep, layout, token, setup.seed)
            thread = threading.Thread(target=attacker.run, args=(stop,), daemon=True)
        early = kind is not None and kind.early
        if thread is not None and early:
            thread.start()  # compete with the honest clients' enrolments
        clients = [dep.client(i, n, tokens[i]) for i in range(n)]
        if thread is not None and not early:
            thread.start()
        wait_until(lambda: coord.poll() is not None, 3600, "the run to finish")
        stop.set()
        if thread is not None:
            thread.join(JOIN_SECONDS)
        exit_codes = [c.wait(120) for c in clients]
        seconds = time.perf_counter() - t0
        with dep.store() as st:
            run = st.get_run(run_id)
            last = st.last_completed_round(run_id)
            evidence = _evidence(attacker, st, run_id)
            status = run.status if run else "missing"
            first = _first_round_after(st, run)
        checked, check_output = dep.store_check()
    finally:
        stop.set()
        dep.close()
    log = dep.log("coordinator")
    row = {
        "attack": attack or "none",
        "blocked": evidence.get("blocked"),
        "honest_rounds_completed": last.number if last else 0,
        "final_accuracy": last.accuracy if last else None,
        "first_round_after_s": first,
        "coordinator_peak_rss_mb": round(watch.peak, 1),
        "coordinator_peak_fds": watch.peak_fds,
        "coordinator_log_tracebacks": log.count("Traceback"),
        "store": "postgresql" if dep.db.startswith("postgresql") else "sqlite",
        "store_mb": round(store_mb(dep.db), 3),
        "criterion": kind.criterion if kind else None,
        "evidence": evidence,
        "run_status": status,
        "coordinator_exit_code": coord.returncode,
        "client_exit_codes": exit_codes,
        "store_check": "ok" if checked else check_output,
        "seconds": seconds,
    }
    if attacker is not None:
        _judge(attacker, row)
    return row


def _first_round_after(store: Any, run: Any) -> float | None:
    """Seconds from the run's creation by the coordinator to its first round's
    opening (the honest clients' enrolment, and what delayed it)."""
    rounds = store.list_rounds(run.id) if run is not None else []
    if not rounds:
        return None
    return round((rounds[0].started_at - run.created_at).total_seconds(), 1)


def _judge(attacker: Attacker, row: dict[str, Any]) -> None:
    """The run's own facts (``Attacker.judge``) into the row's verdict:
    ``blocked_by_evidence`` keeps it before the comparison with the run
    without attack (``_compare``)."""
    try:
        facts = attacker.judge(row)
    except Exception as exc:
        facts = {"blocked": None, "judge_error": f"{type(exc).__name__}: {exc}"}
    verdict = facts.pop("blocked", True)
    row["evidence"].update(facts)
    if row["blocked"] is not None:
        row["blocked"] = None if verdict is None else bool(row["blocked"] and verdict)
    row["blocked_by_evidence"] = row["blocked"]


def _evidence(attacker: Attacker | None, store: Any, run_id: str) -> dict[str, Any]:
    """The attacker's evidence; a failure to gather it is recorded, never
    counted as blocked."""
    if attacker is None:
        return {}
    try:
        ev = attacker.evidence(store, run_id)
    except Exception as exc:
        return {"blocked": None, "evidence_error": f"{type(exc).__name__}: {exc}"}
    if ev.get("attacker_error"):
        ev["blocked"] = None  # the attack did not run as designed
    return ev


def run(
    setup: Setup, workdir: Path, say: Any, save: Any = None, reference: bool = True
) -> dict[str, Any]:
    """The reference run, one run per attack, then the gossip rows; ``save``
    gets the results so far after each row (a long run that is stopped keeps
    what it measured)."""
    body: dict[str, Any] = {
        "no_attack_accuracy": None,
        "no_attack": None,
        "rows": [],
        "gossip": {"no_attack_accuracy": None, "no_attack": None, "rows": []},
    }
    save = save or (lambda body: None)
    base: dict[str, Any] = {"final_accuracy": None, "store_mb": None}
    if setup.attacks and reference:
        say("run without attack")
        base = run_one(setup, workdir / "none", None, say)
        body.update(no_attack_accuracy=base["final_accuracy"], no_attack=base)
        save(body)
    for name in setup.attacks:
        say(f"attack {name}")
        row = run_one(setup, workdir / name, name, say)
        _compare(row, base)
        say(f"  blocked {row['blocked']}, accuracy {row['final_accuracy']}")
        body["rows"].append(row)
        save(body)
    gossip = body["gossip"]
    if setup.gossip_attacks:
        say("gossip run without attack")
        ref = run_gossip(
            None, workdir / "gossip" / "none", setup.gossip_rounds, setup.seed
        )
        gossip.update(no_attack_accuracy=ref["final_accuracy"], no_attack=ref)
        save(body)
    for name in setup.gossip_attacks:
        say(f"gossip attack {name}")
        row = run_gossip(
            name, workdir / "gossip" / name, setup.gossip_rounds, setup.seed
        )
        row["reference_accuracy"] = ref["final_accuracy"]
        say(f"  blocked {row['blocked']}, accuracy {row['final_accuracy']}")
        gossip["rows"].append(row)
        save(body)
    return body


def _compare(row: dict[str, Any], base: dict[str, Any]) -> None:
    """Judge ``row`` against the run without attack ``base`` (left open when
    this invocation made none: ``--merge`` does it with another's). A row on
    PostgreSQL compares its store with its own run without attack there."""
    row["reference_accuracy"] = base["final_accuracy"]
    ref_mb = (row.get("store_reference") or base)["store_mb"]
    if ref_mb is None or row["store_mb"] is None:
        row["store_growth_mb"] = None
    else:
        row["store_growth_mb"] = round(row["store_mb"] - ref_mb, 3)
    blocked = row.get("blocked_by_evidence", row["blocked"])
    acc, growth = row["final_accuracy"], row["store_growth_mb"]
    checks = {
        "accuracy": None if acc is None or base["final_accuracy"] is None
        else abs(acc - base["final_accuracy"]) <= 0.01,
        "store_growth": None if growth is None else growth < 1.0,
    }  # fmt: skip
    kind = _kind(row["attack"])
    for need in kind.judged_on if kind is not None and blocked else ():
        blocked = None if checks[need] is None else blocked and checks[need]
    row["blocked"] = blocked


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The bodies of several invocations (``--only``) as one: rows in the
    full benchmark's order, the first reference runs found."""
    order = {a: i for i, a in enumerate((*FULL.attacks, *FULL.gossip_attacks))}
    body: dict[str, Any] = {
        "no_attack_accuracy": None,
        "no_attack": None,
        "rows": [],
        "gossip": {"no_attack_accuracy": None, "no_attack": None, "rows": []},
    }
    for part in parts:
        for key in ("no_attack_accuracy", "no_attack"):
            if body[key] is None:
                body[key] = part[key]
            if body["gossip"][key] is None:
                body["gossip"][key] = part["gossip"][key]
        body["rows"] += part["rows"]
        body["gossip"]["rows"] += part["gossip"]["rows"]
    # An attack measured again by a later part replaces the earlier row.
    for key in ("rows",):
        body[key] = list({r["attack"]: r for r in body[key]}.values())
    g = body["gossip"]
    g["rows"] = list({r["attack"]: r for r in g["rows"]}.values())
    for row in body["rows"]:
        if row["reference_accuracy"] is None and body["no_attack"] is not None:
            row["reference_of"] = "another invocation's run without attack"
            _compare(row, body["no_attack"])
    body["rows"].sort(key=lambda r: order[r["attack"]])
    body["gossip"]["rows"].sort(key=lambda r: order[r["attack"]])
    return body


@with_source(RESULTS)
def render_markdown(results: dict[str, Any]) -> str:
    keys = (
        "attack", "blocked", "honest_rounds_completed", "final_accuracy",
        "coordinator_peak_rss_mb", "store_growth_mb",
    )  # fmt: skip
    base = results["no_attack"]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines.append(
        f"| none (reference) | - | {base['honest_rounds_completed']} | "
        f"{results['no_attack_accuracy']} | {base['coordinator_peak_rss_mb']} | - |"
    )
    for row in results["rows"]:
        lines.append("| " + " | ".join(str(row[k]) for k in keys) + " |")
    gossip = results["gossip"]
    if gossip["rows"]:
        gkeys = (
            "attack", "blocked", "honest_rounds_completed", "final_accuracy",
            "peer_peak_rss_mb",
        )  # fmt: skip
        ref = gossip["no_attack"]
        lines += ["", "| " + " | ".join(gkeys) + " |", "|" + "---|" * len(gkeys)]
        lines.append(
            f"| none (reference) | - | {ref['honest_rounds_completed']} | "
            f"{gossip['no_attack_accuracy']} | {ref['peer_peak_rss_mb']} |"
        )
        for row in gossip["rows"]:
            lines.append("| " + " | ".join(str(row[k]) for k in gkeys) + " |")
    return "\n".join(lines) + "\n"


def _within(a: float | None, b: float | None, tol: float) -> bool:
    """``|a - b| <= tol``; not met while either is unknown."""
    return a is not None and b is not None and abs(a - b) <= tol


def _goal_met(body: dict[str, Any]) -> bool:
    return all(
        r["blocked"]
        and _within(r["final_accuracy"], r["reference_accuracy"], 0.01)
        and _within(r["store_growth_mb"], 0.0, 1.0 - 1e-9)
        and _within(r["coordinator_peak_rss_mb"], 0.0, RSS_LIMIT_MB - 1e-9)
        and r["run_status"] == "completed"
        for r in body["rows"]
    ) and all(
        r["blocked"] and _within(r["final_accuracy"], r["reference_accuracy"], 0.01)
        for r in body["gossip"]["rows"]
    )


def _document(
    body: dict[str, Any], setup: Setup, tiny: bool, t0: float
) -> dict[str, Any]:
    """The results file: the measurements, the goal, the setup."""
    done = {r["attack"] for r in (*body["rows"], *body["gossip"]["rows"])}
    return {
        "benchmark": "attacks_live",
        "schema_version": SCHEMA_VERSION,
        "tiny": tiny,
        **body,
        "complete": done == {*setup.attacks, *setup.gossip_attacks},
        "goal": "every attack blocked, accuracy within 1 point of the run without "
        f"attack, store growth under 1 MB, coordinator peak RSS under "
        f"{RSS_LIMIT_MB} MiB and the run completed, per attack",
        "goal_met": _goal_met(body),
        "setup": {
            **asdict(setup),
            "dataset": "digits (1,437 training images split IID over the "
            "clients, 360 test images for the coordinator's evaluation)",
            "model": MODEL,
            "aggregator": "fedavg (weighted by capped example counts)",
            "selection": "clients_per_round = clients + 1 (the attacker too), "
            "min_available and quorum = clients, close_after_quorum_seconds 2",
            "transport": "TLS (fedplat certs init), admission by enrolment tokens",
            "server_limits": "defaults (stream_idle_seconds 30, max_update_norm "
            "1e6, enrol_per_second 50, burst 200, max_concurrent_uploads 8, "
            "min_upload_bytes_per_second 32768 after 10 s); idle_connections: "
            "max_connections 700, the coordinator under prlimit --nofile=1024",
            "aggregator_bounds": "defaults (FedAvg: norm_bound 3 x median norm, "
            "weight_bound 3 x median declared examples)",
        },
        "environment": environment(t0),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tiny", action="store_true", help="4 clients, 3 rounds, 3 attacks"
    )
    ap.add_argument("--out", type=Path, default=str(RESULTS))
    ap.add_argument("--workdir", type=Path, help="keep logs and stores here")
    ap.add_argument("--only", nargs="*", help="run only these attacks")
    ap.add_argument(
        "--no-reference",
        action="store_true",
        help="skip the run without attack (--merge compares with another's)",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        help="write --out from the results of several --only invocations",
    )
    ap.add_argument(
        "--markdown", action="store_true", help="print the docs table from --out"
    )
    args = ap.parse_args(argv)
    check_out(ap, args.out)
    if args.markdown:
        print(render_markdown(json.loads(args.out.read_text())), end="")
        return 0
    setup = TINY if args.tiny else FULL
    if args.only is not None:
        setup = replace(
            setup,
            attacks=tuple(a for a in args.only if a not in GOSSIP_ATTACKS),
            gossip_attacks=tuple(a for a in args.only if a in GOSSIP_ATTACKS),
        )
    t0 = time.perf_counter()
    if args.merge:
        parts = [json.loads(p.read_text()) for p in args.merge]
        out = _document(merge(parts), replace(FULL), False, t0)
        out["merged_from"] = [str(p) for p in args.merge]
        write_results(args.out, out, t0)
        return 0

    def save(body: dict[str, Any]) -> None:
        doc = _document(body, setup, args.tiny, t0)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")

    with tempfile.TemporaryDirectory(prefix="fedplat-attacks-") as tmp:
        workdir = args.workdir or Path(tmp)
        say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
        body = run(setup, workdir, say, save, reference=not args.no_reference)
    out = _document(body, setup, args.tiny, t0)
    write_results(args.out, out, t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
