"""The ClientApp: load the node's partition, train, reply with the model."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch.utils.data import DataLoader

from plain_fedavg.task import Net, load_arrays
from plain_fedavg.task import train as train_fn

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model on this node's partition."""
    model = Net()
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    partition_id = int(context.node_config["partition-id"])
    dataset = load_arrays(
        str(context.run_config["data-dir"]), f"partition-{partition_id}"
    )
    loader = DataLoader(
        dataset, batch_size=int(context.run_config["batch-size"]), shuffle=True
    )
    server_round = int(msg.content.config_records["config"]["server-round"])  # type: ignore[arg-type]
    train_loss = train_fn(
        model,
        loader,
        int(context.run_config["local-steps"]),
        float(msg.content.config_records["config"]["lr"]),  # type: ignore[arg-type]
        seed=int(context.run_config["seed"]) * 1000 + server_round * 100 + partition_id,
    )
    metrics = MetricRecord({"train_loss": train_loss, "num-examples": len(dataset)})
    content = RecordDict(
        {"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}
    )
    return Message(content=content, reply_to=msg)
