"""The coordinator SIGKILLed at random moments during a run, and restarted.

Two runs of the same seeded configuration, one after the other, each with a
coordinator process and 8 ``fedplat client`` processes (digits split over 8
clients, an MLP 64-32-10, every client selected every round, quorum 8; TLS
with ``fedplat certs``, enrolment tokens from ``fedplat tokens create``):

* **undisturbed**: the run goes from start to finish;
* **disturbed**: ``kills`` times, the coordinator is SIGKILLed at a random
  moment and started again with the same run file. A share ``startup_share``
  of the kills (in a seeded random order) land uniformly in ``kill_after``
  seconds after the process started (while starting, resuming, waiting for
  clients); the others land at a uniform moment of the round after one the
  restarted coordinator completed of its own (a delay drawn uniformly within
  the length of the round just completed, as the store times it: while
  training, collecting, aggregating, writing the next one), so that every
  cycle makes progress and the kills hit a run that is moving. A kill that
  would land after the run completed is not made (the run is reported with
  fewer kills). The client processes are never touched: they reconnect and
  re-enrol by themselves.

What is checked, from the store (``fedplat.store``) only:

* **lost rounds**: after each kill (before the restart) the records of every
  completed round are snapshotted: the round row (status, counters, bytes,
  accuracy, loss, checkpoint hash, model version) and its participations
  (client, status, bytes, examples, verdict). A round is *lost* when a later
  snapshot, or the final store, no longer has it completed with exactly the
  same records. Completed rounds must also be 1..N without a gap.
* **duplicate updates**: a (round, client) pair with more than one succeeded
  participation, or a round completed more than once (more than one
  ``round_completed`` event for its number).
* ``fedplat store check`` on the final store.

The final models are compared too: the largest absolute difference between
the two runs' last checkpoints (the same updates in the same rounds give the
same model up to the order of float additions).

Usage::

    nice -n 10 python -m bench.faults          # 20 kills, 8 clients (~20 minutes)
    python -m bench.faults --tiny --out /tmp/f.json
    python -m bench.faults --markdown          # the table in docs/security.md
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # allow ``python bench/faults.py``
    sys.path.insert(0, str(REPO))

from bench.common import check_out, environment, write_results  # noqa: E402
from bench.deploy import (  # noqa: E402
    MODEL,
    Deployment,
    free_port,
    run_file,
    snapshot,
    wait_until,
)
from bench.docs import with_source  # noqa: E402

RESULTS = REPO / "bench" / "results" / "faults.json"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Setup:
    clients: int
    rounds: int
    kills: int
    kill_after: tuple[float, float]  # seconds after the coordinator started
    seed: int
    startup_share: float = 0.25  # kills timed from the process start


# Rounds enough that the run outlasts every kill (a training-time kill comes a
# round or a few after its restart).
FULL = Setup(clients=8, rounds=100, kills=20, kill_after=(1.0, 12.0), seed=0)
TINY = Setup(
    clients=3, rounds=30, kills=2, kill_after=(3.0, 8.0), seed=0, startup_share=0.5
)


# ------------------------------------------------------------ the store's view


def audit(dep: Deployment, snapshots: list[dict[int, str]]) -> dict[str, Any]:
    """Lost rounds and duplicate updates (see the module docstring)."""
    final = snapshot(dep)
    first_seen: dict[int, str] = {}
    lost: set[int] = set()
    for snap in [*snapshots, final]:
        for number, rec in first_seen.items():
            if snap.get(number) != rec:
                lost.add(number)
        for number, rec in snap.items():
            first_seen.setdefault(number, rec)
    gaps = sorted(set(range(1, max(final, default=0) + 1)) - set(final))
    with dep.store() as store:
        run = store.get_run_by_name(dep.cfg["run"]["name"])
        assert run is not None
        succeeded: Counter[tuple[int, str]] = Counter()
        for r in store.list_rounds(run.id):
            for p in store.list_participations(run.id, r.number):
                if p.status == "succeeded":
                    succeeded[(r.number, p.client_id)] += 1
        completions = Counter(
            e.round_number for e in store.list_events(run.id, kind="round_completed")
        )
        resumed = len(store.list_events(run.id, kind="run_resumed"))
        status = run.status
        runs = len(store.list_runs())
    dup_updates = sum(n - 1 for n in succeeded.values() if n > 1)
    dup_rounds = sum(n - 1 for n in completions.values() if n > 1)
    return {
        "lost_rounds": len(lost) + len(gaps),
        "lost_round_numbers": sorted(lost | set(gaps)),
        "duplicate_updates": dup_updates + dup_rounds,
        "duplicate_participations": dup_updates,
        "rounds_completed_twice": dup_rounds,
        "completed_rounds": len(final),
        "run_status": status,
        "run_resumed_events": resumed,
        "runs_in_store": runs,
    }


def final_state(dep: Deployment) -> tuple[float | None, Any]:
    """The last round's accuracy and the final model (from its checkpoint)."""
    from fedplat.server.checkpoint import load_checkpoint

    with dep.store() as store:
        run = store.get_run_by_name(dep.cfg["run"]["name"])
        assert run is not None
        last = store.last_completed_round(run.id)
        assert last is not None and last.checkpoint_path is not None
        ckpt = load_checkpoint(
            last.checkpoint_path, expected_sha256=last.checkpoint_sha256
        )
        return last.accuracy, ckpt.weights


# ------------------------------------------------------------ one run


def last_round(dep: Deployment) -> tuple[int, float]:
    """The last completed round's number, and the shortest length in seconds of
    the last three completed rounds (a round's pace: the first round also waits
    for the clients to enrol); (0, 0.0) when none completed."""
    with dep.store() as store:
        run = store.get_run_by_name(dep.cfg["run"]["name"])
        rounds = store.list_rounds(run.id) if run else []
    done = [r for r in rounds if r.status == "completed" and r.finished_at]
    if not done:
        return 0, 0.0
    pace = min((r.finished_at - r.started_at).total_seconds() for r in done[-3:])
    return done[-1].number, pace


def completed_rounds(dep: Deployment) -> int:
    return last_round(dep)[0]


def wait_for_round(dep: Deployment, coord: Any, done: int) -> float:
    """Until the coordinator completes a round after ``done`` (or exits); the
    length of the last completed round in seconds."""
    end = time.monotonic() + 900
    while time.monotonic() < end and coord.poll() is None:
        number, seconds = last_round(dep)
        if number > done:
            return seconds
        time.sleep(0.05)
    return 0.0


def run_once(setup: Setup, workdir: Path, kill: bool, say: Any) -> dict[str, Any]:
    rng = random.Random(setup.seed)
    # Exactly round(kills x startup_share) startup kills, in a seeded order.
    starts = round(setup.kills * setup.startup_share)
    moments = ["startup"] * starts + ["after a round"] * (setup.kills - starts)
    rng.shuffle(moments)
    n = setup.clients
    cfg = run_file(
        workdir,
        f"127.0.0.1:{free_port()}",
        rounds=setup.rounds,
        clients=n,
        deadlines={
            "round_seconds": 60,
            "liveness_seconds": 30,
            "max_round_attempts": 50,
        },
    )
    dep = Deployment(workdir, cfg)
    kills: list[dict[str, Any]] = []
    snapshots: list[dict[int, str]] = []
    t0 = time.perf_counter()
    try:
        name = "coordinator"
        coord, started = dep.coordinator(name), time.monotonic()
        dep.wait_serving()
        tokens = dep.tokens(n)
        clients = [dep.client(i, n, tokens[i]) for i in range(n)]
        while kill and len(kills) < setup.kills:
            startup = moments[len(kills)] == "startup"
            if startup:
                after = rng.uniform(*setup.kill_after)
                time.sleep(max(0.0, after - (time.monotonic() - started)))
            else:
                # After round 2 at the earliest: round 1 waits for enrolment.
                pace = wait_for_round(dep, coord, max(1, completed_rounds(dep)))
                time.sleep(rng.uniform(0.0, pace))
                after = time.monotonic() - started
            if coord.poll() is not None or completed_rounds(dep) >= setup.rounds:
                break  # the run finished before this kill
            coord.send_signal(signal.SIGKILL)
            coord.wait(30)
            snap = snapshot(dep)
            snapshots.append(snap)
            kills.append(
                {
                    "after_s": round(after, 2),
                    "moment": "startup" if startup else "after a round",
                    "completed_rounds": len(snap),
                    "was_serving": "listening on port" in dep.log(name),
                }
            )
            say(
                f"kill {len(kills)}: {after:.1f} s after start, {len(snap)} rounds done"
            )
            name = f"coordinator-{len(kills)}"
            coord, started = dep.coordinator(name), time.monotonic()
        wait_until(lambda: coord.poll() is not None, 3600, "the run to finish")
        exit_codes = [c.wait(120) for c in clients]
        seconds = time.perf_counter() - t0
        checked, check_output = dep.store_check()
        result = audit(dep, snapshots)
        accuracy, weights = final_state(dep)
    finally:
        dep.close()
    return {
        **result,
        "kills": len(kills),
        "kill_moments": kills,
        "coordinator_exit_code": coord.returncode,
        "client_exit_codes": exit_codes,
        "store_check": "ok" if checked else check_output,
        "final_accuracy": accuracy,
        "weights": weights,
        "seconds": seconds,
    }


def run(setup: Setup, workdir: Path, say: Any) -> dict[str, Any]:
    say("undisturbed run")
    calm = run_once(setup, workdir / "undisturbed", False, say)
    say(f"undisturbed: accuracy {calm['final_accuracy']}; now the disturbed run")
    hit = run_once(setup, workdir / "disturbed", True, say)
    diff = float((hit.pop("weights") - calm.pop("weights")).abs().max())
    return {
        "kills": hit["kills"],
        "completed_rounds": hit["completed_rounds"],
        "lost_rounds": hit["lost_rounds"],
        "duplicate_updates": hit["duplicate_updates"],
        "final_accuracy": hit["final_accuracy"],
        "undisturbed_accuracy": calm["final_accuracy"],
        "store_check": hit["store_check"],
        "accuracy_gap_points": 100
        * abs(hit["final_accuracy"] - calm["final_accuracy"]),
        "final_model_max_abs_diff": diff,
        "disturbed": hit,
        "undisturbed": calm,
    }


@with_source(RESULTS)
def render_markdown(results: dict[str, Any]) -> str:
    keys = (
        "tiny", "kills", "completed_rounds", "lost_rounds", "duplicate_updates",
        "final_accuracy", "undisturbed_accuracy", "store_check",
    )  # fmt: skip
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines.append("| " + " | ".join(str(results[k]) for k in keys) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="3 clients, 2 kills")
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
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedplat-faults-") as tmp:
        workdir = args.workdir or Path(tmp)
        body = run(setup, workdir, lambda s: print(s, file=sys.stderr, flush=True))
    out = {
        "benchmark": "faults",
        "schema_version": SCHEMA_VERSION,
        "tiny": args.tiny,
        **body,
        "goal": "0 lost, 0 duplicates, accuracy within 1 point of the undisturbed run",
        "goal_met": body["lost_rounds"] == 0
        and body["duplicate_updates"] == 0
        and body["accuracy_gap_points"] <= 1.0
        and body["store_check"] == "ok",
        "setup": {
            **asdict(setup),
            "dataset": "digits (1,437 training images split IID over the clients, "
            "360 test images for the coordinator's evaluation)",
            "model": MODEL,
            "selection": "every client every round, quorum = clients",
            "transport": "TLS (fedplat certs init), admission by enrolment tokens",
            "client_training": "1 epoch, batch 16, SGD lr 0.1, seeded per round",
        },
        "environment": environment(t0),
    }
    write_results(args.out, out, t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
