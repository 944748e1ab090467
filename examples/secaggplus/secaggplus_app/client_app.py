"""The ClientApp: the method's ready-made client side inside SecAgg+'s mods.

``importance_secaggplus_mod`` is Flower's ``secaggplus_mod`` for the
messages of a secure sum, and lets every other message through (the
library's queries travel as legacy calls too); ``secure_aocs_mod`` serves
the steps of AOCS under SecAgg+ (each names its step in its config) and
lets every other message through. Without SecAgg+ on the server both are
pass-throughs, so one app serves every method, secure or plain.
"""

from __future__ import annotations

from flwr.app import Context
from flwr.client import Client, ClientApp

from flwr_importance.clientapps.fedsampling import make_fedsampling_handlers
from flwr_importance.clientapps.legacy import HandlersFactory
from flwr_importance.clientapps.secure_aggregation import importance_secaggplus_mod
from flwr_importance.clientapps.secure_aocs import secure_aocs_mod
from flwr_importance.clientapps.variance_reduced import make_ocs_handlers
from flwr_importance.compat import handler_client_fn
from secaggplus_app.task import local_task

#: The client side of each method the ServerApp offers (its ``STRATEGIES``).
HANDLERS: dict[str, HandlersFactory] = {
    "fedsampling": make_fedsampling_handlers,
    "aocs": make_ocs_handlers,
}


def client_fn(context: Context) -> Client:
    """The NumPyClient of the run's ``strategy``."""
    strategy = str(context.run_config["strategy"])
    if strategy not in HANDLERS:
        raise ValueError(f"unknown strategy '{strategy}', one of {sorted(HANDLERS)}")
    return handler_client_fn(local_task, HANDLERS[strategy])(context)


app = ClientApp(client_fn=client_fn, mods=[importance_secaggplus_mod, secure_aocs_mod])
