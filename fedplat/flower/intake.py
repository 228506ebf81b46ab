"""Check and decode the training replies of one round, one by one.

Flower's own strategies validate the replies as a group and give up the whole
round on one inconsistent reply (``InconsistentMessageReplies``). Here every
reply is hostile on its own: a reply from a node that was not sampled this
round, a second reply from one node, an error reply, a missing or absurd
example count, arrays that do not match the model, a bad payload or non-finite
values each reject that reply only, with the reason, and the round goes on with
the others.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord, Message, RecordDict

from fedplat.compression import Compressor
from fedplat.flower.records import RecordError, arrays_to_vector, payload_bytes
from fedplat.flower.report import Rejection
from fedplat.flower.uplink import UplinkError, UplinkSpec, decode_update
from fedplat.vectors import Layout, all_finite

__all__ = ["Accepted", "Intake", "RoundInput", "take_replies"]

# Error reasons come from a client: keep what is logged short.
_MAX_REASON = 200


@dataclass(frozen=True)
class RoundInput:
    """What ``configure_train`` sent: the round, the global model and its layout
    (``global_vec`` ``[d]`` float32), and the nodes that were asked."""

    server_round: int
    layout: Layout
    global_vec: torch.Tensor
    template: ArrayRecord
    node_ids: frozenset[int]


@dataclass(frozen=True)
class Accepted:
    """One usable reply: its example count, bytes on the wire and content (for
    the clients' own metrics); its update is its row of :attr:`Intake.stack`."""

    node_id: int
    num_examples: float
    nbytes: int
    content: RecordDict


@dataclass(frozen=True)
class Intake:
    """The accepted replies in ascending node id order, their updates as the
    rows of ``stack`` ``[n_accepted, d]`` (``new - global``), and the rejected."""

    accepted: list[Accepted]
    stack: torch.Tensor
    rejected: list[Rejection]


def _num_examples(content: RecordDict, key: str, limit: float) -> float:
    records = content.metric_records
    if len(records) != 1:
        raise UplinkError(f"expected one MetricRecord, found {len(records)}")
    metrics = next(iter(records.values()))
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UplinkError(f"metric {key!r} must be a number, got {value!r}")
    if not (math.isfinite(value) and 0 < value <= limit):
        raise UplinkError(f"metric {key!r} = {value} is not in (0, {limit:g}]")
    return float(value)


def _decode_into(
    row: torch.Tensor,
    arrays: ArrayRecord,
    sent: RoundInput,
    spec: UplinkSpec,
    compressor: Compressor,
) -> int:
    """Write the reply's update into ``row`` ``[d]``; return its bytes on the wire."""
    data = payload_bytes(arrays)
    if data is not None:
        d = sent.layout.numel
        row.copy_(decode_update(spec, compressor, data, d=d, round=sent.server_round))
        nbytes = len(data)
    else:
        # A plain Flower client (no uplink_mod) returns its new model.
        arrays_to_vector(arrays, sent.layout, out=row, minus=sent.global_vec)
        nbytes = sum(len(a.data) for a in arrays.values())
    if not all_finite(row):
        raise UplinkError("the update holds non-finite values")
    return nbytes


def _accept(
    msg: Message,
    row: torch.Tensor,
    sent: RoundInput,
    spec: UplinkSpec,
    compressor: Compressor,
    weighted_by_key: str,
    max_num_examples: float,
) -> Accepted:
    if msg.has_error():
        reason = str(msg.error.reason)[:_MAX_REASON]
        raise UplinkError(f"client error {msg.error.code}: {reason}")
    content = msg.content
    records = content.array_records  # a view Flower rebuilds on every access
    if len(records) != 1:
        raise UplinkError(f"expected one ArrayRecord, found {len(records)}")
    n = _num_examples(content, weighted_by_key, max_num_examples)
    arrays = next(iter(records.values()))
    nbytes = _decode_into(row, arrays, sent, spec, compressor)
    return Accepted(msg.metadata.src_node_id, n, nbytes, content)


def take_replies(
    replies: Iterable[Message],
    sent: RoundInput,
    spec: UplinkSpec,
    compressor: Compressor,
    *,
    weighted_by_key: str,
    max_num_examples: float,
) -> Intake:
    """Accept or reject each reply, decoding straight into the round's stack.

    Rows follow ascending node id: Flower hands replies over in arrival order,
    and a fixed order makes rules that break ties by position reproducible.
    """
    rejected: list[Rejection] = []
    first: dict[int, Message] = {}
    for msg in replies:
        node = int(msg.metadata.src_node_id)
        if node not in sent.node_ids:
            rejected.append(Rejection(node, "node was not sampled this round"))
        elif node in first:
            rejected.append(Rejection(node, "second reply from this node"))
        else:
            first[node] = msg
    rows = torch.empty(len(first), sent.layout.numel, dtype=torch.float32)
    accepted: list[Accepted] = []
    for node in sorted(first):
        row = rows[len(accepted)]
        try:
            accepted.append(
                _accept(
                    first[node],
                    row,
                    sent,
                    spec,
                    compressor,
                    weighted_by_key,
                    max_num_examples,
                )
            )
        except (UplinkError, RecordError) as exc:
            rejected.append(Rejection(node, str(exc)))
    return Intake(accepted, rows[: len(accepted)], rejected)
