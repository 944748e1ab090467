"""The ClientApp: Flower's quickstart-pytorch client, and each method's version of it.

``train`` and ``evaluate`` are Flower's. Each method of flwr-importance needs
a few lines more on the client, marked as the method's snippet region:
docs/methods.md shows them as a diff against Flower's app (its imports, the
functions it adds, and the registrations that ``<method>_app()`` below makes
on its own ``ClientApp``, where Flower's app has one module-level ``app``). A
project using one method writes only that method's lines.

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
from functools import wraps
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

from flwr_importance import protocol
from pytorchexample.task import Net, load_data
from pytorchexample.task import test as test_fn
from pytorchexample.task import train as train_fn

# Each method's imports: the lines its "Use it" diff adds.
# isort: off
# --8<-- [start:sizes-query-client]
from flwr_importance.clientapps.sizes import add_size_query

# --8<-- [end:sizes-query-client]
# --8<-- [start:loss-query-client]
from flwr_importance.clientapps.loss import add_loss_query

# --8<-- [end:loss-query-client]
# --8<-- [start:ocs-client,aocs-client,mmfl-client]
from flwr_importance.clientapps.variance_reduced import KeptUpdateMod, add_norm_query

# --8<-- [end:ocs-client,aocs-client,mmfl-client]
# --8<-- [start:isfedavg-client]
from flwr_importance.clientapps.isfedavg import ImportanceSampler
from pytorchexample.task import train_isfedavg as train_isfedavg_fn

# --8<-- [end:isfedavg-client]
# --8<-- [start:isfedavg-client,fedsampling-client]
from torch.utils.data import DataLoader

# --8<-- [end:isfedavg-client,fedsampling-client]
# --8<-- [start:fedsampling-client]
from torch.utils.data import Subset
from flwr_importance.clientapps.fedsampling import (
    add_private_size_query,
    fedsampling_gradient,
    fedsampling_reply,
    fedsampling_round,
)

# --8<-- [end:fedsampling-client]
# --8<-- [start:fedsampling-client,folb-client]
from pytorchexample.task import unpack

# --8<-- [end:fedsampling-client,folb-client]
# --8<-- [start:folb-client]
from flwr_importance.clientapps.folb import (
    ProximalTerm,
    folb_reply,
    inexactness,
    local_gradient,
)
# --8<-- [end:folb-client]
# isort: on

#: The message the server sends every node before it starts a method, when
#: the run has several (config ``method``); a message type of its own, so
#: no method's handlers see it.
METHOD_QUERY = "method"
#: ``context.state`` record naming the method this node serves now.
METHOD_STATE_KEY = "quickstart-method"

#: A ClientApp message handler.
Handler = Callable[[Message, Context], Message]


def logged(handler: Handler) -> Handler:
    """``handler``, logging each call: the tests read the log to see it ran."""

    @wraps(handler)
    def logged_handler(msg: Message, context: Context) -> Message:
        log(INFO, "quickstart-pytorch %s: called", handler.__name__)
        return handler(msg, context)

    return logged_handler


# -- Flower's ClientApp (FedAvg) ------------------------------------------------
# --8<-- [start:ocs-client,aocs-client,mmfl-client,isfedavg-client,folb-client,fedsampling-client]  # noqa: E501
# replaces: @app.train()
# --8<-- [end:ocs-client,aocs-client,mmfl-client,isfedavg-client,folb-client,fedsampling-client]  # noqa: E501
def train(msg: Message, context: Context) -> Message:
    """Train the model on local data."""
    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)

    # Load the data
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    trainloader, _ = load_data(partition_id, num_partitions, batch_size)

    # Call the training function
    train_loss = train_fn(
        model,
        trainloader,
        context.run_config["local-epochs"],
        msg.content["config"]["lr"],
        device,
    )

    # Construct and return reply Message
    model_record = ArrayRecord(model.state_dict())
    metrics = {
        "train_loss": train_loss,
        "num-examples": len(trainloader.dataset),
    }
    metric_record = MetricRecord(metrics)
    content = RecordDict({"arrays": model_record, "metrics": metric_record})
    return Message(content=content, reply_to=msg)


def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the model on local data."""
    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)

    # Load the data
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    _, valloader = load_data(partition_id, num_partitions, batch_size)

    # Call the evaluation function
    eval_loss, eval_acc = test_fn(model, valloader, device)

    # Construct and return reply Message
    metrics = {
        "eval_loss": eval_loss,
        "eval_acc": eval_acc,
        "num-examples": len(valloader.dataset),
    }
    metric_record = MetricRecord(metrics)
    content = RecordDict({"metrics": metric_record})
    return Message(content=content, reply_to=msg)


def fedavg_app() -> ClientApp:
    """Flower's quickstart ClientApp: ``@app.train()`` and ``@app.evaluate()``."""
    app = ClientApp()
    app.train()(train)
    app.evaluate()(evaluate)
    return app


# -- the methods that keep Flower's train function ------------------------------
# --8<-- [start:sizes-query-client,fedsampling-client]
def num_train_examples(context: Context) -> int:
    """The size of this node's training set."""
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    trainloader, _ = load_data(partition_id, num_partitions, batch_size)
    return len(trainloader.dataset)


# --8<-- [end:sizes-query-client,fedsampling-client]
def standard_queries_app() -> ClientApp:
    """Flower's app answering the library's standard queries, sizes and losses.

    It serves every method whose nodes only answer those queries (MD and
    clustered sampling the size query, Power-of-Choice both): such a
    method's lines are those of the queries its strategy sends.
    """
    app = fedavg_app()
    # --8<-- [start:sizes-query-client]
    add_size_query(app, num_examples=num_train_examples)
    # --8<-- [end:sizes-query-client]
    # --8<-- [start:loss-query-client]
    add_loss_query(app, evaluate, loss_key="eval_loss")
    # --8<-- [end:loss-query-client]
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


# --8<-- [start:mmfl-client]
def train_mmfl(msg: Message, context: Context) -> Message:
    """Flower's ``train`` on the data of the model the server sent (MMFL)."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    task = msg.content["config"]["model-index"]  # which model, so which task
    trainloader, _ = load_data(partition_id, num_partitions, batch_size, task=task)
    train_loss = train_fn(
        model,
        trainloader,
        context.run_config["local-epochs"],
        msg.content["config"]["lr"],
        device,
    )
    model_record = ArrayRecord(model.state_dict())
    metrics = {"train_loss": train_loss, "num-examples": len(trainloader.dataset)}
    content = RecordDict({"arrays": model_record, "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


# --8<-- [end:mmfl-client]
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
@logged
# --8<-- [start:isfedavg-client]
def train_isfedavg(msg: Message, context: Context) -> Message:
    """Flower's ``train`` on the batches ISFedAvg draws (``task.train_isfedavg``)."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    trainloader, _ = load_data(partition_id, num_partitions, batch_size)
    trainset = trainloader.dataset
    sampler = ImportanceSampler.from_message(msg, context, num_samples=len(trainset))
    trainloader = DataLoader(trainset, batch_sampler=sampler)
    lr = msg.content["config"]["lr"]
    train_loss = train_isfedavg_fn(model, trainloader, sampler, lr, device)
    model_record = ArrayRecord(model.state_dict())
    metrics = {
        "train_loss": train_loss,
        **sampler.finish(context),
        "num-examples": len(trainset),
    }
    content = RecordDict({"arrays": model_record, "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


# --8<-- [end:isfedavg-client]
def isfedavg_app() -> ClientApp:
    """ISFedAvg: ``train_isfedavg`` in place of Flower's ``train``."""
    app = ClientApp()
    # --8<-- [start:isfedavg-client]
    app.train()(train_isfedavg)
    # --8<-- [end:isfedavg-client]
    app.evaluate()(evaluate)
    return app


# --8<-- [start:folb-client]
def train_folb(msg: Message, context: Context) -> Message:
    """Flower's ``train`` with FOLB's gradient, proximal term and inexactness."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    trainloader, _ = load_data(partition_id, num_partitions, batch_size)
    criterion = torch.nn.CrossEntropyLoss()
    gradient = local_gradient(model, trainloader, criterion, unpack=unpack)
    proximal = ProximalTerm(model, msg)  # mu from the server
    train_loss = train_fn(
        model,
        trainloader,
        context.run_config["local-epochs"],
        msg.content["config"]["lr"],
        device,
        proximal=proximal,
    )
    metrics = {"train_loss": train_loss, "num-examples": len(trainloader.dataset)}
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


@logged
# --8<-- [start:fedsampling-client]
def train_fedsampling(msg: Message, context: Context) -> Message:
    """FedSampling: local steps on this round's kept samples, replied as G_c."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    trainloader, _ = load_data(partition_id, num_partitions, batch_size)
    trainset = trainloader.dataset
    plan = fedsampling_round(msg, num_examples=len(trainset))
    kept = DataLoader(Subset(trainset, plan.indices), batch_size=batch_size)
    criterion = torch.nn.CrossEntropyLoss()
    lr = msg.content["config"]["lr"]
    gradient = fedsampling_gradient(
        model, kept, criterion, plan=plan, lr=lr, unpack=unpack
    )
    return fedsampling_reply(msg, gradient)  # G_c alone: no num-examples


# --8<-- [end:fedsampling-client]
def fedsampling_app() -> ClientApp:
    """FedSampling: the private size query and ``train_fedsampling``.

    No ``@app.evaluate()`` here: the strategy sends no evaluation (its
    replies' ``num-examples`` would reveal the sizes this method keeps
    private); the server evaluates centrally.
    """
    app = ClientApp()
    # --8<-- [start:fedsampling-client]
    add_private_size_query(app, num_examples=num_train_examples, max_epsilon=8.0)
    app.train()(train_fedsampling)
    # --8<-- [end:fedsampling-client]
    return app


#: The ClientApp of each method with client lines of its own, by the name the
#: run config's ``strategy`` uses; every other method's nodes answer the
#: standard queries (:func:`standard_queries_app`).
METHOD_APPS: dict[str, Callable[[], ClientApp]] = {
    "fedavg": fedavg_app,
    "ocs": ocs_app,
    "aocs": ocs_app,
    "mmfl": mmfl_app,
    "isfedavg": isfedavg_app,
    "folb": folb_app,
    "fedsampling": fedsampling_app,
}
_APPS = {name: make_app() for name, make_app in METHOD_APPS.items()}
_STANDARD_QUERIES_APP = standard_queries_app()


# -- the app Flower runs: one method, or several one after another ---------------
def current_method(context: Context) -> str:
    """The method this node serves: the last one the server named, else the run's."""
    record = context.state.config_records.get(METHOD_STATE_KEY)
    if record is not None:
        return str(record["method"])
    method = str(context.run_config["strategy"])
    if "," in method:
        raise ValueError(
            f"strategy '{method}' names several methods: a run of several "
            f"methods names each with a {METHOD_QUERY} query first"
        )
    return method


def to_current_method(msg: Message, context: Context) -> Message:
    """Hand ``msg`` to the ClientApp of the method the server is running.

    A method without an app of its own gets the standard queries' app; the
    ServerApp refuses a strategy name it does not know.
    """
    app = _APPS.get(current_method(context), _STANDARD_QUERIES_APP)
    return app(msg, context)


def start_method(msg: Message, context: Context) -> Message:
    """Serve the method the server names next, from a fresh node state.

    The node state of the previous method (OCS's kept updates, ISFedAvg's
    sample probabilities) is dropped, so each method starts as in a run of
    its own.
    """
    method = str(msg.content["config"]["method"])
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
