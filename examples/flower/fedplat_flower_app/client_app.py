"""The ClientApp: trains the received model on this node's data.

``uplink_mod`` turns the reply's model into the round update and encodes it as
the strategy asks (DGC by default: sparse values + indices, with the momentum
and residual kept in the node's context between rounds).
"""

from __future__ import annotations

import torch
from fedplat_flower_app.task import build_model, load_arrays, local_data, train_local
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedplat.flower import uplink_mod

# A simulation gives each ClientApp one CPU; torch must not oversubscribe it.
torch.set_num_threads(1)

app = ClientApp(mods=[uplink_mod])


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = context.run_config
    node = context.node_config
    partition_id = int(node["partition-id"])
    seed = int(cfg["seed"])
    model = build_model(seed)
    load_arrays(model, msg.content["arrays"])
    data = local_data(
        partition_id, int(node["num-partitions"]), float(cfg["alpha"]), seed
    )
    result = train_local(
        model,
        data,
        server_round=int(msg.content["config"]["server-round"]),
        partition_id=partition_id,
        seed=seed,
        epochs=int(cfg["local-epochs"]),
        batch_size=int(cfg["batch-size"]),
        lr=float(cfg["lr"]),
        max_steps=int(cfg["max-steps"]),
    )
    content = RecordDict(
        {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord(
                {"train_loss": result.mean_loss, "num-examples": result.num_examples}
            ),
        }
    )
    return Message(content, reply_to=msg)
