"""The SecAgg+ example's ClientApp, its replies recorded on both sides of AOCS's mod.

Test-only, for ``test_wire_capture``: the example's ``client_fn`` (FedSampling
or AOCS, by the run config's ``strategy``) under the example's two mods, with
:func:`~tests.e2e.reply_recorder.record_replies` inside
``secure_aocs_mod`` (the client side's own replies: FedSampling's ``G_c``,
AOCS's update, norm and size, before that mod removes them under SecAgg+; and
their whole-number metrics, the sizes) and outside it (each AOCS secure-sum
vector, and the ``v_i`` and ``n_i`` the mod keeps), all before SecAgg+ masks
them. The capture's run config turns on ``secure-aocs-unsafe-public-draws``
(not private), so that AOCS's secure run samples as the plain run does.
"""

from __future__ import annotations

from flwr.client import ClientApp
from secaggplus_app.client_app import client_fn

from flwr_importance.clientapps.secure_aggregation import importance_secaggplus_mod
from flwr_importance.clientapps.secure_aocs import secure_aocs_mod
from tests.e2e.reply_recorder import record_replies

app = ClientApp(
    client_fn=client_fn,
    mods=[
        importance_secaggplus_mod,
        record_replies("outside-aocs-mod", kept=True),
        secure_aocs_mod,
        record_replies("inside-aocs-mod", sizes=True),
    ],
)
