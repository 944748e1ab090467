"""Optimal client sampling (OCS/AOCS) on Flower's legacy Strategy API."""

from __future__ import annotations

from flwr_importance.compat.adapter import LegacyStrategyAdapter
from flwr_importance.strategies.ocs import (
    OptimalClientSampling as MessageOptimalClientSampling,
)


class OptimalClientSampling(LegacyStrategyAdapter):
    """OCS (Chen, Horváth, Richtárik, TMLR 2022) as a legacy ``FedAvg`` subclass.

    Implementation based on https://arxiv.org/abs/2010.13723

    Runs :class:`flwr_importance.strategies.OptimalClientSampling` (OCS, and
    AOCS with ``approximate=True``), whose docstring gives the method, its
    parameters and its client contract.

    Parameters
    ----------
    legacy : LegacyOptions or None (default: None)
        Flower's legacy ``FedAvg`` arguments that apply, bundled
        (:class:`~flwr_importance.compat.LegacyOptions`; keyword arguments win).

    Other Parameters
    ----------------
    **options
        The keyword arguments of
        :class:`flwr_importance.strategies.OptimalClientSampling` and the legacy
        ``FedAvg`` arguments that apply, given directly.

    Client contract
    ---------------
    The Message-API class's, over the legacy transport (docs/protocol.md,
    "Legacy API"). ``query.norm`` carries the model, so it is a
    ``ClientProxy.fit`` call made from inside ``configure_fit``; the round's
    ``fit``, which carries no arrays (``kept-update = true``), is a ``fit``
    too. Client: your own ``NumPyClient`` wrapped by
    ``importance_client_fn(client_fn)``, or ``handler_client_fn(task,
    make_ocs_handlers)``.
    """

    message_strategy_class = MessageOptimalClientSampling
