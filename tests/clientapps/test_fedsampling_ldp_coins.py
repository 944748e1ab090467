"""A server that replays the nodes' size-reply coins learns nothing from them.

The attack: the server knows the run config (its ``seed``) and every node's
partition id, so it can rebuild any stream the ClientApp seeds from them. For
each node it replays the ready-made size handler's coins as the old handlers
drew them (:func:`~flwr_importance.clientapps.fedsampling.node_round_streams`
of the node's task seed): where the replayed coin says "random branch", the
replayed uniform draw *is* the reply, and the server knows the reply carries
nothing; where it says "truthful", the server reads the node's exact size.

With private coins the replayed draws are independent of the node's: the
replayed uniform matches the reply only by chance. Among the nodes whose
replayed coin is "random", a reply equals the replayed draw with probability
``P(reply = v)`` for a fixed ``v``: at most ``alpha + (1 - alpha)/(M - 1)``
(``v`` the node's clipped size) and ``(1 - alpha)/(M - 1)`` otherwise. The
test bounds the hit rate by that largest chance plus 4 binomial standard
errors of the number of trials.
"""

from __future__ import annotations

import math

import numpy as np
from flwr.app import ConfigRecord, Context, Message, Metadata, RecordDict

from flwr_importance import protocol
from flwr_importance.clientapps.fedsampling import (
    make_fedsampling_handlers,
    node_round_streams,
)
from flwr_importance.sampling.privacy import ldp_alpha
from simulations.inprocess import resolve_run_config
from simulations.task import local_task

NUM_NODES, ROUNDS, MAX_SIZE, EPSILON = 40, 10, 100, 3.0
RUN_CONFIG = resolve_run_config(
    {
        "strategy": "fedsampling",
        "dataset": "digits",
        "partitioning": "lognormal",
        "model": "logreg",
        "num-supernodes": NUM_NODES,
        "fedsampling-epsilon": EPSILON,
        "fedsampling-max-size": MAX_SIZE,
    }
)


def node_context(partition_id: int, state: RecordDict) -> Context:
    node_config = {"partition-id": partition_id, "num-partitions": NUM_NODES}
    return Context(0, 1000 + partition_id, node_config, state, RUN_CONFIG)


def size_query(server_round: int) -> Message:
    config = ConfigRecord(
        {
            protocol.FEDSAMPLING_MAX_SIZE: MAX_SIZE,
            protocol.FEDSAMPLING_EPSILON: EPSILON,
            protocol.SERVER_ROUND: server_round,
        }
    )
    message_type = protocol.query_message_type(protocol.SIZES_QUERY)
    metadata = Metadata(0, "m", 0, 1, "", "1", 0.0, 3600.0, message_type)
    return Message(metadata=metadata, content=RecordDict({"config": config}))


def replayed_hits() -> tuple[int, int]:
    """(replies equal to the replayed draw, nodes replayed as "random")."""
    handler = make_fedsampling_handlers(local_task)[
        protocol.query_message_type(protocol.SIZES_QUERY)
    ]
    alpha = ldp_alpha(EPSILON, MAX_SIZE)
    hits = trials = 0
    for partition_id in range(NUM_NODES):
        state = RecordDict()
        seed = local_task(node_context(partition_id, state)).seed
        for server_round in range(1, ROUNDS + 1):
            reply = handler(size_query(server_round), node_context(partition_id, state))
            response = reply.content.metric_records[protocol.METRIC_RECORD][
                protocol.FEDSAMPLING_SIZE_RESPONSE
            ]
            # The attacker's replay of the old handler's reply stream.
            _, replayed = node_round_streams(seed, server_round)
            truthful = replayed.random() < alpha
            random_size = int(replayed.integers(1, MAX_SIZE))
            if not truthful:
                trials += 1
                hits += response == random_size
    return hits, trials


def test_the_server_cannot_replay_the_size_reply_coins() -> None:
    hits, trials = replayed_hits()
    alpha = ldp_alpha(EPSILON, MAX_SIZE)
    chance = alpha + (1 - alpha) / (MAX_SIZE - 1)
    bound = chance + 4 * math.sqrt(chance * (1 - chance) / trials)
    assert trials > 0.5 * NUM_NODES * ROUNDS
    assert hits / trials <= bound, (
        f"the server rebuilt {hits} of {trials} random-branch replies from the "
        "run config and partition ids"
    )


def test_the_replay_finds_reproducible_coins() -> None:
    """The same attack on the option that is unsafe by name rebuilds every reply."""
    global RUN_CONFIG
    saved = RUN_CONFIG
    RUN_CONFIG = {**saved, "fedsampling-unsafe-reproducible-coins": True}
    try:
        hits, trials = replayed_hits()
    finally:
        RUN_CONFIG = saved
    assert hits == trials > 0


def test_reproducible_and_private_replies_keep_the_exact_distribution() -> None:
    """Private coins still answer by randomized response (reply = size at rate)."""
    handler = make_fedsampling_handlers(local_task)[
        protocol.query_message_type(protocol.SIZES_QUERY)
    ]
    state = RecordDict()
    size = min(len(local_task(node_context(0, state)).x), MAX_SIZE - 1)
    replies = np.array(
        [
            handler(size_query(r), node_context(0, state)).content.metric_records[
                protocol.METRIC_RECORD
            ][protocol.FEDSAMPLING_SIZE_RESPONSE]
            for r in range(1, 401)
        ]
    )
    alpha = ldp_alpha(EPSILON, MAX_SIZE)
    expected = alpha + (1 - alpha) / (MAX_SIZE - 1)
    assert abs(np.mean(replies == size) - expected) < 4 * math.sqrt(
        expected * (1 - expected) / replies.size
    )
