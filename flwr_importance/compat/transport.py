"""Carrying the Message-API client contract over Flower's legacy transport.

The legacy Strategy API knows four calls to a client: ``get_properties`` (a
config in, scalars out), ``get_parameters``, ``fit`` (a list of arrays and a
config in, a list of arrays, ``num_examples`` and scalar metrics out) and
``evaluate``. The Message-API strategies of this library speak in messages of
several types (``train``, ``evaluate``, ``query.<action>``) whose content may
hold several *named* ArrayRecords (FOLB replies with ``update`` and
``gradient``, OCS sends ``model-0``). This module maps one onto the other
without loss:

- the message type travels in the config under :data:`MESSAGE_TYPE_KEY`;
- the named ArrayRecords travel as one flat list of arrays, with their names and
  lengths in the config (server to client) or the metrics (client to server)
  under :data:`ARRAY_LAYOUT_KEY`, as a JSON list of ``[name, count]`` pairs;
- a message that carries arrays goes by ``fit``, one without by
  ``get_properties`` (whose reply properties become the reply's metrics).

Both ends of the mapping live here: :class:`ProxyGrid`, a Message-API ``Grid``
over the legacy ``ClientProxy`` objects (what lets a Message-API strategy send
its extra queries from inside ``configure_fit``), the conversions of
instructions and replies, and their inverses used by the client side
(:func:`message_from_call`, :func:`reply_scalars`, :func:`fit_reply`: the
handler clients of :mod:`flwr_importance.clientapps.legacy` and the user-client
wrapper of :mod:`flwr_importance.compat.numpy_client`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from logging import WARNING

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    Metadata,
    MetricRecord,
    RecordDict,
)
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    GetPropertiesIns,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.supercore.run import Run
from numpy.typing import NDArray

from flwr_importance import protocol
from flwr_importance.clientapps.messages import message_config
from flwr_importance.local_grid import SynchronousGrid

#: Config key carrying the Message-API message type (``train``, ``query.norm``).
MESSAGE_TYPE_KEY = protocol.COMPAT_MESSAGE_TYPE
#: Config/metric key carrying the names and lengths of the packed ArrayRecords.
ARRAY_LAYOUT_KEY = protocol.COMPAT_ARRAY_LAYOUT
#: Name of the ArrayRecord a plain legacy ``fit``/``evaluate`` model arrives as.
DEFAULT_RECORD = protocol.ARRAY_RECORD

#: What the legacy API accepts as a config value or a metric.
ScalarDict = dict[str, Scalar]

#: How long a message rebuilt on the client lives; it is handled at once, in
#: the process that received the legacy call.
_REBUILT_MESSAGE_TTL = 3600.0


# -- arrays ------------------------------------------------------------------
def pack_arrays(
    records: Mapping[str, ArrayRecord],
) -> tuple[list[NDArray[np.generic]], str]:
    """Named ArrayRecords as one list of arrays and its JSON layout."""
    arrays: list[NDArray[np.generic]] = []
    layout: list[tuple[str, int]] = []
    for name, record in records.items():
        values = record.to_numpy_ndarrays()
        arrays.extend(values)
        layout.append((name, len(values)))
    return arrays, json.dumps(layout)


def unpack_arrays(
    arrays: Sequence[NDArray[np.generic]],
    layout: str | None,
    keys: Sequence[str] | None = None,
) -> RecordDict:
    """The named ArrayRecords :func:`pack_arrays` packed, in a RecordDict.

    Parameters
    ----------
    arrays : Sequence[NDArray]
        The flat list.
    layout : str or None
        The JSON layout; None means one record, :data:`DEFAULT_RECORD`, holding
        every array (what a plain legacy strategy sends).
    keys : Sequence[str], optional
        Array keys for each record of ``len(keys)`` arrays (a client passes its
        model's state-dict keys, so the record loads into the model); otherwise,
        and for records of another length, ``"0"``, ``"1"``, ...

    Raises
    ------
    ValueError
        If the layout is not a list of ``[name, count]`` pairs covering
        ``arrays`` exactly.
    """
    if layout is None:
        entries: object = [[DEFAULT_RECORD, len(arrays)]] if arrays else []
    else:
        entries = json.loads(layout)
    if not isinstance(entries, list) or not all(
        isinstance(entry, list)
        and len(entry) == 2
        and isinstance(entry[0], str)
        and isinstance(entry[1], int)
        and entry[1] >= 0
        for entry in entries
    ):
        raise ValueError(f"malformed {ARRAY_LAYOUT_KEY}: {layout!r}")
    if sum(count for _, count in entries) != len(arrays):
        raise ValueError(f"{ARRAY_LAYOUT_KEY} {layout!r} does not cover {len(arrays)}")
    records = RecordDict()
    offset = 0
    for name, count in entries:
        names = (
            list(keys)
            if keys is not None and len(keys) == count
            else [str(index) for index in range(count)]
        )
        values = arrays[offset : offset + count]
        records[name] = ArrayRecord.from_array_dict(
            {
                key: Array(np.asarray(value))
                for key, value in zip(names, values, strict=True)
            }
        )
        offset += count
    return records


def record_of(parameters: Parameters) -> ArrayRecord:
    """Legacy ``Parameters`` as an ArrayRecord keyed ``"0"``, ``"1"``, ..."""
    return ArrayRecord(parameters_to_ndarrays(parameters))


def parameters_of(record: ArrayRecord) -> Parameters:
    """An ArrayRecord's arrays, in order, as legacy ``Parameters``."""
    return ndarrays_to_parameters(record.to_numpy_ndarrays())


# -- configs and metrics -----------------------------------------------------
def legacy_scalars(values: Mapping[str, object], what: str) -> ScalarDict:
    """A config or metric record as legacy scalars (no lists).

    Raises
    ------
    ValueError
        For a value the legacy API cannot carry (a list).
    """
    scalars: ScalarDict = {}
    for key, value in values.items():
        if not isinstance(value, (bool, bytes, float, int, str)):
            raise ValueError(f"{what} '{key}' = {value!r} is not a legacy scalar")
        scalars[key] = value
    return scalars


def numeric_metrics(values: Mapping[str, Scalar]) -> MetricRecord | None:
    """The numeric entries of legacy metrics as a MetricRecord (None if none)."""
    numbers: dict[str, int | float | list[int] | list[float]] = {
        key: value
        for key, value in values.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }
    return MetricRecord(numbers) if numbers else None


# -- server side: instructions out, replies in --------------------------------
def fit_ins(message: Message) -> FitIns:
    """A Message-API instruction as legacy ``FitIns`` (type and layout in config)."""
    arrays, layout = pack_arrays(message.content.array_records)
    config = legacy_scalars(message_config(message), "config")
    config[MESSAGE_TYPE_KEY] = message.metadata.message_type
    config[ARRAY_LAYOUT_KEY] = layout
    return FitIns(ndarrays_to_parameters(arrays), config)


def reply_from_fit_res(message: Message, fit_res: FitRes) -> Message:
    """The Message-API reply to ``message`` that ``fit_res`` carries.

    The named ArrayRecords are unpacked with positional keys (those of the
    records the server sent); the numeric metrics become one MetricRecord,
    absent when there are none (FedSampling's train reply has no metrics).
    ``num_examples`` is not copied: the handlers report ``num-examples`` in
    their metrics when their contract asks for it.
    A reply whose arrays do not match its layout becomes an error reply.
    """
    if fit_res.status.code != Code.OK:
        return error_reply(message, f"fit failed: {fit_res.status.message}")
    metrics = dict(fit_res.metrics)
    layout = metrics.pop(ARRAY_LAYOUT_KEY, None)
    try:
        content = unpack_arrays(
            parameters_to_ndarrays(fit_res.parameters),
            layout if isinstance(layout, str) else None,
        )
    except ValueError as exc:
        # A malformed reply is the client's fault: an error reply, which the
        # strategy's checks log (naming the node) and leave out.
        return error_reply(message, str(exc))
    metric_record = numeric_metrics(metrics)
    if metric_record is not None:
        content[protocol.METRIC_RECORD] = metric_record
    return Message(content, reply_to=message)


def error_reply(message: Message, reason: str) -> Message:
    """An error reply to ``message`` (what a SuperNode sends when a client fails)."""
    return Message(
        Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason), reply_to=message
    )


def proxies_by_node(client_manager: ClientManager) -> dict[int, ClientProxy]:
    """The connected legacy clients by node id (``proxy.cid == str(node_id)``)."""
    proxies: dict[int, ClientProxy] = {}
    for proxy in client_manager.all().values():
        if not proxy.cid.isdigit():
            raise ValueError(f"client id {proxy.cid!r} is not a node id")
        proxies[int(proxy.cid)] = proxy
    return proxies


class ProxyGrid(SynchronousGrid):
    """A Message-API ``Grid`` that reaches the nodes through legacy ``ClientProxy``.

    What a Message-API strategy needs from inside ``configure_fit``: the
    connected node ids and :meth:`send_and_receive` for its extra round trips.
    A message with arrays goes by ``ClientProxy.fit``, one without by
    ``ClientProxy.get_properties``, all in parallel (as the legacy server's own
    ``fit_clients`` does); a node that fails or is gone gets an error reply, so
    the strategy's own reply checks exclude it with a log line.

    Parameters
    ----------
    client_manager : ClientManager
        The legacy server's client manager.
    max_workers : int, optional
        Threads for the parallel calls (None: Python's default).
    """

    def __init__(self, client_manager: ClientManager, max_workers: int | None = None):
        self.client_manager = client_manager
        self.max_workers = max_workers
        self._run = Run.create_empty(0)

    def get_node_ids(self) -> Iterable[int]:
        """Ids of the clients the legacy server knows."""
        return list(proxies_by_node(self.client_manager))

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Deliver each message through its node's proxy; replies in message order."""
        proxies = proxies_by_node(self.client_manager)
        outgoing = list(messages)
        with ThreadPoolExecutor(max_workers=self.max_workers) as executor:
            replies = executor.map(
                lambda message: self._exchange(message, proxies, timeout), outgoing
            )
            return list(replies)

    @staticmethod
    def _exchange(
        message: Message, proxies: Mapping[int, ClientProxy], timeout: float | None
    ) -> Message:
        node_id = message.metadata.dst_node_id
        proxy = proxies.get(node_id)
        if proxy is None:
            return Message(
                Error(ErrorCode.NODE_UNAVAILABLE, "node is not connected"),
                reply_to=message,
            )
        try:
            if message.content.array_records:
                return reply_from_fit_res(
                    message, proxy.fit(fit_ins(message), timeout, None)
                )
            config = legacy_scalars(message_config(message), "config")
            config[MESSAGE_TYPE_KEY] = message.metadata.message_type
            result = proxy.get_properties(GetPropertiesIns(config), timeout, None)
        # One node's failure, whatever it is, must not end the round: it becomes
        # an error reply that the strategy logs and leaves out.
        except Exception as exc:
            log(
                WARNING,
                "node %d: %s failed: %s",
                node_id,
                message.metadata.message_type,
                exc,
            )
            return error_reply(message, f"{type(exc).__name__}: {exc}")
        if result.status.code != Code.OK:
            return error_reply(message, result.status.message)
        content = RecordDict()
        metric_record = numeric_metrics(result.properties)
        if metric_record is not None:
            content[protocol.METRIC_RECORD] = metric_record
        return Message(content, reply_to=message)


# -- client side: legacy calls in, handler replies out ------------------------
def message_from_call(
    parameters: Sequence[NDArray[np.generic]],
    config: Mapping[str, Scalar],
    *,
    message_type: str,
    context: Context,
    keys: Sequence[str] | None = None,
) -> Message:
    """The Message-API message a legacy call carries, as its handler expects it.

    The arrays are unpacked by the config's :data:`ARRAY_LAYOUT_KEY` (see
    :func:`unpack_arrays`, which ``keys`` is passed to) and the rest of the
    config, without the transport's keys, becomes the ``config`` record.

    Parameters
    ----------
    parameters : Sequence[NDArray]
        The call's arrays (none for ``get_properties``).
    config : Mapping[str, Scalar]
        The call's config.
    message_type : str
        The message type (read from :data:`MESSAGE_TYPE_KEY` by the caller).
    context : Context
        The node's context: the message is addressed to its node.
    keys : Sequence[str], optional
        Array keys for the records, as in :func:`unpack_arrays`.
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
    :func:`reply_from_fit_res` unpacks on the server); the example count is
    the reply's ``num-examples`` metric (0 without).
    """
    arrays, layout = pack_arrays(reply.content.array_records)
    metrics = reply_scalars(reply)
    metrics[ARRAY_LAYOUT_KEY] = layout
    return arrays, int(metrics.get(protocol.NUM_EXAMPLES, 0)), metrics
