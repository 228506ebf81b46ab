"""Fuzzing the coordinator and the gossip peers with structure-aware mutations.

Live servers on 127.0.0.1, each a process of its own started as an operator
would (:mod:`bench.deploy`): a coordinator under the default secure
configuration (TLS, token admission) and two gossip peers (mutual TLS, a
membership, signed messages) training digits. Each generated message starts
from a *valid* request of one call, built fresh (a signed enrolment on a new
challenge, a signed update stream for the client's real task, a peer's signed
push, ...) and is changed by one mutation of :mod:`fedplat.testing.mutations`
(fields set to extreme values, cleared, duplicated or sent with the wrong wire
type; repeated fields and maps made huge; oneofs with both members or none;
another message type; unknown fields; bit flips, cuts and insertions; streams
truncated, extended, reordered, with chunks dropped, duplicated or resized, a
second header or none). Calls go out with valid credentials (an enrolled
client's session; a member peer's certificate and key) and invalid ones (a
wrong or missing session, another client's id, an outsider's certificate from
the same CA, a member's certificate signing as another member).

Every call's answer is classified:

* ``crashes``: the server process died (it is restarted and fuzzing goes on);
* ``hangs``: the call ran past its deadline (10 s; the servers' own idle and
  long-poll limits are shorter, so a server that works always answers first);
* ``internal_errors``: INTERNAL or UNKNOWN status, from a handler or from
  gRPC itself (its "Exception deserializing request" comes with a logged
  traceback): a failure;
* ``parse_errors``: the message was not protobuf of the call's type. Every
  service of both servers (the coordinator's health service included) parses
  through a deserializer that hands these to the handler, which answers
  INVALID_ARGUMENT "malformed ...". Counted apart from the handlers' own
  refusals, as the issue asks;
* ``grpc_limit``: refused by gRPC before any handler ran (a message over the
  server's size limit: RESOURCE_EXHAUSTED);
* everything else by status code, per call and per mutation.

Calls with an empty or blank client id or session token in their metadata,
and the health service's Check and Watch with mutated and random bytes, are
among them (issue 23). Afterwards the servers' logs are searched for
tracebacks (each one a failure, like an INTERNAL answer), ``fedplat store
check`` runs, an honest ``fedplat client`` process must complete a round (with
the fuzzing clients gone quiet), the store is checked again, and both peers
must still be advancing rounds. Writes ``bench/results/fuzz.json``.

Usage::

    nice -n 10 python -m bench.fuzz            # 20,000 messages (~10 minutes)
    python -m bench.fuzz --tiny --out /tmp/f.json
    python -m bench.fuzz --messages 2000 --out /tmp/f.json
    python -m bench.fuzz --markdown            # the table in docs/security.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # allow ``python bench/fuzz.py``
    sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from bench.common import check_out, environment, write_results  # noqa: E402
from bench.deploy import Deployment, free_port, run_file  # noqa: E402
from bench.docs import with_source  # noqa: E402
from bench.fuzz_targets import (  # noqa: E402
    COORDINATOR_RPCS,
    PEER_RPCS,
    CoordinatorTarget,
    PeerTarget,
    Sent,
)

RESULTS = REPO / "bench" / "results" / "fuzz.json"
SCHEMA_VERSION = 1
GOAL_ZERO = (
    "crashes",
    "hangs",
    "internal_errors",
    "store_check_failures",
    "logged_tracebacks",
)


@dataclass(frozen=True)
class Setup:
    messages: int
    peer_share: float  # fraction of messages sent to the gossip peer
    seed: int
    fuzz_clients: int
    deadline_s: float
    enrol_tokens: int


FULL = Setup(20_000, 0.3, 0, 4, 10.0, 200)
TINY = Setup(600, 0.3, 0, 2, 10.0, 20)


def classify(s: Sent) -> str:
    """The outcome class of one call (see the module docstring)."""
    if s.code == "DEADLINE_EXCEEDED":
        return "hang"
    if s.code in ("INTERNAL", "UNKNOWN"):
        return "internal"  # gRPC's own parse failures too: a logged traceback
    if s.code == "INVALID_ARGUMENT" and s.details.startswith("malformed "):
        return "parse_error"
    if s.code == "RESOURCE_EXHAUSTED" and "larger than max" in s.details:
        return "grpc_limit"
    return s.code


class Tally:
    """Counts of outcomes per service, call and mutation."""

    def __init__(self) -> None:
        self.messages = 0
        self.valid_calls = 0
        self.outcomes: Counter[str] = Counter()
        self.per_rpc: dict[str, Counter[str]] = defaultdict(Counter)
        self.per_op: dict[str, Counter[str]] = defaultdict(Counter)
        self.per_cred: dict[str, Counter[str]] = defaultdict(Counter)
        self.examples: dict[str, list[str]] = defaultdict(list)
        self.seconds: dict[str, list[float]] = defaultdict(list)

    def add(self, service: str, s: Sent) -> None:
        if not s.mutated:
            self.valid_calls += 1
            return
        self.messages += 1
        c = classify(s)
        self.outcomes[c] += 1
        self.per_rpc[f"{service}.{s.rpc}"][c] += 1
        self.seconds[f"{service}.{s.rpc}"].append(s.seconds)
        self.per_op[s.op.split(":")[0]][c] += 1
        self.per_cred[f"{service}:{s.cred}"][c] += 1
        if c in ("hang", "internal") and len(self.examples[c]) < 20:
            self.examples[c].append(f"{service}.{s.rpc} {s.op} {s.details[:200]}")


def _tracebacks(dep: Deployment, names: list[str]) -> int:
    return sum(dep.log(n).count("Traceback") for n in names)


def run(setup: Setup, workdir: Path, say: Any) -> dict[str, Any]:
    import random

    rng = random.Random(setup.seed)
    cfg = run_file(
        workdir,
        f"127.0.0.1:{free_port()}",
        rounds=1_000_000,
        clients=2,
        selection={"clients_per_round": 2, "min_available": 1, "quorum": 1},
        deadlines={
            "round_seconds": 8,
            "liveness_seconds": 4,
            "max_round_attempts": 1_000_000,
        },
        server={"long_poll_seconds": 0.25, "stream_idle_seconds": 3.0},
        # The enrolment rate limit would answer most enrolments before their
        # content is looked at; raised so mutations reach the checks behind it.
        admission={"enrol_per_second": 5000.0, "enrol_burst": 5000},
    )
    dep = Deployment(workdir, cfg)
    coord = CoordinatorTarget(dep, rng, setup)
    peers = PeerTarget(workdir / "gossip", rng, setup)
    tally = Tally()
    t0 = time.perf_counter()
    try:
        coord.start()
        peers.start()
        say(f"servers up; fuzzing {setup.messages} messages")
        n_peer = round(setup.messages * setup.peer_share)
        plan = ["peer"] * n_peer + ["coordinator"] * (setup.messages - n_peer)
        rng.shuffle(plan)
        crashes = Counter[str]()
        for k, service in enumerate(plan):
            target = coord if service == "coordinator" else peers
            for s in target.fuzz_one():
                tally.add(service, s)
            if not target.alive():
                crashes[service] += 1
                say(f"{service} died after message {k}; restarting")
                target.restart()
            if k % 1000 == 999:
                say(f"{k + 1} messages, outcomes {dict(tally.outcomes)}")
        fuzz_seconds = time.perf_counter() - t0
        say("fuzzing done; checking the store and an honest round")
        check_after_fuzz = dep.store_check()
        honest = coord.honest_round(timeout=300)
        check_after_round = dep.store_check()
        peers_progress = peers.progress(timeout=60)
        logs = coord.log_names() + peers.log_names()
        tracebacks = _tracebacks(dep, coord.log_names()) + peers.tracebacks()
        rounds_completed = coord.rounds_completed()
    finally:
        coord.close()
        peers.close()
        dep.close()
    checks = [check_after_fuzz, check_after_round]
    per_rpc = {
        name: {"messages": sum(c.values()), **dict(c)}
        for name, c in sorted(tally.per_rpc.items())
    }
    latency = {
        name: {
            "median_s": statistics.median(v),
            "max_s": max(v),
        }
        for name, v in sorted(tally.seconds.items())
    }
    return {
        "messages": tally.messages,
        "crashes": sum(crashes.values()),
        "hangs": tally.outcomes["hang"],
        "internal_errors": tally.outcomes["internal"],
        "store_check_failures": sum(not ok for ok, _ in checks),
        "honest_round_after": bool(honest and all(peers_progress.values())),
        "parse_errors": tally.outcomes["parse_error"],
        "grpc_limit_refusals": tally.outcomes["grpc_limit"],
        "logged_tracebacks": tracebacks,
        "valid_calls_interleaved": tally.valid_calls,
        "outcomes": dict(tally.outcomes.most_common()),
        "per_rpc": per_rpc,
        "call_seconds": latency,
        "per_mutation": {k: dict(v) for k, v in sorted(tally.per_op.items())},
        "per_credentials": {k: dict(v) for k, v in sorted(tally.per_cred.items())},
        "examples": dict(tally.examples),
        "honest_round": {
            "coordinator_round_with_honest_client": honest,
            "peers_advanced": peers_progress,
            "coordinator_rounds_completed_during_run": rounds_completed,
        },
        "store_checks": [out for _, out in checks],
        "rpcs": {"coordinator": list(COORDINATOR_RPCS), "peer": list(PEER_RPCS)},
        "logs_searched": logs,
        "fuzz_seconds": fuzz_seconds,
    }


@with_source(RESULTS)
def render_markdown(results: dict[str, Any]) -> str:
    """The docs' table: headline counts, then messages and outcomes per call."""
    keys = (
        "messages", "crashes", "hangs", "internal_errors", "store_check_failures",
        "honest_round_after", "parse_errors", "grpc_limit_refusals",
        "logged_tracebacks",
    )  # fmt: skip
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines.append("| " + " | ".join(str(results[k]) for k in keys) + " |")
    lines += ["", "| call | messages | outcomes |", "|---|---|---|"]
    for rpc, counts in results["per_rpc"].items():
        rest = ", ".join(
            f"{k} {v}" for k, v in sorted(counts.items()) if k != "messages"
        )
        lines.append(f"| {rpc} | {counts['messages']} | {rest} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="600 messages")
    ap.add_argument(
        "--messages", type=int, help="this many messages (the setup's otherwise)"
    )
    ap.add_argument("--out", type=Path, default=str(RESULTS))
    ap.add_argument("--workdir", type=Path, help="keep logs and stores here")
    ap.add_argument(
        "--markdown", action="store_true", help="print the docs table from --out"
    )
    args = ap.parse_args(argv)
    check_out(ap, args.out)
    if args.markdown:
        print(render_markdown(json.loads(args.out.read_text())), end="")
        return 0
    setup = TINY if args.tiny else FULL
    if args.messages is not None:
        setup = replace(setup, messages=args.messages)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedplat-fuzz-") as tmp:
        workdir = args.workdir or Path(tmp)
        body = run(setup, workdir, lambda s: print(s, file=sys.stderr, flush=True))
    out = {
        "benchmark": "fuzz",
        "schema_version": SCHEMA_VERSION,
        "tiny": args.tiny,
        **body,
        "goal": {k: 0 for k in GOAL_ZERO} | {"honest_round_after": True},
        "goal_met": all(body[k] == 0 for k in GOAL_ZERO) and body["honest_round_after"],
        "setup": {
            **asdict(setup),
            "coordinator": "fedplat coordinator process, TLS (fedplat certs init), "
            "admission by tokens, digits MLP 64-32-10, long poll 0.25 s, stream idle "
            "3 s, enrolment rate limit raised to 5000/s",
            "peers": "two fedplat gossip node processes, mutual TLS, membership "
            "of 0, 1, spare and an observer; fuzzed peer: 0",
        },
        "environment": environment(t0, grpcio=grpc.__version__),
    }
    write_results(args.out, out, t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
