"""Clustered sampling on Flower's legacy Strategy API."""

from __future__ import annotations

from flwr_importance.compat.adapter import LegacyStrategyAdapter
from flwr_importance.strategies.clustered import (
    ClusteredSampling as MessageClusteredSampling,
)


class ClusteredSampling(LegacyStrategyAdapter):
    """Clustered sampling (Fraboni et al., ICML 2021) as a legacy ``FedAvg`` subclass.

    Runs :class:`flwr_importance.strategies.ClusteredSampling`: one draw from
    each of ``m`` distributions (Algorithm 1 by size, Algorithm 2 by the
    similarity of the clients' representative gradients), the plain mean of
    the drawn models with their multiplicities.

    Parameters
    ----------
    clients_per_round : int
        ``m``.
    legacy : LegacyOptions, optional
        Flower's legacy ``FedAvg`` arguments this class honours; they may also
        be given directly (``initial_parameters=...``, ``evaluate_fn=...``),
        see :class:`~flwr_importance.compat.LegacyOptions`. ``fraction_fit``
        and ``min_fit_clients`` raise a ``TypeError``: ``clients_per_round``
        replaces them.
    **options
        The other parameters of the Message-API ``ClusteredSampling``
        (``method``, ``distance``, ``projection_dim``, ``seed``,
        ``query_timeout``, ``min_available_nodes``).

    Client contract
    ---------------
    The size query (first round, and for nodes that join) is a
    ``ClientProxy.get_properties`` call from inside ``configure_fit``
    (``compat-message-type = query.sizes``) answered with the property
    ``num-examples``; ``fit`` is plain FedAvg training whose ``FitRes``
    metrics carry ``num-examples``. Client:
    ``handler_client_fn(task, make_clustered_handlers)``.
    """

    message_strategy_class = MessageClusteredSampling
