"""sklearnexample: Flower's quickstart-sklearn ClientApp, plus each method's lines.

``train`` and ``evaluate`` are Flower's (a ``LogisticRegression`` fitted from
the received weights, log-loss and accuracy). The model-agnostic methods need
a few torch-free lines more, marked with the methods they serve; one app
serves them all here (each helper answers only its own method's messages), a
project using one method keeps only that method's lines:

- ``md``, ``clustered`` and ``power-of-choice``: the true-size query;
- ``power-of-choice``: the local-loss query on ``evaluate``;
- ``ocs``, ``aocs`` and ``mmfl``: :class:`KeptUpdateMod` on ``train`` and the
  norm query running ``train``;
- ``mmfl``: ``train`` and ``evaluate`` pick the model's task by the config's
  ``model-index``.
"""

from __future__ import annotations

import warnings
from logging import INFO

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import log
from sklearn.metrics import log_loss

from sklearnexample.task import (
    UNIQUE_LABELS,
    get_model,
    get_model_params,
    load_data,
    set_model_params,
)

# Each method's imports: the lines its "Use it" block adds.
# isort: off
# --8<-- [start:md-client,clustered-client,power-of-choice-client]
from flwr_importance.clientapps.sizes import add_size_query

# --8<-- [end:md-client,clustered-client,power-of-choice-client]
# --8<-- [start:power-of-choice-client]
from flwr_importance.clientapps.loss import add_loss_query

# --8<-- [end:power-of-choice-client]
# --8<-- [start:ocs-client,aocs-client,mmfl-client]
from flwr_importance.clientapps.variance_reduced import KeptUpdateMod, add_norm_query
# --8<-- [end:ocs-client,aocs-client,mmfl-client]
# isort: on

# Flower ClientApp
app = ClientApp()


# --8<-- [start:mmfl-client]
def model_task(msg: Message) -> int:
    """The task of the message's model: the config's ``model-index`` (mmfl), or 0."""
    return int(msg.content.config_records["config"].get("model-index", 0))  # type: ignore[arg-type]


# --8<-- [end:mmfl-client]


# --8<-- [start:ocs-client,aocs-client,mmfl-client]
@app.train(mods=[KeptUpdateMod(train_loss_key="train_logloss")])
# --8<-- [end:ocs-client,aocs-client,mmfl-client]
def train(msg: Message, context: Context) -> Message:
    """Train the model on local data."""
    # Create LogisticRegression Model
    model = get_model(int(context.run_config["local-epochs"]))

    # Apply received parameters
    ndarrays = msg.content.array_records["arrays"].to_numpy_ndarrays()
    set_model_params(model, ndarrays)

    # Load the data
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    X_train, y_train, _, _ = load_data(  # noqa: N806 (scikit-learn's convention)
        partition_id,
        num_partitions,
        # --8<-- [start:mmfl-client]
        task=model_task(msg),
        # --8<-- [end:mmfl-client]
    )

    # Ignore convergence failure due to low local epochs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Train the model on local data
        model.fit(X_train, y_train)
    log(
        INFO,
        "sklearn-example train: partition %d, %d examples",
        partition_id,
        len(X_train),
    )

    # Let's compute train loss
    y_train_pred_proba = model.predict_proba(X_train)
    train_logloss = log_loss(y_train, y_train_pred_proba, labels=UNIQUE_LABELS)
    accuracy = model.score(X_train, y_train)

    # Construct and return reply Message
    model_record = ArrayRecord(get_model_params(model))
    metrics = {
        "num-examples": len(X_train),
        "train_logloss": train_logloss,
        "train_accuracy": accuracy,
    }
    content = RecordDict({"arrays": model_record, "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the model on local data."""
    # Create LogisticRegression Model
    model = get_model(int(context.run_config["local-epochs"]))

    # Apply received parameters
    ndarrays = msg.content.array_records["arrays"].to_numpy_ndarrays()
    set_model_params(model, ndarrays)

    # Load the data
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    _, _, X_test, y_test = load_data(  # noqa: N806 (scikit-learn's convention)
        partition_id,
        num_partitions,
        # --8<-- [start:mmfl-client]
        task=model_task(msg),
        # --8<-- [end:mmfl-client]
    )

    # Evaluate the model on local data
    y_test_pred_proba = model.predict_proba(X_test)
    accuracy = model.score(X_test, y_test)
    loss = log_loss(y_test, y_test_pred_proba, labels=UNIQUE_LABELS)

    # Construct and return reply Message
    metrics = {"num-examples": len(X_test), "test_logloss": loss, "accuracy": accuracy}
    content = RecordDict({"metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


# --8<-- [start:md-client,clustered-client,power-of-choice-client]
def num_train_examples(context: Context) -> int:
    """The size of this node's training set."""
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    return len(load_data(partition_id, num_partitions)[1])


add_size_query(app, num_examples=num_train_examples)
# --8<-- [end:md-client,clustered-client,power-of-choice-client]
# --8<-- [start:ocs-client,aocs-client,mmfl-client]
add_norm_query(app, train, train_loss_key="train_logloss")
# --8<-- [end:ocs-client,aocs-client,mmfl-client]
# --8<-- [start:power-of-choice-client]
add_loss_query(app, evaluate, loss_key="test_logloss")
# --8<-- [end:power-of-choice-client]
