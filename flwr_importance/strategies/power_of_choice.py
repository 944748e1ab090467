"""Power-of-Choice client selection (Cho, Wang, Joshi, AISTATS 2022).

Each round ``d`` candidates are drawn without replacement with probabilities
proportional to their sizes, and the ``m`` of them with the highest local loss
at the current global model train; the new model is the plain mean of their
models. The selection leans towards clients the model fits worst, on purpose:
it converges faster than unbiased sampling and pays with a bias that does not
vanish (docs/methods.md, §6).

The maths, :func:`~flwr_importance.sampling.power_of_choice.draw_candidates`
and :func:`~flwr_importance.sampling.power_of_choice.select_highest`, are in
:mod:`flwr_importance.sampling.power_of_choice`; :class:`PowerOfChoice` asks
for the losses and keeps the size table and the plain mean of
:class:`~flwr_importance.strategies._multiset.MultisetSampling` (a selection
without repeats is a multiset whose counts are all one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import TYPE_CHECKING, Literal

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from numpy.typing import NDArray

from flwr_importance import protocol
from flwr_importance.method_spec import MethodSpec
from flwr_importance.sampling.power_of_choice import draw_candidates, select_highest
from flwr_importance.strategies._multiset import (
    DrawRound,
    MultisetSampling,
)
from flwr_importance.strategies.replies import CheckedReply, ClientSide
from flwr_importance.validation import check_choice, check_count

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from flwr_importance.strategies.base import StrategyOptions

#: ``pow-d``: the candidates' losses are asked at the current model
#: (``query.loss``); ``rpow-d``: no query, each candidate ranks by the mean
#: training loss it reported the last time it trained.
Variant = Literal["pow-d", "rpow-d"]

#: The loss and the sample count the candidates report in their ``query.loss``
#: reply (model 0).
CANDIDATE_LOSS = protocol.per_model_key(protocol.LOSS, 0)
CANDIDATE_SIZE = protocol.per_model_key(protocol.NUM_EXAMPLES, 0)


@dataclass(frozen=True)
class Selection:
    """One round's Power-of-Choice selection, for its round metrics.

    Attributes
    ----------
    candidates : int
        ``|A|``, the candidates drawn.
    ranked : int
        The candidates with a loss to rank by (pow-d: those that answered
        ``query.loss`` usably).
    selected_losses : tuple[float, ...]
        The losses the selected clients were ranked by (``inf``: not known).
    """

    candidates: int
    ranked: int
    selected_losses: tuple[float, ...]

    def metrics(self) -> dict[str, int | float]:
        """``candidates``, ``ranked-candidates``, ``selected`` and ``selected-loss``.

        ``selected-loss`` is the mean of the selected clients' known losses;
        it is left out when none is known.
        """
        known = [loss for loss in self.selected_losses if math.isfinite(loss)]
        metrics: dict[str, int | float] = {
            "candidates": self.candidates,
            "ranked-candidates": self.ranked,
            "selected": len(self.selected_losses),
        }
        if known:
            metrics["selected-loss"] = float(np.mean(known))
        return metrics


class PowerOfChoice(MultisetSampling):
    """Power-of-Choice: the ``m`` highest losses of ``d`` candidates drawn by size.

    Implementation based on https://arxiv.org/abs/2010.01243

    Algorithm 1 of the paper. Each round:

    1. draw the candidate set ``A`` of ``d`` clients without replacement,
       with probabilities ``p_k = n_k / n``
       (:func:`~flwr_importance.sampling.draw_candidates`);
    2. rank them by their local loss ``F_k(w^t)`` at the current global
       model and keep the ``m`` highest
       (:func:`~flwr_importance.sampling.select_highest`);
    3. those ``m`` train, and the new model is their plain mean
       ``w^{t+1} = (1/m) sum_{k in S} w_k`` (no size weights: the sizes
       entered through the draw).

    ``d = m`` trains every candidate (no loss ranking), but it is not the
    paper's unbiased baseline ``rand``: ``rand`` draws ``m`` clients *with*
    replacement by ``p_k`` and takes the plain mean, which is
    :class:`~flwr_importance.strategies.MDSampling`; without replacement the
    plain mean gives the large clients less than their share
    (docs/methods.md, §6). ``d = N`` trains the ``m`` highest-loss clients of
    the whole federation every round.

    The selection is biased by design. Clients with a high loss are picked
    more often than their share ``p_k``, so the model moves faster at first
    (the paper's speed-up grows with ``d``) but the expected update is not
    the gradient of the global objective ``sum_k p_k F_k``: the paper's
    bound keeps a bias term that does not vanish with the rounds. Larger
    ``d`` is faster and more biased; prefer an unbiased method where the
    final error matters more than the rounds to get close.

    Variants (the paper's Section 5):

    * ``pow-d``: the server sends the current model to the ``d`` candidates
      in a ``query.loss`` round trip and ranks by the losses they report.
    * ``cpow-d`` (computation-efficient): the same server; the clients'
      loss handler evaluates ``F_k`` on a mini-batch of ``b`` samples
      instead of all local data (register
      :func:`~flwr_importance.clientapps.loss.add_loss_query` with an evaluate
      function that does so).
    * ``rpow-d`` (communication- and computation-efficient): no extra round
      trip; each candidate ranks by the mean training loss (``train-loss``)
      of its latest train reply.

    See docs/methods.md, section "6. Power-of-Choice: the highest losses of a
    size-proportional candidate set", for the equations and the decisions
    (ties, unknown losses, failed candidates, the default ``d``).

    Parameters
    ----------
    clients_per_round : int
        ``m``, the clients trained per round (>= 1).
    candidates : int or None (default: None)
        ``d``, the candidates drawn per round (>= ``m``); None or 0 (a run
        config cannot hold None): ``2 m``. With fewer clients than ``d``
        known, all of them are candidates (logged).
    variant : {"pow-d", "rpow-d"} (default: "pow-d")
        Where the losses come from (above).
    report_cap : float or None (default: None)
        Clip each reported size above ``report_cap`` times the round's median
        size (``> 1``, logged by node) before the candidate draw; the losses
        are not bounded (a rank cannot be); None: no bound
        (docs/deployment.md, "A dishonest node's reach").

    Other Parameters
    ----------------
    **options
        The shared settings of
        :class:`~flwr_importance.strategies.base.ImportanceStrategy`, with
        its defaults: ``seed`` seeds the candidate draws, ``query_timeout``
        bounds the wait for the ``query.sizes`` and ``query.loss`` replies.

    Raises
    ------
    TypeError, ValueError
        A setting of the wrong type or out of range (``candidates < m``, an
        unknown variant).

    Client contract
    ---------------
    - ``query.sizes`` (a node's first round): config ``server-round``; the
      reply's MetricRecord holds ``num-examples``, as for
      :class:`~flwr_importance.strategies.MDSampling`.
    - ``query.loss`` (``pow-d``, each round, candidates only): the current
      model as the ArrayRecord ``model-0`` (not under ``arrayrecord_key``)
      and config ``server-round`` only; no training. The reply's
      MetricRecord holds ``loss-0``, the mean loss of that model on the
      node's training data (finite, ``>= 0``; higher ranks first; ``cpow-d``
      is this reply computed on a mini-batch), and ``num-examples-0``
      (``>= 0``). A candidate without a usable reply is not selected.
    - ``train`` to the selected: as Flower's ``FedAvg`` (the model under
      ``arrayrecord_key``, config ``server-round`` and the
      ``train_config``); the reply holds one ArrayRecord, the trained local
      model, and ``num-examples`` (``>= 0``, refreshing the size) and, for
      ``rpow-d``, ``train-loss`` (the mean training loss of the round's
      local steps): ``rpow-d`` sends no query and ranks a candidate by the
      ``train-loss`` of its latest train reply (a node never heard from
      ranks first; a reply without a finite one keeps the previous value).
    - ``evaluate``: as Flower's ``FedAvg``.

    Handlers: :func:`~flwr_importance.clientapps.sizes.add_size_query` and,
    for ``pow-d``, :func:`~flwr_importance.clientapps.loss.add_loss_query`
    (it answers from the user's evaluate function, no training), beside the
    user's own train and evaluate functions.

    Notes
    -----
    Round metrics: ``candidates`` (``|A|``), ``ranked-candidates`` (those
    with a loss), ``selected``, ``selected-loss`` (the mean loss the selected
    were ranked by, known ones only) and those of
    :class:`~flwr_importance.strategies.MDSampling`
    (``distinct-clients``, ``aggregated-draws``, the replies' mean metrics).
    """

    fewer_nodes_effect = "every client is a candidate and all of them train"
    client_side = ClientSide(
        "add `add_size_query(app, num_examples=...)` "
        "(flwr_importance.clientapps.sizes) and, for variant='pow-d', "
        "`add_loss_query(app, local_loss)` (flwr_importance.clientapps.loss); "
        "for variant='rpow-d' the train reply carries `train-loss`",
        "docs/methods.md#6-power-of-choice-the-highest-losses-of-a-size-proportional"
        "-candidate-set",
    )

    def __init__(
        self,
        *,
        clients_per_round: int,
        candidates: int | None = None,
        variant: Variant = "pow-d",
        report_cap: float | None = None,
        **options: Unpack[StrategyOptions],
    ) -> None:
        super().__init__(
            clients_per_round=clients_per_round, report_cap=report_cap, **options
        )
        check_choice("variant", variant, Variant)
        self.candidates = check_count(
            "candidates", 0 if candidates is None else candidates, minimum=0
        )
        if self.candidates == 0:
            self.candidates = 2 * self.clients_per_round
        if self.candidates < self.clients_per_round:
            raise ValueError(
                f"candidates (d = {self.candidates}) must be >= clients_per_round "
                f"(m = {self.clients_per_round}): the m selected are drawn from them"
            )
        self.variant: Variant = variant
        self._train_losses: dict[int, float] = {}

    @property
    def train_losses(self) -> dict[int, float]:
        """``rpow-d``'s table: each node's latest reported ``train-loss``."""
        return dict(self._train_losses)

    def sampling_settings(self) -> dict[str, object]:
        """``m`` (the selected), ``d`` and the variant."""
        return {
            "Selected per round (m)": self.clients_per_round,
            "Candidates per round (d)": self.candidates,
            "Variant": self.variant,
        }

    # -- the selection -------------------------------------------------------------
    def track_nodes(self, node_ids: Sequence[int]) -> None:
        """Forget the training losses of nodes that are gone."""
        for node_id in set(self._train_losses) - set(node_ids):
            del self._train_losses[node_id]

    def draw_clients(
        self, node_ids: Sequence[int], sizes: NDArray[np.int64], draw: DrawRound
    ) -> NDArray[np.intp]:
        """The ``m`` highest-loss candidates of ``d`` drawn by size (positions).

        The selection's metrics go into the round's (:class:`Selection`).
        """
        positive = int(np.count_nonzero(sizes))
        if positive < self.candidates:
            log(
                WARNING,
                "configure_train: %d clients with a known, positive size, fewer "
                "than candidates=%d: all of them are candidates",
                positive,
                self.candidates,
            )
        candidates = draw_candidates(sizes, min(self.candidates, positive), self.rng)
        candidate_ids = [node_ids[position] for position in candidates]
        if self.variant == "pow-d":
            losses = self._query_losses(
                draw.server_round, draw.arrays, draw.grid, candidate_ids
            )
        else:
            losses = {
                node_id: self._train_losses.get(node_id, math.inf)
                for node_id in candidate_ids
            }
        ranked = [position for position in candidates if node_ids[position] in losses]
        ranked_losses = [losses[node_ids[position]] for position in ranked]
        chosen = select_highest(ranked_losses, self.clients_per_round)
        selection = Selection(
            candidates=len(candidates),
            ranked=len(ranked),
            selected_losses=tuple(ranked_losses[index] for index in chosen),
        )
        draw.metrics.update(selection.metrics())
        log(
            INFO,
            "configure_train: %s selected %d of %d candidates (%d ranked)",
            self.variant,
            len(chosen),
            len(candidates),
            len(ranked),
        )
        return np.array([ranked[index] for index in chosen], dtype=np.intp)

    def _query_losses(
        self,
        server_round: int,
        arrays: ArrayRecord,
        grid: Grid,
        candidate_ids: Sequence[int],
    ) -> dict[int, float]:
        """``pow-d``: each candidate's ``loss-0`` at the current model, by node.

        Candidates that fail, do not answer or send no finite, non-negative
        loss and count are left out (logged by node).
        """
        config = ConfigRecord({protocol.SERVER_ROUND: server_round})
        replies = self.query(
            grid,
            dict.fromkeys(candidate_ids, config),
            protocol.LOSS_QUERY,
            {protocol.model_record_name(0): arrays},
        )
        checked = self.check_replies(
            replies.values(),
            nonnegative_keys=[CANDIDATE_LOSS, CANDIDATE_SIZE],
            expected_nodes=set(candidate_ids),
            context=protocol.query_message_type(protocol.LOSS_QUERY),
        )
        if len(checked) < len(candidate_ids):
            log(
                WARNING,
                "configure_train: %d of %d candidates gave no usable loss and "
                "cannot be selected",
                len(candidate_ids) - len(checked),
                len(candidate_ids),
            )
        return {reply.node_id: reply.metrics[CANDIDATE_LOSS] for reply in checked}

    def record_replies(self, replies: Sequence[CheckedReply]) -> None:
        """``rpow-d``: keep the ``train-loss`` of every aggregated reply."""
        if self.variant != "rpow-d":
            return
        missing = 0
        for reply in replies:
            loss = reply.metrics.get(protocol.TRAIN_LOSS)
            if loss is None or not math.isfinite(loss):
                missing += 1
            else:
                self._train_losses[reply.node_id] = loss
        if missing:
            log(
                WARNING,
                "aggregate_train: %d of %d replies carry no finite '%s'; rpow-d "
                "ranks those clients by their previous one",
                missing,
                len(replies),
                protocol.TRAIN_LOSS,
            )


METHOD = MethodSpec(
    name="power-of-choice",
    strategy=PowerOfChoice,
    client_queries=(protocol.SIZES_QUERY, protocol.LOSS_QUERY),
    central_dp_refusal=(
        "its selection ranks the clients' losses against each other: one "
        "client's loss changes which others are selected"
    ),
)
