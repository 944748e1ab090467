"""The client's end of the legacy transport: a legacy call in, a handler's reply out.

A legacy strategy of :mod:`flwr_importance.compat` sends each Message-API
message as a ``fit`` or ``get_properties`` call, its type and array layout in
the config (the wire format of :mod:`flwr_importance.legacy_wire`). A legacy
client rebuilds from that call the message a Message-API handler expects
(:func:`message_from_call`) and turns the handler's reply back into what the
legacy call returns (:func:`reply_scalars`, :func:`fit_reply`): what the
ready-made handler client of :mod:`.legacy` and the wrapper of your own client
in :mod:`.numpy_client` share. Torch-free.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np
from flwr.app import ConfigRecord, Context, Message, Metadata
from flwr.common import Scalar
from flwr.common.constant import SUPERLINK_NODE_ID
from numpy.typing import NDArray

from flwr_importance import protocol
from flwr_importance.legacy_wire import (
    ARRAY_LAYOUT_KEY,
    MESSAGE_TYPE_KEY,
    ScalarDict,
    legacy_scalars,
    pack_arrays,
    unpack_arrays,
)

#: How long a message rebuilt on the client lives; it is handled at once, in
#: the process that received the legacy call.
_REBUILT_MESSAGE_TTL = 3600.0


def message_from_call(
    parameters: Sequence[NDArray[np.generic]],
    config: Mapping[str, Scalar],
    *,
    message_type: str,
    context: Context,
    keys: Sequence[str] | None = None,
) -> Message:
    """The Message-API message a legacy call carries, as its handler expects it.

    The arrays are unpacked by the config's
    :data:`~flwr_importance.legacy_wire.ARRAY_LAYOUT_KEY` (see
    :func:`~flwr_importance.legacy_wire.unpack_arrays`, which ``keys`` is
    passed to) and the rest of the config, without the transport's keys,
    becomes the ``config`` record.

    Parameters
    ----------
    parameters : Sequence[NDArray]
        The call's arrays (none for ``get_properties``).
    config : Mapping[str, Scalar]
        The call's config.
    message_type : str
        The message type (read from
        :data:`~flwr_importance.legacy_wire.MESSAGE_TYPE_KEY` by the caller).
    context : Context
        The node's context: the message is addressed to its node.
    keys : Sequence[str], optional
        Array keys for the records, as in
        :func:`~flwr_importance.legacy_wire.unpack_arrays`.
    """
    settings = ConfigRecord(
        {
            key: value
            for key, value in config.items()
            if key not in (MESSAGE_TYPE_KEY, ARRAY_LAYOUT_KEY)
        }
    )
    layout = config.get(ARRAY_LAYOUT_KEY)
    content = unpack_arrays(parameters, None if layout is None else str(layout), keys)
    content[protocol.CONFIG_RECORD] = settings
    # Built from its metadata: outside a ClientApp process (in a test, or a
    # simulation worker) Flower's task identity for new messages is unset.
    metadata = Metadata(
        run_id=context.run_id,
        message_id="",
        src_node_id=SUPERLINK_NODE_ID,
        dst_node_id=context.node_id,
        reply_to_message_id="",
        group_id="",
        created_at=time.time(),
        ttl=_REBUILT_MESSAGE_TTL,
        message_type=message_type,
    )
    return Message(content, metadata=metadata)  # type: ignore[call-overload]


def reply_scalars(reply: Message) -> ScalarDict:
    """A handler reply's metrics as legacy scalars (all of its MetricRecords)."""
    metrics: ScalarDict = {}
    for record in reply.content.metric_records.values():
        metrics.update(legacy_scalars(record, "metric"))
    return metrics


def fit_reply(reply: Message) -> tuple[list[NDArray[np.generic]], int, ScalarDict]:
    """A handler reply as ``NumPyClient.fit`` returns it (arrays, count, metrics).

    Its named ArrayRecords packed, with their layout in the metrics (what
    :func:`~flwr_importance.compat.transport.reply_from_fit_res` unpacks on
    the server); the example count is the reply's ``num-examples`` metric (0
    without).
    """
    arrays, layout = pack_arrays(reply.content.array_records)
    metrics = reply_scalars(reply)
    metrics[ARRAY_LAYOUT_KEY] = layout
    return arrays, int(metrics.get(protocol.NUM_EXAMPLES, 0)), metrics
