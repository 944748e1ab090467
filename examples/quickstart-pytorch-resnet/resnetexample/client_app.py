"""The ClientApp: Flower's quickstart-pytorch client with ISFedAvg's sampler.

Flower's ``train`` with three changes: the ResNet, the
:class:`~flwr_importance.clientapps.isfedavg.ImportanceSampler` as the
DataLoader's batch sampler (built with the model, so a model ISFedAvg cannot
serve is refused here, at round 1), and the sampler's statistics in the reply.
"""

# Flower's quickstart reads records and configs untyped; its lines are kept.
# mypy: disable-error-code="arg-type, union-attr, index"

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch.utils.data import DataLoader

from flwr_importance.clientapps.isfedavg import ImportanceSampler
from resnetexample.task import Net, load_data
from resnetexample.task import test as test_fn
from resnetexample.task import train as train_fn

app = ClientApp()


def received_model(
    msg: Message, context: Context
) -> tuple[torch.nn.Module, torch.device]:
    """The run's ResNet with the received weights, on the GPU if there is one."""
    model = Net(
        str(context.run_config["norm"]), int(context.run_config["resnet-width"])
    )
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    return model.to(device), device


def node_data(context: Context) -> tuple[DataLoader, DataLoader]:
    """The partition of the node running this app."""
    return load_data(
        int(context.node_config["partition-id"]),
        int(context.node_config["num-partitions"]),
        int(context.run_config["image-size"]),
    )


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train on the batches ISFedAvg draws; reply with its statistics."""
    model, device = received_model(msg, context)
    trainloader, _ = node_data(context)
    trainset = trainloader.dataset
    sampler = ImportanceSampler.from_message(
        msg, context, num_samples=len(trainset), model=model
    )
    trainloader = DataLoader(trainset, batch_sampler=sampler)
    train_loss = train_fn(
        model, trainloader, sampler, msg.content["config"]["lr"], device
    )
    metrics = {
        "train_loss": train_loss,
        **sampler.finish(context),
        "num-examples": len(trainset),
    }
    content = RecordDict(
        {"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)}
    )
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Flower's ``evaluate``: the received model on the local test set."""
    model, device = received_model(msg, context)
    _, testloader = node_data(context)
    loss, accuracy = test_fn(model, testloader, device)
    metrics = {
        "eval_loss": loss,
        "eval_acc": accuracy,
        "num-examples": len(testloader.dataset),
    }
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
