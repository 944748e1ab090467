"""ISFedAvg on Flower's legacy Strategy API."""

from __future__ import annotations

from flwr_importance.compat.adapter import LegacyStrategyAdapter
from flwr_importance.strategies.isfedavg import ISFedAvg as MessageISFedAvg


class ISFedAvg(LegacyStrategyAdapter):
    """ISFedAvg (Rizk, Vlaski, Sayed, ICASSP 2021) as a legacy ``FedAvg`` subclass.

    Implementation based on https://arxiv.org/abs/2010.13600

    Runs :class:`flwr_importance.strategies.ISFedAvg`, whose docstring gives
    the method, its parameters and its client contract.

    Parameters
    ----------
    legacy : LegacyOptions or None (default: None)
        Flower's legacy ``FedAvg`` arguments that apply, bundled
        (:class:`~flwr_importance.compat.LegacyOptions`; keyword arguments win).

    Other Parameters
    ----------------
    **options
        The keyword arguments of :class:`flwr_importance.strategies.ISFedAvg`
        and the legacy ``FedAvg`` arguments that apply, given directly.

    Client contract
    ---------------
    The Message-API class's, over the legacy transport (docs/protocol.md,
    "Legacy API"). There is no extra round trip: the train config rides in
    each selected client's ``FitIns.config`` and the reply's metrics in its
    ``FitRes.metrics``. Client: ``handler_client_fn(task,
    make_isfedavg_handlers)``.
    """

    message_strategy_class = MessageISFedAvg
