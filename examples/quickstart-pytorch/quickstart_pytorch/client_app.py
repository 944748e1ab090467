"""The ClientApp: Flower's quickstart-pytorch client, and each method's version of it.

``train`` and ``evaluate`` are Flower's. Each method of flwr-importance needs
a few lines more on the client: its ``<method>_app()`` below is Flower's app
with those lines (marked as the method's snippet region), and its train
function, where the method changes training, is Flower's with the changed
lines marked. A project using one method writes only that method's lines.

One ``flwr run`` of this example may run several methods one after another
(the run config's ``strategy``, comma-separated): the ``app`` Flower runs
hands each message to the ClientApp of the method the server is running.
"""

# Flower's quickstart reads records, configs and datasets untyped (a record's
# item is any record type, a config value any config type, a Dataset has no
# declared length); its lines are kept as they are.
# mypy: disable-error-code="arg-type, union-attr, index"

from __future__ import annotations

from collections.abc import Callable
from logging import INFO

import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.common.logger import log
from torch.utils.data import DataLoader, Subset

from flwr_importance import protocol
from flwr_importance.clientapps.fedsampling import (
    add_private_size_query,
    fedsampling_gradient,
    fedsampling_reply,
    fedsampling_round,
)
from flwr_importance.clientapps.folb import (
    ProximalTerm,
    folb_reply,
    inexactness,
    local_gradient,
)
from flwr_importance.clientapps.isfedavg import ImportanceSampler
from flwr_importance.clientapps.loss import add_loss_query
from flwr_importance.clientapps.sizes import add_size_query
from flwr_importance.clientapps.variance_reduced import (
    KeptUpdateMod,
    add_norm_query,
)
from quickstart_pytorch.task import Net, load_data, unpack
from quickstart_pytorch.task import test as test_fn
from quickstart_pytorch.task import train as train_fn
from quickstart_pytorch.task import train_isfedavg as train_isfedavg_fn

#: The message the server sends every node before it starts a method, when
#: the run has several (config ``method``); a message type of its own, so
#: no method's handlers see it.
METHOD_QUERY = "method"
#: ``context.state`` record naming the method this node serves now.
METHOD_STATE_KEY = "quickstart-method"


# -- Flower's ClientApp (FedAvg) ------------------------------------------------
def received_model(msg: Message) -> tuple[Net, torch.device]:
    """Load the model and initialize it with the received weights."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)
    return model, device


def node_data(context: Context, task: int = 0) -> tuple[DataLoader, DataLoader]:
    """Load this node's data (of ``task``, for MMFL's second model)."""
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    return load_data(partition_id, num_partitions, batch_size, task=task)


def num_train_examples(context: Context) -> int:
    """The size of this node's training set."""
    trainloader, _ = node_data(context)
    return len(trainloader.dataset)


def trained_reply(
    msg: Message, model: torch.nn.Module, metrics: dict[str, float]
) -> Message:
    """Construct and return the reply Message: the trained model and its metrics."""
    model_record = ArrayRecord(model.state_dict())
    metric_record = MetricRecord(metrics)
    content = RecordDict({"arrays": model_record, "metrics": metric_record})
    return Message(content=content, reply_to=msg)


def train(msg: Message, context: Context) -> Message:
    """Train the model on local data."""
    model, device = received_model(msg)
    trainloader, _ = node_data(context)
    train_loss = train_fn(
        model,
        trainloader,
        context.run_config["local-epochs"],
        msg.content["config"]["lr"],
        device,
    )
    metrics = {"train_loss": train_loss, "num-examples": len(trainloader.dataset)}
    return trained_reply(msg, model, metrics)


def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the model on local data."""
    model, device = received_model(msg)
    _, valloader = node_data(context)
    eval_loss, eval_acc = test_fn(model, valloader, device)
    metric_record = MetricRecord(
        {
            "eval_loss": eval_loss,
            "eval_acc": eval_acc,
            "num-examples": len(valloader.dataset),
        }
    )
    content = RecordDict({"metrics": metric_record})
    return Message(content=content, reply_to=msg)


def fedavg_app() -> ClientApp:
    """Flower's quickstart ClientApp: ``@app.train()`` and ``@app.evaluate()``."""
    app = ClientApp()
    app.train()(train)
    app.evaluate()(evaluate)
    return app


# -- the methods that keep Flower's train function ------------------------------
def sizes_app() -> ClientApp:
    """MD and clustered sampling (both algorithms): Flower's app and the size query."""
    app = fedavg_app()
    # --8<-- [start:md-client,clustered-client,power-of-choice-client]
    add_size_query(app, num_examples=num_train_examples)
    # --8<-- [end:md-client,clustered-client,power-of-choice-client]
    return app


def power_of_choice_app() -> ClientApp:
    """Power-of-Choice: the size query and the loss query on Flower's ``evaluate``."""
    app = sizes_app()
    # --8<-- [start:power-of-choice-client]
    add_loss_query(app, evaluate, loss_key="eval_loss")
    # --8<-- [end:power-of-choice-client]
    return app


def ocs_app() -> ClientApp:
    """OCS and AOCS: Flower's ``train`` behind the kept-update mod, the norm query.

    AOCS differs from OCS only in the server's solver.
    """
    app = ClientApp()
    # --8<-- [start:ocs-client,aocs-client]
    app.train(mods=[KeptUpdateMod(train_loss_key="train_loss")])(train)
    add_norm_query(app, train, train_loss_key="train_loss")
    # --8<-- [end:ocs-client,aocs-client]
    app.evaluate()(evaluate)
    return app


def train_mmfl(msg: Message, context: Context) -> Message:
    """Flower's ``train`` on the data of the model the server sent (MMFL)."""
    model, device = received_model(msg)
    # --8<-- [start:mmfl-client]
    task = msg.content["config"]["model-index"]  # which model, so which task
    trainloader, _ = node_data(context, task)
    # --8<-- [end:mmfl-client]
    train_loss = train_fn(
        model,
        trainloader,
        context.run_config["local-epochs"],
        msg.content["config"]["lr"],
        device,
    )
    metrics = {"train_loss": train_loss, "num-examples": len(trainloader.dataset)}
    return trained_reply(msg, model, metrics)


def mmfl_app() -> ClientApp:
    """MMFL: ``train_mmfl`` behind the kept-update mod, and the norm query.

    No federated evaluation: the server evaluates each model centrally.
    """
    app = ClientApp()
    # --8<-- [start:mmfl-client]
    app.train(mods=[KeptUpdateMod(train_loss_key="train_loss")])(train_mmfl)
    add_norm_query(app, train_mmfl, train_loss_key="train_loss")
    # --8<-- [end:mmfl-client]
    return app


# -- the methods that change training --------------------------------------------
def train_isfedavg(msg: Message, context: Context) -> Message:
    """Flower's ``train`` on the batches ISFedAvg draws (``task.train_isfedavg``)."""
    model, device = received_model(msg)
    trainloader, _ = node_data(context)
    # --8<-- [start:isfedavg-client]
    trainset = trainloader.dataset
    sampler = ImportanceSampler.from_message(msg, context, num_samples=len(trainset))
    trainloader = DataLoader(trainset, batch_sampler=sampler)
    lr = msg.content["config"]["lr"]
    train_loss = train_isfedavg_fn(model, trainloader, sampler, lr, device)
    metrics = {
        "train_loss": train_loss,
        **sampler.finish(context),
        "num-examples": len(trainset),
    }
    # --8<-- [end:isfedavg-client]
    return trained_reply(msg, model, metrics)


def isfedavg_app() -> ClientApp:
    """ISFedAvg: ``train_isfedavg`` in place of Flower's ``train``."""
    app = ClientApp()
    # --8<-- [start:isfedavg-client]
    app.train()(train_isfedavg)
    # --8<-- [end:isfedavg-client]
    app.evaluate()(evaluate)
    return app


def train_folb(msg: Message, context: Context) -> Message:
    """Flower's ``train`` with FOLB's gradient, proximal term and inexactness."""
    model, device = received_model(msg)
    trainloader, _ = node_data(context)
    # --8<-- [start:folb-client]
    criterion = torch.nn.CrossEntropyLoss()
    gradient = local_gradient(model, trainloader, criterion, unpack=unpack)
    proximal = ProximalTerm(model, msg)  # mu from the server
    # --8<-- [end:folb-client]
    train_loss = train_fn(
        model,
        trainloader,
        context.run_config["local-epochs"],
        msg.content["config"]["lr"],
        device,
        # --8<-- [start:folb-client]
        proximal=proximal,
        # --8<-- [end:folb-client]
    )
    metrics = {"train_loss": train_loss, "num-examples": len(trainloader.dataset)}
    # --8<-- [start:folb-client]
    gamma = inexactness(
        model,
        trainloader,
        criterion,
        gradient=gradient,
        proximal=proximal,
        unpack=unpack,
    )
    return folb_reply(msg, model, gradient=gradient, gamma=gamma, metrics=metrics)
    # --8<-- [end:folb-client]


def folb_app() -> ClientApp:
    """FOLB: ``train_folb`` in place of Flower's ``train``."""
    app = ClientApp()
    # --8<-- [start:folb-client]
    app.train()(train_folb)
    # --8<-- [end:folb-client]
    app.evaluate()(evaluate)
    return app


def train_fedsampling(msg: Message, context: Context) -> Message:
    """FedSampling: the gradient over this round's kept samples; the server steps."""
    model, _ = received_model(msg)
    trainloader, _ = node_data(context)
    log(INFO, "quickstart-pytorch train_fedsampling: gradient of the kept samples")
    # --8<-- [start:fedsampling-client]
    trainset = trainloader.dataset
    plan = fedsampling_round(msg, num_examples=len(trainset))
    kept = DataLoader(Subset(trainset, plan.indices), batch_size=trainloader.batch_size)
    criterion = torch.nn.CrossEntropyLoss()
    gradient = fedsampling_gradient(model, kept, criterion, plan=plan, unpack=unpack)
    return fedsampling_reply(msg, gradient)  # G_c alone: no num-examples
    # --8<-- [end:fedsampling-client]


def fedsampling_app() -> ClientApp:
    """FedSampling: the private size query and ``train_fedsampling``.

    No ``@app.evaluate()``: evaluation replies carry ``num-examples``, the size
    this method keeps private; the server evaluates centrally.
    """
    app = ClientApp()
    # --8<-- [start:fedsampling-client]
    add_private_size_query(app, num_examples=num_train_examples)
    app.train()(train_fedsampling)
    # --8<-- [end:fedsampling-client]
    return app


#: Each method's ClientApp, by the name the run config's ``strategy`` uses.
METHOD_APPS: dict[str, Callable[[], ClientApp]] = {
    "fedavg": fedavg_app,
    "md": sizes_app,
    "clustered": sizes_app,
    "clustered-size": sizes_app,
    "power-of-choice": power_of_choice_app,
    "ocs": ocs_app,
    "aocs": ocs_app,
    "mmfl": mmfl_app,
    "isfedavg": isfedavg_app,
    "folb": folb_app,
    "fedsampling": fedsampling_app,
}
_APPS = {name: make_app() for name, make_app in METHOD_APPS.items()}


# -- the app Flower runs: one method, or several one after another ---------------
def current_method(context: Context) -> str:
    """The method this node serves: the last one the server named, else the run's."""
    record = context.state.config_records.get(METHOD_STATE_KEY)
    if record is not None:
        return str(record["method"])
    method = str(context.run_config["strategy"])
    if method not in _APPS:
        raise ValueError(
            f"strategy '{method}' names no method (known: {sorted(_APPS)}); a run "
            f"of several methods names each with a {METHOD_QUERY} query first"
        )
    return method


def to_current_method(msg: Message, context: Context) -> Message:
    """Hand ``msg`` to the ClientApp of the method the server is running."""
    return _APPS[current_method(context)](msg, context)


def start_method(msg: Message, context: Context) -> Message:
    """Serve the method the server names next, from a fresh node state.

    The node state of the previous method (OCS's kept updates, ISFedAvg's
    sample probabilities) is dropped, so each method starts as in a run of
    its own.
    """
    method = str(msg.content["config"]["method"])
    if method not in _APPS:
        raise ValueError(f"unknown method '{method}' (known: {sorted(_APPS)})")
    for key in list(context.state):
        del context.state[key]
    context.state[METHOD_STATE_KEY] = ConfigRecord({"method": method})
    return Message(RecordDict(), reply_to=msg)


app = ClientApp()
app.train()(to_current_method)
app.evaluate()(to_current_method)
for action in (protocol.SIZES_QUERY, protocol.NORM_QUERY, protocol.LOSS_QUERY):
    app.query(action)(to_current_method)
app.query(METHOD_QUERY)(start_method)
