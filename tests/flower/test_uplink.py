"""The uplink contract: the spec, uplink_mod on the client, decoding on the server."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import ErrorCode

from fedplat.compression import Payload
from fedplat.flower import UplinkError, UplinkSpec, uplink_mod
from fedplat.flower.records import payload_bytes
from fedplat.flower.uplink import CONFIG_KEY, decode_update
from fedplat.vectors import Layout, TensorSpec
from tests.support.flower import contexts, flower_identity, model_arrays

SHAPES = {"w": (2, 2)}
LAYOUT = Layout((TensorSpec("w", (2, 2)),))


@pytest.fixture(autouse=True)
def _identity() -> object:
    with flower_identity():
        yield


def _train_msg(
    spec: UplinkSpec | None, server_round: int, global_vec: np.ndarray
) -> Message:
    config = ConfigRecord({"server-round": server_round})
    if spec is not None:
        config[CONFIG_KEY] = spec.to_config()
    arrays = model_arrays(global_vec.astype(np.float32), SHAPES)
    content = RecordDict({"arrays": arrays, "config": config})
    return Message(content, dst_node_id=5, message_type=MessageType.TRAIN)


def _adds(update: np.ndarray, arrays_key: str = "arrays") -> object:
    """call_next of a ClientApp that returns ``global + update``."""

    def call_next(msg: Message, ctx: Context) -> Message:
        sent = msg.content["arrays"]
        new = np.concatenate([a.numpy().ravel() for a in sent.values()]) + update
        content = RecordDict(
            {
                arrays_key: model_arrays(new.astype(np.float32), SHAPES),
                "metrics": MetricRecord({"num-examples": 3}),
            }
        )
        return Message(content, reply_to=msg)

    return call_next


def test_spec_refuses_what_the_flower_strategy_cannot_do() -> None:
    with pytest.raises(UplinkError, match="'central' is not supported"):
        UplinkSpec.parse({"privacy": {"mode": "central", "noise_multiplier": 1.0}})
    with pytest.raises(UplinkError, match=r"needs privacy\.noise_multiplier"):
        UplinkSpec.parse({"privacy": {"mode": "local", "epsilon": 1.0}})
    with pytest.raises(UplinkError, match="compressoin"):
        UplinkSpec.parse({"compressoin": {"name": "dgc"}})
    with pytest.raises(UplinkError, match="JSON string under 64 KiB"):
        UplinkSpec.from_config("x" * 70_000)
    with pytest.raises(UplinkError, match="bad uplink spec"):
        UplinkSpec.from_config('{"seed": -1}')
    with pytest.raises(UplinkError, match=r"compression: .*nosuch"):
        UplinkSpec.parse({"compression": {"name": "nosuch"}}).compressor(LAYOUT)


def test_spec_round_trips_through_the_config_record() -> None:
    spec = UplinkSpec.parse(
        {
            "compression": {"name": "countsketch", "params": {"rows": 3, "cols": 8}},
            "privacy": {"mode": "local", "clip_norm": 2.0, "noise_multiplier": 0.7},
            "seed": 99,
        }
    )
    again = UplinkSpec.from_config(spec.to_config())
    assert again == spec and again.key == spec.key
    assert not spec.is_dense and UplinkSpec().is_dense


def test_mod_leaves_messages_of_other_strategies_alone() -> None:
    ctx = contexts([5])[5]
    reply = uplink_mod(_train_msg(None, 1, np.zeros(4)), ctx, _adds(np.ones(4)))
    assert reply.content["arrays"]["w"].numpy().tolist() == [[1, 1], [1, 1]]
    assert len(ctx.state) == 0


def test_topk_error_feedback_is_kept_in_the_node_state_across_rounds() -> None:
    spec = UplinkSpec.parse({"compression": {"name": "topk", "params": {"k": 1}}})
    ctx = contexts([5])[5]
    comp = spec.compressor(LAYOUT)
    update = np.array([4.0, 3.0, 2.0, 1.0], dtype=np.float32)
    sent = []
    for r in (1, 2):
        reply = uplink_mod(_train_msg(spec, r, np.zeros(4)), ctx, _adds(update))
        data = payload_bytes(reply.content["arrays"])
        assert data is not None
        sent.append(decode_update(spec, comp, data, d=4, round=r).tolist())
    # Round 1 sends the largest entry; round 2 sends residual + update's largest
    # (3 + 3 = 6), which only a restored residual can produce.
    assert sent == [[4, 0, 0, 0], [0, 6, 0, 0]]


def test_dgc_payload_is_sparse_and_smaller_than_the_model() -> None:
    spec = UplinkSpec.parse(
        {
            "compression": {
                "name": "dgc",
                "params": {"ratio": 0.01, "warmup_densities": []},
            }
        }
    )
    shapes = {"w": (50, 40), "b": (40,)}
    ctx = contexts([5])[5]
    g = model_arrays(np.zeros(2040, dtype=np.float32), shapes)
    msg = Message(
        RecordDict(
            {
                "arrays": g,
                "config": ConfigRecord(
                    {"server-round": 1, CONFIG_KEY: spec.to_config()}
                ),
            }
        ),
        dst_node_id=5,
        message_type=MessageType.TRAIN,
    )

    def call_next(m: Message, c: Context) -> Message:
        new = np.random.default_rng(0).normal(size=2040).astype(np.float32)
        return Message(
            RecordDict(
                {
                    "arrays": model_arrays(new, shapes),
                    "metrics": MetricRecord({"num-examples": 1}),
                }
            ),
            reply_to=m,
        )

    reply = uplink_mod(msg, ctx, call_next)
    data = payload_bytes(reply.content["arrays"])
    assert data is not None
    payload = Payload.from_bytes(data, expected_d=2040)
    # The 2-D weight is sparsified to 1%; the bias travels densely (Lin et al. 2018).
    assert payload.kind == "sparse" and payload.indices is not None
    assert payload.indices.numel() == 20 + 40
    assert len(data) < 2040 * 4 / 5


def test_local_dp_noises_the_sketch_and_the_strategy_decodes_it() -> None:
    spec = UplinkSpec.parse(
        {
            "compression": {"name": "countsketch", "params": {"rows": 1, "cols": 4}},
            "privacy": {"mode": "local", "clip_norm": 100.0, "noise_multiplier": 1.0},
            "seed": 3,
        }
    )
    comp = spec.compressor(LAYOUT)
    update = np.array([1.0, -2.0, 3.0, 0.5], dtype=np.float32)
    decoded = []
    for node in (5, 6):
        ctx = contexts([node])[node]
        reply = uplink_mod(_train_msg(spec, 2, np.zeros(4)), ctx, _adds(update))
        data = payload_bytes(reply.content["arrays"])
        assert data is not None
        decoded.append(decode_update(spec, comp, data, d=4, round=2))
    exact = comp.decode(comp.encode(torch.from_numpy(update), round=2, seed=3))
    # Same update, same sketch: only the clients' own Gaussian noise differs
    # (sigma = 1 * 100 per sketch bucket).
    assert not torch.allclose(decoded[0], decoded[1])
    assert not torch.allclose(decoded[0], exact)
    with pytest.raises(UplinkError, match="sketch round 2, expected 3"):
        decode_update(spec, comp, data, d=4, round=3)


def test_mod_answers_a_bad_spec_or_a_mismatched_reply_with_an_error() -> None:
    ctx = contexts([5])[5]
    msg = _train_msg(None, 1, np.zeros(4))
    msg.content["config"][CONFIG_KEY] = '{"compression": {"name": "nosuch"}}'
    reply = uplink_mod(msg, ctx, _adds(np.ones(4)))
    assert reply.has_error()
    assert reply.error.code == ErrorCode.MOD_FAILED_PRECONDITION
    assert "nosuch" in str(reply.error.reason)

    spec = UplinkSpec.parse({"compression": {"name": "topk", "params": {"k": 1}}})

    def wrong_model(m: Message, c: Context) -> Message:
        arrays = ArrayRecord({"v": model_arrays(np.zeros(4, np.float32), SHAPES)["w"]})
        content = RecordDict(
            {"arrays": arrays, "metrics": MetricRecord({"num-examples": 1})}
        )
        return Message(content, reply_to=m)

    reply = uplink_mod(_train_msg(spec, 1, np.zeros(4)), ctx, wrong_model)
    assert reply.has_error() and "unexpected arrays" in str(reply.error.reason)
