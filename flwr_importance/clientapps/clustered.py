"""ClientApp handlers for clustered and MD sampling (Fraboni et al., ICML 2021).

Training and evaluation are Flower's FedAvg ones; the only extra message is
the server's size query. With your own ``@app.train()`` (it replies
``num-examples``, as Flower's quickstart does), register the size query with
:func:`~flwr_importance.clientapps.sizes.add_size_query`::

    add_size_query(app, num_examples=lambda context: len(load_trainset(context)))

The ready-made set, for a :class:`~flwr_importance.clientapps.LocalTask`::

    app = register_handlers(ClientApp(), make_clustered_handlers(my_task))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flwr_importance import protocol
from flwr_importance.clientapps.messages import ClientHandler
from flwr_importance.clientapps.standard import standard_handlers

if TYPE_CHECKING:
    from flwr_importance.clientapps.local_task import TaskFactory


def make_clustered_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
    """The handler set of clustered and MD sampling.

    FedAvg's train and evaluate, and ``query.sizes`` with the true size: the
    standard handlers of the methods' ``client_queries``.
    """
    return standard_handlers(task_factory, (protocol.SIZES_QUERY,))
