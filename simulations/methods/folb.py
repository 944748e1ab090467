"""``strategy = "folb"``: FOLB (eq. 13 by default; eqs. 9-10, 18 by options).

Options (``[tool.flwr.app.config]``, ``# --- folb ---`` block): ``folb-mode``
(``single-set`` | ``two-set``), ``folb-psi`` (eq. 18, 0 = off), ``folb-penalty``
(``norm-product`` | ``global-norm``), ``folb-negative`` (``flip`` | ``drop``),
``folb-denominator`` (``abs`` | ``signed``). The FedProx ``mu`` is the shared
``proximal-mu``; ``clients-per-round`` is ``K``; ``seed`` seeds the sampling.
"""

from __future__ import annotations

from typing import cast

from flwr_importance.aggregation.folb import Denominator, NegativeRule, Penalty
from flwr_importance.clientapps.folb import make_folb_handlers
from flwr_importance.strategies.folb import FOLB, Mode
from simulations.config import ExperimentConfig


def build_strategy(config: ExperimentConfig, num_clients: int) -> FOLB:
    """FOLB drawing ``clients-per-round`` nodes with replacement each round.

    Federated evaluation is off: the ServerApp evaluates centrally.
    """
    return FOLB(
        clients_per_round=config.clients_per_round,
        proximal_mu=config.proximal_mu,
        mode=cast(Mode, str(config.option("folb-mode"))),
        psi=float(config.option("folb-psi")),
        penalty=cast(Penalty, str(config.option("folb-penalty"))),
        negative=cast(NegativeRule, str(config.option("folb-negative"))),
        denominator=cast(Denominator, str(config.option("folb-denominator"))),
        seed=config.seed,
        fraction_evaluate=0.0,
        min_available_nodes=min(config.clients_per_round, num_clients),
    )


#: The ClientApp side: the method's handler set from the library.
client_handlers = make_folb_handlers
