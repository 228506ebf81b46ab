"""Flower client mods that compress (and locally noise) the outgoing update.

:func:`uplink_mod` wraps a ClientApp's ``train`` handler: it remembers the
global model that arrived, lets the app train, turns the reply's model into the
round update ``new - global`` (a flat float32 vector, :mod:`fedplat.vectors`),
encodes it as the strategy asked (:mod:`fedplat.flower.uplink`: DGC, top-k with
error feedback, count-sketch, with or without local DP noise) and replaces the
reply's ArrayRecord with the payload bytes (:func:`~fedplat.flower.records.
payload_record`). The compressor's memory (error-feedback residual, DGC
momentum and velocity) lives in the node's ``Context.state``, which Flower keeps
across rounds on the simulation and the deployment engine alike.

Usage::

    from fedplat.flower import uplink_mod
    app = ClientApp(mods=[uplink_mod])

A training message without the strategy's uplink spec (another strategy) passes
through untouched.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MessageType,
)
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.constant import ErrorCode

from fedplat.compression import Compressor, StateDict
from fedplat.flower.records import (
    arrays_to_vector,
    layout_of_arrays,
    payload_record,
)
from fedplat.flower.uplink import CONFIG_KEY, UplinkError, UplinkSpec, encode_update
from fedplat.privacy import make_noise_generator, secure_seed

__all__ = ["uplink_mod"]

log = logging.getLogger("fedplat.flower")

_STATE_PREFIX = "fedplat.compressor."


def _error(msg: Message, reason: str) -> Message:
    log.error("uplink_mod: %s", reason)
    return Message(
        Error(code=ErrorCode.MOD_FAILED_PRECONDITION, reason=f"uplink_mod: {reason}"),
        reply_to=msg,
    )


def _only(record: dict[str, object], what: str) -> tuple[str, object]:
    if len(record) != 1:
        raise UplinkError(f"expected exactly one {what}, found {len(record)}")
    return next(iter(record.items()))


def load_compressor(ctx: Context, spec: UplinkSpec, comp: Compressor) -> None:
    """Restore ``comp``'s state saved under ``spec`` in the node's state, if any."""
    key = _STATE_PREFIX + spec.key
    state: StateDict = {}
    tensors = ctx.state.array_records.get(key + ".tensors")
    if tensors is not None:
        for k, a in tensors.items():
            state[k] = torch.from_numpy(a.numpy().copy())
    scalars = ctx.state.config_records.get(key + ".scalars")
    if scalars is not None:
        for k, v in scalars.items():
            if not isinstance(v, int | float | str | bool):
                raise UplinkError(f"compressor state {k!r} has type {type(v)}")
            state[k] = v
    if state:
        comp.load_state_dict(state)


def save_compressor(ctx: Context, spec: UplinkSpec, comp: Compressor) -> None:
    """Keep ``comp``'s state in the node's state for the next round."""
    key = _STATE_PREFIX + spec.key
    tensors = ArrayRecord()
    scalars = ConfigRecord()
    for k, v in comp.state_dict().items():
        if isinstance(v, torch.Tensor):
            tensors[k] = Array(np.ascontiguousarray(v.detach().numpy()))
        else:
            scalars[k] = v
    ctx.state[key + ".tensors"] = tensors
    ctx.state[key + ".scalars"] = scalars


def uplink_mod(msg: Message, ctx: Context, call_next: ClientAppCallable) -> Message:
    """Encode the reply of a training message as the strategy's uplink spec asks.

    Errors (a spec this client cannot use, a reply whose arrays do not match the
    model it was sent) become an error reply with the reason, never a
    traceback in the app.
    """
    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, ctx)
    configs = msg.content.config_records
    cfg = next((c for c in configs.values() if CONFIG_KEY in c), None)
    if cfg is None:
        return call_next(msg, ctx)
    try:
        spec = UplinkSpec.from_config(cfg[CONFIG_KEY])
        server_round = cfg.get("server-round")
        if isinstance(server_round, bool) or not isinstance(server_round, int):
            raise UplinkError(f"server-round must be an int, got {server_round!r}")
        _, sent = _only(dict(msg.content.array_records), "ArrayRecord in the message")
        assert isinstance(sent, ArrayRecord)
        layout = layout_of_arrays(sent)
        before = arrays_to_vector(sent, layout)
        # Before training: a spec this client cannot use costs no local work.
        comp = spec.compressor(layout)
        load_compressor(ctx, spec, comp)
    except ValueError as exc:  # UplinkError, RecordError, CompressionError, ...
        return _error(msg, str(exc))
    reply = call_next(msg, ctx)
    if reply.has_error():
        return reply
    try:
        key, arrays = _only(
            dict(reply.content.array_records), "ArrayRecord in the reply"
        )
        assert isinstance(arrays, ArrayRecord)
        update = arrays_to_vector(arrays, layout) - before
        data = encode_update(
            spec,
            comp,
            update,
            round=server_round,
            noise=make_noise_generator(secure_seed()),
        )
        save_compressor(ctx, spec, comp)
    except ValueError as exc:  # UplinkError, RecordError, CompressionError, ...
        return _error(msg, str(exc))
    reply.content[key] = payload_record(data)
    return reply
