"""The attackers of issue 23 ("No single caller can stop a run or wreck the
model") for ``bench/attacks_live.py``, in the framework of :mod:`bench.attackers`.

Outsiders: calls with blank or unknown client ids (``empty_client_id``),
enrolments of 3.84 MiB layouts, 200 at a time (``huge_layout_enroll``), and a
thousand idle connections against a coordinator under a 1,024 open-file limit
(``idle_connections``). Insiders (they hold a token): example counts that do
not fit PostgreSQL's int4 on a PostgreSQL store (``pg_int_overflow``), trickled
uploads from fresh sessions to hold decoding slots (``slot_hoarding``), updates
of norm just below ``server.max_update_norm`` (``norm_insider``) or declaring
2^31-1 examples (``max_weight_insider``) in a harmful direction, and a client
named in Markdown and HTML (``markdown_name``), looked at on the monitor's
pages (:func:`monitor_markup`).

Each ``blocked`` is decided from the store, the attacker's own record of its
calls and the facts of the run (``Attacker.judge``); insiders whose updates
are accepted by design are also judged on accuracy (``judged_on``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import grpc
import numpy as np
from fedplat.server.aggregator_section import WeightBound

from bench.attackers import Attacker, reason_of
from fedplat.proto import common_pb2 as common
from fedplat.proto import fedplat_pb2 as pb
from fedplat.security.identity import Identity
from fedplat.store import Store
from fedplat.testing.protocol import dense_payload_bytes
from fedplat.transport.grpc import CLIENT_ID_KEY, TOKEN_KEY

INT4_MAX = 2**31 - 1
#: The coordinator's peak resident set an attack must stay under (MiB).
RSS_LIMIT_MB = 1500
#: A client name of Markdown and HTML (printable, under 128 characters).
HOSTILE_NAME = (
    "![t](http://attacker.example/t.png) [click](http://evil.example) "
    "<img src=x onerror=alert(1)>"
)


def _ident(b: bytes) -> bytes:
    return b


def _run_completed(store: Store, run_id: str) -> bool:
    run = store.get_run(run_id)
    return run is not None and run.status == "completed"


# ------------------------------------------------------------ outsiders


class EmptyClientId(Attacker):
    name = "empty_client_id"
    criterion = (
        'every call of every method with client id "" or " " in its metadata '
        "(a made-up session token, a blank one or none) or in its request, and "
        "with a well-formed id no client has, refused; no client and no event "
        "in the store with a blank or unknown client id; the run completes"
    )
    IDS = ("", " ", "   ")
    TOKENS = ("", " ", "made-up-session-token")
    #: Every method (Challenge and Enroll: a blank id in the request too).
    METHODS: tuple[str, ...] = (
        "GetTask", "DownloadModel", "UploadUpdate", "ReportMetrics", "SecAgg",
        "Challenge", "Enroll",
    )  # fmt: skip

    def step(self, stop: threading.Event) -> None:
        cid = self.rng.choice([*self.IDS, secrets.token_hex(8)])
        md = ((CLIENT_ID_KEY, cid), (TOKEN_KEY, self.rng.choice(self.TOKENS)))
        rpc = self.rng.choice(self.METHODS)
        self.call(lambda: self._send(rpc, cid, md))
        stop.wait(0.05)

    def _send(self, rpc: str, cid: str, md: Any) -> Any:
        c, task, kw = self.client, secrets.token_hex(8), {"metadata": md, "timeout": 10}
        if rpc == "UploadUpdate":
            fake = pb.Task(task_id=task, round=1, nonce=b"n")
            return c.stub.UploadUpdate(iter(c.update(fake, self.payload())), **kw)
        if rpc == "DownloadModel":
            return list(c.stub.DownloadModel(pb.DownloadRequest(task_id=task), **kw))
        if rpc == "Enroll":  # a new key, a made-up token, a real challenge for ""
            c.identity = Identity.generate()
            enrol = c.enroll_request(enrolment_token=f"fpt1.{task}.x")
            enrol.client_id = cid  # "": a new client, then the token decides
            return c.stub.Enroll(enrol, **kw)
        # A challenge for "" or for an id is anyone's (it reveals nothing).
        blank = cid if cid and not cid.strip() else " "
        req = {
            "GetTask": pb.GetTaskRequest(wait_seconds=0.1),
            "ReportMetrics": pb.MetricsReport(task_id=task, round=1, metrics={"l": 1}),
            "SecAgg": pb.SecAggRequest(task_id=task, round=1),
            "Challenge": pb.ChallengeRequest(client_id=blank),
        }[rpc]
        return getattr(c.stub, rpc)(req, **kw)

    def extra_evidence(
        self, store: Store, run_id: str, facts: dict[str, Any]
    ) -> dict[str, Any]:
        base = super().extra_evidence(store, run_id, facts)
        clients = {c.id for c in store.list_clients(run_id)}
        named = [(e, e.client_id) for e in store.list_events() if e.client_id]
        bad = Counter(
            e.kind
            for e, cid in named
            if not cid.strip() or (e.run_id == run_id and cid not in clients)
        )
        blank = [c for c in clients if not c.strip()]
        done = _run_completed(store, run_id)
        return {
            "blocked": base["blocked"] and not bad and not blank and done,
            "events_naming_blank_or_unknown_ids": dict(bad),
            "blank_client_ids_in_store": len(blank),
            "run_completed": done,
        }


class HugeLayoutEnroll(Attacker):
    name = "huge_layout_enroll"
    criterion = (
        "every wave of 200 concurrent Enroll requests of 3.84 MiB (a layout of "
        "100,000 long tensor names, no token) refused before parsing "
        "(INVALID_ARGUMENT: over the Enroll's bound) or by the cap on "
        "unauthenticated calls per address (RESOURCE_EXHAUSTED); coordinator "
        "peak RSS under 1.5 GB"
    )
    WAVE, CHANNELS, TENSORS = 200, 13, 100_000
    TARGET_BYTES = int(3.84 * 2**20)

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.request: bytes | None = None
        self.channels: list[grpc.Channel] = []
        self.waves = 0

    def run(self, stop: threading.Event) -> None:
        super().run(stop)
        for ch in self.channels:
            ch.close()

    def _build(self) -> bytes:
        """One serialized EnrollRequest of about :attr:`TARGET_BYTES`."""
        pad = (self.TARGET_BYTES - 4096) // self.TENSORS - 13  # a spec: pad + 13
        layout = common.Layout(
            tensors=[
                common.TensorSpec(name=f"{'w' * pad}{i:06d}", shape=[1])
                for i in range(self.TENSORS)
            ]
        )
        c = self.client
        c.identity = Identity.generate()
        req = pb.EnrollRequest(
            name="mallory", num_examples=10, public_key=c.identity.public_key,
            challenge=secrets.token_bytes(48), signature=secrets.token_bytes(64),
        )  # fmt: skip
        req.layout.CopyFrom(layout)
        req.name += "y" * (self.TARGET_BYTES - req.ByteSize())  # to the byte
        return req.SerializeToString()

    def step(self, stop: threading.Event) -> None:
        if self.request is None:
            self.request = self._build()
            self.channels = [
                grpc.secure_channel(
                    self.dep.address,
                    self.dep.channel_credentials(),
                    options=[("grpc.use_local_subchannel_pool", 1)],
                )
                for _ in range(self.CHANNELS)
            ]
        raw = self.request
        path = "/fedplat.v1.Coordinator/Enroll"

        def one(i: int) -> None:
            ch = self.channels[i % self.CHANNELS]
            self.call(lambda: ch.unary_unary(path, _ident, _ident)(raw, timeout=60))

        with ThreadPoolExecutor(self.WAVE) as pool:
            list(pool.map(one, range(self.WAVE)))
        self.waves += 1
        stop.wait(1.0)

    def extra_evidence(
        self, store: Store, run_id: str, facts: dict[str, Any]
    ) -> dict[str, Any]:
        base = super().extra_evidence(store, run_id, facts)
        before_parse = sum(
            n for r, n in self.reasons.items() if "exceeds its N-byte bound" in r
        )
        return {
            "blocked": base["blocked"] and before_parse > 0,
            "request_bytes": len(self.request or b""),
            "waves": self.waves,
            "refused_before_parsing": before_parse,
        }

    def judge(self, row: dict[str, Any]) -> dict[str, Any]:
        rss = row["coordinator_peak_rss_mb"]
        return {"blocked": rss == rss and rss < RSS_LIMIT_MB}


class IdleConnections(Attacker):
    name = "idle_connections"
    criterion = (
        "with the coordinator under a 1,024 open-file limit and "
        "server.max_connections 700: 500 TCP connections that never start TLS, "
        "250 that finish TLS and send nothing and 250 gRPC channels connected "
        "without a call, each reopened when closed, leave the run completed; "
        "no 'Too many open files' in the coordinator's log; its open "
        "descriptors stay under 1,024"
    )
    nofile = 1024
    server: ClassVar[dict[str, Any]] = {"max_connections": 700}
    judged_on = ("accuracy",)
    RAW, TLS, CHANNELS = 500, 250, 250

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.lock = threading.Lock()
        self.open = Counter[str]()
        self.peak_open = 0
        self.opened = Counter[str]()
        self.held: dict[str, list[float]] = {"raw": [], "tls": []}  # lifetimes

    def run(self, stop: threading.Event) -> None:
        host, _, port = self.dep.address.rpartition(":")
        ctx = ssl.create_default_context(cafile=str(self.dep.ca))
        ctx.check_hostname = False
        ctx.set_alpn_protocols(["h2"])
        threads = [
            threading.Thread(
                target=self._hold, args=(kind, (host, int(port)), ctx, stop)
            )
            for kind in ["raw"] * self.RAW + ["tls"] * self.TLS
        ]
        for th in threads:
            th.start()
        try:
            self._channels(stop)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        for th in threads:
            th.join(60)

    def _hold(
        self, kind: str, addr: tuple[str, int], ctx: ssl.SSLContext, stop: Any
    ) -> None:
        """One connection at a time, reopened when the server closes it."""
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                sock = socket.create_connection(addr, timeout=30)
                if kind == "tls":
                    sock = ctx.wrap_socket(sock, server_hostname="localhost")
            except OSError:  # refused at accept (over the cap), or no server
                with self.lock:
                    self.codes[f"{kind}_connect_or_handshake_failed"] += 1
                stop.wait(1.0)
                continue
            self._count(kind, +1)
            with contextlib.closing(sock):
                sock.settimeout(1.0)
                while not stop.is_set():
                    try:
                        if not sock.recv(4096):
                            break  # closed by the server
                    except TimeoutError:
                        continue
                    except OSError:
                        break
            self._count(kind, -1)
            self.held[kind].append(time.monotonic() - t0)
            stop.wait(1.0)

    def _count(self, kind: str, d: int) -> None:
        with self.lock:
            self.open[kind] += d
            self.opened[kind] += max(d, 0)
            self.peak_open = max(self.peak_open, sum(self.open.values()))

    def _channels(self, stop: threading.Event) -> None:
        """gRPC channels kept connected (READY) without a call: one that the
        server closed goes IDLE and is asked to connect again."""
        creds = self.dep.channel_credentials()
        opts = [("grpc.use_local_subchannel_pool", 1)]  # a connection each
        chans = [
            grpc.secure_channel(self.dep.address, creds, opts)
            for _ in range(self.CHANNELS)
        ]
        idle, ready = grpc.ChannelConnectivity.IDLE, grpc.ChannelConnectivity.READY
        state = [idle] * self.CHANNELS

        def seen(i: int, s: grpc.ChannelConnectivity) -> None:
            if s == ready != state[i]:
                self._count("channel", +1)
            elif state[i] == ready != s:
                self._count("channel", -1)
            state[i] = s

        for i, ch in enumerate(chans):
            ch.subscribe(functools.partial(seen, i), try_to_connect=True)
        pending = []
        while not stop.wait(2.0):
            pending = [
                grpc.channel_ready_future(ch)
                for ch, s in zip(chans, state, strict=True)
                if s == idle
            ]
        for f in pending:
            f.cancel()
        for ch in chans:
            ch.close()

    def extra_evidence(
        self, store: Store, run_id: str, facts: dict[str, Any]
    ) -> dict[str, Any]:
        def median(v: list[float]) -> float | None:
            return round(float(np.median(v)), 1) if v else None

        return {
            "blocked": sum(self.opened.values()) > 0 and _run_completed(store, run_id),
            "connections_opened": dict(self.opened),
            "peak_open_connections": self.peak_open,
            "median_lifetime_s": {k: median(v) for k, v in self.held.items()},
            "lived_over_5s": {k: sum(x > 5 for x in v) for k, v in self.held.items()},
        }

    def judge(self, row: dict[str, Any]) -> dict[str, Any]:
        log = self.dep.log("coordinator")
        emfile = log.count("Too many open files") + log.count("EMFILE")
        fds = row["coordinator_peak_fds"]
        return {
            "blocked": emfile == 0 and 0 < fds < (self.nofile or 0),
            "coordinator_nofile": self.nofile,
            "emfile_in_coordinator_log": emfile,
        }


# ------------------------------------------------------------ insiders


class PgIntOverflow(Attacker):
    name = "pg_int_overflow"
    criterion = (
        "on a PostgreSQL store: every upload declaring 2^31, 2^32 or 2^63-1 "
        "examples and every enrolment declaring 2^31 (its own re-enrolment and "
        "a new identity's) refused with INVALID_ARGUMENT; the run completes and "
        "`fedplat store check` passes on PostgreSQL"
    )
    admitted = True
    postgres = True

    def on_task(self, t: pb.Task, stop: threading.Event) -> None:
        c = self.client
        data = self.payload()
        for n in (2**31, 2**32, 2**63 - 1):
            update = c.update(t, data, num_examples=n)
            self.call(functools.partial(c.upload, update))
        me, identity = c.client_id, c.identity
        self.call(lambda: c.stub.Enroll(c.enroll_request(me, num_examples=2**31)))
        c.identity = Identity.generate()
        self.call(lambda: c.stub.Enroll(c.enroll_request(num_examples=2**31)))
        c.identity = identity

    def extra_evidence(
        self, store: Store, run_id: str, facts: dict[str, Any]
    ) -> dict[str, Any]:
        codes = {k for k in self.codes if k != "UNAVAILABLE"}  # the run's end
        invalid = self.codes["INVALID_ARGUMENT"]
        return {
            "blocked": invalid > 0 and codes == {"INVALID_ARGUMENT"},
            "invalid_argument": invalid,
            "run_completed": _run_completed(store, run_id),
        }

    def judge(self, row: dict[str, Any]) -> dict[str, Any]:
        return {
            "blocked": row["run_status"] == "completed"
            and row["store_check"] == "ok"
            and row["store"] == "postgresql",
        }


def max_overlap(spans: list[tuple[float, float]], margin: float = 0.5) -> int:
    """The most of ``spans`` (start, end) in progress at once, each shortened
    by ``margin`` at both ends (the client sees a stream's end after the
    server freed its slot)."""
    edges = sorted(
        e
        for a, b in spans
        if b - a > 2 * margin
        for e in ((a + margin, 1), (b - margin, -1))
    )
    now = peak = 0
    for _, d in edges:
        now += d
        peak = max(peak, now)
    return peak


class SlotHoarding(Attacker):
    name = "slot_hoarding"
    criterion = (
        "16 concurrent uploads of its open task, each trickling 128 bytes a "
        "second, from sessions renewed by re-enrolling every 5 s: at most one "
        "in progress at a time (the others RESOURCE_EXHAUSTED, another upload "
        "of this client is in progress), that one cut as too slow, none "
        "aggregated; every honest round completes"
    )
    admitted = True
    judged_on = ("accuracy",)
    STREAMS, CHUNK, PERIOD, HOLD_S, RENEW_S = 16, 128, 1.0, 60.0, 5.0
    #: Answers after which the task is over for this client.
    TASK_OVER = ("FAILED_PRECONDITION", "NOT_FOUND", "ALREADY_EXISTS")

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.streams: list[tuple[float, float, str]] = []
        self.sessions = Counter[str]()
        self.lock = threading.Lock()
        self.current: pb.Task | None = None
        self.over: set[str] = set()  # tasks it can upload for no more
        self.renewed = 0.0

    def run(self, stop: threading.Event) -> None:
        workers = [
            threading.Thread(target=self._hoard, args=(stop,))
            for _ in range(self.STREAMS)
        ]
        for w in workers:
            w.start()
        super().run(stop)
        for w in workers:
            w.join(60)

    def step(self, stop: threading.Event) -> None:
        """Follow the rounds (the uploaders use the newest task) and renew the
        session every ``RENEW_S``."""
        if time.monotonic() - self.renewed >= self.RENEW_S:
            self.renewed = time.monotonic()
            try:  # its registered key: no token needed
                self.client.enroll(client_id=self.client.client_id)
                self.sessions["OK"] += 1
            except grpc.RpcError as exc:
                self.sessions[exc.code().name] += 1
        try:
            t = self.client.poll(1.0)
        except grpc.RpcError:
            stop.wait(1.0)
            return
        if t.kind == pb.Task.TRAIN and t.task_id not in {x.task_id for x in self.tasks}:
            self.tasks.append(t)
            self.current = t
        elif t.kind == pb.Task.FINISHED:
            stop.wait(1.0)

    def _hoard(self, stop: threading.Event) -> None:
        c, data = self.client, self.payload()
        while not stop.is_set():
            t = self.current
            if t is None or t.task_id in self.over:
                stop.wait(0.25)
                continue
            t0, code, outcome = time.monotonic(), "OK", "OK"
            try:
                c.stub.UploadUpdate(
                    self._trickle(c.header(t, data), data, stop),
                    metadata=c.md,
                    timeout=self.HOLD_S,
                )
            except grpc.RpcError as exc:
                code, outcome = exc.code().name, reason_of(exc)
            with self.lock:
                self.streams.append((t0, time.monotonic(), outcome))
                self.codes[code] += 1
                self.reasons[outcome] += code != "OK"
            if code in self.TASK_OVER or code == "OK":
                self.over.add(t.task_id)
            stop.wait(0.5)

    def _trickle(
        self, header: pb.UpdateChunk, data: bytes, stop: threading.Event
    ) -> Iterator[pb.UpdateChunk]:
        yield header
        for i in range(0, len(data), self.CHUNK):
            if stop.wait(self.PERIOD):
                return
            yield pb.UpdateChunk(data=data[i : i + self.CHUNK])

    def extra_evidence(
        self, store: Store, run_id: str, facts: dict[str, Any]
    ) -> dict[str, Any]:
        held = [(a, b) for a, b, _ in self.streams if b - a >= 2.0]
        outcomes = [o for *_, o in self.streams]
        busy = sum("another upload of this client" in o for o in outcomes)
        slow = sum("slower than" in o for o in outcomes)
        most = max_overlap(held)
        return {
            "blocked": most <= 1
            and busy > 0
            and slow > 0
            and facts["accepted_requests"] == 0
            and facts["updates_aggregated"] == 0,
            "upload_streams": len(self.streams),
            "streams_held_over_2s": len(held),
            "most_held_at_once": most,
            "refused_busy": busy,
            "cut_too_slow": slow,
            "longest_stream_s": round(
                max((b - a for a, b, _ in self.streams), default=0), 1
            ),
            "re_enrolments": dict(self.sessions),
        }

    def judge(self, row: dict[str, Any]) -> dict[str, Any]:
        rounds = self.dep.cfg["run"]["rounds"]
        return {
            "blocked": row["run_status"] == "completed"
            and row["honest_rounds_completed"] == rounds
        }


class _Insider(Attacker):
    """An admitted client that downloads the global model and uploads a
    harmful update of its choice; evidence: its participations per round."""

    admitted = True
    judged_on = ("accuracy",)

    def global_model(self, t: pb.Task) -> np.ndarray | None:
        """The task's global model (a download is an honest client's right)."""
        try:
            raw = self.client.download(t)
        except grpc.RpcError:
            return None
        v = np.frombuffer(raw, "<f4")
        return v.astype(np.float64) if v.size == self.layout.numel else None

    def send(self, t: pb.Task, update: np.ndarray, examples: int) -> None:
        c, data = self.client, dense_payload_bytes(update.astype("<f4"))
        self.call(lambda: c.upload(c.update(t, data, num_examples=examples)))

    def rounds(self, store: Store, run_id: str) -> list[dict[str, Any]]:
        me = self._my_clients(store, run_id)
        out = []
        for r in store.list_rounds(run_id):
            parts = store.list_participations(run_id, r.number)
            total = sum(p.verdict.weight or 0.0 for p in parts)
            top = max(
                (p.verdict.weight or 0.0 for p in parts if p.client_id not in me),
                default=0.0,
            )
            for p in (p for p in parts if p.client_id in me):
                w = p.verdict.weight or 0.0
                out.append(
                    {
                        "round": r.number,
                        "status": p.status,
                        "weight_share": round(w / total, 4) if total else None,
                        "vs_largest_honest": round(w / top, 3) if top else None,
                        "flags": list(p.verdict.flags),
                        "aggregated": p.status == "succeeded" or w > 0,
                    }
                )
        return out

    def flagged(self, store: Store, run_id: str, flag: str) -> dict[str, Any]:
        """``blocked`` when each aggregated update of it carries ``flag``."""
        rounds = self.rounds(store, run_id)
        used = [r for r in rounds if r["aggregated"]]
        with_flag = sum(flag in r["flags"] for r in used)
        return {
            "blocked": bool(used) and with_flag == len(used),
            "aggregated_rounds": len(used),
            f"rounds_{flag.replace('-', '_')}": with_flag,
            "max_weight_share": max((r["weight_share"] or 0 for r in used), default=0),
            "per_round": rounds,
        }


class NormInsider(_Insider):
    name = "norm_insider"
    criterion = (
        "each round a valid signed update of norm 9e5 (just under "
        "server.max_update_norm, 1e6) pointing from the global model to zero, "
        "with an honest example count: every one aggregated is norm-bounded "
        "(its verdict's flags); accuracy within a point of the run without attack"
    )
    NORM = 9e5

    def on_task(self, t: pb.Task, stop: threading.Event) -> None:
        g = self.global_model(t)
        d = (
            -g
            if g is not None and np.linalg.norm(g) > 0
            else -np.ones(self.layout.numel)
        )
        self.send(t, d / np.linalg.norm(d) * self.NORM, 180)

    def extra_evidence(
        self, store: Store, run_id: str, facts: dict[str, Any]
    ) -> dict[str, Any]:
        return self.flagged(store, run_id, "norm-bounded")


class MaxWeightInsider(_Insider):
    name = "max_weight_insider"
    criterion = (
        "a client whose token carries no weight cap enrols and uploads declaring "
        "2^31-1 examples, each round undoing the global model's last step (an "
        "update of that step's norm): every one aggregated is weight-capped (its "
        "verdict's flags, its weight share per round in the evidence); accuracy "
        "within a point of the run without attack"
    )
    uncapped = True
    enrolment: ClassVar[dict[str, Any]] = {"num_examples": INT4_MAX}

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.last: np.ndarray | None = None

    def on_task(self, t: pb.Task, stop: threading.Event) -> None:
        g = self.global_model(t)
        if g is None:
            return
        step = g - self.last if self.last is not None else np.zeros_like(g)
        self.last = g
        norm = float(np.linalg.norm(step))
        if norm == 0:  # no step seen yet: towards zero, with norm 1
            step, norm = g, 1.0
        self.send(t, -step / max(float(np.linalg.norm(step)), 1e-12) * norm, INT4_MAX)

    def extra_evidence(
        self, store: Store, run_id: str, facts: dict[str, Any]
    ) -> dict[str, Any]:
        # Every weight below a cap is "weight-capped" (a token's too), so the
        # weight itself must also be within the run's weight bound.
        ev = self.flagged(store, run_id, "weight-capped")
        bound = WeightBound().multiplier
        worst = max((r["vs_largest_honest"] or 0 for r in ev["per_round"]), default=0)
        return {
            **ev,
            "blocked": ev["blocked"] and worst <= bound * 1.01,
            "max_weight_vs_largest_honest": worst,
            "weight_bound_multiplier": bound,
        }


#: Kinds of element whose text Streamlit renders as Markdown.
MARKDOWN_ELEMENTS = (
    "title", "header", "subheader", "markdown", "caption",
    "info", "warning", "error", "success",
)  # fmt: skip


def monitor_markup(db: str, run_id: str, text: str) -> dict[str, Any]:
    """What the monitor's clients and run pages (``fedplat.ui`` under
    Streamlit's AppTest, on the store ``db``) make of a stored ``text``: every
    Markdown body they render parsed as CommonMark (links, images and HTML
    found: ``markup``), and whether a reader sees ``text`` literally, in the
    rendered text or in a table cell (``shown_as_text``)."""
    import markdown_it
    from fedplat.ui import APP_PATH, DB_ENV
    from streamlit.testing.v1 import AppTest

    md = markdown_it.MarkdownIt("commonmark")
    out: dict[str, Any] = {"markup": [], "shown_as_text": {}, "exceptions": []}
    saved = os.environ.get(DB_ENV)
    os.environ[DB_ENV] = db
    try:
        for page in ("clients", "run"):
            at = AppTest.from_file(str(APP_PATH), default_timeout=120)
            at.run()
            at.query_params["run"] = run_id
            at.switch_page(f"views/{page}.py").run()
            out["exceptions"] += [str(e.value)[:300] for e in at.exception]
            bodies = [str(e.value) for k in MARKDOWN_ELEMENTS for e in getattr(at, k)]
            bodies += [str(e.label) for e in at.expander]
            seen = []
            for body in bodies:
                for tok in md.parse(body):
                    kids = tok.children or []
                    found = [k.type for k in kids if k.type in _MARKUP]
                    if found or tok.type == "html_block":
                        out["markup"].append(f"{page}: {found} in {body[:200]!r}")
                    seen += [
                        k.content for k in kids if k.type in ("text", "code_inline")
                    ]
            cells = [str(v) for df in at.dataframe for v in df.value.to_numpy().ravel()]
            out["shown_as_text"][page] = text in "".join(seen) or text in cells
    finally:
        if saved is None:
            os.environ.pop(DB_ENV, None)
        else:
            os.environ[DB_ENV] = saved
    return out


_MARKUP = ("link_open", "image", "html_inline")
_TEXT = ("text", "code_inline")


class MarkdownName(Attacker):
    name = "markdown_name"
    criterion = (
        "a client enrolled under a name of Markdown and HTML (an image, a link, "
        "an <img onerror>) and taking part in every round: the monitor's clients "
        "and run pages render no link, image or HTML, and show the name as text"
    )
    admitted = True
    judged_on = ("accuracy",)
    enrolment: ClassVar[dict[str, Any]] = {"name": HOSTILE_NAME}

    def on_task(self, t: pb.Task, stop: threading.Event) -> None:
        c = self.client  # a free-rider's update: the model it was given
        self.call(lambda: c.upload(c.update(t, self.payload(0.0))))

    def extra_evidence(
        self, store: Store, run_id: str, facts: dict[str, Any]
    ) -> dict[str, Any]:
        names = [c.name for c in store.list_clients(run_id) if c.name == HOSTILE_NAME]
        try:
            seen = monitor_markup(self.dep.db, run_id, HOSTILE_NAME)
        except ImportError as exc:  # no streamlit or markdown-it: not judged
            return {"blocked": None, "monitor": f"not checked: {exc}"}
        shown = seen["shown_as_text"]
        return {
            "blocked": bool(names)
            and not seen["markup"]
            and not seen["exceptions"]
            and any(shown.values()),
            "stored_name": names[0] if names else None,
            "monitor": seen,
        }


BOUNDS_ATTACKS: dict[str, type[Attacker]] = {
    a.name: a
    for a in (
        EmptyClientId,
        HugeLayoutEnroll,
        IdleConnections,
        PgIntOverflow,
        SlotHoarding,
        NormInsider,
        MaxWeightInsider,
        MarkdownName,
    )
}

__all__ = [
    "BOUNDS_ATTACKS",
    "HOSTILE_NAME",
    "RSS_LIMIT_MB",
    "max_overlap",
    "monitor_markup",
]
