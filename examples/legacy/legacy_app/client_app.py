"""The legacy ClientApp: a NumPyClient serving the chosen method's handlers."""

from __future__ import annotations

import functools

from flwr.app import Context
from flwr.client import Client, ClientApp

from flwr_importance.clientapps.legacy import HandlersFactory
from flwr_importance.clientapps.standard import method_handlers
from flwr_importance.compat import handler_client_fn
from flwr_importance.registry import methods
from legacy_app.task import local_task

#: Each method's ready-made client handlers (the same as on the Message API),
#: for every method of the library that runs on the legacy API.
HANDLERS: dict[str, HandlersFactory] = {
    spec.name: functools.partial(method_handlers, spec)
    for spec in methods()
    if spec.legacy_api
}


def client_fn(context: Context) -> Client:
    """The NumPyClient of the run's ``strategy``."""
    strategy = str(context.run_config["strategy"])
    if strategy not in HANDLERS:
        raise ValueError(f"unknown strategy '{strategy}', one of {sorted(HANDLERS)}")
    return handler_client_fn(local_task, HANDLERS[strategy])(context)


app = ClientApp(client_fn=client_fn)
