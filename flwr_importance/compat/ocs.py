"""Optimal client sampling (OCS/AOCS) on Flower's legacy Strategy API."""

from __future__ import annotations

from flwr_importance.compat.adapter import LegacyStrategyAdapter
from flwr_importance.strategies.ocs import (
    OptimalClientSampling as MessageOptimalClientSampling,
)


class OptimalClientSampling(LegacyStrategyAdapter):
    """OCS (Chen, Horváth, Richtárik, TMLR 2022) as a legacy ``FedAvg`` subclass.

    Implementation based on https://arxiv.org/abs/2010.13723

    Runs :class:`flwr_importance.strategies.OptimalClientSampling`: every node
    reports its update norm, nodes are sampled independently with the optimal
    (or AOCS) probabilities, and the sampled updates are combined into the
    unbiased ``w + server_lr * sum (d_i / p_i) U_i``.

    Parameters
    ----------
    legacy : LegacyOptions or None (default: None)
        Flower's legacy ``FedAvg`` arguments, bundled
        (:class:`~flwr_importance.compat.LegacyOptions`).

    Other Parameters
    ----------------
    **options
        The keyword arguments of the Message-API ``OptimalClientSampling``
        (``clients_per_round``, ``m``, required; ``approximate``, ``uniform``,
        ``aocs_iterations``, ``server_lr``, ``seed``, ``min_available_nodes``,
        ``query_timeout``) and the legacy ``FedAvg`` arguments, given directly.

    Client contract
    ---------------
    The norm query is a ``ClientProxy.fit`` call from inside ``configure_fit``
    (``compat-message-type = query.norm``, the model as ``model-0``): the
    client trains, keeps its update in ``context.state`` and returns no arrays,
    only ``update-norm-0`` and ``num-examples-0`` in the ``FitRes`` metrics.
    The round's ``fit`` then carries no model (``kept-update = true``) and
    returns the kept update as the ArrayRecord ``update``. Client: your own
    ``NumPyClient`` wrapped by ``importance_client_fn(client_fn)``, or
    ``handler_client_fn(task, make_ocs_handlers)``.
    """

    message_strategy_class = MessageOptimalClientSampling
