"""FOLB on Flower's legacy Strategy API."""

from __future__ import annotations

from flwr_importance.compat.adapter import LegacyStrategyAdapter
from flwr_importance.strategies import folb as message_folb


class FOLB(LegacyStrategyAdapter):
    """FOLB (Nguyen et al., IEEE JSAC 2021) as a legacy ``FedAvg`` subclass.

    Implementation based on https://arxiv.org/abs/2007.13137

    Runs :class:`flwr_importance.strategies.FOLB`, whose docstring gives the
    method, its parameters and its client contract.

    Parameters
    ----------
    legacy : LegacyOptions or None (default: None)
        Flower's legacy ``FedAvg`` arguments that apply, bundled
        (:class:`~flwr_importance.compat.LegacyOptions`; keyword arguments win).

    Other Parameters
    ----------------
    **options
        The keyword arguments of :class:`flwr_importance.strategies.FOLB` and
        the legacy ``FedAvg`` arguments that apply, given directly.

    Client contract
    ---------------
    The Message-API class's, over the legacy transport (docs/protocol.md,
    "Legacy API"). A train reply's two ArrayRecords, ``update`` and
    ``gradient``, travel in one ``FitRes``, their layout in the metric
    ``compat-array-layout``. In two-set mode ``query.gradient`` carries the
    model, so it is a ``ClientProxy.fit`` call made from inside
    ``configure_fit``. Client: ``handler_client_fn(task, make_folb_handlers)``.
    """

    message_strategy_class = message_folb.FOLB
