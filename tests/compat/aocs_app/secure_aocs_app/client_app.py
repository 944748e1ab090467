"""The ClientApp: a NumPyClient wrapped for OCS, inside SecAgg+ and secure AOCS."""

from __future__ import annotations

from flwr.client import ClientApp

from flwr_importance.clientapps.secure_aggregation import importance_secaggplus_mod
from flwr_importance.clientapps.secure_aocs import secure_aocs_mod
from flwr_importance.compat import importance_client_fn
from secure_aocs_app.task import client_fn

app = ClientApp(
    client_fn=importance_client_fn(client_fn),
    mods=[importance_secaggplus_mod, secure_aocs_mod],
)
