"""ISFedAvg on Flower's legacy Strategy API."""

from __future__ import annotations

from flwr_importance.compat.adapter import LegacyStrategyAdapter
from flwr_importance.strategies.isfedavg import ISFedAvg as MessageISFedAvg


class ISFedAvg(LegacyStrategyAdapter):
    """ISFedAvg (Rizk, Vlaski, Sayed, ICASSP 2021) as a legacy ``FedAvg`` subclass.

    Implementation based on https://arxiv.org/abs/2010.13600

    Runs :class:`flwr_importance.strategies.ISFedAvg`: ``L`` clients selected
    with ``P(k in S) = L p_k``, importance-sampled local steps (eq. 8, 29), the
    plain mean of the returned models (eq. 5) and eq. 28 for the ``p_k``.

    Parameters
    ----------
    legacy : LegacyOptions or None (default: None)
        Flower's legacy ``FedAvg`` arguments, bundled
        (:class:`~flwr_importance.compat.LegacyOptions`).

    Other Parameters
    ----------------
    **options
        The keyword arguments of the Message-API ``ISFedAvg``
        (``clients_per_round``, ``L``, required; ``local_steps_range``,
        ``batch_size_range``, ``uniform``, ``keep_app_step_size``,
        ``min_relative_client_prob``, ``min_relative_sample_prob``, ``seed``,
        ``min_available_nodes``) and
        the legacy ``FedAvg`` arguments, given directly.

    Client contract
    ---------------
    No extra round trip: each selected client's settings (``isfedavg-client-prob``,
    ``-num-clients``, ``-local-steps``, ``-batch-size``, ...) ride in its own
    ``FitIns.config``; ``isfedavg-sigma2`` and ``isfedavg-g2`` come back in the
    ``FitRes`` metrics. The per-sample probabilities stay in the client's
    ``context.state``. Client: ``handler_client_fn(task, make_isfedavg_handlers)``.
    """

    message_strategy_class = MessageISFedAvg
