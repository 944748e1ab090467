"""FedSampling on Flower's legacy Strategy API."""

from __future__ import annotations

from flwr_importance.compat.adapter import LegacyStrategyAdapter
from flwr_importance.strategies.fedsampling import FedSampling as MessageFedSampling


class FedSampling(LegacyStrategyAdapter):
    """FedSampling (Qi et al., IJCAI 2023) as a legacy ``FedAvg`` subclass.

    Runs :class:`flwr_importance.strategies.FedSampling`: every node keeps each
    sample with probability ``K / N_tilde``, ``N_tilde`` estimated from
    eps-LDP randomized size replies (eq. 1-2); ``Theta - eta sum_c G_c``.

    Parameters
    ----------
    samples_per_round : int
        ``K``.
    legacy : LegacyOptions, optional
        Initial parameters and evaluation (off by default: evaluate replies
        reveal ``num-examples``).
    **options
        The other parameters of the Message-API ``FedSampling`` (``max_size``,
        ``epsilon``, ``server_lr``, ``local_steps``, ``min_available_nodes``,
        ``query_timeout``).

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
