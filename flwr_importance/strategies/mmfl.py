"""Multi-model federated learning with optimal variance-reduced sampling (MMFL).

Zhang, Li, Gong, Siew, Joe-Wong, El-Azouzi, "Optimal Variance-Reduced Client
Sampling in Multiple Models Federated Learning" (ICDCS 2024 poster),
docs/methods.md §5.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from logging import INFO
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from numpy.typing import NDArray

from flwr_importance import protocol
from flwr_importance.aggregation.variance_reduced import (
    size_fractions,
    uniform_assignment_prob,
)
from flwr_importance.method_spec import MethodSpec
from flwr_importance.sampling.variance_reduced import (
    assign_models,
    estimator_variance,
    mmfl_probs,
)
from flwr_importance.strategies.base import log_settings
from flwr_importance.strategies.replies import ClientSide
from flwr_importance.strategies.report_bounds import report_cap_setting
from flwr_importance.strategies.unbiased_sampling import (
    OPTIMAL_SAMPLING_DOCS,
    SamplePlan,
    UnbiasedSampling,
)
from flwr_importance.validation import check_choice, check_count

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from flwr_importance.strategies.base import StrategyOptions

Variant = Literal["gradnorm", "loss", "random", "round-robin"]
VARIANTS: tuple[Variant, ...] = get_args(Variant)

#: A round's sample: population, ``d``, ``p``, node -> model, and the scores
#: ``d * ||U||`` when they are update norms (else None).
_Sample = tuple[
    list[int],
    NDArray[np.float64],
    NDArray[np.float64],
    dict[int, int],
    NDArray[np.float64] | None,
]

#: Separates the model prefix from a parameter name in a packed ArrayRecord.
PACKED_SEPARATOR = "/"


def pack_models(models: Sequence[ArrayRecord]) -> ArrayRecord:
    """The ``S`` models as one ArrayRecord, keys ``model-<s>/<parameter>``.

    Flower's ``Strategy.start`` and ``Result`` carry one ArrayRecord; packing
    lets the multi-model strategy run in Flower's own round loop, while every
    message carries the models as separate ArrayRecords (``model-<s>``).
    """
    arrays: dict[str, Array] = {}
    for model_index, model in enumerate(models):
        for key, array in model.items():
            arrays[
                f"{protocol.model_record_name(model_index)}{PACKED_SEPARATOR}{key}"
            ] = array
    return ArrayRecord.from_array_dict(arrays)


def unpack_models(packed: ArrayRecord) -> list[ArrayRecord]:
    """Inverse of :func:`pack_models`: the models in index order.

    Raises
    ------
    ValueError
        If a key is not ``model-<s>/<parameter>`` or the indices are not
        ``0..S-1``.
    """
    grouped: dict[int, dict[str, Array]] = {}
    for packed_key, array in packed.items():
        name, separator, key = packed_key.partition(PACKED_SEPARATOR)
        index = name.removeprefix(protocol.MODEL_RECORD_PREFIX)
        if (
            not separator
            or not index.isdigit()
            or name != protocol.model_record_name(int(index))
        ):
            raise ValueError(f"'{packed_key}' is not a packed model key")
        grouped.setdefault(int(index), {})[key] = array
    if sorted(grouped) != list(range(len(grouped))):
        raise ValueError(f"packed model indices {sorted(grouped)} are not 0..S-1")
    return [ArrayRecord.from_array_dict(grouped[index]) for index in sorted(grouped)]


#: Flower's ``evaluate_fn`` of ``Strategy.start``: one round's central evaluation.
EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]


def evaluate_every_model(
    evaluate_fn: EvaluateFn | Sequence[EvaluateFn],
) -> EvaluateFn:
    """Your ``evaluate_fn`` of one model, made the ``evaluate_fn`` of packed models.

    The returned function unpacks the models (:func:`unpack_models`), runs
    ``evaluate_fn`` on each, and returns each metric's mean over the models
    under its own name and the models' values under ``<name>-per-model``.

    Parameters
    ----------
    evaluate_fn : callable or sequence of callables
        ``(server_round, arrays) -> MetricRecord | None``, as Flower's
        ``Strategy.start`` takes: one for every model, or one per model (in
        model order) when each model has its own test set.

    Returns
    -------
    callable
        ``(server_round, packed) -> MetricRecord | None``; None when every
        model's evaluation returned None.

    Raises
    ------
    ValueError
        When called, if the models' metrics have different names, or a
        sequence does not have one function per model.
    TypeError
        When called, if a metric is not a number (a list has no mean).

    Examples
    --------
    >>> from flwr.app import Array, ArrayRecord, MetricRecord
    >>> from flwr_importance.strategies import evaluate_every_model, pack_models
    >>> def first_weight(server_round, arrays):
    ...     return MetricRecord({"w": float(arrays["w"].numpy()[0])})
    >>> models = [ArrayRecord({"w": Array(np.array([x]))}) for x in (1.0, 3.0)]
    >>> metrics = evaluate_every_model(first_weight)(1, pack_models(models))
    >>> metrics["w"], metrics["w-per-model"]
    (2.0, [1.0, 3.0])
    """

    def evaluate_packed(server_round: int, packed: ArrayRecord) -> MetricRecord | None:
        models = unpack_models(packed)
        functions = (
            [evaluate_fn] * len(models) if callable(evaluate_fn) else evaluate_fn
        )
        if len(functions) != len(models):
            raise ValueError(
                f"{len(functions)} evaluate functions for {len(models)} models"
            )
        per_model = [
            metrics
            for function, arrays in zip(functions, models, strict=True)
            if (metrics := function(server_round, arrays)) is not None
        ]
        if not per_model:
            return None
        names = list(per_model[0])
        if any(list(metrics) != names for metrics in per_model):
            raise ValueError("every model's evaluation must return the same metrics")
        merged = MetricRecord()
        for name in names:
            values = [metrics[name] for metrics in per_model]
            if not all(isinstance(value, int | float) for value in values):
                raise TypeError(f"metric '{name}' is not a number: it has no mean")
            numbers = [float(value) for value in values]  # type: ignore[arg-type]
            merged[name] = sum(numbers) / len(numbers)
            merged[f"{name}-per-model"] = numbers
        return merged

    return evaluate_packed


def per_model_files(
    packed: ArrayRecord, path: str | Path
) -> list[tuple[ArrayRecord, Path]]:
    """Each packed model, with the file your app's save lines write it to.

    ``path`` is the file your app saves its one model to; model ``s`` goes
    to ``<stem>-<s><suffix>`` beside it. Each ArrayRecord is one model as
    your app's own model holds it (``arrays.to_torch_state_dict()`` loads
    into your ``Net``; ``arrays.to_numpy_ndarrays()`` sets a scikit-learn
    model's parameters), where the packed record loads into neither.

    Examples
    --------
    >>> from flwr.app import Array, ArrayRecord
    >>> from flwr_importance.strategies import pack_models, per_model_files
    >>> models = [ArrayRecord({"w": Array(np.zeros(2))})] * 2
    >>> [str(path) for _, path in per_model_files(pack_models(models), "out/m.pt")]
    ['out/m-0.pt', 'out/m-1.pt']
    """
    path = Path(path)
    return [
        (arrays, path.with_name(f"{path.stem}-{index}{path.suffix}"))
        for index, arrays in enumerate(unpack_models(packed))
    ]


class MultiModelSampling(UnbiasedSampling):
    """Train ``S`` models at once, each client training at most one per round.

    Implementation based on https://openreview.net/forum?id=fbnNUNashm

    Algorithm 1 and eq. 5 of the paper. Client ``i`` trains model ``s`` with
    probability ``p_{s|i}`` or idles; the server updates every model with the
    unbiased ``w_s + server_lr * sum_{i in A_s} (d_is / p_{s|i}) U_is``, where
    ``d_is = n_is / sum_j n_js`` and ``U_is`` is the local model delta. The
    ``S`` global models travel through Flower's round loop packed in one
    ArrayRecord (:func:`pack_models` / :func:`unpack_models`); in messages each
    is its own ArrayRecord ``model-<s>``.

    Variants (``p_{s|i}`` and who trains):

    - ``"gradnorm"``: ``query.norm`` with all models; every client trains all
      ``S`` (exact, expensive) and reports ``||U_is||``;
      ``p = mmfl_probs(d * ||U||, m)``; the sampled clients send the kept
      update of their model.
    - ``"loss"``: ``query.loss`` with all models; clients report their mean loss
      ``f_is(w_s)`` (forward passes only); ``p = mmfl_probs(d * f, m)``; only the
      sampled clients train.
    - ``"random"``: ``m`` clients without replacement, each given a uniformly
      random model; ``p = m / (N S)``.
    - ``"round-robin"``: the same ``m`` clients; client ``i`` trains model
      ``(node_id + round) mod S``, so its model rotates every round; weighted
      with the same ``p = m / (N S)``.

    See docs/methods.md, section "5. Optimal client sampling (OCS, AOCS) and
    multi-model sampling (MMFL)", for the equations and the decisions.

    Parameters
    ----------
    num_models : int
        ``S``.
    clients_per_round : int
        ``m``, the expected number of active clients over all models.
    variant : {"gradnorm", "loss", "random", "round-robin"} (default: "gradnorm")
        How ``p_{s|i}`` is computed and who trains (above).
    server_lr : float (default: 1.0)
        Server step on the estimate.
    report_cap : float or None (default: None)
        Clip each reported update norm, loss and size above ``report_cap``
        times the round's median of that quantity (``> 1``, logged by node);
        None: no bound (docs/deployment.md, "A dishonest node's reach").

    Other Parameters
    ----------------
    **options
        The shared settings of
        :class:`~flwr_importance.strategies.base.ImportanceStrategy`, with its
        defaults except ``fraction_evaluate``: 0.0, and any other value is
        refused (see :attr:`no_federated_evaluation`). ``seed`` seeds the
        draws, ``query_timeout`` bounds the wait for query replies;
        ``arrayrecord_key`` does not apply (the models travel as
        ``model-<s>``, as the protocol names them).

    Client contract
    ---------------
    Models are numbered ``0..S-1`` and travel as ArrayRecords ``model-<s>``,
    never under ``arrayrecord_key``; a per-model metric key ends in ``-<s>``.
    ``U_s = w_local - w_s`` is a node's update of model ``s``: its local
    model after training from the received ``w_s``, minus ``w_s``, never
    scaled by ``d_is`` or ``1/p``; the server computes
    ``d_is = n_is / sum_j n_js`` over the usable replies.

    - ``query.norm`` (gradnorm) every round to every connected node: every
      model, config ``server-round`` and the ``train_config``. The node
      trains each model on that model's task data, exactly as for a train
      message, keeps each ``U_s`` in its node state tagged with this
      round's ``server-round`` (dropping older ones) and replies
      ``update-norm-<s>`` (``||U_s||``, the plain Euclidean norm over all
      arrays, not ``||d_is U_s||``) and ``num-examples-<s>`` (``n_is``, its
      samples of task ``s``), both ``>= 0``; ``train-loss-<s>`` may come
      too (the helpers send it; unused).
    - ``query.loss`` (loss) every round to every connected node: every
      model, config ``server-round`` and the ``train_config``; no training.
      Reply ``loss-<s>`` (the mean loss of model ``s`` on the node's data of
      task ``s``, ``>= 0``) and ``num-examples-<s>``.
    - ``query.sizes`` (random, round-robin) once per node, the first time it
      is seen; no model; config ``server-round`` and ``num-models`` (``S``).
      Reply ``num-examples-<s>`` for every ``s`` in ``0..S-1``.
    - ``train`` to each sampled node: config ``server-round`` (the round of
      this round's query), the ``train_config``, ``model-index`` (the model
      ``s`` it trains) and ``kept-update``. With ``kept-update = true``
      (gradnorm) the message carries no ArrayRecord and the node sends the
      update it kept at this round's ``query.norm``; a missing or stale one
      (another round's ``server-round``, e.g. after a restart) must raise,
      never be sent. With ``kept-update = false`` the message carries the
      ArrayRecord ``model-<s>`` and the node trains it now. Reply: the
      ArrayRecord ``update`` (``U_s``, keyed and shaped like model ``s``)
      and one MetricRecord with ``model-index`` (the message's, else the
      reply is dropped), ``num-examples`` (``>= 0``) and, optionally,
      ``train-loss`` (finite; averaged into the round's metrics only).

    No federated evaluation: the ServerApp evaluates each model centrally.

    Handlers: :mod:`flwr_importance.clientapps.variance_reduced`.

    Notes
    -----
    Round metrics: ``num-sampled``, ``num-received``, ``num-received-<s>``,
    ``train-loss``, ``expected-participants`` and, for ``"gradnorm"``,
    ``variance`` and ``random-variance`` (the estimator's variance given the
    round's updates under ``p`` and under ``m / (N S)``).
    """

    no_federated_evaluation = (
        "MultiModelSampling trains S models, packed in one ArrayRecord; Flower's "
        "evaluate messages carry one model, so evaluate each model on the server "
        "(evaluate_fn) instead"
    )
    unused_settings = frozenset({"arrayrecord_key"})
    fewer_nodes_effect = (
        "every node trains every round (only which model it trains is sampled)"
    )
    client_side = ClientSide(
        "add `add_norm_query(app, train)` and `@app.train(mods=[KeptUpdateMod()])` "
        "(variant='gradnorm'), `add_loss_query(app, evaluate)` ('loss') or "
        "`add_model_sizes_query(app, num_examples=...)` ('random', 'round-robin'), "
        "from flwr_importance.clientapps.variance_reduced, with a train function that "
        "reads `model-index`",
        OPTIMAL_SAMPLING_DOCS,
    )

    def __init__(
        self,
        *,
        num_models: int,
        clients_per_round: int,
        variant: Variant = "gradnorm",
        server_lr: float = 1.0,
        report_cap: float | None = None,
        **options: Unpack[StrategyOptions],
    ) -> None:
        self.num_models = check_count("num_models", num_models)
        check_choice("variant", variant, Variant)
        self.variant = variant
        super().__init__(
            clients_per_round=clients_per_round,
            server_lr=server_lr,
            report_cap=report_cap,
            **options,
        )
        self._known_sizes: dict[int, NDArray[np.float64]] = {}

    def summary(self) -> None:
        """Log the method's parameters, then the shared ones."""
        log_settings(
            f"MultiModelSampling ({self.variant})",
            {
                "Models S": self.num_models,
                "Expected active clients m": self.clients_per_round,
                "Server lr": f"{self.server_lr:g}",
                **report_cap_setting(self.report_cap),
            },
        )
        super().summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Compute ``p_{s|i}`` for the variant, assign models, build messages."""
        models = tuple(unpack_models(arrays))
        if len(models) != self.num_models:
            raise ValueError(
                f"{len(models)} packed models, strategy built for {self.num_models}"
            )
        node_ids, query_config = self.round_population(grid, server_round, config)
        if self.variant in ("gradnorm", "loss"):
            sample = self._optimal_sample(node_ids, query_config, models, grid)
        else:
            sample = self._baseline_sample(server_round, node_ids, grid)
        population, fractions, probs, assigned, scores = sample
        plan = SamplePlan(
            server_round=server_round,
            arrays=arrays,
            nodes=frozenset(assigned),
            node_ids=tuple(population),
            fractions=fractions,
            probs=probs,
            assigned=assigned,
            models=models,
            scores=scores,
        )
        self.keep_plan(plan)
        log(
            INFO,
            "configure_train: %d of %d nodes active, per model %s",
            len(assigned),
            len(population),
            np.bincount(list(assigned.values()), minlength=self.num_models),
        )
        return self.train_messages(plan, config, send_models=self.variant != "gradnorm")

    def _optimal_sample(
        self,
        node_ids: list[int],
        config: ConfigRecord,
        models: Sequence[ArrayRecord],
        grid: Grid,
    ) -> _Sample:
        """``p = mmfl_probs(d * score, m)`` from a norm or loss query."""
        action, score_key = (
            (protocol.NORM_QUERY, protocol.UPDATE_NORM)
            if self.variant == "gradnorm"
            else (protocol.LOSS_QUERY, protocol.LOSS)
        )
        answered, (scores, sizes) = self.query_matrix(
            grid,
            dict.fromkeys(node_ids, config),
            action,
            [score_key, protocol.NUM_EXAMPLES],
            self.num_models,
            {protocol.model_record_name(s): model for s, model in enumerate(models)},
        )
        scores = self.bounded(scores, answered, score_key)
        fractions = size_fractions(self.bounded(sizes, answered, protocol.NUM_EXAMPLES))
        weighted_scores = fractions * scores
        probs = mmfl_probs(weighted_scores, self.clients_per_round)
        drawn = assign_models(probs, self.rng)
        assigned = {
            answered[int(row)]: int(drawn[row]) for row in np.flatnonzero(drawn >= 0)
        }
        # Only update norms make the estimator's variance known.
        norms = weighted_scores if self.variant == "gradnorm" else None
        return answered, fractions, probs, assigned, norms

    def _baseline_sample(
        self, server_round: int, node_ids: list[int], grid: Grid
    ) -> _Sample:
        """``m`` clients without replacement; a random or rotating model each."""
        unknown = [node_id for node_id in node_ids if node_id not in self._known_sizes]
        if unknown:
            answered, (sizes,) = self.query_matrix(
                grid,
                dict.fromkeys(
                    unknown,
                    ConfigRecord(
                        {
                            protocol.SERVER_ROUND: server_round,
                            protocol.NUM_MODELS: self.num_models,
                        }
                    ),
                ),
                protocol.SIZES_QUERY,
                [protocol.NUM_EXAMPLES],
                self.num_models,
            )
            self._known_sizes.update(zip(answered, sizes, strict=True))
        population = [node_id for node_id in node_ids if node_id in self._known_sizes]
        known = [self._known_sizes[node] for node in population]
        if self.report_cap is not None:
            known = list(
                self.bounded(
                    np.array(known).reshape(len(population), self.num_models),
                    population,
                    protocol.NUM_EXAMPLES,
                )
            )
        fractions = size_fractions(known)
        fractions = fractions.reshape(len(population), self.num_models)
        num_active = min(self.clients_per_round, len(population))
        active = self.rng.choice(len(population), size=num_active, replace=False)
        if self.variant == "random":
            models = self.rng.integers(self.num_models, size=num_active)
        else:
            models = np.array(
                [(population[row] + server_round) % self.num_models for row in active]
            )
        probs = np.full(
            fractions.shape,
            uniform_assignment_prob(
                max(len(population), 1), self.num_models, self.clients_per_round
            ),
        )
        assigned = {
            population[row]: int(model)
            for row, model in zip(active, models, strict=True)
        }
        return population, fractions, probs, assigned, None

    def aggregate_round(
        self, plan: SamplePlan, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Apply ``w_s + server_lr * sum_{i in A_s} (d_is / p_is) U_is`` per model."""
        new_models, metrics = self.unbiased_step(plan, replies)
        metrics["expected-participants"] = float(plan.probs.sum())
        norms = plan.scores
        # No population: every node failed its query; nothing to compare.
        if norms is not None and norms.shape[0] > 0:
            random_probs = np.full_like(
                norms,
                uniform_assignment_prob(
                    norms.shape[0], self.num_models, self.clients_per_round
                ),
            )
            metrics["variance"] = estimator_variance(norms, plan.probs)
            metrics["random-variance"] = estimator_variance(norms, random_probs)
        return pack_models(new_models), MetricRecord(dict(metrics))


METHOD = MethodSpec(
    name="mmfl",
    strategy=MultiModelSampling,
    client_handlers="flwr_importance.clientapps.variance_reduced:make_mmfl_handlers",
    # Several models in one round trip: the legacy API carries one Parameters.
    legacy_api=False,
    central_dp_refusal=(
        "each client's probabilities p_{s|i} water-fill over every client's "
        "norms, and its weights d_is are normalised over the replies: one "
        "client moves the others' terms"
    ),
)
