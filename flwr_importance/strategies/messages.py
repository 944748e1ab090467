"""Messages out, replies in: the connected nodes, per-node messages, query round trips.

Strategies build every message through
:meth:`~flwr_importance.strategies.base.ImportanceStrategy.build_messages`,
which calls :func:`node_messages` with the strategy's ``arrayrecord_key`` and
``configrecord_key``; :func:`send_query` sends such messages and keeps the
replies that arrived (telling the strategy's reply ledger what it dropped).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import INFO, WARNING

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from flwr_importance import protocol
from flwr_importance.strategies.replies import (
    NO_REPLY,
    ReplyLedger,
    ReplyProblem,
    error_problem,
)

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
    grid: Grid,
    messages: Sequence[Message],
    action: str,
    timeout: float,
    ledger: ReplyLedger | None = None,
) -> dict[int, Message]:
    """The good replies to the ``query.<action>`` ``messages``, by node id.

    Nodes that fail or do not answer within ``timeout`` seconds are logged and
    left out: the caller works with whoever answered (and checks the content
    of their replies). ``ledger`` counts the dropped replies and, when every
    node that answered sent an error, settles whether the client side is
    missing (:meth:`~flwr_importance.strategies.replies.ReplyLedger.settle`).

    Raises
    ------
    ClientSideMissingError
        Through ``ledger``: every node that answered has no handler for the
        query.
    """
    message_type = protocol.query_message_type(action)
    replies = grid.send_and_receive(messages, timeout=timeout)
    answered: dict[int, Message] = {}
    errors: list[ReplyProblem | None] = []
    failed: set[int] = set()
    for reply in replies:
        node_id = reply.metadata.src_node_id
        problem: ReplyProblem | None = None
        if reply.has_error():
            problem = error_problem(reply)
            errors.append(problem)
            failed.add(node_id)
        elif node_id in answered:
            problem = ReplyProblem(
                detail="duplicate reply from the same node", reason="duplicate reply"
            )
        else:
            answered[node_id] = reply
            continue
        log(WARNING, "%s: node %d failed: %s", message_type, node_id, problem)
        if ledger is not None:
            ledger.record(message_type, problem.reason)
    asked = {message.metadata.dst_node_id for message in messages}
    missing = asked - set(answered)
    if missing:
        log(
            INFO,
            "%s: %d of %d nodes did not answer",
            message_type,
            len(missing),
            len(asked),
        )
    if ledger is not None:
        ledger.record(message_type, NO_REPLY, len(missing - failed))
        if not answered:
            ledger.settle(message_type, errors)
    return answered
