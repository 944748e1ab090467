"""The legacy ClientApp: a NumPyClient serving the chosen method's handlers."""

from __future__ import annotations

from flwr.app import Context
from flwr.client import Client, ClientApp

from flwr_importance.clientapps.clustered import make_clustered_handlers
from flwr_importance.clientapps.fedsampling import make_fedsampling_handlers
from flwr_importance.clientapps.folb import make_folb_handlers
from flwr_importance.clientapps.isfedavg import make_isfedavg_handlers
from flwr_importance.clientapps.optimal import make_ocs_handlers
from flwr_importance.compat import handler_client_fn
from flwr_importance.compat.clients import HandlersFactory
from legacy_app.task import local_task

#: Each method's client handlers (the same as on the Message API).
HANDLERS: dict[str, HandlersFactory] = {
    "isfedavg": make_isfedavg_handlers,
    "folb": make_folb_handlers,
    "fedsampling": make_fedsampling_handlers,
    "clustered": make_clustered_handlers,
    "md": make_clustered_handlers,
    "ocs": make_ocs_handlers,
}


def client_fn(context: Context) -> Client:
    """The NumPyClient of the run's ``strategy``."""
    strategy = str(context.run_config["strategy"])
    if strategy not in HANDLERS:
        raise ValueError(f"unknown strategy '{strategy}', one of {sorted(HANDLERS)}")
    return handler_client_fn(local_task, HANDLERS[strategy])(context)


app = ClientApp(client_fn=client_fn)
