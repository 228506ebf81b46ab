"""The two live targets of ``bench/fuzz.py``: the coordinator and a gossip peer.

Each target starts its server processes, builds a fresh valid request of a
randomly chosen call, mutates it (:mod:`fedplat.testing.mutations`), sends it
with valid or invalid credentials and reports what came back
(:class:`Sent`); it can tell whether its servers are alive, restart them, and
check that honest participants still get served afterwards.
"""

from __future__ import annotations

import random
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2

from bench.deploy import (
    MODEL,
    Deployment,
    Processes,
    free_port,
    peer_status,
    wait_until,
)
from fedplat.gossip.pki import make_cluster
from fedplat.gossip.scenario import ModelSpec
from fedplat.gossip.setup import build_model
from fedplat.gossip.tls import PeerTls, open_channel
from fedplat.proto import fedplat_pb2 as pb
from fedplat.security.certs import issue
from fedplat.security.identity import Identity
from fedplat.testing.mutations import Mutated, mutate_message, mutate_stream
from fedplat.testing.peer import PEER_RPCS, raw_channel, send_raw, valid_peer_requests
from fedplat.testing.protocol import RawClient, dense_payload_bytes
from fedplat.transport.grpc import CLIENT_ID_KEY, TOKEN_KEY
from fedplat.vectors import Layout, layout_of

SERVICE = "fedplat.v1.Coordinator"
HEALTH = "grpc.health.v1.Health"
#: Each call of the coordinator (its own service's and the health service's,
#: ``Health.``) and whether it streams requests / responses; a health watch
#: streams for as long as the caller stays.
COORDINATOR_RPCS = {
    "Challenge": "unary",
    "Enroll": "unary",
    "GetTask": "unary",
    "DownloadModel": "server_stream",
    "UploadUpdate": "client_stream",
    "ReportMetrics": "unary",
    "SecAgg": "unary",
    "Health.Check": "unary",
    "Health.Watch": "watch",
}
#: Credentials in metadata besides a client's own: an empty or blank client id
#: or session token (issue 23: never an identity, never a stored event).
BLANK_CREDENTIALS = {
    "blank_client": ("", None),
    "space_client": (" ", None),
    "blank_token": (None, ""),
    "space_token": (None, " "),
    "blank_both": ("", ""),
}


@dataclass(frozen=True)
class Sent:
    """One call and its answer."""

    rpc: str
    code: str
    details: str
    op: str = ""
    cred: str = ""
    mutated: bool = True
    seconds: float = 0.0


def _ident(b: bytes) -> bytes:
    return b


def call_raw(
    channel: grpc.Channel,
    rpc: str,
    messages: list[bytes],
    metadata: tuple[tuple[str, str], ...],
    timeout: float,
) -> tuple[str, str, bytes]:
    """Send serialized ``messages`` to a coordinator call: (status, details,
    the response's bytes when it was a unary answer)."""
    service, _, method = rpc.rpartition(".")
    path = f"/{HEALTH if service == 'Health' else SERVICE}/{method}"
    kind = COORDINATOR_RPCS[rpc]
    try:
        if kind == "watch":  # its first answer (or refusal) is the outcome
            watch = channel.unary_stream(path, _ident, _ident)(
                messages[0] if messages else b"", metadata=metadata, timeout=timeout
            )
            next(watch, None)
            watch.cancel()
            out = b""
        elif kind == "client_stream":
            out = channel.stream_unary(path, _ident, _ident)(
                iter(messages), metadata=metadata, timeout=timeout
            )
        elif kind == "server_stream":
            stream = channel.unary_stream(path, _ident, _ident)
            for _ in stream(
                messages[0] if messages else b"", metadata=metadata, timeout=timeout
            ):
                pass
            out = b""
        else:
            out = channel.unary_unary(path, _ident, _ident)(
                messages[0] if messages else b"", metadata=metadata, timeout=timeout
            )
    except grpc.RpcError as exc:
        return exc.code().name, exc.details() or "", b""
    return "OK", "", out


# ------------------------------------------------------------ the coordinator


class _FuzzClient(RawClient):
    """An enrolled client whose current task the fuzzer keeps track of."""

    task: pb.Task | None = None
    past: list[pb.Task]


class CoordinatorTarget:
    """A coordinator process fuzzed by a few enrolled clients and strangers."""

    def __init__(self, dep: Deployment, rng: random.Random, setup: Any) -> None:
        self.dep = dep
        self.rng = rng
        self.setup = setup
        self.clients: list[_FuzzClient] = []
        self.tokens: list[str] = []
        self.restarts = 0
        self.count = 0

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.dep.coordinator()
        self.dep.wait_serving()
        with self.dep.store() as store:
            run = store.get_run_by_name(self.dep.cfg["run"]["name"])
            assert run is not None
            self.layout = Layout.from_dict(run.layout)
            self.run_id = run.id
        n = self.setup.fuzz_clients
        tokens = self.dep.tokens(n + self.setup.enrol_tokens + 1)
        self.honest_token, self.tokens = tokens[0], tokens[1 + n :]
        creds = self.dep.channel_credentials()
        for i in range(n):
            c = _FuzzClient(
                self.dep.address,
                self.layout,
                name=f"fuzz-{i}",
                token=tokens[1 + i],
                credentials=creds,
                timeout=self.setup.deadline_s,
            )
            c.past = []
            c.enroll()
            self.clients.append(c)
        self.enroller = RawClient(
            self.dep.address, self.layout, name="new", credentials=creds
        )
        # Small, varied values: a harmless update whose chunks all differ, so
        # reordered or resized chunks change what the signature covers.
        noise = np.random.default_rng(self.setup.seed).normal(
            0, 1e-3, self.layout.numel
        )
        self.payload = dense_payload_bytes(noise.astype("<f4"))

    def alive(self) -> bool:
        return all(
            p.poll() is None
            for name, p in self.dep.procs.items()
            if name.startswith("coordinator")
        )

    def restart(self) -> None:
        self.restarts += 1
        self.dep.coordinator(f"coordinator-{self.restarts}")
        self.dep.wait_serving()
        for c in self.clients:
            c.enroll(client_id=c.client_id)  # known key: no token needed

    def close(self) -> None:
        for c in [*self.clients, self.enroller]:
            c.close()

    def log_names(self) -> list[str]:
        return self.dep.log_names("coordinator")

    # ------------------------------------------------------------ fuzzing
    def _refresh_tasks(self) -> list[Sent]:
        """Each client polls once (valid); now and then it answers its task
        with a valid update, so rounds close and tasks rotate during the fuzz."""
        out = []
        for c in self.clients:
            code, details, raw = call_raw(
                c.channel,
                "GetTask",
                [pb.GetTaskRequest(wait_seconds=0.0).SerializeToString()],
                c.md,
                self.setup.deadline_s,
            )
            out.append(Sent("GetTask", code, details, mutated=False))
            if code != "OK":
                continue
            t = pb.Task.FromString(raw)
            if t.kind == pb.Task.TRAIN and (
                c.task is None or c.task.task_id != t.task_id
            ):
                if c.task is not None:
                    c.past = [*c.past[-9:], c.task]
                c.task = t
                if self.rng.random() < 0.3:
                    code, details, _ = call_raw(
                        c.channel,
                        "UploadUpdate",
                        [m.SerializeToString() for m in c.update(t, self.payload)],
                        c.md,
                        self.setup.deadline_s,
                    )
                    out.append(Sent("UploadUpdate", code, details, mutated=False))
        return out

    def _task(self, c: _FuzzClient) -> pb.Task:
        """The client's open task, an old one, or one it never had."""
        roll = self.rng.random()
        if c.task is not None and roll < 0.6:
            return c.task
        if c.past and roll < 0.8:
            return self.rng.choice(c.past)
        return pb.Task(
            task_id=secrets.token_hex(8), round=self.rng.randrange(1, 50), nonce=b"n"
        )

    def _credentials(self, c: _FuzzClient) -> tuple[str, tuple[tuple[str, str], ...]]:
        other = self.rng.choice(self.clients)
        mode = self.rng.choice(
            ["valid"] * 6
            + ["bad_token", "unknown_client", "none", "other_client"]
            + list(BLANK_CREDENTIALS)
        )
        if mode in BLANK_CREDENTIALS:
            cid, tok = BLANK_CREDENTIALS[mode]
            cid = c.client_id if cid is None else cid
            return mode, (
                (CLIENT_ID_KEY, cid),
                (TOKEN_KEY, c.session if tok is None else tok),
            )
        md = {
            "valid": c.md,
            "bad_token": ((CLIENT_ID_KEY, c.client_id), (TOKEN_KEY, "forged")),
            "unknown_client": ((CLIENT_ID_KEY, "0" * 16), (TOKEN_KEY, "x")),
            "none": (),
            "other_client": ((CLIENT_ID_KEY, other.client_id), (TOKEN_KEY, c.session)),
        }[mode]
        return mode, md

    def _base(self, rpc: str, c: _FuzzClient) -> tuple[list[Message], str]:
        """A valid request (or stream) of ``rpc`` and the enrolment credential."""
        if rpc == "Challenge":
            cid = self.rng.choice(["", c.client_id])
            return [pb.ChallengeRequest(client_id=cid)], "none"
        if rpc == "Enroll":
            if self.rng.random() < 0.5:
                return [c.enroll_request(client_id=c.client_id)], "registered_key"
            e = self.enroller
            e.identity = Identity.generate()
            e.token = self.tokens.pop() if self.tokens else "fpt1.spent.token"
            return [e.enroll_request()], "token" if self.tokens else "spent_token"
        if rpc == "GetTask":
            return [pb.GetTaskRequest(wait_seconds=self.rng.choice([0.0, 0.1]))], ""
        if rpc.startswith("Health."):
            name = self.rng.choice(["", SERVICE, "unknown.Service"])
            return [health_pb2.HealthCheckRequest(service=name)], "none"
        t = self._task(c)
        if rpc == "SecAgg":
            wait = self.rng.choice([0.0, 0.1])
            return [
                pb.SecAggRequest(task_id=t.task_id, round=t.round, wait_seconds=wait)
            ], ""
        if rpc == "DownloadModel":
            return [pb.DownloadRequest(task_id=t.task_id)], ""
        if rpc == "ReportMetrics":
            return [
                pb.MetricsReport(
                    task_id=t.task_id, round=t.round, metrics={"loss": 0.5}
                )
            ], ""
        return [c.header(t, self.payload), *c.body(self.payload, 2048)], ""

    def fuzz_one(self) -> list[Sent]:
        self.count += 1
        out = self._refresh_tasks() if self.count % 30 == 1 else []
        rpc = self.rng.choice(list(COORDINATOR_RPCS))
        c = self.rng.choice(self.clients)
        base, enrol_cred = self._base(rpc, c)
        if len(base) > 1 or rpc == "UploadUpdate":
            m: Mutated = mutate_stream(base, self.rng)
        elif rpc.startswith("Health.") and self.rng.random() < 0.3:
            m = Mutated([self.rng.randbytes(self.rng.randrange(1, 64))], "random_bytes")
        else:
            others = [pb.GetTaskRequest(wait_seconds=1.0), pb.DownloadRequest()]
            m = mutate_message(base[0], self.rng, others)
        cred, md = self._credentials(c)
        if enrol_cred:  # calls without a session: none, or blank ones
            blank = self.rng.random() < 0.25
            cred = f"{enrol_cred}+blank_metadata" if blank else enrol_cred
            md = ((CLIENT_ID_KEY, ""), (TOKEN_KEY, "")) if blank else ()
        t0 = time.perf_counter()
        code, details, raw = call_raw(
            c.channel, rpc, m.messages, md, self.setup.deadline_s
        )
        took = time.perf_counter() - t0
        if rpc == "Enroll" and code == "OK":
            self._enrolled(raw)
        out.append(Sent(rpc, code, details, m.op, cred, seconds=took))
        return out

    def _enrolled(self, raw: bytes) -> None:
        """A mutated enrolment that was admitted: a fuzz client that re-enrolled
        has a new session (its old one ended)."""
        resp = pb.EnrollResponse.FromString(raw)
        for c in self.clients:
            if c.client_id == resp.client_id:
                c.session = resp.token

    # ------------------------------------------------------------ afterwards
    def honest_round(self, timeout: float) -> int | None:
        """Start an honest ``fedplat client`` (the fuzzers fall silent) and wait
        for a completed round with its update: that round's number."""
        p = self.dep.client(0, 1, self.honest_token)

        def done() -> int | None:
            with self.dep.store() as store:
                me = [
                    c for c in store.list_clients(self.run_id) if c.name == "client-0"
                ]
                if not me:
                    return None
                for r in reversed(store.list_rounds(self.run_id)):
                    if r.status != "completed":
                        continue
                    parts = store.list_participations(self.run_id, r.number)
                    if any(
                        x.client_id == me[0].id and x.status == "succeeded"
                        for x in parts
                    ):
                        return r.number
            return None

        try:
            return int(wait_until(done, timeout, "an honest round"))
        except TimeoutError:
            return None
        finally:
            self.dep.kill("client-0")
            assert p.poll() is not None

    def rounds_completed(self) -> int:
        with self.dep.store() as store:
            run = store.get_run(self.run_id)
            return 0 if run is None else run.current_round


# ------------------------------------------------------------ a gossip peer


class PeerTarget:
    """Peers 0 and 1 (neighbours) as processes; the fuzzer speaks to peer 0 as
    member 1 (its neighbour, compromised), as member ``spare`` (admitted, not a
    neighbour), as ``spare`` signing for 1, and as an outsider whose
    certificate comes from the same CA."""

    IDS = ("0", "1")

    def __init__(self, root: Path, rng: random.Random, setup: Any) -> None:
        self.root = root
        self.rng = rng
        self.setup = setup
        self.procs = Processes(root / "logs")
        self.files = make_cluster(root, [*self.IDS, "spare"])
        self.outsider = issue(self.files.pki, "outsider", server=False)
        model = build_model(
            ModelSpec(name=MODEL["name"], params=MODEL["params"]), (1, 8, 8), 10, 0
        )
        self.layout = layout_of(model)
        self.ports = {i: free_port() for i in self.IDS}
        self.round = 0
        self.count = 0
        self.restarts = 0

    def _node(self, node_id: str) -> None:
        other = "1" if node_id == "0" else "0"
        self.procs.start(
            f"peer-{node_id}-{self.restarts}",
            [
                "gossip", "node", "--id", node_id,
                "--listen", f"127.0.0.1:{self.ports[node_id]}",
                "--seeds", f"{other}@127.0.0.1:{self.ports[other]}",
                "--dataset", "digits", "--num-nodes", "2",
                "--model", MODEL["name"], "--model-params", '{"hidden": [32]}',
                "--rounds", "1000000", "--min-round-s", "0.5", "--threads", "1",
                "--stream-idle", "3", *self.files.node_args(node_id),
            ],
        )  # fmt: skip

    def start(self) -> None:
        for i in self.IDS:
            self._node(i)
        self.address = f"127.0.0.1:{self.ports['0']}"
        wait_until(lambda: self._status("0") is not None, 180, "peer 0 to serve")
        tls = PeerTls.load(
            self.files.ca, self.outsider.cert_path, self.outsider.key_path
        )
        self.channels = {
            "neighbour": raw_channel(
                self.files, self.address, as_id="1", server_id="0"
            ),
            "member": raw_channel(
                self.files, self.address, as_id="spare", server_id="0"
            ),
            "outsider": open_channel(
                self.address, tls, "0", [("grpc.max_send_message_length", 64 << 20)]
            ),
        }

    def _status(self, node_id: str) -> Any:
        return peer_status(self.files, f"127.0.0.1:{self.ports[node_id]}", node_id)

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs.procs.values())

    def restart(self) -> None:
        self.procs.close()
        self.restarts += 1
        self.start()

    def fuzz_one(self) -> list[Sent]:
        self.count += 1
        if self.count % 100 == 1:
            st = self._status("0")
            self.round = st.round if st is not None else self.round
        rpc = self.rng.choice(list(PEER_RPCS))
        cred = self.rng.choice(
            ["neighbour", "neighbour", "member", "impersonate", "outsider"]
        )
        sender = {"neighbour": "1", "member": "spare", "impersonate": "1"}.get(
            cred, "outsider"
        )
        channel = self.channels["member" if cred == "impersonate" else cred]
        req = valid_peer_requests(
            self.files, sender, "0", self.layout, round=self.round,
            sender_address=f"127.0.0.1:{self.ports['1']}",
        )  # fmt: skip
        if rpc == "PushModel":
            m = mutate_stream(req.push, self.rng)
        else:
            field = {
                "Hello": "hello",
                "Ping": "ping",
                "PullModel": "pull",
                "GetStatus": "status",
            }[rpc]
            m = mutate_message(getattr(req, field), self.rng, [req.ping, req.status])
        t0 = time.perf_counter()
        code, details = send_raw(channel, rpc, m.messages, self.setup.deadline_s)
        took = time.perf_counter() - t0
        return [Sent(rpc, code.name, details, m.op, cred, seconds=took)]

    def progress(self, timeout: float) -> dict[str, bool]:
        """Whether each peer is alive and completes two more rounds."""
        start = {i: self._status(i) for i in self.IDS}
        out = {}
        for i in self.IDS:
            r0 = start[i].round if start[i] is not None else None
            try:
                wait_until(
                    lambda i=i, r0=r0: (
                        r0 is not None
                        and (st := self._status(i)) is not None
                        and st.round >= r0 + 2
                    ),
                    timeout,
                    f"peer {i} to advance",
                )
                out[i] = True
            except TimeoutError:
                out[i] = False
        return out

    def tracebacks(self) -> int:
        return sum(self.procs.log(n).count("Traceback") for n in self.log_names())

    def log_names(self) -> list[str]:
        return self.procs.log_names("peer")

    def close(self) -> None:
        for ch in getattr(self, "channels", {}).values():
            ch.close()
        self.procs.close()
