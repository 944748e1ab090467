"""``strategy = "folb"``: FOLB (eq. 13 by default; eqs. 9-10, 18 by options).

Options (``[tool.flwr.app.config]``, ``# --- folb ---`` block): ``folb-mode``
(``single-set`` | ``two-set``), ``folb-psi`` (eq. 18, 0 = off), ``folb-penalty``
(``norm-product`` | ``global-norm``), ``folb-negative`` (``flip`` | ``drop``),
``folb-denominator`` (``abs`` | ``signed``), ``folb-weighting`` (``samples``,
the paper's ``n_k / n`` objective, | ``uniform``), ``folb-replace`` (draws with
replacement, as the paper's analysis; default false: ``K`` distinct nodes, the
same as the ``fedavg``/``fedprox`` baselines' within a seed) and
``folb-server-lr`` (the factor on the aggregated update, 1 by default). The
FedProx ``mu`` is the shared ``proximal-mu``; ``clients-per-round`` is ``K``;
``seed`` seeds the draws. Local work is drawn per node and round as for the
baselines (:func:`simulations.methods.fedavg.round_local_work`).
"""

from __future__ import annotations

from typing import cast

from flwr_importance.aggregation.folb import Denominator, Mode, NegativeRule, Penalty
from flwr_importance.clientapps.folb import make_folb_handlers
from flwr_importance.strategies.folb import FOLB, Weighting
from flwr_importance.tooling.declarations import (
    CannedVariant,
    MethodTooling,
    sampling_arguments,
)
from simulations.config import ExperimentConfig
from simulations.methods.fedavg import with_round_local_work


def build_strategy(config: ExperimentConfig, num_clients: int) -> FOLB:
    """FOLB drawing ``clients-per-round`` nodes each round.

    Federated evaluation is off: the ServerApp evaluates centrally.
    """
    clients_per_round = min(config.clients_per_round, num_clients)
    return FOLB(
        clients_per_round=clients_per_round,
        proximal_mu=config.proximal_mu,
        mode=cast(Mode, str(config.option("folb-mode"))),
        weighting=cast(Weighting, str(config.option("folb-weighting"))),
        replace=bool(config.option("folb-replace")),
        server_lr=float(config.option("folb-server-lr")),
        psi=float(config.option("folb-psi")),
        penalty=cast(Penalty, str(config.option("folb-penalty"))),
        negative=cast(NegativeRule, str(config.option("folb-negative"))),
        denominator=cast(Denominator, str(config.option("folb-denominator"))),
        seed=config.seed,
        server_optimizer=config.server_optimizer(),
        fraction_evaluate=0.0,
        min_available_nodes=clients_per_round,
    )


#: The ClientApp side: the library's FOLB handlers, local work drawn per round.
client_handlers = with_round_local_work(make_folb_handlers)

#: How the tests and benchmarks run the method (simulations/tooling.py).
TOOLING = MethodTooling(
    headline_preset="folb-synthetic-1-1",
    canned=(
        # Two-set FOLB's gradient set costs about m more nodes' work.
        CannedVariant(
            arguments=sampling_arguments(proximal_mu=0.01),
            replies={"train": "folb-train"},
            baseline="fedavg-2m",
        ),
    ),
    equal_work=lambda work: {"proximal-mu": 0.01},
    # The digits run is the short one; IID so that two rounds improve.
    smoke_preset="folb-digits",
    smoke={"partitioning": "iid", "local-lr": 0.2},
    benchmark="folb",
)
