"""FedSampling's size query on the client: a randomized-response size, torch-free.

Qi et al., "FedSampling: A Better Sampling Strategy for Federated Learning",
IJCAI 2023, eq. 1. The node's true size ``|D_c|`` never leaves it: the
``query.sizes`` reply is the clipped size with probability ``alpha``, else a
uniform draw (:func:`~flwr_importance.sampling.privatize_size`). One line on
any framework's ClientApp::

    add_private_size_query(
        app, num_examples=lambda ctx: len(load_trainset(ctx)), max_epsilon=3.0
    )

Its coins come from OS entropy and it refuses a query asking for more than
``max_epsilon``; it keeps its own ledger (:class:`NodeLedger`).

The rest of FedSampling's client (the round's kept samples and ``G_c``) needs
gradients: :mod:`flwr_importance.clientapps.fedsampling`, which re-exports
these two functions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from flwr_importance import protocol
from flwr_importance.clientapps.messages import config_number, metrics_reply
from flwr_importance.clientapps.sizes import SampleCount, sample_count_source
from flwr_importance.sampling.privacy import privatize_size
from flwr_importance.validation import check_positive

#: The node state's record of its own privacy ledger (answers, epsilon spent).
NODE_LEDGER_RECORD = "fedsampling-node-ledger"


@dataclass(frozen=True, kw_only=True)
class NodeLedger:
    """What this node's size replies have spent in the run: its own count.

    Kept in the node's state (``context.state``, record
    :data:`NODE_LEDGER_RECORD`), so it holds whatever the server counts: the
    server's :class:`~flwr_importance.sampling.PrivacyLedger` sees only the
    replies that reached it.

    Attributes
    ----------
    answers : int
        Size replies sent.
    epsilon_spent : float
        Their epsilons added up (basic composition).
    """

    answers: int = 0
    epsilon_spent: float = 0.0

    @classmethod
    def load(cls, context: Context) -> NodeLedger:
        """The ledger in ``context.state`` (empty on the node's first query)."""
        record = context.state.config_records.get(NODE_LEDGER_RECORD)
        if record is None:
            return cls()
        return cls(
            answers=int(record["answers"]),  # type: ignore[arg-type]
            epsilon_spent=float(record["epsilon-spent"]),  # type: ignore[arg-type]
        )

    def charged(self, epsilon: float) -> NodeLedger:
        """The ledger after one more reply at ``epsilon``."""
        return NodeLedger(
            answers=self.answers + 1, epsilon_spent=self.epsilon_spent + epsilon
        )

    def save(self, context: Context) -> None:
        """Write the ledger into ``context.state``."""
        context.state[NODE_LEDGER_RECORD] = ConfigRecord(
            {"answers": self.answers, "epsilon-spent": self.epsilon_spent}
        )


def node_epsilon_cap(context: Context, max_epsilon: float | None = None) -> float:
    """The largest epsilon one size reply of this node may spend.

    ``max_epsilon`` when given, else the node config's
    ``fedsampling-max-epsilon`` (the node operator's own setting). The server
    chooses the epsilon of each query, so the cap must come from the node.

    Raises
    ------
    ValueError
        ``client side misconfigured``: neither is set.
    """
    if max_epsilon is None:
        value = context.node_config.get(protocol.FEDSAMPLING_MAX_EPSILON_NODE_KEY)
        if value is None:
            raise ValueError(
                f"{protocol.CLIENT_SIDE_MISCONFIGURED}: no epsilon cap for the size "
                "query: pass max_epsilon=... to add_private_size_query (the "
                "epsilon your ServerApp's FedSampling uses) or set the node "
                f"config '{protocol.FEDSAMPLING_MAX_EPSILON_NODE_KEY}'"
            )
        max_epsilon = float(value)
    return check_positive("max_epsilon", max_epsilon)


def private_size_reply(
    message: Message,
    context: Context,
    *,
    num_examples: int,
    max_epsilon: float | None = None,
    rng: np.random.Generator | None = None,
    reproducible_coins: bool = False,
) -> Message:
    """The reply to FedSampling's ``query.sizes``: a randomized-response size.

    Reads ``max-size`` (``M``) and ``epsilon`` from the config and replies
    ``size-response`` ``r`` in ``{1..M-1}``: the clipped true size with
    probability ``alpha``, else a uniform draw (eq. 1). Each reply is
    eps-LDP; replies of different rounds are independent, so over ``T``
    replies the privacy losses add up to ``T eps``. The node's own ledger
    (:class:`NodeLedger`) counts the reply, and the reply carries it:
    ``node-size-answers``, ``node-epsilon-spent`` and
    ``node-reproducible-coins``.

    Parameters
    ----------
    message : Message
        The ``query.sizes`` message.
    context : Context
        The node's context: its state keeps the ledger, its node config may
        hold the cap (``fedsampling-max-epsilon``) and a budget
        (``fedsampling-epsilon-budget``, the epsilon all of the run's replies
        may spend).
    num_examples : int
        The node's true number of training samples; it never leaves the node.
    max_epsilon : float, optional
        The largest epsilon one reply may spend (:func:`node_epsilon_cap`).
    rng : numpy.random.Generator, optional
        The coins. Default: fresh OS entropy, which nobody else can replay.
        A generator seeded from anything the server knows (the run config,
        the partition id) lets the server replay every coin and read which
        replies are truthful: then set ``reproducible_coins``.
    reproducible_coins : bool, default False
        Whether ``rng`` is such a replayable stream; the reply says so.

    Returns
    -------
    Message
        The reply.

    Raises
    ------
    ValueError
        The query's ``epsilon`` is above the cap or would take the node's
        spent epsilon above its budget (Flower sends an error reply; nothing
        is drawn or counted), or no cap is set.
    """
    max_size = int(config_number(message, protocol.FEDSAMPLING_MAX_SIZE))
    epsilon = config_number(message, protocol.FEDSAMPLING_EPSILON)
    cap = node_epsilon_cap(context, max_epsilon)
    if epsilon > cap:
        raise ValueError(
            f"the server asks for epsilon={epsilon:g}, this node allows at most "
            f"{cap:g} per size reply"
        )
    ledger = NodeLedger.load(context).charged(epsilon)
    budget = context.node_config.get(protocol.FEDSAMPLING_EPSILON_BUDGET_NODE_KEY)
    if budget is not None and ledger.epsilon_spent > float(budget):
        raise ValueError(
            f"answering would spend epsilon {ledger.epsilon_spent:g} in all, above "
            f"this node's budget {float(budget):g}"
        )
    response = privatize_size(
        num_examples,
        max_size,
        epsilon,
        rng if rng is not None else np.random.default_rng(),
    )
    ledger.save(context)
    return metrics_reply(
        message,
        {
            protocol.FEDSAMPLING_SIZE_RESPONSE: response,
            protocol.FEDSAMPLING_NODE_ANSWERS: ledger.answers,
            protocol.FEDSAMPLING_NODE_EPSILON: ledger.epsilon_spent,
            protocol.FEDSAMPLING_NODE_REPRODUCIBLE_COINS: int(reproducible_coins),
        },
    )


def add_private_size_query(
    app: ClientApp,
    *,
    num_examples: SampleCount | None = None,
    node_config_key: str | None = None,
    max_epsilon: float | None = None,
) -> None:
    """Register ``@app.query("sizes")`` answering by randomized response.

    Parameters
    ----------
    app, num_examples, node_config_key
        As in :func:`~flwr_importance.clientapps.sizes.add_size_query`.
    max_epsilon : float, optional
        The node's cap on the server's ``epsilon`` per reply (see
        :func:`node_epsilon_cap`: without it, the node config must set one).

    Examples
    --------
    >>> from flwr.clientapp import ClientApp
    >>> app = ClientApp()
    >>> add_private_size_query(app, num_examples=lambda context: 600, max_epsilon=3)
    """
    count = sample_count_source(
        num_examples=num_examples, node_config_key=node_config_key
    )
    if max_epsilon is not None:
        check_positive("max_epsilon", max_epsilon)

    def private_size(message: Message, context: Context) -> Message:
        return private_size_reply(
            message, context, num_examples=count(context), max_epsilon=max_epsilon
        )

    app.query(protocol.SIZES_QUERY)(private_size)
