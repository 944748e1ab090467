"""The server's end of the legacy transport: instructions out, replies in.

The legacy strategies run a Message-API strategy inside ``configure_fit`` and
``aggregate_fit``; its messages travel as legacy calls in the wire format of
:mod:`flwr_importance.legacy_wire` (the message type and array layout in the
config, a message with arrays by ``fit``, one without by ``get_properties``).
This module holds the server's end of that mapping: :class:`ProxyGrid`, a
Message-API ``Grid`` over the legacy ``ClientProxy`` objects (what lets a
Message-API strategy send its extra queries from inside ``configure_fit``),
and the conversions of instructions into legacy calls and of their results
into Message-API replies. The client's end, which rebuilds the message from
the call, is :mod:`flwr_importance.clientapps.legacy_calls`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from logging import WARNING

from flwr.app import Error, Message, RecordDict
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    GetPropertiesIns,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.constant import ErrorCode
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.supercore.run import Run

from flwr_importance import protocol
from flwr_importance.clientapps.messages import message_config
from flwr_importance.legacy_wire import (
    ARRAY_LAYOUT_KEY,
    MESSAGE_TYPE_KEY,
    legacy_scalars,
    numeric_metrics,
    pack_arrays,
    unpack_arrays,
)
from flwr_importance.local_grid import SynchronousGrid


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
