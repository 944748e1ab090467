"""FedSampling on Flower's legacy Strategy API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from flwr_importance.compat.adapter import LegacyStrategyAdapter
from flwr_importance.strategies.fedsampling import FedSampling as MessageFedSampling


class FedSampling(LegacyStrategyAdapter):
    """FedSampling (Qi et al., IJCAI 2023) as a legacy ``FedAvg`` subclass.

    Implementation based on https://arxiv.org/abs/2306.14245

    Runs :class:`flwr_importance.strategies.FedSampling`: every node keeps each
    sample with probability ``K / N_tilde``, ``N_tilde`` estimated from
    eps-LDP randomized size replies (eq. 1-2); ``Theta - eta sum_c G_c``.

    Parameters
    ----------
    legacy : LegacyOptions or None (default: None)
        Flower's legacy ``FedAvg`` arguments this class honours, bundled; they
        may also be given directly (``initial_parameters=...``,
        ``evaluate_fn=...``), see :class:`~flwr_importance.compat.LegacyOptions`.
        Refused, with the reason: ``fraction_fit`` and ``min_fit_clients``
        (every node trains on the samples it keeps; ``samples_per_round`` sets
        the round's size), ``fraction_evaluate > 0`` (evaluate replies would
        reveal the sizes: use ``evaluate_fn``) and
        ``fit_metrics_aggregation_fn`` (the fit replies carry no metrics).

    Other Parameters
    ----------------
    **options
        The keyword arguments of the Message-API ``FedSampling``
        (``samples_per_round``, ``K``, required; ``max_size``, ``epsilon``,
        ``server_lr``, ``local_steps``, ``min_available_nodes``,
        ``query_timeout``) and the legacy ``FedAvg`` arguments, given directly.

    Client contract
    ---------------
    The size query is a ``ClientProxy.get_properties`` call from inside
    ``configure_fit`` (config ``compat-message-type = query.sizes``,
    ``max-size``, ``epsilon``, ``server-round``), answered with the property
    ``size-response``. ``fit`` carries ``samples-per-round``,
    ``estimated-total-size`` and ``local-steps``; the ``FitRes`` holds ``G_c``,
    ``num_examples = 0`` and no size metric. Client:
    ``handler_client_fn(task, make_fedsampling_handlers)``.
    """

    message_strategy_class = MessageFedSampling
    clients_parameter = (
        "samples_per_round (K): every node trains, on the samples it keeps"
    )
    refused_options: ClassVar[Mapping[str, str]] = {
        "fit_metrics_aggregation_fn": "FedSampling's fit replies carry no metrics "
        "and num_examples = 0: a count would reveal the node's size",
    }
