"""Messages out, replies in: the connected nodes, per-node messages, query round trips.

Strategies build every message through
:meth:`~flwr_importance.strategies.base.ImportanceStrategy.build_messages`,
which calls :func:`node_messages` with the strategy's ``arrayrecord_key`` and
``configrecord_key``; :func:`send_query` sends such messages and keeps the
replies that arrived.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import INFO, WARNING

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import sample_nodes

#: What a message shares with every node: one ArrayRecord (stored under
#: ``arrayrecord_key``) or several, by name (e.g. one per model).
SharedArrays = ArrayRecord | Mapping[str, ArrayRecord] | None


def connected_nodes(grid: Grid, min_available_nodes: int) -> list[int]:
    """The connected node ids, sorted.

    Waits until at least ``min_available_nodes`` (and at least one) are
    connected; waits as Flower's ``FedAvg`` does; sorted so that a seeded draw over them
    does not depend on the order the grid lists them in.
    """
    _, connected = sample_nodes(grid, max(min_available_nodes, 1), 0)
    return sorted(connected)


def warn_if_fewer_nodes(num_nodes: int, clients_per_round: int, effect: str) -> None:
    """Warn, every round it happens, that fewer nodes are connected than sampled.

    A method configured for more clients than the federation has does not
    sample at all (every node takes part, or draws repeat): the run looks like
    the method's but is not. ``effect`` says what the method does instead.
    """
    if num_nodes < clients_per_round:
        log(
            WARNING,
            "configure_train: %d nodes connected, fewer than clients_per_round=%d: "
            "%s; start more nodes or lower clients_per_round",
            num_nodes,
            clients_per_round,
            effect,
        )


def node_messages(
    node_configs: Mapping[int, ConfigRecord],
    message_type: str,
    arrays: SharedArrays,
    arrayrecord_key: str,
    configrecord_key: str,
) -> list[Message]:
    """One message per node, each with its own config (and the shared arrays)."""
    named_arrays: Mapping[str, ArrayRecord] = (
        {arrayrecord_key: arrays} if isinstance(arrays, ArrayRecord) else arrays or {}
    )
    # Nodes given the same ConfigRecord object share one RecordDict, as all
    # nodes do in Flower's FedAvg: a RecordDict per node costs more than the
    # rest of a 1,000-node query round.
    contents: dict[int, RecordDict] = {}
    messages = []
    for node_id, config in node_configs.items():
        content = contents.get(id(config))
        if content is None:
            content = RecordDict({configrecord_key: config, **named_arrays})
            contents[id(config)] = content
        messages.append(Message(content, node_id, message_type))
    return messages


def send_query(
    grid: Grid, messages: Sequence[Message], action: str, timeout: float
) -> dict[int, Message]:
    """The good replies to the ``query.<action>`` ``messages``, by node id.

    Nodes that fail or do not answer within ``timeout`` seconds are logged and
    left out: the caller works with whoever answered.
    """
    replies = grid.send_and_receive(messages, timeout=timeout)
    answered: dict[int, Message] = {}
    for reply in replies:
        node_id = reply.metadata.src_node_id
        if reply.has_error():
            log(
                WARNING,
                "query.%s: node %d failed: %s",
                action,
                node_id,
                reply.error.reason,
            )
        elif node_id in answered:
            log(
                WARNING,
                "query.%s: duplicate reply from node %d ignored",
                action,
                node_id,
            )
        else:
            answered[node_id] = reply
    asked = {message.metadata.dst_node_id for message in messages}
    missing = asked - set(answered)
    if missing:
        log(
            INFO,
            "query.%s: %d of %d nodes did not answer",
            action,
            len(missing),
            len(asked),
        )
    return answered
