"""A hand-rolled coordinator client: every field of every message under control.

:class:`RawClient` enrols like the SDK (challenge, Ed25519 proof, token) and builds
signed update streams, but lets the caller change any header field, the signature,
the chunking or the body, or skip steps: what tests of the coordinator's defences,
the fuzzer (``bench/fuzz.py``) and the live attack benchmark
(``bench/attacks_live.py``) need.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import grpc
import numpy as np

from fedplat.compression.wire import dense_header
from fedplat.proto import fedplat_pb2 as pb
from fedplat.proto import fedplat_pb2_grpc as pb_grpc
from fedplat.proto import serde
from fedplat.protocol.messages import PAYLOAD_V1
from fedplat.security.identity import ENROL, UPDATE, Identity, statement
from fedplat.transport.grpc import CLIENT_ID_KEY, TOKEN_KEY
from fedplat.vectors import Layout


def dense_payload_bytes(values: np.ndarray) -> bytes:
    """A dense float32 upload payload (header + little-endian values)."""
    v = np.ascontiguousarray(values, dtype="<f4")
    return dense_header(v.size) + v.tobytes()


class RawClient:
    """Speaks the coordinator protocol by hand (see the module docstring)."""

    def __init__(
        self,
        address: str,
        layout: Layout,
        *,
        name: str = "raw",
        token: str = "",
        identity: Identity | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.channel = (
            grpc.secure_channel(address, credentials)
            if credentials is not None
            else grpc.insecure_channel(address)
        )
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        self.layout = layout
        self.name = name
        self.token = token
        self.identity = identity or Identity.generate()
        self.timeout = timeout
        self.client_id = ""
        self.session = ""
        self.run_id = ""

    @property
    def md(self) -> tuple[tuple[str, str], ...]:
        return ((CLIENT_ID_KEY, self.client_id), (TOKEN_KEY, self.session))

    def close(self) -> None:
        self.channel.close()

    # ------------------------------------------------------------ enrolment
    def enroll_request(self, client_id: str = "", **overrides: Any) -> pb.EnrollRequest:
        """A signed enrolment request on a fresh challenge (fields overridable)."""
        ch = self.stub.Challenge(
            pb.ChallengeRequest(client_id=client_id), timeout=self.timeout
        ).challenge
        key = self.identity.public_key
        req = pb.EnrollRequest(
            name=self.name,
            num_examples=10,
            layout=serde.layout_to_proto(self.layout),
            client_id=client_id,
            public_key=key,
            challenge=ch,
            signature=self.identity.sign(ENROL, ch, client_id, key),
            enrolment_token=self.token,
        )
        for k, v in overrides.items():
            if k == "layout":
                req.layout.CopyFrom(v)
            else:
                setattr(req, k, v)
        return req

    def enroll(self, client_id: str = "", **overrides: Any) -> pb.EnrollResponse:
        resp = self.stub.Enroll(
            self.enroll_request(client_id, **overrides), timeout=self.timeout
        )
        self.client_id, self.session, self.run_id = (
            resp.client_id,
            resp.token,
            resp.run_id,
        )
        return resp

    # ------------------------------------------------------------ tasks
    def poll(self, wait: float = 1.0) -> pb.Task:
        return self.stub.GetTask(
            pb.GetTaskRequest(wait_seconds=wait),
            metadata=self.md,
            timeout=wait + self.timeout,
        )

    def task(self, attempts: int = 60) -> pb.Task:
        """The next TRAIN task (polls until one comes)."""
        for _ in range(attempts):
            t = self.poll(2.0)
            if t.kind == pb.Task.TRAIN:
                return t
        raise TimeoutError(f"{self.name}: no task after {attempts} polls")

    def download(self, task: pb.Task) -> bytes:
        parts = self.stub.DownloadModel(
            pb.DownloadRequest(task_id=task.task_id),
            metadata=self.md,
            timeout=self.timeout,
        )
        return b"".join(p.data for p in parts if p.WhichOneof("part") == "data")

    # ------------------------------------------------------------ uploads
    def header(
        self, task: pb.Task, payload: bytes, *, sign: bool = True, **overrides: Any
    ) -> pb.UpdateChunk:
        """A (signed) update header for ``payload``; overrides apply before the
        signature is computed unless ``signature`` itself is overridden."""
        h = pb.UpdateHeader(
            task_id=task.task_id,
            round=task.round,
            num_examples=10,
            layout=serde.layout_to_proto(self.layout),
            encoding=PAYLOAD_V1,
            total_bytes=len(payload),
            sha256=hashlib.sha256(payload).hexdigest(),
        )
        signature = overrides.pop("signature", None)
        for k, v in overrides.items():
            if k == "layout":
                h.layout.CopyFrom(v)
            elif k == "metrics":
                h.metrics.update(v)
            else:
                setattr(h, k, v)
        if signature is not None:
            h.signature = signature
        elif sign:
            h.signature = self.identity.key.sign(
                statement(
                    UPDATE, self.run_id, h.round, h.task_id, task.nonce, h.sha256,
                    h.num_examples, h.encoding,
                )
            )  # fmt: skip
        return pb.UpdateChunk(header=h)

    @staticmethod
    def body(payload: bytes, chunk: int = 65536) -> list[pb.UpdateChunk]:
        return [
            pb.UpdateChunk(data=payload[i : i + chunk])
            for i in range(0, len(payload), chunk)
        ]

    def update(
        self, task: pb.Task, payload: bytes, **overrides: Any
    ) -> list[pb.UpdateChunk]:
        return [self.header(task, payload, **overrides), *self.body(payload)]

    def upload(self, chunks: Iterable[pb.UpdateChunk]) -> pb.UploadAck:
        return self.stub.UploadUpdate(
            iter(list(chunks)), metadata=self.md, timeout=self.timeout
        )


__all__ = ["RawClient", "dense_payload_bytes"]
