"""The ClientApp: no training; returns the received arrays shifted by
``1e-3 * (partition-id + 1)`` (a distinct reply per SuperNode)."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    shift = np.float32(1e-3 * (int(context.node_config["partition-id"]) + 1))
    arrays = msg.content["arrays"]
    assert isinstance(arrays, ArrayRecord)
    new = ArrayRecord([a.numpy() + shift for a in arrays.values()])
    content = RecordDict({"arrays": new, "metrics": MetricRecord({"num-examples": 10})})
    return Message(content, reply_to=msg)
