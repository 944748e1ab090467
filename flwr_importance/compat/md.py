"""MD sampling on Flower's legacy Strategy API."""

from __future__ import annotations

from flwr_importance.compat.adapter import LegacyStrategyAdapter
from flwr_importance.strategies.md import MDSampling as MessageMDSampling


class MDSampling(LegacyStrategyAdapter):
    """MD sampling (Fraboni et al., ICML 2021, Section 2) as a legacy ``FedAvg``.

    Runs :class:`flwr_importance.strategies.MDSampling`: ``m`` i.i.d. draws
    with ``p_i = n_i / M_tot``, the plain mean of the drawn models with their
    multiplicities.

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
        The other parameters of the Message-API ``MDSampling`` (``seed``,
        ``query_timeout``, ``min_available_nodes``).

    Client contract
    ---------------
    As :class:`flwr_importance.compat.ClusteredSampling`: sizes by
    ``ClientProxy.get_properties`` (``num-examples``), plain FedAvg ``fit``.
    Client: ``handler_client_fn(task, make_clustered_handlers)``.
    """

    message_strategy_class = MessageMDSampling
