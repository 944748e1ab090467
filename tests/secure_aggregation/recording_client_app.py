"""The SecAgg+ example's ClientApp, recording each train reply before masking.

Test-only, for ``test_wire_capture``: a mod *inside* ``importance_secaggplus_mod``
sees the reply of the library's client side exactly as it leaves the user's
code, before SecAgg+ masks it (or, without SecAgg+, exactly as it is sent), and
writes its float arrays to ``<record-dir>/<node id>-<message id>-<n>.npy``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from flwr.app import Context, Message, MessageType
from flwr.client import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from secaggplus_app.client_app import client_fn

from flwr_importance.clientapps.secure_aggregation import importance_secaggplus_mod


def record_train_replies(
    msg: Message, ctxt: Context, call_next: ClientAppCallable
) -> Message:
    """Pass ``msg`` on; write the float arrays of a train reply to the record dir."""
    reply = call_next(msg, ctxt)
    if msg.metadata.message_type == MessageType.TRAIN and not reply.has_error():
        folder = Path(str(ctxt.run_config["record-dir"]))
        folder.mkdir(parents=True, exist_ok=True)
        arrays = [
            array
            for record in reply.content.array_records.values()
            for array in record.to_numpy_ndarrays()
            if np.issubdtype(array.dtype, np.floating) and array.size >= 8
        ]
        for index, array in enumerate(arrays):
            name = f"{ctxt.node_id}-{msg.metadata.message_id}-{index}.npy"
            np.save(folder / name, array)
    return reply


app = ClientApp(
    client_fn=client_fn, mods=[importance_secaggplus_mod, record_train_replies]
)
