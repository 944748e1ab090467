"""The ClientApp: Flower's quickstart-pytorch client, plus each strategy's lines.

``train`` and ``evaluate`` are Flower's. The strategies of flwr-importance
need a few lines more, each block marked with the strategies it serves; one
app serves them all here (the run config's ``strategy`` says which runs), a
project using one strategy keeps only that strategy's lines. docs/methods.md
shows each strategy's lines as a diff against Flower's version ("Use it").
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch.utils.data import DataLoader, Subset

from flwr_importance.clientapps.fedsampling import (
    fedsampling_gradient,
    fedsampling_reply,
    fedsampling_round,
    private_size_reply,
)
from flwr_importance.clientapps.folb import (
    ProximalTerm,
    folb_reply,
    inexactness,
    local_gradient,
)
from flwr_importance.clientapps.isfedavg import ImportanceSampler
from flwr_importance.clientapps.optimal import (
    KeptUpdateMod,
    add_loss_query,
    add_norm_query,
)
from flwr_importance.clientapps.sizes import size_reply
from flwr_importance.protocol import MODEL_INDEX
from quickstart_pytorch.task import Net, load_data
from quickstart_pytorch.task import test as test_fn
from quickstart_pytorch.task import train as train_fn

app = ClientApp()


def received_model(msg: Message) -> tuple[Net, torch.device]:
    """The global model of the message, on this node's device."""
    model = Net()
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    return model.to(device), device


def node_data(context: Context, task: int = 0) -> tuple[DataLoader, DataLoader]:
    """The node's train and test DataLoaders (of ``task``, for the multi-model run)."""
    return load_data(
        int(context.node_config["partition-id"]),
        int(context.node_config["num-partitions"]),
        int(context.run_config["batch-size"]),
        task,
    )


def num_train_examples(context: Context) -> int:
    """The size of this node's training set."""
    return len(node_data(context)[0].dataset)  # type: ignore[arg-type]


# ocs, aocs, mmfl: every node runs `train` once per round inside query.norm and
# keeps the update; the mod sends it when the node is sampled, without training
# again (plain train messages pass through).
@app.train(mods=[KeptUpdateMod(train_loss_key="train_loss")])
def train(msg: Message, context: Context) -> Message:
    """Train the model on local data."""
    strategy = str(context.run_config["strategy"])
    if strategy == "isfedavg":
        return train_isfedavg(msg, context)
    if strategy == "folb":
        return train_folb(msg, context)
    if strategy == "fedsampling":
        return train_fedsampling(msg, context)

    model, device = received_model(msg)
    config = msg.content.config_records["config"]
    task = int(config.get(MODEL_INDEX, 0))  # type: ignore[arg-type]  # mmfl: which model
    trainloader, _ = node_data(context, task)

    train_loss = train_fn(
        model,
        trainloader,
        int(context.run_config["local-epochs"]),
        float(config["lr"]),  # type: ignore[arg-type]
        device,
    )

    num_examples = len(trainloader.dataset)  # type: ignore[arg-type]
    metrics = MetricRecord({"train_loss": train_loss, "num-examples": num_examples})
    return trained_reply(msg, model, metrics)


def trained_reply(
    msg: Message, model: torch.nn.Module, metrics: MetricRecord
) -> Message:
    """The reply to a train message: the trained model and its metrics."""
    content = RecordDict(
        {"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}
    )
    return Message(content=content, reply_to=msg)


# ocs, aocs, mmfl: answer query.norm by running `train` (above).
add_norm_query(app, train, train_loss_key="train_loss")


def train_isfedavg(msg: Message, context: Context) -> Message:
    """ISFedAvg: batches drawn by importance, the eq. 8 weights on the loss.

    The server decides this node's local steps and batch size: the sampler
    yields exactly those batches, in place of the run config's epochs and
    batch size.
    """
    model, device = received_model(msg)
    trainset = node_data(context)[0].dataset
    sampler = ImportanceSampler.from_message(
        msg,
        context,
        num_samples=len(trainset),  # type: ignore[arg-type]
    )
    trainloader = DataLoader(trainset, batch_sampler=sampler)
    per_sample = torch.nn.CrossEntropyLoss(reduction="none")

    def importance_weighted(
        net: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        sampler.observe(net, images, labels, per_sample)
        return sampler.weighted_loss(per_sample(net(images), labels))

    lr = float(msg.content.config_records["config"]["lr"])  # type: ignore[arg-type]
    train_fn(model, trainloader, 1, lr, device, batch_loss=importance_weighted)

    num_examples = len(trainset)  # type: ignore[arg-type]
    metrics = MetricRecord({**sampler.finish(context), "num-examples": num_examples})
    return trained_reply(msg, model, metrics)


def train_folb(msg: Message, context: Context) -> Message:
    """FOLB: FedProx's proximal term, the local gradient before, gamma after."""
    model, device = received_model(msg)
    trainloader, _ = node_data(context)
    criterion = torch.nn.CrossEntropyLoss()
    gradient = local_gradient(model, trainloader, criterion)  # g_k, before training
    proximal = ProximalTerm(model, msg)  # (mu/2) ||w - w^t||^2, mu from the server

    def with_proximal_term(
        net: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        return criterion(net(images), labels) + proximal(net)

    train_loss = train_fn(
        model,
        trainloader,
        int(context.run_config["local-epochs"]),
        float(msg.content.config_records["config"]["lr"]),  # type: ignore[arg-type]
        device,
        batch_loss=with_proximal_term,
    )
    gamma = inexactness(
        model, trainloader, criterion, gradient=gradient, proximal=proximal
    )
    num_examples = len(trainloader.dataset)  # type: ignore[arg-type]
    metrics = {"train_loss": train_loss, "num-examples": num_examples}
    return folb_reply(msg, model, gradient=gradient, gamma=gamma, metrics=metrics)


def train_fedsampling(msg: Message, context: Context) -> Message:
    """FedSampling: the gradient sum over this round's kept samples, no count.

    The server takes the step (its ``server_lr``), so the optimizer is not
    used; the number of gradient steps is the server's (1 in the paper).
    """
    model, _ = received_model(msg)
    trainset = node_data(context)[0].dataset
    plan = fedsampling_round(msg, num_examples=len(trainset))  # type: ignore[arg-type]
    trainloader = DataLoader(
        Subset(trainset, plan.indices), batch_size=int(context.run_config["batch-size"])
    )
    criterion = torch.nn.CrossEntropyLoss()
    gradient = fedsampling_gradient(model, trainloader, criterion, plan=plan)
    return fedsampling_reply(msg, gradient)  # G_c alone: no num-examples


# clustered, md: the true size; fedsampling: a randomized-response size.
@app.query("sizes")
def sizes(msg: Message, context: Context) -> Message:
    """The node's training-set size, privatized for FedSampling."""
    num_examples = num_train_examples(context)
    if str(context.run_config["strategy"]) == "fedsampling":
        return private_size_reply(msg, num_examples=num_examples)
    return size_reply(msg, num_examples=num_examples)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the model on local data."""
    model, device = received_model(msg)
    _, valloader = node_data(context)

    eval_loss, eval_acc = test_fn(model, valloader, device)

    num_examples = len(valloader.dataset)  # type: ignore[arg-type]
    metrics = MetricRecord(
        {"eval_loss": eval_loss, "eval_acc": eval_acc, "num-examples": num_examples}
    )
    content = RecordDict({"metrics": metrics})
    return Message(content=content, reply_to=msg)


def local_loss(msg: Message, context: Context) -> Message:
    """The received model's loss on this node's training data (no training)."""
    model, device = received_model(msg)
    task = int(msg.content.config_records["config"].get(MODEL_INDEX, 0))  # type: ignore[arg-type]
    trainloader, _ = node_data(context, task)
    loss, _ = test_fn(model, trainloader, device)
    num_examples = len(trainloader.dataset)  # type: ignore[arg-type]
    metrics = MetricRecord({"train_loss": loss, "num-examples": num_examples})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


# Strategies that rank nodes by their local loss (mmfl's loss variant, poc):
# answer query.loss with `local_loss` on each received model.
add_loss_query(app, local_loss, loss_key="train_loss")
