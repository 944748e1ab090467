"""The ready-made client side of a method that needs only standard queries.

A strategy whose clients train as in FedAvg and answer only the library's
standard queries declares them (``client_queries`` of its
:class:`~flwr_importance.registry.MethodSpec`) instead of writing client
code: ``"sizes"`` (the true sample count, :mod:`.sizes`) and ``"loss"`` (the
loss of the received model ``model-0`` on the local data, :mod:`.loss`'s
query on FedAvg's evaluate handler).

On your own ClientApp (any framework), the same queries are one line each,
torch-free: :func:`~flwr_importance.clientapps.sizes.add_size_query` and
:func:`~flwr_importance.clientapps.loss.add_loss_query` on your evaluate
function (Power-of-Choice's whole client side). The ready-made handlers here
train a :class:`~flwr_importance.clientapps.LocalTask` and load torch when
built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from flwr_importance import protocol
from flwr_importance.clientapps.loss import loss_query_handler
from flwr_importance.clientapps.messages import ClientHandler
from flwr_importance.clientapps.sizes import make_sizes_handler
from flwr_importance.registry import MethodSpec, load_attribute

if TYPE_CHECKING:
    from flwr_importance.clientapps.local_task import TaskFactory


def standard_handlers(
    task_factory: TaskFactory, queries: Sequence[str]
) -> dict[str, ClientHandler]:
    """FedAvg's train and evaluate handlers and the standard ``queries``.

    Parameters
    ----------
    task_factory : TaskFactory
        ``Context -> LocalTask``: the node's model and data.
    queries : Sequence[str]
        Query actions among ``"sizes"`` and ``"loss"``.

    Raises
    ------
    ValueError
        A query action that is not a standard one.
    """
    from flwr_importance.clientapps.local_task import (
        make_evaluate_handler,
        make_train_handler,
    )

    evaluate = make_evaluate_handler(task_factory)
    available = {
        protocol.SIZES_QUERY: lambda: make_sizes_handler(task_factory),
        protocol.LOSS_QUERY: lambda: loss_query_handler(evaluate),
    }
    unknown = sorted(set(queries) - set(available))
    if unknown:
        raise ValueError(
            f"no standard handler for queries {unknown}; "
            f"standard ones: {sorted(available)}"
        )
    return {
        "train": make_train_handler(task_factory),
        "evaluate": evaluate,
        **{
            protocol.query_message_type(action): available[action]()
            for action in queries
        },
    }


def method_handlers(
    spec: MethodSpec, task_factory: TaskFactory
) -> dict[str, ClientHandler]:
    """The ready-made client side a registry method declares.

    Its own handler factory (``client_handlers``), or FedAvg's handlers plus
    the standard handlers of its ``client_queries``.
    """
    if spec.client_handlers:
        return dict(load_attribute(spec.client_handlers)(task_factory))
    return standard_handlers(task_factory, spec.client_queries)
