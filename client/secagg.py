"""A client's part in a round's secure aggregation (``privacy.secure_aggregation``).

When a task carries a :class:`fedplat.protocol.task.SecAggSpec` the client does not
upload its update. It clips the update (or, with a sketch compressor, its
sketch) to the round's clip norm, appends ``clip_norm * [not clipped]`` under
adaptive clipping, and runs SecAgg / SecAgg+ (:class:`fedplat.secagg.SecAggClient`)
over the ``SecAgg`` call: advertise keys, share keys, masked input, unmask. Every
message it sends is signed with its identity key over the task (domain
``SECAGG``), like an update. :class:`SecAggParticipant` keeps the protocol state
between polls, so the same code runs under a long-polling gRPC client and the
step-by-step simulator.
"""

from __future__ import annotations

import logging

import torch
from fedplat.client.uplink import UplinkLayer

from fedplat.privacy import clip_l2
from fedplat.protocol.messages import (
    SecAggReplyKind,
    SecAggRequest,
    Task,
    secagg_statement,
)
from fedplat.secagg import SecAggClient, SecAggConfig, SecAggError, decode, encode
from fedplat.security.identity import SECAGG, Identity
from fedplat.transport.base import Connection
from fedplat.vectors import all_finite

log = logging.getLogger("fedplat.client")

__all__ = ["SecAggParticipant", "secagg_vector"]


def secagg_vector(task: Task, delta: torch.Tensor, uplink: UplinkLayer) -> torch.Tensor:
    """What this client masks: ``[dim]`` float32 (see the module docstring)."""
    cfg = task.config
    spec, privacy = cfg.secagg, cfg.privacy
    if spec is None or privacy is None:
        raise SecAggError("secure aggregation needs the round's clip norm")
    vec = delta
    if not cfg.compression.is_identity:
        _, comp = uplink.compressor(cfg.compression)
        payload = comp.encode(delta, round=task.round, seed=cfg.compression_seed)
        if payload.kind != "sketch":
            raise SecAggError(f"secure aggregation cannot sum {payload.kind} payloads")
        vec = payload.values.to(torch.float32)
    c = clip_l2(vec, privacy.clip_norm)
    if not spec.adaptive:
        return c.vector
    bit = 0.0 if c.clipped else privacy.clip_norm
    return torch.cat([c.vector, torch.tensor([bit], dtype=torch.float32)])


class SecAggParticipant:
    """One task's protocol run, advanced a call at a time (module docstring)."""

    def __init__(self, task: Task, vector: torch.Tensor) -> None:
        spec = task.config.secagg
        assert spec is not None
        self.task = task
        self.config = SecAggConfig.from_dict(spec.config)
        if vector.shape != (self.config.dim,):
            raise SecAggError(
                f"the round masks [{self.config.dim}] vectors, this client has "
                f"{tuple(vector.shape)}"
            )
        if not all_finite(vector):
            raise SecAggError("the vector to mask holds NaN or Inf")
        self.protocol = SecAggClient(self.config, spec.party)
        self.vector = vector
        self.outgoing = encode(self.protocol.advertise())
        self.done = False
        self.reason = ""

    def advance(
        self, conn: Connection, identity: Identity, run_id: str, wait: float
    ) -> bool:
        """Send what is pending and answer what the coordinator sent, until it
        says WAIT (False) or DONE (True)."""
        t = self.task
        while not self.done:
            msg, self.outgoing = self.outgoing, b""
            sig = b""
            if msg:
                fields = secagg_statement(run_id, t.round, t.task_id, t.nonce, msg)
                sig = identity.sign(SECAGG, *fields)
            reply = conn.secagg(SecAggRequest(t.task_id, t.round, msg, sig, wait))
            if reply.kind is SecAggReplyKind.WAIT:
                return False
            if reply.kind is SecAggReplyKind.DONE:
                self.done, self.reason = True, reply.reason
                break
            try:
                answer = self.protocol.respond(
                    decode(reply.message, self.config), self.vector
                )
            except SecAggError as exc:
                # An inconsistent coordinator message: this client stops
                # answering (it never answers a phase twice).
                log.warning("secure aggregation stopped: %s", exc)
                self.done, self.reason = True, str(exc)
                break
            self.outgoing = encode(answer)
        return True
