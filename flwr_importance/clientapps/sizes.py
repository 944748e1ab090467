"""The size query: a node's true sample count, for the strategies that weight by it.

Clustered sampling, MD sampling (Fraboni et al., "Clustered Sampling:
Low-Variance and Improved Representativity for Clients Selection in Federated
Learning", ICML 2021) and the size-weighted baseline of FedSampling ask each
node once for its number of training samples ``n_i`` with a ``query.sizes``
message (the ``Client contract`` of
:class:`flwr_importance.strategies.MDSampling`); training and evaluation are
Flower's FedAvg ones. A ClientApp whose ``@app.train()`` already replies
``num-examples`` needs one line more::

     app = ClientApp()

     @app.train()
     def train(msg, context): ...  # unchanged

    +add_size_query(app, num_examples=lambda context: len(load_trainset(context)))

or, when the SuperNode is started with ``--node-config "num-examples=600"``,
``add_size_query(app, node_config_key="num-examples")``.

The reply reveals the true size: FedSampling's privatized reply is
:func:`~flwr_importance.clientapps.fedsampling.add_private_size_query`.

This module imports no torch: it serves any framework's ClientApp.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from flwr_importance import protocol
from flwr_importance.clientapps.messages import ClientHandler, metrics_reply

if TYPE_CHECKING:
    from flwr_importance.clientapps.local_task import TaskFactory

#: ``context -> n``: a node's number of local training samples.
SampleCount = Callable[[Context], int]


def checked_sample_count(value: object, *, source: str) -> int:
    """``value`` as a sample count: a whole number ``>= 0``.

    Parameters
    ----------
    value : object
        What the node's size source gave.
    source : str
        Where it came from, for the error message.

    Raises
    ------
    ValueError
        If ``value`` is not a whole number (a bool is not one) or is negative.

    Examples
    --------
    >>> checked_sample_count(600, source="num_examples")
    600
    >>> checked_sample_count(600.0, source="num_examples")
    600
    >>> checked_sample_count(-1, source="num_examples")
    Traceback (most recent call last):
    ...
    ValueError: num_examples gave -1, not a sample count (a whole number >= 0)
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value != int(value)
        or value < 0
    ):
        raise ValueError(
            f"{source} gave {value!r}, not a sample count (a whole number >= 0)"
        )
    return int(value)


def sample_count_source(
    *, num_examples: SampleCount | None = None, node_config_key: str | None = None
) -> SampleCount:
    """Where a node's sample count comes from: a callable or its node config.

    Parameters
    ----------
    num_examples : callable, optional
        ``context -> n``, e.g. ``lambda context: len(trainset)``.
    node_config_key : str, optional
        The node-config key holding ``n`` (``flower-supernode --node-config``).

    Returns
    -------
    callable
        ``context -> n``, checked by :func:`checked_sample_count`.

    Raises
    ------
    ValueError
        Unless exactly one of the two is given.
    """
    if (num_examples is None) == (node_config_key is None):
        raise ValueError("give exactly one of num_examples and node_config_key")

    def count(context: Context) -> int:
        if num_examples is not None:
            return checked_sample_count(num_examples(context), source="num_examples")
        assert node_config_key is not None
        if node_config_key not in context.node_config:
            raise ValueError(f"the node config lacks '{node_config_key}'")
        return checked_sample_count(
            context.node_config[node_config_key],
            source=f"node config '{node_config_key}'",
        )

    return count


def size_reply(message: Message, *, num_examples: int) -> Message:
    """The reply to ``query.sizes``: ``MetricRecord({"num-examples": n})``."""
    return metrics_reply(message, {protocol.NUM_EXAMPLES: num_examples})


def size_query_handler(
    *, num_examples: SampleCount | None = None, node_config_key: str | None = None
) -> ClientHandler:
    """A ``query.sizes`` handler answering the node's true sample count.

    Parameters are those of :func:`sample_count_source` (exactly one).
    """
    count = sample_count_source(
        num_examples=num_examples, node_config_key=node_config_key
    )

    def sizes(message: Message, context: Context) -> Message:
        return size_reply(message, num_examples=count(context))

    return sizes


def add_size_query(
    app: ClientApp,
    *,
    num_examples: SampleCount | None = None,
    node_config_key: str | None = None,
) -> None:
    """Register ``@app.query("sizes")`` answering the node's true sample count.

    What :class:`~flwr_importance.strategies.ClusteredSampling`,
    :class:`~flwr_importance.strategies.MDSampling` and
    :class:`~flwr_importance.strategies.PowerOfChoice` ask before they draw
    clients; their train messages are Flower's FedAvg ones, so the
    user's ``@app.train()`` stays as it is (it must reply ``num-examples``, as
    Flower's quickstart does).

    Parameters
    ----------
    app : ClientApp
        The user's app; it must not have a ``query.sizes`` handler yet.
    num_examples : callable, optional
        ``context -> n``, the node's number of training samples.
    node_config_key : str, optional
        Read ``n`` from this node-config key instead (exactly one of the two).

    Examples
    --------
    >>> from flwr.clientapp import ClientApp
    >>> app = ClientApp()
    >>> add_size_query(app, num_examples=lambda context: 600)
    """
    app.query(protocol.SIZES_QUERY)(
        size_query_handler(num_examples=num_examples, node_config_key=node_config_key)
    )


def make_sizes_handler(task_factory: TaskFactory) -> ClientHandler:
    """The ready-made ``query.sizes`` handler: the size of the task's local data.

    The one size handler of clustered, MD and size-weighted sampling's
    ready-made handler sets.
    """
    return size_query_handler(num_examples=lambda context: len(task_factory(context).x))
