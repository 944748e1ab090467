"""A client mod that keeps every float a node's reply holds, and the search for them.

Test-only, for ``test_wire_capture``. Placed inside ``importance_secaggplus_mod``
(and, for AOCS, on both sides of ``secure_aocs_mod``), :func:`record_replies`
sees each reply as the library's client side made it, before SecAgg+ masks it
(without SecAgg+: exactly as it is sent), and writes its float arrays and float
metrics to ``<record-dir>/<node id>-<message id>-<position>-<n>.npy``.
:func:`searchable` turns a recorded array into byte strings to look for on the
wire.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from flwr.app import Context, Message
from flwr.clientapp.typing import ClientAppCallable

Mod = Callable[[Message, Context, ClientAppCallable], Message]

# Bytes per searched window of a float32 array (8 values), and windows per array.
WINDOW_BYTES = 32
WINDOWS_PER_ARRAY = 16


def record_replies(position: str) -> Mod:
    """A mod writing the floats of every reply to the run config's ``record-dir``."""

    def mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
        reply = call_next(msg, ctxt)
        if reply.has_error():
            return reply
        # An Array without bytes (a reply whose values were removed) holds
        # nothing to look for.
        values = [
            array.numpy()
            for record in reply.content.array_records.values()
            for array in record.values()
            if array.data
        ]
        arrays = [array for array in values if np.issubdtype(array.dtype, np.floating)]
        metrics = [
            float(value)
            for record in reply.content.metric_records.values()
            for value in record.values()
            if isinstance(value, float)
        ]
        if metrics:
            arrays.append(np.array(metrics, dtype=np.float64))
        folder = Path(str(ctxt.run_config["record-dir"]))
        folder.mkdir(parents=True, exist_ok=True)
        for index, array in enumerate(arrays):
            name = f"{ctxt.node_id}-{msg.metadata.message_id}-{position}-{index}.npy"
            np.save(folder / name, array)
        return reply

    return mod


def searchable(array: np.ndarray) -> list[bytes]:
    """Byte strings of ``array`` that can only match its own bytes on the wire.

    An array of 32 bytes or more: ``WINDOWS_PER_ARRAY`` windows of
    ``WINDOW_BYTES`` of its bytes, in its own dtype, spread evenly (aligned to
    whole values; all-zero windows left out). A shorter float64 array (a few
    metrics, a small secure-sum vector): each value's own 8 bytes, unless it
    is a short dyadic fraction (an integer over 4096, such as 0.0, 1.0 or
    0.25), which other fields could hold by chance.
    """
    data = np.ascontiguousarray(array).tobytes()
    if len(data) >= WINDOW_BYTES:
        size = array.dtype.itemsize
        starts = np.linspace(0, len(data) - WINDOW_BYTES, WINDOWS_PER_ARRAY)
        windows = [data[int(s) // size * size :][:WINDOW_BYTES] for s in starts]
        return [window for window in dict.fromkeys(windows) if any(window)]
    if array.dtype != np.float64:
        return []
    return [
        value.tobytes()
        for value in array.ravel()
        if not float(value * 4096.0).is_integer()
    ]
