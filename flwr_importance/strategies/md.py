"""MD sampling, the multinomial baseline of clustered sampling (Fraboni et al.).

It is also FedSampling's client-level baseline, "size-weighted" client
sampling (Qi et al., IJCAI 2023, Section 4.3), kept under that name as
:data:`SizeWeightedSampling`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from flwr_importance import protocol
from flwr_importance.method_spec import MethodSpec
from flwr_importance.sampling import md_sample
from flwr_importance.strategies._multiset import DrawRound, MultisetSampling


class MDSampling(MultisetSampling):
    """Multinomial distribution (MD) client sampling with FedAvg aggregation.

    Fraboni, Vidal, Kameni, Lorenzi, "Clustered Sampling: Low-Variance and
    Improved Representativity for Clients Selection in Federated Learning",
    ICML 2021, Section 2 (the baseline of Li et al., 2020): ``m`` i.i.d. draws
    with ``p_i = n_i / M_tot``; the new model is the plain mean of the ``m``
    drawn models, a client drawn twice counting twice (it trains once).  The
    round metric ``distinct-clients`` shows how often repeats happen (with 100
    equal clients and ``m = 10``, only ~63% of rounds see 10 distinct ones).

    The same scheme is the weighted client sampling baseline of FedSampling
    (Qi et al., "FedSampling: A Better Sampling Strategy for Federated
    Learning", IJCAI 2023, Section 4.3), which is why
    :data:`SizeWeightedSampling` names this class: it needs every client's
    true size, the privacy cost FedSampling avoids (docs/methods.md, §3-4).

    Parameters
    ----------
    clients_per_round : int
        ``m``, draws per round.
    **options
        The shared settings of
        :class:`~flwr_importance.strategies.base.ImportanceStrategy`, with its
        defaults (``seed`` seeds the draws, ``query_timeout`` bounds the wait
        for the replies to ``query.sizes``).

    Notes
    -----
    Client contract (the same for :class:`ClusteredSampling`):

    - ``query.sizes`` (the first round, and once for every node that joins):
      the server sends a ConfigRecord ``config`` with ``server-round``; the
      reply carries one MetricRecord with ``num-examples``, the client's sample
      count (a non-negative integer).  A client without a size is not drawn.
    - ``train``: ArrayRecord ``arrays`` (the global model) and ConfigRecord
      ``config`` with ``server-round``, once per distinct drawn client.  The
      reply carries one ArrayRecord with the model's keys and shapes and one
      MetricRecord with ``num-examples`` (which updates the client's size);
      every other numeric metric all replies share is averaged with the
      draws' multiplicities (e.g. ``train-loss``).
    - ``evaluate``: as Flower's ``FedAvg``.

    Round metrics: ``distinct-clients`` and ``aggregated-draws``.  The server
    learns each client's sample count, as in Flower's ``FedAvg``.
    """

    def draw_clients(
        self, node_ids: Sequence[int], sizes: NDArray[np.int64], draw: DrawRound
    ) -> NDArray[np.intp]:
        """``m`` i.i.d. draws with probabilities ``n_i / M_tot``."""
        return md_sample(sizes / sizes.sum(), self.clients_per_round, self.rng)


#: FedSampling's size-weighted client sampling baseline (Qi et al., IJCAI 2023,
#: Section 4.3): ``m`` draws with ``P(k) = n_k / sum_l n_l``, weight
#: ``count_k / m``, which is MD sampling, so the name is bound to
#: :class:`MDSampling` (same draws for the same seed as the former class).
#: Compared with that former class: every argument is keyword-only, the round
#: metrics are ``distinct-clients`` and ``aggregated-draws`` (were
#: ``num-distinct-clients`` and ``num-updates``), train replies must carry
#: ``num-examples`` (it refreshes the size), and the defaults are the shared
#: ones: ``fraction_evaluate=1.0`` (was 0.0), ``min_available_nodes=1`` (was 2).
SizeWeightedSampling = MDSampling


METHOD = MethodSpec(
    name="md",
    strategy=MDSampling,
    title="MD sampling",
    paper="Fraboni et al.'s baseline (Li et al.)",
    section="4-clustered-sampling-and-md-sampling",
    client_queries=(protocol.SIZES_QUERY,),
    # FedSampling's comparisons call it size-weighted client sampling.
    app_aliases=("sizeweighted",),
)
