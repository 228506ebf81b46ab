"""Drive a Flower strategy and ClientApps in one process, without a SuperLink.

Flower's ``Message`` constructor reads the task identity a ServerApp process is
given; :func:`flower_identity` sets it. :func:`run_round` does what Flower's
``Strategy.start`` loop does for one training round: ``configure_train``, each
node's ClientApp (with its own persistent ``Context``), ``aggregate_train``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.supercore.task_identity import TaskIdentity

# Message -> reply: a ClientApp, or a function that forges replies.
ClientFn = Callable[[Message, Context], Message]


@contextmanager
def flower_identity() -> Iterator[None]:
    """Run as Flower's ServerApp task (run 1) for the duration."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id = 1
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


class StaticGrid:
    """The part of Flower's Grid a strategy's sampling uses: the node ids."""

    def __init__(self, node_ids: list[int]) -> None:
        self.node_ids = list(node_ids)

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)


def model_arrays(vec: np.ndarray, shapes: Mapping[str, tuple[int, ...]]) -> ArrayRecord:
    """Split a flat float32 vector into named arrays of ``shapes`` (in order)."""
    out, pos = ArrayRecord(), 0
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        out[name] = Array(np.ascontiguousarray(vec[pos : pos + n].reshape(shape)))
        pos += n
    assert pos == vec.size
    return out


def flat(arrays: ArrayRecord) -> np.ndarray:
    """All arrays of a record concatenated, float32."""
    return np.concatenate(
        [a.numpy().astype(np.float32).ravel() for a in arrays.values()]
    )


def shift_app(
    updates: Mapping[int, np.ndarray],
    num_examples: Mapping[int, int],
    mods: list[Any] | None = None,
) -> ClientApp:
    """A ClientApp whose node ``i`` returns ``global + updates[i]``."""
    app = ClientApp(mods=mods or [])

    @app.train()
    def train(msg: Message, ctx: Context) -> Message:
        node = msg.metadata.dst_node_id
        arrays = next(iter(msg.content.array_records.values()))
        shapes = {k: tuple(a.shape) for k, a in arrays.items()}
        new = flat(arrays) + updates[node].astype(np.float32)
        content = RecordDict(
            {
                "arrays": model_arrays(new, shapes),
                "metrics": MetricRecord(
                    {"num-examples": num_examples[node], "train_loss": 0.5}
                ),
            }
        )
        return Message(content, reply_to=msg)

    return app


def contexts(node_ids: list[int]) -> dict[int, Context]:
    """One persistent Context per node (what a SuperNode keeps across rounds)."""
    return {
        n: Context(
            run_id=1, node_id=n, node_config={}, state=RecordDict(), run_config={}
        )
        for n in node_ids
    }


def run_round(
    strategy: Strategy,
    server_round: int,
    arrays: ArrayRecord,
    client: ClientFn,
    ctxs: Mapping[int, Context],
    *,
    extra_replies: list[Callable[[list[Message]], Message]] | None = None,
) -> tuple[ArrayRecord | None, MetricRecord | None]:
    """One training round: configure, run ``client`` on every message, aggregate.

    ``extra_replies`` forge further replies from the round's messages (for
    rejection tests).
    """
    random.seed(server_round)  # Flower samples nodes with the random module
    grid = cast(Grid, StaticGrid(sorted(ctxs)))
    messages = list(
        strategy.configure_train(server_round, arrays, ConfigRecord(), grid)
    )
    replies = [client(m, ctxs[m.metadata.dst_node_id]) for m in messages]
    for forge in extra_replies or []:
        replies.append(forge(messages))
    return strategy.aggregate_train(server_round, replies)
