"""The AOCS test app's ClientApp, its replies recorded on both sides of its mod.

Test-only, for ``test_wire_capture``: the app's client
(``importance_client_fn`` around its NumPyClient, ``secure_aocs_mod`` inside
``importance_secaggplus_mod``) with
:func:`~tests.secure_aggregation.reply_recorder.record_replies` inside
``secure_aocs_mod`` (the client's own replies: its update, norm and size,
before the mod removes them under SecAgg+) and outside it (each secure-sum
vector, before SecAgg+ masks it).
"""

from __future__ import annotations

from flwr.client import ClientApp
from secure_aocs_app.task import client_fn

from flwr_importance.clientapps.secure_aggregation import importance_secaggplus_mod
from flwr_importance.clientapps.secure_aocs import secure_aocs_mod
from flwr_importance.compat import importance_client_fn
from tests.secure_aggregation.reply_recorder import record_replies

app = ClientApp(
    client_fn=importance_client_fn(client_fn),
    mods=[
        importance_secaggplus_mod,
        record_replies("outside-aocs-mod"),
        secure_aocs_mod,
        record_replies("inside-aocs-mod"),
    ],
)
