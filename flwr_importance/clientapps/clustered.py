"""ClientApp handlers for clustered and MD sampling (Fraboni et al., ICML 2021).

Training is plain FedAvg training
(:func:`~flwr_importance.clientapps.make_train_handler`, which reports
``num-examples``); the only extra message is the server's size query, answered
by :func:`make_sizes_handler`::

    app = ClientApp()
    app.train()(make_train_handler(my_task))
    app.query("sizes")(make_sizes_handler(my_task))
"""

from __future__ import annotations

from flwr.app import Context, Message, MetricRecord, RecordDict

from flwr_importance.clientapps.common import (
    ClientHandler,
    TaskFactory,
    make_evaluate_handler,
    make_train_handler,
)
from flwr_importance.protocol import (
    NUM_EXAMPLES,
)


def make_sizes_handler(task_factory: TaskFactory) -> ClientHandler:
    """Answer ``query.sizes`` with the node's sample count.

    The reply carries one MetricRecord ``metrics`` with ``num-examples``, the
    number of local training samples (what the server uses for ``n_i``).
    """

    def sizes(message: Message, context: Context) -> Message:
        task = task_factory(context)
        content = RecordDict({"metrics": MetricRecord({NUM_EXAMPLES: len(task.x)})})
        return Message(content, reply_to=message)

    return sizes


def make_clustered_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
    """The handler set of clustered and MD sampling: train, evaluate, query.sizes."""
    return {
        "train": make_train_handler(task_factory),
        "evaluate": make_evaluate_handler(task_factory),
        "query.sizes": make_sizes_handler(task_factory),
    }
