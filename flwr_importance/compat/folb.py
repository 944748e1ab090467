"""FOLB on Flower's legacy Strategy API."""

from __future__ import annotations

from flwr_importance.compat.adapter import LegacyStrategyAdapter
from flwr_importance.strategies import folb as message_folb


class FOLB(LegacyStrategyAdapter):
    """FOLB (Nguyen et al., IEEE JSAC 2021) as a legacy ``FedAvg`` subclass.

    Implementation based on https://arxiv.org/abs/2007.13137

    Runs :class:`flwr_importance.strategies.FOLB`: ``K`` uniform draws (``K``
    distinct devices by default), FedProx local solves, updates weighed by the
    alignment of their gradient with the sample-weighted estimate of the
    global one (eq. 13, 9-10 or 18).

    Parameters
    ----------
    legacy : LegacyOptions or None (default: None)
        Flower's legacy ``FedAvg`` arguments (initial parameters, evaluation),
        bundled (:class:`~flwr_importance.compat.LegacyOptions`).

    Other Parameters
    ----------------
    **options
        The keyword arguments of the Message-API ``FOLB``
        (``clients_per_round``, required; ``proximal_mu``, ``mode``,
        ``weighting``, ``replace``, ``server_lr``, ``psi``, ``penalty``,
        ``negative``, ``denominator``, ``seed``, ``query_timeout``,
        ``min_available_nodes``) and the legacy ``FedAvg`` arguments, given
        directly.

    Client contract
    ---------------
    ``fit`` (config ``server-round``, ``proximal-mu``) returns two ArrayRecords
    in one ``FitRes``: ``update`` then ``gradient``, their layout in the metric
    ``compat-array-layout``, and ``gamma`` and ``num-examples`` in the
    metrics. Two-set mode: the gradients of ``S2`` are a ``ClientProxy.fit``
    call made from inside ``configure_fit`` with ``compat-message-type =
    query.gradient`` (it carries the model, which ``get_properties`` cannot);
    the client computes ``grad F_k(w^t)`` without training. Client:
    ``handler_client_fn(task, make_folb_handlers)``.
    """

    message_strategy_class = message_folb.FOLB
