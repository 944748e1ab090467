"""MD sampling, the multinomial baseline of clustered sampling (Fraboni et al.).

It is also FedSampling's client-level baseline, "size-weighted" client
sampling (Qi et al., IJCAI 2023, Section 4.3), the app name ``sizeweighted``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from flwr_importance import protocol
from flwr_importance.method_spec import MethodSpec
from flwr_importance.sampling.pips import md_sample
from flwr_importance.strategies._multiset import DrawRound, MultisetSampling


class MDSampling(MultisetSampling):
    """Multinomial distribution (MD) client sampling with FedAvg aggregation.

    Implementation based on https://arxiv.org/abs/1907.02189

    ``m`` i.i.d. draws with ``p_i = n_i / sum_j n_j``; the new model is the
    plain mean of the ``m`` drawn models, a client drawn twice counting twice
    (it trains once). Li et al.'s sampling scheme, the baseline of clustered
    sampling (Fraboni et al., ICML 2021, Section 2) and FedSampling's
    size-weighted client sampling (Qi et al., IJCAI 2023, Section 4.3): it
    needs every client's true size, the privacy cost FedSampling avoids. The
    round metric ``distinct-clients`` shows how often repeats happen (with 100
    equal clients and ``m = 10``, only ~63% of rounds see 10 distinct ones).
    See docs/methods.md, section "4. Clustered sampling (and MD sampling)",
    for the equations and the decisions.

    Parameters
    ----------
    clients_per_round : int
        ``m``, draws per round.
    report_cap : float or None (default: None)
        Clip each reported size above ``report_cap`` times the round's median
        size (``> 1``, logged by node) before the draw; None: no bound
        (docs/deployment.md, "A dishonest node's reach").

    Other Parameters
    ----------------
    **options
        The shared settings of
        :class:`~flwr_importance.strategies.base.ImportanceStrategy`, with its
        defaults (``seed`` seeds the draws, ``query_timeout`` bounds the wait
        for the replies to ``query.sizes``).

    Client contract
    ---------------
    The same for :class:`ClusteredSampling`:

    - ``query.sizes`` (the first round, and once for every node that joins):
      no model; config ``server-round`` only. The reply carries one
      MetricRecord with ``num-examples``, the client's sample count (a whole
      number ``>= 0``). A client without a usable reply is not drawn and is
      asked again the next round.
    - ``train``, once per distinct drawn client: the global model under
      ``arrayrecord_key`` and config ``server-round`` and the
      ``train_config``, as Flower's ``FedAvg``. The reply carries one
      ArrayRecord, the trained local model (not an update), with the model's
      keys and shapes, and one MetricRecord with ``num-examples`` (``>= 0``;
      a whole number updates the client's size); every other numeric metric
      all replies share is averaged with the draws' multiplicities (e.g.
      ``train-loss``).
    - ``evaluate``: as Flower's ``FedAvg``.

    Handlers: :func:`~flwr_importance.clientapps.sizes.add_size_query` beside
    the user's own train and evaluate functions, or the ready-made
    :func:`~flwr_importance.clientapps.clustered.make_clustered_handlers`.

    Notes
    -----
    Round metrics: ``distinct-clients`` and ``aggregated-draws``.  The server
    learns each client's sample count, as in Flower's ``FedAvg``.
    """

    def draw_clients(
        self, node_ids: Sequence[int], sizes: NDArray[np.int64], draw: DrawRound
    ) -> NDArray[np.intp]:
        """``m`` i.i.d. draws with probabilities ``n_i / M_tot``."""
        return md_sample(sizes / sizes.sum(), self.clients_per_round, self.rng)


METHOD = MethodSpec(
    name="md",
    strategy=MDSampling,
    client_queries=(protocol.SIZES_QUERY,),
    central_dp_refusal=(
        "its draws and weights d_k = n_k / sum_j n_j depend on every client's "
        "size: one client moves the others' terms"
    ),
)
