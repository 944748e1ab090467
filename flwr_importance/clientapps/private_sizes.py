"""FedSampling's size query on the client: a randomized-response size, torch-free.

Qi et al., "FedSampling: A Better Sampling Strategy for Federated Learning",
IJCAI 2023, eq. 1. The node's true size ``|D_c|`` never leaves it: the
``query.sizes`` reply is the clipped size with probability ``alpha``, else a
uniform draw (:func:`~flwr_importance.sampling.privatize_size`). One line on
any framework's ClientApp::

    add_private_size_query(app, num_examples=lambda ctx: len(load_trainset(ctx)))

The rest of FedSampling's client (the round's kept samples and ``G_c``) needs
gradients: :mod:`flwr_importance.clientapps.fedsampling`, which re-exports
these two functions.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from flwr_importance import protocol
from flwr_importance.clientapps.messages import config_number, metrics_reply
from flwr_importance.clientapps.sizes import SampleCount, sample_count_source
from flwr_importance.sampling import privatize_size


def private_size_reply(
    message: Message,
    *,
    num_examples: int,
    max_epsilon: float | None = None,
    rng: np.random.Generator | None = None,
) -> Message:
    """The reply to FedSampling's ``query.sizes``: a randomized-response size.

    Reads ``max-size`` (``M``) and ``epsilon`` from the config and replies
    ``MetricRecord({"size-response": r})`` with ``r`` in ``{1..M-1}``: the
    clipped true size with probability ``alpha``, else a uniform draw (eq. 1).
    Each round's reply is eps-LDP; replies of different rounds are
    independent, so over ``T`` rounds the privacy losses add up to ``T eps``
    unless replies are de-linked from the node (the paper's client anonymity,
    Section 3.5.2).

    Parameters
    ----------
    message : Message
        The ``query.sizes`` message.
    num_examples : int
        The node's true number of training samples; it never leaves the node.
    max_epsilon : float, optional
        The largest privacy budget this node accepts. The server chooses
        ``epsilon`` (every node must use the same one for the estimate), so a
        node that does not trust it to ask for a small one sets this cap: a
        query asking for more raises, which Flower sends as an error reply.
    rng : numpy.random.Generator, optional
        Source of the randomized response (default: fresh OS entropy).

    Returns
    -------
    Message
        The reply, with the one metric ``size-response``.
    """
    max_size = int(config_number(message, protocol.FEDSAMPLING_MAX_SIZE))
    epsilon = config_number(message, protocol.FEDSAMPLING_EPSILON)
    if max_epsilon is not None and epsilon > max_epsilon:
        raise ValueError(
            f"the server asks for epsilon={epsilon:g}, this node allows at "
            f"most {max_epsilon:g}"
        )
    response = privatize_size(
        num_examples,
        max_size,
        epsilon,
        rng if rng is not None else np.random.default_rng(),
    )
    return metrics_reply(message, {protocol.FEDSAMPLING_SIZE_RESPONSE: response})


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
        The node's cap on the server's ``epsilon`` (see
        :func:`private_size_reply`).

    Examples
    --------
    >>> from flwr.clientapp import ClientApp
    >>> app = ClientApp()
    >>> add_private_size_query(app, num_examples=lambda context: 600, max_epsilon=3)
    """
    count = sample_count_source(
        num_examples=num_examples, node_config_key=node_config_key
    )

    def private_size(message: Message, context: Context) -> Message:
        return private_size_reply(
            message, num_examples=count(context), max_epsilon=max_epsilon
        )

    app.query(protocol.SIZES_QUERY)(private_size)
