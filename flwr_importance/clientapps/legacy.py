"""The legacy API's ready-made client side: the library's handlers in a NumPyClient.

A :class:`HandlerClient` serves the legacy calls with the very handlers a
Message-API ClientApp registers (:mod:`flwr_importance.clientapps`): it
rebuilds the message the handler expects from the legacy call (type and
array layout from the config, see :mod:`.legacy_calls`) and turns the reply
back into what the legacy API returns::

    from flwr.client import ClientApp
    from flwr_importance.clientapps.isfedavg import make_isfedavg_handlers
    from flwr_importance.compat import handler_client_fn

    app = ClientApp(client_fn=handler_client_fn(my_task, make_isfedavg_handlers))

Per method, the handler sets are the ``make_<method>_handlers`` functions of
:mod:`flwr_importance.clientapps`; ``context.state`` (ISFedAvg's sample
probabilities, OCS's kept update) persists across rounds as it does for a
Message-API ClientApp.

This is client-side code (torch, through :mod:`.local_task`), so it lives here,
not in :mod:`flwr_importance.compat`, whose server side loads no ML framework;
``compat.HandlerClient`` and ``compat.handler_client_fn`` load it on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from flwr.app import Context, Message
from flwr.client import Client, NumPyClient
from flwr.common import NDArrays

from flwr_importance import protocol
from flwr_importance.clientapps.legacy_calls import (
    fit_reply,
    message_from_call,
    reply_scalars,
)
from flwr_importance.clientapps.local_task import TaskFactory
from flwr_importance.clientapps.messages import ClientHandler
from flwr_importance.legacy_wire import MESSAGE_TYPE_KEY, ScalarDict
from flwr_importance.tasks import get_weights

#: ``task_factory -> {message type: handler}``, e.g. ``make_isfedavg_handlers``.
HandlersFactory = Callable[[TaskFactory], Mapping[str, ClientHandler]]


class HandlerClient(NumPyClient):
    """A ``NumPyClient`` that serves each legacy call with a Message-API handler.

    ``fit`` runs the handler of the message type in the config
    (``compat-message-type``, default ``train``), ``get_properties`` the one of
    a query without arrays, ``evaluate`` the ``evaluate`` handler. A handler's
    error propagates, which Flower reports to the server as a failed client.

    Parameters
    ----------
    context : Context
        The node's context (its ``state`` persists across rounds).
    task_factory : TaskFactory
        The node's task; its model's state-dict keys name the received arrays.
    handlers : Mapping[str, ClientHandler]
        Handlers by message type.
    """

    def __init__(
        self,
        context: Context,
        task_factory: TaskFactory,
        handlers: Mapping[str, ClientHandler],
    ) -> None:
        self.node_context = context
        self.task_factory = task_factory
        self.handlers = handlers

    def get_parameters(self, config: ScalarDict) -> NDArrays:
        """The node's initial model (the legacy server's fallback initial model)."""
        return get_weights(self.task_factory(self.node_context).model)

    def get_properties(self, config: ScalarDict) -> ScalarDict:
        """A query without arrays: its reply's metrics."""
        return reply_scalars(self._handle([], config, protocol.QUERY_CATEGORY))

    def fit(
        self, parameters: NDArrays, config: ScalarDict
    ) -> tuple[NDArrays, int, ScalarDict]:
        """A train message or a query with arrays: its reply's arrays and metrics."""
        return fit_reply(self._handle(parameters, config, "train"))

    def evaluate(
        self, parameters: NDArrays, config: ScalarDict
    ) -> tuple[float, int, ScalarDict]:
        """The ``evaluate`` handler: loss, ``num-examples`` and its metrics."""
        metrics = reply_scalars(self._handle(parameters, config, "evaluate"))
        return (
            float(metrics[protocol.LOSS]),
            int(metrics.get(protocol.NUM_EXAMPLES, 0)),
            metrics,
        )

    def _handle(
        self, parameters: NDArrays, config: ScalarDict, default_type: str
    ) -> Message:
        """Rebuild the message from the legacy call and run its handler."""
        message_type = str(config.get(MESSAGE_TYPE_KEY, default_type))
        handler = self.handlers.get(message_type)
        if handler is None:
            raise ValueError(f"no handler for message type '{message_type}'")
        model_keys = list(self.task_factory(self.node_context).model.state_dict())
        message = message_from_call(
            parameters,
            config,
            message_type=message_type,
            context=self.node_context,
            keys=model_keys,
        )
        return handler(message, self.node_context)


def handler_client_fn(
    task_factory: TaskFactory, handlers_factory: HandlersFactory
) -> Callable[[Context], Client]:
    """A legacy ``client_fn`` serving the calls with ``handlers_factory``'s handlers.

    Parameters
    ----------
    task_factory : TaskFactory
        ``Context -> LocalTask``: the node's model, objective, data, settings.
    handlers_factory : HandlersFactory
        The method's handler set, e.g.
        :func:`~flwr_importance.clientapps.isfedavg.make_isfedavg_handlers`.
    """
    handlers = handlers_factory(task_factory)

    def client_fn(context: Context) -> Client:
        return HandlerClient(context, task_factory, handlers).to_client()

    return client_fn
