"""Shared base of MD and clustered sampling: draws with repeats, mean with multiplicity.

Both schemes of Fraboni et al. (ICML 2021) draw ``m`` clients *with repeats*
and set the new global model to the plain mean of the ``m`` drawn models, a
client drawn twice counting twice (paper, eq. 3 with ``omega_i`` = times drawn
/ ``m``).  They differ only in how the ``m`` draws are made, which is the one
abstract method, :meth:`MultisetSampling.draw_clients`.

A client drawn several times trains once: its model is the same whichever draw
it answers, so sending it several messages would only repeat the work.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from numpy.typing import NDArray

from flwr_importance import protocol
from flwr_importance.strategies.base import ImportanceStrategy, RoundPlan, log_settings
from flwr_importance.strategies.messages import connected_nodes, warn_if_fewer_nodes
from flwr_importance.strategies.replies import CheckedReply, ClientSide
from flwr_importance.strategies.report_bounds import (
    bound_reports,
    check_report_cap,
    report_cap_setting,
)
from flwr_importance.validation import check_count

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from flwr_importance.strategies.base import StrategyOptions


@dataclass(kw_only=True)
class DrawRound:
    """What a round's draw may use besides the sizes, and the metrics it adds.

    Attributes
    ----------
    server_round : int
        The round.
    arrays : ArrayRecord
        The global model the round starts from.
    grid : Grid
        The grid, for a draw that asks the nodes first (a query).
    metrics : dict[str, int | float]
        Round metrics the draw reports; ``aggregate_train`` adds them to its
        own.
    """

    server_round: int
    arrays: ArrayRecord
    grid: Grid
    metrics: dict[str, int | float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class DrawPlan(RoundPlan):
    """A round's draws and the round metrics its draw reported.

    ``drawn`` counts how often each node of ``nodes`` was drawn;
    ``draw_metrics`` are :attr:`DrawRound.metrics`.
    """

    drawn: Counter[int]
    draw_metrics: Mapping[str, int | float]


class MultisetSampling(ImportanceStrategy[DrawPlan], ABC):
    """``m`` draws with repeats, one training per distinct client, mean with repeats.

    Keeps every connected node's sample count ``n_i``: asked with a
    ``query.sizes`` round trip the first time a node is seen (the first round,
    and whenever nodes join), refreshed from the ``num-examples`` of its train
    replies, forgotten when the node leaves.  A node that does not answer the
    size query is not drawn this round and is asked again the next.

    Parameters
    ----------
    clients_per_round : int
        ``m``, the number of draws per round (>= 1).
    report_cap : float or None (default: None)
        Clip each reported size above ``report_cap`` times the round's median
        size (``> 1``, logged by node) before the draw; None: no bound
        (docs/deployment.md, "A dishonest node's reach").

    Other Parameters
    ----------------
    **options
        The shared settings of
        :class:`~flwr_importance.strategies.base.ImportanceStrategy`, with its
        defaults: ``seed`` seeds the draws, ``query_timeout`` bounds the wait
        for the size replies.
    """

    #: What a round does when fewer nodes are connected than ``m`` (logged).
    fewer_nodes_effect = "the m draws repeat nodes"
    client_side = ClientSide(
        "add `add_size_query(app, num_examples=...)` "
        "(flwr_importance.clientapps.sizes) beside a train function that "
        "replies `num-examples`",
        "docs/methods.md#4-clustered-sampling-and-md-sampling",
    )

    def __init__(
        self,
        *,
        clients_per_round: int,
        report_cap: float | None = None,
        **options: Unpack[StrategyOptions],
    ) -> None:
        self.clients_per_round = check_count("clients_per_round", clients_per_round)
        self.report_cap = check_report_cap(report_cap)
        super().__init__(**options)
        self._sizes: dict[int, int] = {}

    # -- what a sampling scheme defines ------------------------------------------
    @abstractmethod
    def draw_clients(
        self, node_ids: Sequence[int], sizes: NDArray[np.int64], draw: DrawRound
    ) -> NDArray[np.intp]:
        """The round's ``m`` draws, as positions in ``node_ids`` (repeats allowed).

        ``sizes[i]`` is the sample count of ``node_ids[i]``; they do not all
        vanish. ``draw`` gives the round, the model and the grid, and takes
        the round metrics the draw reports.
        """

    def track_nodes(self, node_ids: Sequence[int]) -> None:
        """Called each round with the nodes that can be drawn (drop the others)."""

    def keeps_updates(self) -> bool:
        """Whether :meth:`record_updates` needs the returned models (default no)."""
        return False

    def record_replies(self, replies: Sequence[CheckedReply]) -> None:
        """Receive the round's usable train replies, checked (default: ignore).

        For what a subclass keeps from them besides the sizes (e.g. the
        losses Power-of-Choice's ``rpow-d`` ranks by).
        """

    def record_updates(
        self, models: Mapping[int, ArrayRecord], global_model: ArrayRecord
    ) -> None:
        """Receive the returned models and the model they started from.

        Called only when :meth:`keeps_updates` is true.
        """

    # -- read-only views -------------------------------------------------------
    @property
    def drawn_counts(self) -> dict[int, int]:
        """Times each node was drawn in the latest round (a node id -> count map)."""
        return {} if self.plan is None else dict(self.plan.drawn)

    @property
    def sizes(self) -> dict[int, int]:
        """The sample count known for each node."""
        return dict(self._sizes)

    def summary(self) -> None:
        """Log :meth:`sampling_settings` under the class name, then the shared ones."""
        log_settings(type(self).__name__, self.sampling_settings())
        super().summary()

    def sampling_settings(self) -> dict[str, object]:
        """The sampling scheme's settings, by label; subclasses add theirs."""
        return {
            "Draws per round (m)": self.clients_per_round,
            **report_cap_setting(self.report_cap),
        }

    # -- Flower's Strategy API -------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Draw ``m`` clients with repeats; one train message per distinct client."""
        connected = connected_nodes(grid, self.min_available_nodes)
        warn_if_fewer_nodes(
            len(connected), self.clients_per_round, self.fewer_nodes_effect
        )
        self._refresh_sizes(server_round, sorted(connected), grid)
        node_ids = sorted(self._sizes)
        self.track_nodes(node_ids)
        sizes = np.array([self._sizes[node_id] for node_id in node_ids], np.int64)
        if self.report_cap is not None:
            # Whole sample counts still: the bound is above 1 when it bites.
            sizes = np.floor(
                bound_reports(
                    sizes,
                    self.report_cap,
                    node_ids,
                    protocol.NUM_EXAMPLES,
                    "configure_train",
                )
            ).astype(np.int64)
        if sizes.sum() == 0:
            log(WARNING, "configure_train: no client with a known, positive size")
            return []
        draw = DrawRound(server_round=server_round, arrays=arrays, grid=grid)
        positions = self.draw_clients(node_ids, sizes, draw)
        drawn = Counter(node_ids[position] for position in positions)
        self.keep_plan(
            DrawPlan(
                server_round=server_round,
                arrays=arrays,
                nodes=frozenset(drawn),
                drawn=drawn,
                draw_metrics=draw.metrics,
            )
        )
        log(
            INFO,
            "configure_train: %d draws, %d distinct clients (of %d)",
            len(positions),
            len(drawn),
            len(node_ids),
        )
        config[protocol.SERVER_ROUND] = server_round
        return self.build_messages(
            dict.fromkeys(sorted(drawn), config), MessageType.TRAIN, arrays
        )

    def aggregate_round(
        self, plan: DrawPlan, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Plain mean of the returned models, each counted as often as drawn.

        A drawn client that fails or sends a bad reply is left out: the mean
        is over the draws that came back (docs/methods.md, section "4.
        Clustered sampling (and MD sampling)", failed replies). No usable
        reply: the model stays.
        """
        usable = self.check_replies(
            replies,
            nonnegative_keys=[protocol.NUM_EXAMPLES],
            expected_arrays=plan.arrays,
            expected_nodes=plan.nodes,
        )
        if not usable:
            log(WARNING, "aggregate_train: no usable reply, the model is unchanged")
            return None, None
        for reply in usable:
            self._store_size(reply, "aggregate_train")
        self.record_replies(usable)
        multiplicity = np.array([plan.drawn[reply.node_id] for reply in usable])
        weights = multiplicity / multiplicity.sum()
        if self.keeps_updates():
            returned = {reply.node_id: reply.array_record for reply in usable}
            self.record_updates(returned, plan.arrays)
        arrays = self.release(
            plan.arrays,
            [reply.array_record for reply in usable],
            multiplicity.astype(np.float64),
            mean_of=plan.drawn.total(),
        )
        metrics = _round_metrics(usable, weights, multiplicity)
        return arrays, MetricRecord({**metrics, **plan.draw_metrics})

    # -- sizes -----------------------------------------------------------------
    def _refresh_sizes(
        self, server_round: int, connected: list[int], grid: Grid
    ) -> None:
        """Forget departed nodes; ask newly seen ones for their size."""
        for node_id in set(self._sizes) - set(connected):
            del self._sizes[node_id]
        unknown = [node_id for node_id in connected if node_id not in self._sizes]
        if not unknown:
            return
        query_config = ConfigRecord({protocol.SERVER_ROUND: server_round})
        replies = self.query(
            grid, dict.fromkeys(unknown, query_config), protocol.SIZES_QUERY
        )
        context = protocol.query_message_type(protocol.SIZES_QUERY)
        for reply in self.check_replies(
            replies.values(), nonnegative_keys=[protocol.NUM_EXAMPLES], context=context
        ):
            self._store_size(reply, context)

    def _store_size(self, reply: CheckedReply, context: str) -> None:
        """Keep a reply's ``num-examples`` if it is a whole number (logged if not)."""
        size = reply.metrics[protocol.NUM_EXAMPLES]
        if size != int(size):
            log(
                WARNING,
                "%s: node %d sent a non-integer %s (%r), size not updated",
                context,
                reply.node_id,
                protocol.NUM_EXAMPLES,
                size,
            )
            return
        self._sizes[reply.node_id] = int(size)


def _round_metrics(
    replies: Sequence[CheckedReply],
    weights: NDArray[np.float64],
    multiplicity: NDArray[np.int64],
) -> MetricRecord:
    """Multiplicity-weighted means of the metrics all replies share, and the counts.

    ``distinct-clients`` is the number of distinct clients aggregated this
    round, ``aggregated-draws`` the number of draws they account for.
    """
    shared = set.intersection(*(set(reply.metrics) for reply in replies))
    metrics: dict[str, int | float | list[int] | list[float]] = {
        key: float(np.dot(weights, [reply.metrics[key] for reply in replies]))
        for key in sorted(shared)
    }
    metrics["distinct-clients"] = len(replies)
    metrics["aggregated-draws"] = int(multiplicity.sum())
    return MetricRecord(metrics)
