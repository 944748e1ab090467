"""A privacy ledger: the size queries each node answered, and what they spent.

FedSampling asks every available node for its size each round, and each
answer is a fresh epsilon-LDP randomized response
(:func:`~flwr_importance.sampling.privacy.privatize_size`): a node's privacy
loss grows with the queries it answers. :class:`PrivacyLedger` counts them per
node id and composes their epsilon two ways, by the basic composition theorem
(``k eps``, pure) and by the advanced composition theorem at a stated
``delta'``.

**Decision:** a node has answered when its reply reached the server, whether
or not the reply was then usable: a malformed reply (a size out of range, a
missing metric) still left the node, so it counts. An error reply carries no
content and a node that stayed silent sent nothing: neither counts. A reply
that arrives after the query's timeout is never read by the server and is not
counted, although the node did send it: the node's own count is the
authoritative one for the node.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from flwr_importance.sampling.privacy import (
    advanced_composition_crossover,
    advanced_composition_epsilon,
    basic_composition_epsilon,
)

#: ``delta'`` of the advanced composition column when none is given: the
#: chance that the bound fails, per node. Well below one over the number of
#: nodes of any federation this library runs (the usual rule for ``delta``).
DEFAULT_DELTA_PRIME = 1e-6

#: Flower's node ids are unsigned 64-bit integers.
NODE_ID_LIMIT = 2**64


@dataclass(frozen=True, kw_only=True)
class PrivacySpend:
    """Each node's cumulative privacy loss from its size replies, after a round.

    Columns in the order of ``node_ids`` (ascending); a node that has not yet
    answered spent nothing and is not listed.

    Attributes
    ----------
    server_round : int
        The round whose end the columns describe.
    node_ids : tuple of int
        The nodes that answered at least one size query, as exact integers.
    size_queries : tuple of int
        ``k``, the size queries each answered.
    basic_epsilon : tuple of float
        ``k eps``: the node's size is ``(k eps, 0)``-LDP (basic composition).
    advanced_epsilon : tuple of float
        The advanced composition theorem's ``eps'`` at ``delta'``, or
        ``k eps`` where that is smaller: either way the node's size is
        ``(advanced_epsilon, delta')``-LDP, since ``(k eps, 0)``-LDP implies
        ``(k eps, delta')``-LDP.
    """

    server_round: int
    node_ids: tuple[int, ...]
    size_queries: tuple[int, ...]
    basic_epsilon: tuple[float, ...]
    advanced_epsilon: tuple[float, ...]


@dataclass(frozen=True, kw_only=True)
class NodeReport:
    """What a node's own ledger said in its latest size reply.

    Attributes
    ----------
    answers : int
        The size replies the node says it has sent, that one included.
    epsilon_spent : float
        Their epsilon added up, as the node counts it.
    reproducible_coins : bool
        The node drew its coins from seeded streams the server can replay:
        its replies are then not private, whatever the epsilons say.
    """

    answers: int
    epsilon_spent: float
    reproducible_coins: bool


class PrivacyLedger:
    """Per node id, the size queries it answered and the epsilon they spent.

    Parameters
    ----------
    epsilon : float
        The LDP budget of one size reply, positive and finite.
    delta_prime : float (default: DEFAULT_DELTA_PRIME)
        ``delta'`` of the advanced composition column, in ``(0, 1)``.

    Attributes
    ----------
    advanced_from : int or None
        The fewest answers from which the advanced composition bound is below
        ``k eps`` (None: never, as at ``epsilon >= ln 2``); below it the two
        columns are equal.

    Raises
    ------
    ValueError
        If ``epsilon`` is not positive and finite or ``delta_prime`` not in
        ``(0, 1)``.

    Examples
    --------
    Node ids keep all 64 bits:

    >>> ledger = PrivacyLedger(epsilon=0.5)
    >>> ledger.record(1, [2**64 - 1, 7])
    >>> ledger.record(3, [7])
    >>> spend = ledger.spend(3)
    >>> spend.node_ids, spend.size_queries, spend.basic_epsilon
    ((7, 18446744073709551615), (2, 1), (1.0, 0.5))
    >>> ledger.spend(2).size_queries, ledger.spend(0).node_ids
    ((1, 1), ())
    """

    def __init__(
        self, *, epsilon: float, delta_prime: float = DEFAULT_DELTA_PRIME
    ) -> None:
        # Also validates epsilon and delta_prime, with the reason.
        self.advanced_from = advanced_composition_crossover(epsilon, delta_prime)
        self.epsilon = epsilon
        self.delta_prime = delta_prime
        # Per node, the rounds of its answers in order (a round twice if it
        # answered two queries in it): any round's count is one bisection.
        self._answer_rounds: dict[int, list[int]] = {}
        self._last_round = 0
        #: Per round, per node, its own ledger as its size reply stated it.
        self.node_reports: dict[int, dict[int, NodeReport]] = {}

    def record(self, server_round: int, node_ids: Collection[int]) -> None:
        """Count one size query answered by each of ``node_ids`` in ``server_round``.

        Raises
        ------
        ValueError
            If ``server_round`` is before a round already recorded, a node id
            is not an integer in ``[0, 2**64)``, or one appears twice.
        """
        if server_round < self._last_round:
            raise ValueError(
                f"round {server_round} recorded after round {self._last_round}: "
                "record the rounds in order"
            )
        nodes = [_node_id(node_id) for node_id in node_ids]
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"a node answers a query once, got {sorted(nodes)}")
        self._last_round = server_round
        for node_id in nodes:
            self._answer_rounds.setdefault(node_id, []).append(server_round)

    def record_node_reports(
        self, server_round: int, reports: dict[int, NodeReport]
    ) -> None:
        """Keep what each node's own ledger said in ``server_round``'s size reply."""
        self.node_reports[server_round] = {
            _node_id(node_id): report for node_id, report in reports.items()
        }

    def latest_node_reports(self, server_round: int) -> dict[int, NodeReport]:
        """Per node, the latest report up to the end of ``server_round``."""
        latest: dict[int, NodeReport] = {}
        for reported_round in sorted(self.node_reports):
            if reported_round <= server_round:
                latest.update(self.node_reports[reported_round])
        return latest

    def answers(self, server_round: int) -> dict[int, int]:
        """Per node, the size queries it answered up to the end of ``server_round``."""
        counts = {
            node_id: bisect.bisect_right(rounds, server_round)
            for node_id, rounds in self._answer_rounds.items()
        }
        return {node_id: count for node_id, count in counts.items() if count}

    def spend(self, server_round: int) -> PrivacySpend:
        """Each node's cumulative epsilon at the end of ``server_round``."""
        counts = sorted(self.answers(server_round).items())
        queries = np.array([count for _, count in counts], dtype=np.int64)
        basic = basic_composition_epsilon(self.epsilon, queries)
        advanced = np.minimum(
            basic,
            advanced_composition_epsilon(self.epsilon, queries, self.delta_prime),
        )
        return PrivacySpend(
            server_round=server_round,
            node_ids=tuple(node_id for node_id, _ in counts),
            size_queries=tuple(int(count) for count in queries),
            basic_epsilon=tuple(float(value) for value in basic),
            advanced_epsilon=tuple(float(value) for value in advanced),
        )


def _node_id(node_id: int) -> int:
    """``node_id`` as a Python int, checked to be a Flower (uint64) node id."""
    if isinstance(node_id, bool):
        raise ValueError(f"node ids are integers, got {node_id!r}")
    exact = operator.index(node_id)
    if not 0 <= exact < NODE_ID_LIMIT:
        raise ValueError(f"node ids lie in [0, 2**64), got {node_id!r}")
    return exact
