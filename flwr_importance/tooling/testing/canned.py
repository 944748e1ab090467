"""Canned replies: run a strategy's server side with no ClientApp at all.

:class:`CannedReplyGrid` answers every message at once with a reply built by a
:data:`Responder`; :func:`canned_responders` gives, for the reply kinds a
canned variant of a method declares
(:class:`~flwr_importance.tooling.declarations.CannedVariant`), replies of
those kinds (model-shaped arrays, the metrics, the query answers), drawn from
a :class:`Fleet` of per-node values; :func:`canned_strategy` builds the
variant's strategy over such a fleet. The variants themselves are declared
with each method's app (``simulations/tooling.py`` collects them). Only server
work runs, so timing a round (the server-overhead benchmark) or spoiling one
reply of it (the bad-input tests) measures the strategy alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import cast

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp.strategy import Strategy
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from numpy.typing import NDArray

from flwr_importance.local_grid import SynchronousGrid
from flwr_importance.method_spec import MethodSpec
from flwr_importance.tooling.declarations import CannedSetup, CannedVariant

#: Builds a reply's content from the message it answers.
Responder = Callable[[Message], RecordDict]

#: FedSampling's size threshold ``M`` in the canned replies and strategy.
MAX_SIZE = 100

#: The reply kinds of Flower's ``FedAvg``: a model per train message.
FEDAVG_REPLIES: Mapping[str, str] = {"train": "model"}


@dataclass
class CannedReplyGrid(SynchronousGrid):
    """A grid whose nodes answer each message type with a pre-built reply.

    Parameters
    ----------
    num_nodes : int
        Connected nodes, with ids ``2..num_nodes+1``.
    responders : Mapping[str, Responder]
        Per message type, the reply content for a message.

    Attributes
    ----------
    seconds : float
        Time spent building replies since the last :meth:`reset_clock`
        (a benchmark subtracts it from the strategy's time).
    """

    num_nodes: int
    responders: Mapping[str, Responder]
    seconds: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._node_ids = list(range(2, self.num_nodes + 2))
        self._run = Run.create_empty(1)
        # Flower reads these when a Message is built (as in InProcessGrid).
        TaskIdentity.run_id = 1
        TaskIdentity.node_id = SUPERLINK_NODE_ID
        TaskIdentity.task_id = 1
        self._message_count = 0

    def reset_clock(self) -> None:
        """Start counting the grid's own time from zero."""
        self.seconds = 0.0

    def get_node_ids(self) -> Iterable[int]:
        """Ids of the connected nodes."""
        return list(self._node_ids)

    def node_index(self, node_id: int) -> int:
        """The node's position ``0..num_nodes-1`` (for per-node canned values)."""
        return node_id - 2

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """One canned reply per message, built now."""
        start = time.perf_counter()
        replies = [self.reply_to(message) for message in messages]
        self.seconds += time.perf_counter() - start
        return replies

    def reply_to(self, message: Message) -> Message:
        """The canned reply to ``message``, addressed as a node's would be."""
        self._message_count += 1
        message.metadata.__dict__["_message_id"] = f"{self._message_count:032x}"
        content = self.responders[message.metadata.message_type](message)
        return Message(content, reply_to=message)


@dataclass(frozen=True)
class Fleet:
    """Per-node values the canned replies report, the model and reply models.

    Attributes
    ----------
    model : ArrayRecord
        The global model the strategy starts from.
    reply_models : tuple[ArrayRecord, ...]
        Model-shaped arrays the nodes send, node ``i`` the ``i``-th modulo
        their number (a pool: distinct replies for every node of a large
        fleet would not fit in memory).
    sizes : NDArray[np.int64]
        Each node's sample count, by node position.
    norms : NDArray[np.float64]
        Each node's update norm, by node position.
    """

    model: ArrayRecord
    reply_models: tuple[ArrayRecord, ...]
    sizes: NDArray[np.int64]
    norms: NDArray[np.float64]

    @classmethod
    def skewed(
        cls,
        *,
        num_nodes: int,
        model: ArrayRecord,
        reply_models: Iterable[ArrayRecord],
        seed: int = 0,
    ) -> Fleet:
        """Log-normal sizes (at least 1) and update norms, skewed as non-IID nodes."""
        rng = np.random.default_rng(seed)
        return cls(
            model=model,
            reply_models=tuple(reply_models),
            sizes=np.maximum(1, rng.lognormal(4.0, 1.0, num_nodes)).astype(np.int64),
            norms=rng.lognormal(0.0, 0.5, num_nodes),
        )

    @property
    def num_nodes(self) -> int:
        """Number of nodes the fleet describes."""
        return len(self.sizes)

    def reply_model(self, node_index: int, offset: int = 0) -> ArrayRecord:
        """The model-shaped arrays node ``node_index`` sends (``offset``: another)."""
        return self.reply_models[(node_index + offset) % len(self.reply_models)]


def canned_responders(
    replies: Mapping[str, str], *, fleet: Fleet, node_index: Callable[[int], int]
) -> dict[str, Responder]:
    """The message types a strategy sends and the canned reply to each.

    Parameters
    ----------
    replies : Mapping[str, str]
        Per message type, the reply kind (:func:`reply_kinds`): a canned
        variant's ``replies``, or :data:`FEDAVG_REPLIES` for Flower's
        ``FedAvg``.
    fleet : Fleet
        The per-node values the replies carry.
    node_index : Callable[[int], int]
        A node id's position in the fleet (:meth:`CannedReplyGrid.node_index`).

    Returns
    -------
    dict[str, Responder]
        Per message type (``train``, ``query.sizes`` ...), its responder.
    """
    kinds = reply_kinds(fleet=fleet, node_index=node_index)
    return {message_type: kinds[kind] for message_type, kind in replies.items()}


def reply_kinds(
    *, fleet: Fleet, node_index: Callable[[int], int]
) -> dict[str, Responder]:
    """Every kind of canned reply a registry declaration may name.

    ``model`` (FedAvg's train reply: the model and ``num-examples``),
    ``isfedavg-train`` (plus eq. 29's and eq. 14's reports), ``folb-train``
    (update, gradient and ``gamma``), ``sizes`` (``num-examples``),
    ``size-response`` (FedSampling's randomized size), ``gradient-sum``
    (FedSampling's ``G_c``), ``norm`` and ``loss`` (the query replies of model
    0) and ``kept-update`` (the OCS/MMFL train reply).
    """

    def size_of(message: Message) -> int:
        return int(fleet.sizes[node_index(message.metadata.dst_node_id)])

    def arrays_of(message: Message, offset: int = 0) -> ArrayRecord:
        return fleet.reply_model(node_index(message.metadata.dst_node_id), offset)

    def metrics(values: Mapping[str, float]) -> RecordDict:
        return RecordDict({"metrics": MetricRecord(dict(values))})

    def model_reply(extra: Callable[[Message], dict[str, float]]) -> Responder:
        def respond(message: Message) -> RecordDict:
            content = metrics({"num-examples": size_of(message), **extra(message)})
            content["arrays"] = arrays_of(message)
            return content

        return respond

    def model_zero_metric(key: str, values: NDArray[np.floating]) -> Responder:
        def respond(message: Message) -> RecordDict:
            index = node_index(message.metadata.dst_node_id)
            return metrics(
                {f"{key}-0": float(values[index]), "num-examples-0": size_of(message)}
            )

        return respond

    def kept_update(message: Message) -> RecordDict:
        model_index = message.content.config_records["config"]["model-index"]
        content = metrics(
            {
                "num-examples": size_of(message),
                "train-loss": 1.0,
                "model-index": int(cast(int, model_index)),
            }
        )
        content["update"] = arrays_of(message)
        return content

    def folb_train(message: Message) -> RecordDict:
        content = metrics({"num-examples": size_of(message), "gamma": 0.5})
        content["update"] = arrays_of(message)
        content["gradient"] = arrays_of(message, offset=1)
        return content

    return {
        "model": model_reply(lambda message: {}),
        "isfedavg-train": model_reply(
            lambda message: {"isfedavg-sigma2": 0.5, "isfedavg-g2": 1.0}
        ),
        "folb-train": folb_train,
        "sizes": lambda message: metrics({"num-examples": size_of(message)}),
        "size-response": lambda message: metrics(
            {"size-response": min(size_of(message), MAX_SIZE - 1)}
        ),
        "gradient-sum": lambda message: RecordDict({"arrays": arrays_of(message)}),
        # Norms double as losses: both only need to differ between nodes.
        "norm": model_zero_metric("update-norm", fleet.norms),
        "loss": model_zero_metric("loss", fleet.norms),
        "kept-update": kept_update,
    }


def canned_strategy(
    spec: MethodSpec,
    variant: CannedVariant,
    *,
    clients_per_round: int,
    fleet: Fleet,
    projection_dim: int,
) -> Strategy:
    """The method's strategy in a canned variant's configuration.

    The variant gives its arguments (federated evaluation off; FedSampling
    trains every node with ``K`` a tenth of the fleet's samples).

    Parameters
    ----------
    spec : MethodSpec
        The method.
    variant : CannedVariant
        One of its canned variants (``simulations/tooling.py``'s
        ``canned_variants()`` has every method's, by name).
    clients_per_round : int
        ``m``.
    fleet : Fleet
        The nodes (their sizes give the total size).
    projection_dim : int
        Clustered sampling's ``projection_dim`` (similarity variant).

    Returns
    -------
    Strategy
        A fresh strategy, seeded with its default seed.
    """
    setup = CannedSetup(
        clients_per_round=clients_per_round,
        total_size=int(fleet.sizes.sum()),
        max_size=MAX_SIZE,
        projection_dim=projection_dim,
    )
    return spec.build(**variant.arguments(setup))
