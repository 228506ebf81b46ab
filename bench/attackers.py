"""The attackers of ``bench/attacks_live.py``, one class per attack of issue 11
(issue 23's are in :mod:`bench.attackers_bounds`).

Each attacker runs in a thread of the benchmark while 8 honest client
processes train, speaking the protocol by hand (:class:`RawClient`) over the
deployment's TLS. It counts the status of every request it makes, and after
the run it reads the store to decide whether it was **blocked**, from
evidence only: its requests were refused, none of its updates entered an
aggregate (no succeeded participation, no aggregation weight), and what the
attack aimed at is unchanged (see each class's ``criterion``).

``admitted`` attackers hold an enrolment token, as a compromised device
would: they are clients of the run, selected like the others, and attack from
inside. ``has_token`` attackers hold a valid token they never enrol with (the
identity takeover uses it to claim another client's id); the others never had
a token. Class attributes set the run an attack needs (server limits, the
coordinator's open-file limit, a PostgreSQL store, tokens without a cap).
"""

from __future__ import annotations

import functools
import random
import re
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import grpc
import numpy as np

from bench.deploy import Deployment, snapshot
from fedplat.proto import common_pb2 as common
from fedplat.proto import fedplat_pb2 as pb
from fedplat.security.identity import Identity
from fedplat.store import Store
from fedplat.testing.protocol import RawClient, dense_payload_bytes
from fedplat.vectors import Layout

NAME = "mallory"


def reason_of(exc: grpc.RpcError) -> str:
    """A refusal as ``CODE: details``, numbers masked (so refusals group)."""
    details = re.sub(r"\d+(\.\d+)?", "N", exc.details() or "")
    return f"{exc.code().name}: {details[:120]}"


class Attacker:
    """The common part: a hand-rolled client, request counters, evidence."""

    name: ClassVar[str]
    criterion: ClassVar[str]
    admitted: ClassVar[bool] = False
    #: Holds a valid enrolment token (every admitted attacker does).
    has_token: ClassVar[bool] = False
    #: Start before the honest clients connect (to compete with them).
    early: ClassVar[bool] = False
    #: How an admitted attacker enrols (``RawClient.enroll`` overrides).
    enrolment: ClassVar[dict[str, Any]] = {}
    #: The run file's ``server`` settings under this attack (issue 23's limits).
    server: ClassVar[dict[str, Any]] = {}
    #: The coordinator's open-file limit (``prlimit --nofile``); None: inherited.
    nofile: ClassVar[int | None] = None
    #: Runs on a throwaway PostgreSQL store (with a reference run of its own).
    postgres: ClassVar[bool] = False
    #: Its token carries no per-client weight cap (only the run's).
    uncapped: ClassVar[bool] = False
    #: What ``blocked`` also needs, judged against the run without attack:
    #: "accuracy" within a point, "store_growth" under 1 MB.
    judged_on: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self, dep: Deployment, layout: Layout, token: str | None, seed: int
    ) -> None:
        self.dep = dep
        self.layout = layout
        self.token = token
        self.rng = random.Random(seed)
        self.codes: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()  # refusals by code and details
        self.client = self.raw(NAME, token or "")
        self.tasks: list[pb.Task] = []
        self.run_id = ""
        self.error: str | None = None

    def raw(self, name: str, token: str = "") -> RawClient:
        return RawClient(
            self.dep.address,
            self.layout,
            name=name,
            token=token,
            credentials=self.dep.channel_credentials(),
            timeout=60,
        )

    def call(self, fn: Callable[[], Any]) -> Any:
        """Make one request; count its status code."""
        try:
            out = fn()
        except grpc.RpcError as exc:
            self.codes[exc.code().name] += 1
            self.reasons[reason_of(exc)] += 1
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                time.sleep(0.5)  # the coordinator is gone (the run ended)
            return None
        self.codes["OK"] += 1
        return out

    # ------------------------------------------------------------ running
    def run(self, stop: threading.Event) -> None:
        try:
            if self.admitted:
                enrol = functools.partial(self.client.enroll, **self.enrolment)
                while not stop.is_set() and self.call(enrol) is None:
                    stop.wait(1.0)
                self.codes.clear()  # the enrolment itself is not part of the attack
                self.reasons.clear()
            while not stop.is_set():
                self.step(stop)
        except Exception as exc:  # a bug of the attacker, not a defence: reported
            self.error = f"{type(exc).__name__}: {exc}"

    def step(self, stop: threading.Event) -> None:
        """One move (outsiders); an admitted attacker acts on each new task."""
        t = self.next_task(stop)
        if t is not None:
            self.on_task(t, stop)

    def on_task(self, t: pb.Task, stop: threading.Event) -> None:
        raise NotImplementedError

    def next_task(self, stop: threading.Event) -> pb.Task | None:
        """Poll until a new TRAIN task (or stop); remembers every task."""
        while not stop.is_set():
            try:
                t = self.client.poll(1.0)
            except grpc.RpcError:
                stop.wait(1.0)
                continue
            if t.kind == pb.Task.FINISHED:
                stop.wait(1.0)
            elif t.kind == pb.Task.TRAIN and all(
                t.task_id != p.task_id for p in self.tasks
            ):
                self.tasks.append(t)
                return t
        return None

    def payload(self, value: float = 0.0) -> bytes:
        return dense_payload_bytes(np.full(self.layout.numel, value, "<f4"))

    # ------------------------------------------------------------ evidence
    def evidence(self, store: Store, run_id: str) -> dict[str, Any]:
        """Whether the attack was blocked, and the facts that decide it."""
        me = self._my_clients(store, run_id)
        aggregated = 0
        for r in store.list_rounds(run_id):
            for p in store.list_participations(run_id, r.number):
                if p.client_id in me and (
                    p.status == "succeeded" or (p.verdict.weight or 0) > 0
                ):
                    aggregated += 1
        facts = {
            "attacker_error": self.error,
            "requests": dict(self.codes),
            "accepted_requests": self.codes["OK"],
            "updates_aggregated": aggregated,
            "attacker_clients_in_store": len(me),
            "clients_in_store": len(store.list_clients(run_id)),
            "refusals": dict(self.reasons.most_common(12)),
        }
        return {**facts, **self.extra_evidence(store, run_id, facts)}

    def judge(self, row: dict[str, Any]) -> dict[str, Any]:
        """Facts of the whole run that decide too (peak RSS, open files, the
        coordinator's log), with ``blocked`` when they do: none by default."""
        return {}

    def _my_clients(self, store: Store, run_id: str) -> set[str]:
        return {
            c.id for c in store.list_clients(run_id) if not c.name.startswith("client-")
        }

    def extra_evidence(
        self, store: Store, run_id: str, facts: dict[str, Any]
    ) -> dict[str, Any]:
        """``blocked`` and the attack's own facts (default: nothing accepted,
        nothing aggregated)."""
        return {
            "blocked": facts["accepted_requests"] == 0
            and facts["updates_aggregated"] == 0
            and sum(self.codes.values()) > 0
        }


# ------------------------------------------------------------ outsiders


class SybilFlood(Attacker):
    name = "sybil_flood"
    criterion = (
        "every enrolment without a valid token refused; no client other than "
        "the honest ones in the store"
    )
    early = True

    def step(self, stop: threading.Event) -> None:
        c = self.client
        c.identity = Identity.generate()
        c.name = f"sybil-{secrets.token_hex(3)}"
        c.token = self.rng.choice(
            ["", f"fpt1.{secrets.token_hex(6)}.{secrets.token_hex(16)}"]
        )
        self.call(c.enroll)

    def extra_evidence(
        self, store: Store, run_id: str, facts: dict[str, Any]
    ) -> dict[str, Any]:
        base = super().extra_evidence(store, run_id, facts)
        honest = self.dep.cfg["selection"]["min_available"]
        return {"blocked": base["blocked"] and facts["clients_in_store"] == honest}


class IdentityTakeover(Attacker):
    name = "identity_takeover"
    criterion = (
        "every enrolment as the victim (its id and name, the attacker's own key "
        "and a valid token of its own) and every call with a guessed session "
        "refused; the victim's registered key unchanged and its updates "
        "aggregated in every round"
    )
    has_token = True

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.victim: Any = None

    def step(self, stop: threading.Event) -> None:
        if self.victim is None:
            with self.dep.store() as store:
                run = store.get_run_by_name(self.dep.cfg["run"]["name"])
                found = (
                    [c for c in store.list_clients(run.id) if c.name == "client-0"]
                    if run
                    else []
                )
            if not found:
                stop.wait(0.5)
                return
            self.victim, self.run_id = found[0], run.id  # type: ignore[union-attr]
        c, v = self.client, self.victim
        c.name = "client-0"
        way = self.rng.randrange(3)
        if way == 0:  # its id, our key, our valid token
            self.call(lambda: c.enroll(client_id=v.id))
        elif way == 1:  # a challenge for no id, then claim the victim's id

            def swap() -> Any:
                req = c.enroll_request(client_id="")
                req.client_id = v.id
                return c.stub.Enroll(req, timeout=10)

            self.call(swap)
        else:  # a guessed session token for the victim's id
            c.client_id, c.session = v.id, secrets.token_urlsafe(32)
            self.call(lambda: c.poll(0.0))
        stop.wait(0.05)

    def extra_evidence(
        self, store: Store, run_id: str, facts: dict[str, Any]
    ) -> dict[str, Any]:
        base = super().extra_evidence(store, run_id, facts)
        if self.victim is None:
            return {"blocked": False, "victim": None}
        now = store.get_client(run_id, self.victim.id)
        rounds = [r for r in store.list_rounds(run_id) if r.status == "completed"]
        served = sum(
            any(
                p.client_id == self.victim.id and p.status == "succeeded"
                for p in store.list_participations(run_id, r.number)
            )
            for r in rounds
        )
        key_kept = now is not None and now.public_key == self.victim.public_key
        return {
            "blocked": base["blocked"] and key_kept and served == len(rounds),
            "victim_key_unchanged": key_kept,
            "victim_rounds_aggregated": served,
        }


class StoreFlooding(Attacker):
    name = "store_flooding"
    criterion = (
        "every enrolment carrying long strings (names, info, tensor names, "
        "tokens) refused; the store grows by less than 1 MB more than in the "
        "run without attack"
    )
    judged_on = ("store_growth",)

    def step(self, stop: threading.Event) -> None:
        c = self.client
        c.identity = Identity.generate()
        big = "x" * self.rng.choice([300, 10_000, 100_000])
        way = self.rng.randrange(4)
        if way == 0:
            self.call(lambda: c.enroll(name=big))
        elif way == 1:

            def many_infos() -> Any:
                req = c.enroll_request()  # its Challenge may be refused too
                for i in range(200):
                    req.info[f"{big[:200]}{i}"] = big[:5000]
                return c.stub.Enroll(req, timeout=30)

            self.call(many_infos)
        elif way == 2:
            many = common.Layout(
                tensors=[
                    common.TensorSpec(name=big[:1000] + str(i), shape=[1])
                    for i in range(1000)
                ]
            )
            self.call(lambda: c.enroll(layout=many))
        else:
            self.call(lambda: c.enroll(enrolment_token=big))


# ------------------------------------------------------------ admitted clients


class Replay(Attacker):
    name = "replay"
    criterion = (
        "the attacker's own accepted update replayed at once and after its "
        "round closed, a download after the upload, and cross-round, cross-run "
        "and foreign-task uploads all refused; it has at most one succeeded "
        "participation per round (its own update); the records of every "
        "completed round identical before and after"
    )
    admitted = True

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.snapshots: list[dict[int, str]] = []
        self.sent: list[list[pb.UpdateChunk]] = []  # its accepted uploads
        self.own = Counter[str]()

    def on_task(self, t: pb.Task, stop: threading.Event) -> None:
        c, data = self.client, self.payload(0.0)
        self.snapshots.append(snapshot(self.dep))
        for old in self.sent:  # its own updates of rounds that closed
            self.call(functools.partial(c.upload, old))
        own = c.update(t, data)
        try:  # its own, honest-looking update (not part of the attack)
            c.upload(own)
            self.own["OK"] += 1
            self.sent.append(own)
        except grpc.RpcError as exc:
            self.own[exc.code().name] += 1
        self.call(lambda: c.upload(own))  # replayed at once
        self.call(lambda: c.download(t))  # a download after the upload
        self.call(lambda: c.upload(c.update(t, data, round=t.round + 1)))
        run_id, c.run_id = c.run_id, "another-run"
        self.call(lambda: c.upload(c.update(t, data)))
        c.run_id = run_id
        fake = pb.Task(task_id=secrets.token_hex(8), round=t.round, nonce=t.nonce)
        self.call(lambda: c.upload(c.update(fake, data)))

    def extra_evidence(
        self, store: Store, run_id: str, facts: dict[str, Any]
    ) -> dict[str, Any]:
        final = snapshot(self.dep)
        changed = sorted(
            {
                n
                for snap in self.snapshots
                for n, rec in snap.items()
                if final.get(n) != rec
            }
        )
        me = self._my_clients(store, run_id)
        per_round = Counter(
            r.number
            for r in store.list_rounds(run_id)
            for p in store.list_participations(run_id, r.number)
            if p.client_id in me and p.status == "succeeded"
        )
        return {
            "blocked": facts["accepted_requests"] == 0
            and sum(self.codes.values()) > 0
            and max(per_round.values(), default=0) <= 1
            and not changed,
            "own_updates": dict(self.own),
            "attacker_succeeded_per_round_max": max(per_round.values(), default=0),
            "closed_rounds_changed": changed,
        }


class WeightInflation(Attacker):
    name = "weight_inflation"
    criterion = (
        "a valid update declaring 10^12 examples gets no more aggregation "
        "weight than the largest honest client of the same round"
    )
    admitted = True

    def on_task(self, t: pb.Task, stop: threading.Event) -> None:
        c = self.client
        # A free-rider's update (its own vector: the model it was given) that
        # would freeze the global model if its weight were honoured.
        self.call(lambda: c.upload(c.update(t, self.payload(0.0), num_examples=10**12)))

    def extra_evidence(
        self, store: Store, run_id: str, facts: dict[str, Any]
    ) -> dict[str, Any]:
        me = self._my_clients(store, run_id)
        worst = 0.0
        for r in store.list_rounds(run_id):
            parts = store.list_participations(run_id, r.number)
            mine = [p.verdict.weight or 0.0 for p in parts if p.client_id in me]
            honest = [p.verdict.weight or 0.0 for p in parts if p.client_id not in me]
            if mine and honest and max(honest) > 0:
                worst = max(worst, max(mine) / max(honest))
        return {
            "blocked": worst <= 1.0 + 1e-6 and facts["requests"] != {},
            "max_weight_vs_largest_honest": worst,
        }


class HugeRows(Attacker):
    name = "huge_magnitude_rows"
    criterion = (
        "every update with finite but huge values (1e5 .. 3e38) refused; none "
        "aggregated"
    )
    admitted = True

    def on_task(self, t: pb.Task, stop: threading.Event) -> None:
        c = self.client
        value = self.rng.choice([1e5, 1e20, 3e38])
        self.call(lambda: c.upload(c.update(t, self.payload(value))))


class IdleStreams(Attacker):
    name = "idle_streams"
    criterion = (
        "every upload stream that goes silent after its header is cut or "
        "refused (RESOURCE_EXHAUSTED), unauthenticated ones before a byte is "
        "read; none aggregated; every honest round completes"
    )
    admitted = True

    def on_task(self, t: pb.Task, stop: threading.Event) -> None:
        c = self.client
        header = c.header(t, self.payload())

        def idle(md: Any) -> Iterator[pb.UpdateChunk]:
            yield header
            stop.wait(120)  # send nothing more

        def hold(md: Any) -> None:
            self.call(lambda: c.stub.UploadUpdate(idle(md), metadata=md, timeout=150))

        stranger = (("x-fedplat-client", "0" * 16), ("x-fedplat-token", "x"))
        threads = [threading.Thread(target=hold, args=(c.md,)) for _ in range(6)]
        threads += [threading.Thread(target=hold, args=(stranger,)) for _ in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()


class OversizedUploads(Attacker):
    name = "oversized_uploads"
    criterion = (
        "uploads declaring 2 GiB, sending more than declared, or sending a body "
        "without a task are refused, the first and last before the body is read; "
        "none aggregated"
    )
    admitted = True

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.sent_mb = 0.0

    def _stream(self, first: pb.UpdateChunk, mb: int) -> Iterator[pb.UpdateChunk]:
        yield first
        block = b"\x00" * (1 << 20)
        for _ in range(mb):
            self.sent_mb += 1
            yield pb.UpdateChunk(data=block)

    def on_task(self, t: pb.Task, stop: threading.Event) -> None:
        c, data = self.client, self.payload()
        self.upload(self._stream(c.header(t, data, total_bytes=2**31), 64))
        fake = pb.Task(task_id=secrets.token_hex(8), round=t.round, nonce=b"n")
        self.upload(self._stream(c.header(fake, data, total_bytes=2**31), 64))
        self.upload(iter([*c.update(t, data), *c.body(data * 50)]))

    def upload(self, stream: Iterator[pb.UpdateChunk]) -> None:
        c = self.client
        self.call(lambda: c.stub.UploadUpdate(stream, metadata=c.md, timeout=60))

    def extra_evidence(
        self, store: Store, run_id: str, facts: dict[str, Any]
    ) -> dict[str, Any]:
        base = super().extra_evidence(store, run_id, facts)
        return {**base, "attacker_sent_mb": self.sent_mb}


ATTACKS: dict[str, type[Attacker]] = {
    a.name: a
    for a in (
        SybilFlood,
        IdentityTakeover,
        Replay,
        WeightInflation,
        HugeRows,
        IdleStreams,
        OversizedUploads,
        StoreFlooding,
    )
}

__all__ = ["ATTACKS", "NAME", "Attacker", "reason_of"]
