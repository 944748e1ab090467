"""A client mod that keeps every number a node's reply holds, and the search for them.

Test-only, for ``test_wire_capture``. Placed inside ``importance_secaggplus_mod``
(and, for AOCS, on both sides of ``secure_aocs_mod``), :func:`record_replies`
sees each reply as the library's client side made it, before SecAgg+ masks it
(without SecAgg+: exactly as it is sent), and writes its float arrays and float
metrics to ``<record-dir>/<node id>-<message id>-<position>-<n>.npy``; asked
to, also its whole-number metrics (sizes) as an ``int64`` array, or the
``v_i`` and ``n_i`` that ``secure_aocs_mod`` keeps. :func:`searchable` turns
a recorded array into byte strings to look for on the wire.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp.typing import ClientAppCallable
from flwr.proto.recorddict_pb2 import MetricRecordValue

from flwr_importance import protocol
from flwr_importance.clientapps.secure_aocs import KEPT_SCORE_KEY

Mod = Callable[[Message, Context, ClientAppCallable], Message]

# Bytes per searched window of a float32 array (8 values), and windows per array.
WINDOW_BYTES = 32
WINDOWS_PER_ARRAY = 16
# A float64 array of at most this many values (metrics, a secure-sum vector
# of AOCS) is searched value by value.
VALUES_SEARCHED_ONE_BY_ONE = 16
# The tag and length that put a record value into its record's item (field 2).
_ITEM_VALUE_TAG = b"\x12"


def _whole_numbers(reply: Message) -> list[int]:
    """The reply's metrics that are whole numbers: ints, and integral floats."""
    return [
        int(value)
        for record in reply.content.metric_records.values()
        for value in record.values()
        if (isinstance(value, int) and not isinstance(value, bool))
        or (isinstance(value, float) and value.is_integer())
    ]


def _kept_score(context: Context) -> list[float]:
    """``[v_i, n_i]`` as ``secure_aocs_mod`` keeps them (none outside AOCS)."""
    kept = context.state.get(KEPT_SCORE_KEY)
    if not isinstance(kept, ConfigRecord):
        return []
    keys = (protocol.UPDATE_NORM, protocol.NUM_EXAMPLES)
    return [float(kept[key]) for key in keys]  # type: ignore[arg-type]


def record_replies(position: str, *, sizes: bool = False, kept: bool = False) -> Mod:
    """A mod writing the floats of every reply to the run config's ``record-dir``.

    With ``sizes``, also the reply's whole-number metrics (an ``int64``
    array); with ``kept``, the ``v_i`` (float64) and ``n_i`` (``int64``) the
    node keeps for AOCS under SecAgg+ (nothing when it keeps none).
    """

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
        if sizes:
            arrays.append(np.array(_whole_numbers(reply), dtype=np.int64))
        if kept:
            score = _kept_score(ctxt)
            arrays.append(np.array(score[:1], dtype=np.float64))
            arrays.append(np.array(score[1:], dtype=np.int64))
        folder = Path(str(ctxt.run_config["record-dir"]))
        folder.mkdir(parents=True, exist_ok=True)
        for index, array in enumerate(arrays):
            name = f"{ctxt.node_id}-{msg.metadata.message_id}-{position}-{index}.npy"
            np.save(folder / name, array)
        return reply

    return mod


def integer_encodings(value: int) -> list[bytes]:
    """The bytes ``value`` has in a message, each way a reply may hold it.

    As a record value, the way Flower serializes it (a ``sint64``, or a
    ``uint64`` above the ``sint64`` range) or as a whole float (``double``),
    each with the tag and length of its record item; and as an ``int64`` (or
    ``uint64``) array entry, little-endian. Not as ``int32``: its 4 bytes
    occur by chance in the masked vectors (each ``int64`` below ``2^32``).
    """
    values = [MetricRecordValue(double=float(value))]
    values.append(
        MetricRecordValue(sint64=value)
        if value < 2**63
        else MetricRecordValue(uint64=value)
    )
    encodings = []
    for record_value in values:
        data = record_value.SerializeToString()
        encodings.append(_ITEM_VALUE_TAG + bytes([len(data)]) + data)
    return [*encodings, np.int64(value).tobytes()]


def searchable(array: np.ndarray) -> list[bytes]:
    """Byte strings of ``array`` that can only match its own bytes on the wire.

    A float64 array of at most ``VALUES_SEARCHED_ONE_BY_ONE`` values (a few
    metrics, a secure-sum vector of AOCS): each value's own 8 bytes, unless
    it is a short dyadic fraction (an integer over 4096, such as 0.0, 1.0 or
    0.25), which other fields could hold by chance. An ``int64`` array of
    whole numbers (sizes): each value's :func:`integer_encodings`, unless
    below 2 (a flag or a count of 0 or 1). Any other array of 32 bytes or
    more: ``WINDOWS_PER_ARRAY`` windows of ``WINDOW_BYTES`` of its bytes, in
    its own dtype, spread evenly (aligned to whole values; all-zero windows
    left out).
    """
    if array.dtype == np.int64:
        return [
            encoding
            for value in array.ravel()
            if value >= 2
            for encoding in integer_encodings(int(value))
        ]
    if array.dtype == np.float64 and array.size <= VALUES_SEARCHED_ONE_BY_ONE:
        return [
            value.tobytes()
            for value in array.ravel()
            if not float(value * 4096.0).is_integer()
        ]
    data = np.ascontiguousarray(array).tobytes()
    if len(data) < WINDOW_BYTES:
        return []
    size = array.dtype.itemsize
    starts = np.linspace(0, len(data) - WINDOW_BYTES, WINDOWS_PER_ARRAY)
    windows = [data[int(s) // size * size :][:WINDOW_BYTES] for s in starts]
    return [window for window in dict.fromkeys(windows) if any(window)]
