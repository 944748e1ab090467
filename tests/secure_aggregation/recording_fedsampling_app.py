"""The SecAgg+ example's ClientApp (FedSampling), its replies recorded.

Test-only, for ``test_wire_capture``: the example's ``client_fn`` with
:func:`~tests.secure_aggregation.reply_recorder.record_replies` inside
``importance_secaggplus_mod``, so each ``G_c`` is recorded before SecAgg+
masks it.
"""

from __future__ import annotations

from flwr.client import ClientApp
from secaggplus_app.client_app import client_fn

from flwr_importance.clientapps.secure_aggregation import importance_secaggplus_mod
from tests.secure_aggregation.reply_recorder import record_replies

app = ClientApp(
    client_fn=client_fn,
    mods=[importance_secaggplus_mod, record_replies("inside-secagg")],
)
