"""The mechanism measured directly: each sampler's error against full participation.

Every variance-reducing sampler exists to bring the round's aggregate closer
to the full-participation update ``sum_i d_i U_i`` (``d_i = n_i / sum_j n_j``)
at the same expected participation ``m``. This benchmark measures that error
on real client updates (:mod:`benchmarks.mechanism_capture`): at an early, a
middle and a late round of a claim benchmark's run (its setting and seeds),
every client trains from the same global model; each sampler then draws its
sample :data:`DRAWS` times (``--full``: :data:`DRAWS_FULL`) with the
library's own sampling functions, forms its aggregate as its strategy does,
and the mean of ``||aggregate - full update||^2`` over the draws estimates
its error:

- OCS and AOCS (Chen et al.): independent participation with ``p_i`` from
  ``optimal_client_probs`` / ``aocs_probs`` on ``||d_i U_i||``, aggregate
  ``sum_{i in S} (d_i / p_i) U_i``; against the same estimator at uniform
  probabilities ``p_i = m / N``, drawn by the same ``poisson_sample``
  (independent Bernoulli participation);
- clustered sampling, Algorithms 1 and 2 (Fraboni et al.): one draw per
  distribution, plain mean of the drawn updates counted with repeats; against
  MD sampling (``md_sample``, ``m`` draws with ``p_i = d_i``);
- MMFL (Zhang et al.), per model: ``mmfl_probs`` on ``||d_is U_is||`` (and on
  the losses, its loss variant), ``assign_models``, ``sum (d_is / p_is)
  U_is`` per model; against random assignment (``m`` clients without
  replacement, each a uniform model, ``p = m / (N S)``);
- ISFedAvg's client level (Rizk et al.), on its headline preset: ``L``
  clients by ``systematic_sample`` at the realized probabilities of the
  run's stored ``p_k`` (eqs. 28-29), the mean of the updates each divided by
  ``K p_k`` (the client's own rescaling, to first order in the step); against
  its uniform variant (``p_k = 1/K``). The models and ``p_k`` come from
  ISFedAvg's own run, every client's update from its ClientApp at
  ``p_k = 1/K`` (no rescaling) with its ``E_k`` and ``B_k``;
- Power-of-Choice (Cho et al., ``pow-d``): ``draw_candidates`` by size,
  ``select_highest`` losses at ``w^t``, plain mean; against uniform sampling
  as the simulation's FedAvg does it (``uniform_client_set``, ``m`` distinct
  clients, mean weighted by ``n_i``) and MD sampling. It is biased on
  purpose: its squared bias ``||E aggregate - full update||^2`` is reported
  beside its error.

Every aggregate is linear in the updates, ``sum_i W_i U_i`` with the draw's
weights ``W``, so its squared error is ``(W - d)^T G (W - d)`` with the Gram
matrix ``G = U U^T``: a draw costs ``O(N^2)`` whatever the model's size.

The global models come from the *baseline's* run of each claim benchmark
(uniform FedAvg, MD sampling, random assignment) in its own setting: every
sampler of a setting is judged on the same updates, at models none of the
compared methods steered (ISFedAvg's from its own run, the only one holding
its client probabilities). Algorithm 2's representative gradients are every
client's update of the round before (the state its strategy holds when
every client trained then).

Ratios (method / baseline) are geometric means over the captured rounds of
the per-round error ratios, with a 95% bootstrap interval over the captured
rounds (paired: both samplers see the same updates), each round's ratio
perturbed by its Monte Carlo error; the p-value for "ratio = 1" and the
detectable effect (80% power, two-sided 5%) come from the same resamples
(:mod:`benchmarks.evidence`), and so does the verdict. Each setting gives
one row per comparison (per model for MMFL) and round stage, and a pooled
one; the pooled rows of the settings whose paper states a lower error go to
``claims.json``. Power-of-Choice's paper states a bias, not a lower error:
its rows say only on which side of 1 the ratio lies.

Quick mode: :data:`SEEDS`, :data:`DRAWS` draws, the claim benchmarks' quick
settings; ``--full``: :data:`SEEDS_FULL`, :data:`DRAWS_FULL` draws, their
``--full`` settings. Seeds run in up to two worker processes; the summary
states the time taken.

Usage: ``python -m benchmarks.mechanism [--full] [--output-dir DIR]``.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from benchmarks import clustered, isfedavg, variance_reduced
from benchmarks import power_of_choice as power_of_choice_benchmark
from benchmarks.evidence import (
    CLAIMS_FILE,
    LEVEL,
    MAX_WORKERS,
    MIN_REPORTED_SEEDS,
    MIN_REPORTED_SEEDS_FULL,
    RESAMPLES,
    ClaimRow,
    Overrides,
    RatioInterval,
    bootstrap_p_value,
    detectable_effect,
    effect_text,
    verdict,
    write_claims,
)
from benchmarks.harness import (
    benchmark_parser,
    markdown_table,
    prepare_run,
    start_benchmark,
)
from benchmarks.mechanism_capture import CapturedRound, capture_rounds
from flwr_importance.aggregation.isfedavg import realized_normalized_probs
from flwr_importance.aggregation.variance_reduced import uniform_assignment_prob
from flwr_importance.sampling.clustered import (
    clustered_distributions_by_size,
    clustered_distributions_from_distances,
    sample_from_distributions,
)
from flwr_importance.sampling.distances import Distance
from flwr_importance.sampling.pips import md_sample, poisson_sample, systematic_sample
from flwr_importance.sampling.power_of_choice import draw_candidates, select_highest
from flwr_importance.sampling.representatives import RepresentativeGradients
from flwr_importance.sampling.schedule import uniform_client_set
from flwr_importance.sampling.variance_reduced import (
    aocs_probs,
    assign_models,
    mmfl_probs,
    optimal_client_probs,
)
from simulations.inprocess import default_run_config, load_preset

#: The section title of this benchmark in docs/results.md.
TITLE = "The mechanism: each sampler's aggregate error against full participation"

#: Draws of each sampler per captured round.
DRAWS, DRAWS_FULL = 10_000, 20_000
#: Seeds of the runs whose rounds are captured: as many as every comparison
#: reports at least (:data:`benchmarks.evidence.MIN_REPORTED_SEEDS`).
SEEDS = tuple(range(MIN_REPORTED_SEEDS))
SEEDS_FULL = tuple(range(MIN_REPORTED_SEEDS_FULL))
#: What the ratio is of, in the claim table.
STATISTIC = "aggregate MSE vs full participation"
STAGES = ("early", "middle", "late")
#: A row's reading where the paper claims nothing of the error.
UNCLAIMED_READING = {"as the paper": "lower", "unlike the paper": "higher"}
POOLED = "pooled"

#: A sampler: the captured round (one per model) and a generator to ``draws``
#: weight matrices, one per model, of shape ``(draws, N)``: the aggregate of
#: draw ``k`` is ``sum_i W[k, i] U_i``.
DrawWeights = Callable[
    [Sequence[CapturedRound], np.random.Generator, int], list[NDArray[np.float64]]
]


@dataclass(frozen=True)
class Sampler:
    """A sampler as its strategy aggregates: weights per draw, unbiased or not."""

    draw: DrawWeights
    unbiased: bool


# -- samplers ------------------------------------------------------------------
#: Draws made in one call of a library sampling function: every function draws
#: independently per row or entry, so ``k`` draws are one call on ``k`` stacked
#: copies of the round's probabilities, in chunks that bound the memory.
CHUNK = 1_000
#: ``(rng, draws) -> positions``: the clients of each draw, shape ``(draws, k)``.
Positions = Callable[[np.random.Generator, int], NDArray[np.intp]]


def _chunks(draws: int) -> list[int]:
    """``draws`` as chunk sizes of at most :data:`CHUNK`."""
    return [min(CHUNK, draws - start) for start in range(0, draws, CHUNK)]


def independent(probabilities: Callable[[CapturedRound], NDArray]) -> Sampler:
    """Independent participation (``poisson_sample``), aggregate ``sum (d/p) U``."""

    def draw(
        models: Sequence[CapturedRound], rng: np.random.Generator, draws: int
    ) -> list[NDArray[np.float64]]:
        (model,) = models
        probs = probabilities(model)
        scale = np.divide(
            model.fractions, probs, out=np.zeros_like(probs), where=probs > 0
        )
        blocks = []
        for size in _chunks(draws):
            included = np.zeros(size * model.num_clients)
            included[poisson_sample(np.tile(probs, size), rng)] = 1.0
            blocks.append(included.reshape(size, model.num_clients) * scale)
        return [np.concatenate(blocks)]

    return Sampler(draw, unbiased=True)


def multiset(
    positions: Callable[[CapturedRound], Positions], *, unbiased: bool = True
) -> Sampler:
    """Draws with repeats, plain mean counted with multiplicity (MD, clustered, PoC).

    ``positions(model)`` prepares the round (its distributions) and draws.
    """

    def draw(
        models: Sequence[CapturedRound], rng: np.random.Generator, draws: int
    ) -> list[NDArray[np.float64]]:
        (model,) = models
        drawn = positions(model)(rng, draws)
        clients = model.num_clients
        cells = drawn + clients * np.arange(draws)[:, None]
        counts = np.bincount(cells.ravel(), minlength=draws * clients)
        return [counts.reshape(draws, clients) / drawn.shape[1]]

    return Sampler(draw, unbiased=unbiased)


def ocs(m: int) -> Sampler:
    """OCS's exact probabilities on ``||d_i U_i||``."""
    return independent(lambda model: optimal_client_probs(model.weighted_norms, m))


def aocs(m: int, iterations: int) -> Sampler:
    """AOCS's probabilities after ``iterations`` rescalings."""
    return independent(
        lambda model: aocs_probs(model.weighted_norms, m, max_iterations=iterations)
    )


def uniform_independent(m: int) -> Sampler:
    """OCS's estimator at uniform probabilities ``m / N``."""
    return independent(lambda model: np.full(model.num_clients, m / model.num_clients))


def md(m: int) -> Sampler:
    """MD sampling: ``m`` i.i.d. draws with ``p_i = d_i``."""

    def positions(model: CapturedRound) -> Positions:
        return lambda rng, draws: md_sample(model.fractions, m * draws, rng).reshape(
            draws, m
        )

    return multiset(positions)


def _from_distributions(distributions: NDArray[np.float64]) -> Positions:
    """One draw per distribution (``sample_from_distributions``), per draw."""

    def draw(rng: np.random.Generator, draws: int) -> NDArray[np.intp]:
        rows = distributions.shape[0]
        return np.concatenate(
            [
                sample_from_distributions(np.tile(distributions, (size, 1)), rng)
                .reshape(size, rows)
                .astype(np.intp)
                for size in _chunks(draws)
            ]
        )

    return draw


def clustered_by_size(m: int) -> Sampler:
    """Clustered sampling, Algorithm 1 (distributions by sample size)."""
    return multiset(
        lambda model: _from_distributions(
            clustered_distributions_by_size(model.sizes, m)
        )
    )


def clustered_by_similarity(m: int, *, distance: Distance = "arccos") -> Sampler:
    """Clustered sampling, Algorithm 2, on the previous round's updates.

    The representative gradients and their distances are the strategy's own
    (:class:`~flwr_importance.sampling.representatives.RepresentativeGradients`).
    """

    def positions(model: CapturedRound) -> Positions:
        gradients = RepresentativeGradients(distance, None, model.seed)
        gradients.align(list(range(model.num_clients)))
        if model.previous_updates is None:
            raise ValueError("Algorithm 2 needs the previous round's updates")
        gradients.update(dict(enumerate(model.previous_updates)))
        return _from_distributions(
            clustered_distributions_from_distances(
                model.sizes, gradients.distances(), m
            )
        )

    return multiset(positions)


def power_of_choice(m: int, candidates: int) -> Sampler:
    """``pow-d``: the ``m`` highest losses of ``candidates`` drawn by size.

    One draw at a time: ``draw_candidates`` draws without replacement.
    """

    def positions(model: CapturedRound) -> Positions:
        def draw(rng: np.random.Generator, draws: int) -> NDArray[np.intp]:
            chosen = np.empty((draws, m), dtype=np.intp)
            for row in chosen:
                drawn = draw_candidates(model.sizes, candidates, rng)
                row[:] = drawn[select_highest(model.losses[drawn], m)]
            return chosen

        return draw

    return multiset(positions, unbiased=False)


def uniform_fedavg(m: int) -> Sampler:
    """The simulation's FedAvg: ``m`` distinct clients, mean weighted by ``n_i``.

    One draw at a time: ``uniform_client_set`` seeds each draw (its round).
    """

    def draw(
        models: Sequence[CapturedRound], rng: np.random.Generator, draws: int
    ) -> list[NDArray[np.float64]]:
        (model,) = models
        seed = int(rng.integers(2**31))
        clients = range(model.num_clients)
        weights = np.zeros((draws, model.num_clients))
        for draw_index, row in enumerate(weights):
            chosen = uniform_client_set(
                clients, m, seed=seed, server_round=draw_index, replace=False
            )
            row[chosen] = model.sizes[chosen] / model.sizes[chosen].sum()
        return [weights]

    return Sampler(draw, unbiased=False)


def isfedavg_client_level(clients: int, *, uniform: bool = False) -> Sampler:
    """ISFedAvg's client level: ``L`` clients by ``systematic_sample``, eq. 5's mean.

    Inclusion ``L p_k`` with the realized probabilities the strategy sends
    (``realized_normalized_probs`` of its stored ``p_k``, or of ``1/K`` for
    its uniform variant); a selected client divides its step by ``K p_k``,
    taken here as its update divided by ``K p_k`` (exact for one local step,
    to first order in the step otherwise); the aggregate is the plain mean of
    the ``L`` scaled updates. One draw at a time (a random order per draw).
    """

    def draw(
        models: Sequence[CapturedRound], rng: np.random.Generator, draws: int
    ) -> list[NDArray[np.float64]]:
        (model,) = models
        population = model.num_clients
        stored = (
            np.full(population, 1 / population)
            if uniform or model.client_probs is None
            else model.client_probs
        )
        realized = realized_normalized_probs(stored, clients)
        scale = 1 / (clients * population * realized)
        weights = np.zeros((draws, population))
        for row in weights:
            chosen = systematic_sample(clients * realized, rng)
            row[chosen] = scale[chosen]
        return [weights]

    return Sampler(draw, unbiased=True)


def _model_matrix(
    models: Sequence[CapturedRound], column: Callable[[CapturedRound], NDArray]
) -> NDArray[np.float64]:
    """``(N, S)``: ``column(model)`` per model."""
    return np.stack([column(model) for model in models], axis=1)


def _assigned_weights(
    models: Sequence[CapturedRound],
    assigned: NDArray[np.intp],
    probs: NDArray[np.float64],
) -> list[NDArray[np.float64]]:
    """Per model ``s``: ``W[k, i] = d_is / p_is`` if draw ``k`` gives ``i`` model ``s``.

    ``assigned`` is ``(draws, N)``: each draw's model per client, -1 if idle.
    """
    fractions = _model_matrix(models, lambda model: model.fractions)
    scale = np.divide(fractions, probs, out=np.zeros_like(probs), where=probs > 0)
    return [
        np.where(assigned == index, scale[:, index], 0.0)
        for index in range(len(models))
    ]


def mmfl(m: int, *, by_loss: bool = False) -> Sampler:
    """MMFL: ``mmfl_probs`` on ``d_is ||U_is||`` (or ``d_is`` times the loss)."""

    def draw(
        models: Sequence[CapturedRound], rng: np.random.Generator, draws: int
    ) -> list[NDArray[np.float64]]:
        scores = _model_matrix(
            models,
            (lambda model: model.fractions * model.losses)
            if by_loss
            else (lambda model: model.weighted_norms),
        )
        probs = mmfl_probs(scores, m)
        assigned = np.concatenate(
            [
                assign_models(np.tile(probs, (size, 1)), rng).reshape(size, -1)
                for size in _chunks(draws)
            ]
        )
        return _assigned_weights(models, assigned, probs)

    return Sampler(draw, unbiased=True)


def random_assignment(m: int) -> Sampler:
    """MMFL's random baseline: ``m`` clients without replacement, a uniform model each.

    ``MultiModelSampling`` draws it in a private method (``rng.choice`` of the
    clients, then ``rng.integers`` of their models); the same distribution
    here, every draw at once (the first ``m`` of a random permutation).
    """

    def draw(
        models: Sequence[CapturedRound], rng: np.random.Generator, draws: int
    ) -> list[NDArray[np.float64]]:
        clients, num_models = models[0].num_clients, len(models)
        active_count = min(m, clients)
        order = rng.permuted(np.tile(np.arange(clients), (draws, 1)), axis=1)
        assigned = np.full((draws, clients), -1, dtype=np.intp)
        np.put_along_axis(
            assigned,
            order[:, :active_count],
            rng.integers(num_models, size=(draws, active_count)),
            axis=1,
        )
        probs = np.full(
            (clients, num_models), uniform_assignment_prob(clients, num_models, m)
        )
        return _assigned_weights(models, assigned, probs)

    return Sampler(draw, unbiased=True)


def full_participation() -> Sampler:
    """Every client at its full-participation weight: no error (a check)."""

    def draw(
        models: Sequence[CapturedRound], rng: np.random.Generator, draws: int
    ) -> list[NDArray[np.float64]]:
        return [np.tile(model.fractions, (draws, 1)) for model in models]

    return Sampler(draw, unbiased=True)


# -- errors ----------------------------------------------------------------------
@dataclass(frozen=True)
class AggregateError:
    """One sampler's error on one captured round (one model).

    Attributes
    ----------
    mse : float
        Mean over the draws of ``||aggregate - full update||^2``.
    standard_error : float
        Its Monte Carlo standard error.
    squared_bias : float
        ``||mean aggregate - full update||^2``, the mean over the draws.
    full_norm2 : float
        ``||full update||^2``, the scale the errors are read against.
    """

    mse: float
    standard_error: float
    squared_bias: float
    full_norm2: float

    def to_json(self) -> dict[str, float]:
        """The four numbers, by name."""
        return {
            "mse": self.mse,
            "standard-error": self.standard_error,
            "squared-bias": self.squared_bias,
            "full-norm2": self.full_norm2,
        }


def aggregate_errors(
    model: CapturedRound, weights: NDArray[np.float64]
) -> NDArray[np.float64]:
    """``||sum_i W[k, i] U_i - sum_i d_i U_i||^2`` for every draw ``k``."""
    deviations = weights - model.fractions
    return np.einsum("kn,nm,km->k", deviations, model.gram, deviations)


def measure(
    sampler: Sampler,
    models: Sequence[CapturedRound],
    *,
    draws: int,
    seed: int,
) -> list[AggregateError]:
    """The sampler's error per model of one captured round, over ``draws`` draws."""
    rng = np.random.default_rng(seed)
    results = []
    for model, weights in zip(models, sampler.draw(models, rng, draws), strict=True):
        errors = aggregate_errors(model, weights)
        bias = weights.mean(axis=0) - model.fractions
        results.append(
            AggregateError(
                mse=float(errors.mean()),
                standard_error=float(errors.std(ddof=1) / np.sqrt(draws)),
                squared_bias=float(bias @ model.gram @ bias),
                full_norm2=float(model.full_update @ model.full_update),
            )
        )
    return results


# -- ratios ----------------------------------------------------------------------
def error_ratio(
    method: Sequence[AggregateError],
    baseline: Sequence[AggregateError],
    *,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> RatioInterval:
    """Geometric mean of the per-round error ratios, bootstrap over the rounds.

    Entry ``j`` of both sides comes from the same captured round (the same
    updates), so each resample picks rounds once for both; each picked round's
    log ratio moves by a normal draw of its Monte Carlo standard error (delta
    method), so a single round still gets the interval its draws allow. The
    p-value and the detectable effect come from the same resamples
    (:func:`benchmarks.evidence.bootstrap_p_value`,
    :func:`benchmarks.evidence.detectable_effect`).

    Returns
    -------
    RatioInterval
        The ratio, its interval, p-value and detectable effect; NaN where an
        error is 0 (a sampler that always draws everyone).

    Raises
    ------
    ValueError
        If the sides differ in length or are empty.
    """
    if len(method) != len(baseline) or not method:
        raise ValueError(
            f"need one error per captured round on both sides, got {len(method)} "
            f"and {len(baseline)}"
        )
    method_mse = np.array([error.mse for error in method])
    base_mse = np.array([error.mse for error in baseline])
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratios = np.log(method_mse) - np.log(base_mse)
        log_variances = (
            np.array([error.standard_error for error in method]) / method_mse
        ) ** 2 + (
            np.array([error.standard_error for error in baseline]) / base_mse
        ) ** 2
    if not (np.all(np.isfinite(log_ratios)) and np.all(np.isfinite(log_variances))):
        nan = float("nan")
        return RatioInterval(nan, nan, nan)
    rng = np.random.default_rng(seed)
    picked = rng.integers(0, log_ratios.size, size=(resamples, log_ratios.size))
    noise = rng.normal(0.0, np.sqrt(log_variances[picked]))
    ratios = np.exp((log_ratios[picked] + noise).mean(axis=1))
    tail = (1 - level) / 2
    return RatioInterval(
        float(np.exp(log_ratios.mean())),
        float(np.quantile(ratios, tail, method="inverted_cdf")),
        float(np.quantile(ratios, 1 - tail, method="inverted_cdf")),
        p_value=bootstrap_p_value(ratios, ratios),
        detectable_effect=detectable_effect(ratios),
    )


# -- settings --------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Setting:
    """One claim benchmark's setting: its runs, its samplers, its comparisons.

    Attributes
    ----------
    name : str
        A short name (the table's first column).
    paper, claim, data : str
        As in the claim table.
    overrides : Overrides
        The run config of the run whose rounds are captured (the baseline's).
    run : str
        Which run that is, in words.
    rounds : tuple[int, int, int]
        The early, middle and late rounds captured.
    participation : int
        ``m``, the expected participants (draws) of every sampler.
    samplers : dict[str, Sampler]
        By name.
    comparisons : tuple[tuple[str, str], ...]
        ``(method, baseline)`` pairs.
    previous : bool
        Whether a sampler needs the previous round's updates (Algorithm 2).
    claimed : bool
        Whether the paper states the error is lower (the rows go to the claim
        table); Power-of-Choice's paper states a bias, not a lower error.
    """

    name: str
    paper: str
    claim: str
    data: str
    overrides: Overrides
    run: str
    rounds: tuple[int, int, int]
    participation: int
    samplers: dict[str, Sampler]
    comparisons: tuple[tuple[str, str], ...]
    previous: bool = False
    claimed: bool = True


def settings(full: bool) -> list[Setting]:
    """The claim benchmarks' settings, quick or ``--full``, as they run them."""
    single, multi = variance_reduced.descriptions(full)
    ocs_shared = dict(single.comparisons[0].shared)
    ocs_m = int(ocs_shared["clients-per-round"])
    ocs_rounds = int(ocs_shared["num-server-rounds"])
    mmfl_shared = dict(multi.comparisons[0].shared)
    mmfl_m = int(mmfl_shared["clients-per-round"])
    mmfl_rounds = int(mmfl_shared["num-server-rounds"])
    clustered_shared = load_preset("clustered-digits")
    clustered_m = int(clustered_shared["clients-per-round"])
    clustered_rounds = 100 if full else 30
    isfedavg_shared = load_preset("isfedavg-logistic")
    isfedavg_l = int(isfedavg_shared["clients-per-round"])
    isfedavg_rounds = int(isfedavg_shared["num-server-rounds"]) if full else 40
    power_of_choice_shared = load_preset(power_of_choice_benchmark.PRESET)
    power_of_choice_m = int(power_of_choice_shared["clients-per-round"])
    power_of_choice_rounds = 60 if full else 30
    return [
        Setting(
            name="OCS",
            paper=single.paper,
            claim="optimal client sampling has a lower update variance than "
            "uniform sampling at equal expected participation",
            data=single.data,
            overrides={**ocs_shared, "strategy": "fedavg"},
            run="uniform FedAvg",
            rounds=_stages(ocs_rounds),
            participation=ocs_m,
            samplers={
                "ocs": ocs(ocs_m),
                "aocs": aocs(ocs_m, int(_app_default("ocs-aocs-iterations"))),
                "uniform": uniform_independent(ocs_m),
            },
            comparisons=(("ocs", "uniform"), ("aocs", "uniform")),
        ),
        Setting(
            name="Clustered",
            paper=clustered.PAPER,
            claim="clustered sampling gives aggregation weights of lower variance "
            "than MD sampling, hence a lower-variance aggregate",
            data="digits, one class per client (100 clients, 10 per digit), "
            "logistic regression: the paper's MNIST setting",
            overrides={**clustered_shared, "strategy": "md"},
            run="MD sampling",
            rounds=_stages(clustered_rounds),
            participation=clustered_m,
            samplers={
                "alg1-size": clustered_by_size(clustered_m),
                "alg2-arccos": clustered_by_similarity(clustered_m),
                "md": md(clustered_m),
            },
            comparisons=(("alg1-size", "md"), ("alg2-arccos", "md")),
            previous=True,
        ),
        Setting(
            name="MMFL",
            paper=multi.paper,
            claim="variance-reduced client-model assignment has a lower "
            "variance of each model's aggregate than random assignment",
            data=multi.data,
            overrides={**mmfl_shared, "mmfl-variant": "random"},
            run="random assignment",
            rounds=_stages(mmfl_rounds),
            participation=mmfl_m,
            samplers={
                "mmfl-gradnorm": mmfl(mmfl_m),
                "mmfl-loss": mmfl(mmfl_m, by_loss=True),
                "random": random_assignment(mmfl_m),
            },
            comparisons=(("mmfl-gradnorm", "random"), ("mmfl-loss", "random")),
        ),
        Setting(
            name="ISFedAvg",
            paper=isfedavg.PAPER,
            claim="importance sampling of clients (eqs. 28-29) gives a "
            "lower-variance aggregate than uniform sampling of as many clients",
            data="the ISFedAvg logistic preset (synthetic logistic regression, "
            "100 clients of 100 samples, E_k in 1..5, B_k in 1..10): equal "
            "sizes, so the full-participation update is eq. 1's plain mean",
            overrides={
                **isfedavg_shared,
                "num-server-rounds": isfedavg_rounds,
            },
            run="ISFedAvg (its client probabilities exist only there)",
            rounds=_stages(isfedavg_rounds),
            participation=isfedavg_l,
            samplers={
                "isfedavg": isfedavg_client_level(isfedavg_l),
                "uniform": isfedavg_client_level(isfedavg_l, uniform=True),
            },
            comparisons=(("isfedavg", "uniform"),),
        ),
        Setting(
            name="Power-of-Choice",
            paper=power_of_choice_benchmark.PAPER,
            claim="Power-of-Choice biases the aggregate towards high-loss clients",
            data="digits split over 100 clients by Dirichlet(0.3) labels, "
            "logistic regression (the Power-of-Choice benchmark's)",
            overrides={**power_of_choice_shared, "strategy": "fedavg"},
            run="uniform FedAvg",
            rounds=_stages(power_of_choice_rounds),
            participation=power_of_choice_m,
            samplers={
                "pow-d": power_of_choice(
                    power_of_choice_m,
                    int(power_of_choice_shared["power-of-choice-candidates"]),
                ),
                "uniform": uniform_fedavg(power_of_choice_m),
                "md": md(power_of_choice_m),
            },
            comparisons=(("pow-d", "uniform"), ("pow-d", "md")),
            claimed=False,
        ),
    ]


def _stages(rounds: int) -> tuple[int, int, int]:
    """Early, middle and late rounds of a run of ``rounds`` rounds."""
    return (2, max(3, (rounds + 1) // 2), rounds)


def _app_default(key: str) -> bool | int | float | str:
    """The app's default for run-config ``key``."""
    return default_run_config()[key]


# -- evaluation ------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class MechanismRow:
    """One comparison at one stage (or pooled), for one model."""

    setting: str
    method: str
    baseline: str
    model_index: int | None
    stage: str
    rounds: tuple[int, ...]
    method_errors: tuple[AggregateError, ...]
    baseline_errors: tuple[AggregateError, ...]
    ratio: RatioInterval
    unbiased: bool
    claimed: bool

    @property
    def verdict(self) -> str:
        """:func:`benchmarks.evidence.verdict`, paper's direction below 1.

        Where the paper claims nothing of the error (``claimed`` False), the
        side of 1 the interval lies on: ``"lower"`` or ``"higher"``.
        """
        reading = verdict(self.ratio.low, self.ratio.high, "below")
        if self.claimed:
            return reading
        return UNCLAIMED_READING.get(reading, reading)

    @property
    def label(self) -> str:
        """``method / baseline`` with the model where there are several."""
        model = "" if self.model_index is None else f" (model {self.model_index})"
        return f"{self.method} / {self.baseline}{model}"

    def relative(self, errors: Sequence[AggregateError]) -> float:
        """Median over the rounds of the error over ``||full update||^2``."""
        return float(np.median([error.mse / error.full_norm2 for error in errors]))

    def bias_share(self) -> float:
        """Median over the rounds of the method's squared bias over its error."""
        return float(
            np.median([error.squared_bias / error.mse for error in self.method_errors])
        )

    def cells(self) -> list[str]:
        """The markdown table's cells."""
        return [
            self.setting,
            self.label,
            f"{self.stage} ({', '.join(str(value) for value in self.rounds)})",
            f"{self.relative(self.method_errors):.3g}",
            f"{self.relative(self.baseline_errors):.3g}",
            self.ratio.text(),
            "n/a" if self.ratio.p_value is None else f"{self.ratio.p_value:.2g}",
            effect_text(self.ratio.detectable_effect),
            "unbiased" if self.unbiased else f"{self.bias_share():.0%}",
            self.verdict,
        ]

    def to_json(self) -> dict[str, Any]:
        """Every number of the row."""
        interval = self.ratio
        return {
            "setting": self.setting,
            "method": self.method,
            "baseline": self.baseline,
            "model": self.model_index,
            "stage": self.stage,
            "rounds": list(self.rounds),
            "ratio": interval.ratio,
            "low": interval.low,
            "high": interval.high,
            "p-value": interval.p_value,
            "detectable-effect": interval.detectable_effect,
            "verdict": self.verdict,
            "method-errors": [error.to_json() for error in self.method_errors],
            "baseline-errors": [error.to_json() for error in self.baseline_errors],
        }


@dataclass(frozen=True)
class UnitResult:
    """Every sampler's errors (per model) on one captured round."""

    seed: int
    stage: str
    server_round: int
    errors: dict[str, list[AggregateError]]


def measure_seed(
    setting: Setting,
    seed: int,
    *,
    draws: int,
    capture: Callable[..., list[CapturedRound]] = capture_rounds,
) -> list[UnitResult]:
    """Capture the setting's rounds of ``seed``'s run; measure every sampler on each."""
    started = time.perf_counter()
    captured = capture(
        setting.overrides,
        seed=seed,
        rounds=setting.rounds,
        previous=setting.previous,
    )
    units = []
    for stage, server_round in zip(STAGES, setting.rounds, strict=True):
        models = [model for model in captured if model.server_round == server_round]
        units.append(
            UnitResult(
                seed,
                stage,
                server_round,
                {
                    name: measure(
                        sampler,
                        models,
                        draws=draws,
                        seed=_draw_seed(seed, server_round, index),
                    )
                    for index, (name, sampler) in enumerate(setting.samplers.items())
                },
            )
        )
    print(
        f"  {setting.name} seed {seed}: rounds {setting.rounds} captured and "
        f"drawn ({time.perf_counter() - started:.1f} s)",
        flush=True,
    )
    return units


def evaluate_setting(
    setting: Setting, *, seeds: Sequence[int], draws: int
) -> list[MechanismRow]:
    """:func:`measure_seed` for every seed, in this process, then the rows."""
    units = [
        unit for seed in seeds for unit in measure_seed(setting, seed, draws=draws)
    ]
    return comparison_rows(setting, units)


def _setting_seed(full: bool, name: str, seed: int, draws: int) -> list[UnitResult]:
    """:func:`measure_seed` of the setting ``name`` (a worker process's job).

    The settings are rebuilt here: samplers are closures, which do not pickle.
    """
    setting = next(each for each in settings(full) if each.name == name)
    return measure_seed(setting, seed, draws=draws)


def evaluate_all(
    full: bool, *, seeds: Sequence[int], draws: int, workers: int = MAX_WORKERS
) -> tuple[list[Setting], list[MechanismRow]]:
    """Every setting and seed, ``workers`` processes side by side; the rows.

    Each seed's numbers depend on the seed alone, whichever process runs it.
    """
    setting_list = settings(full)
    jobs = [(setting.name, seed) for setting in setting_list for seed in seeds]
    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=prepare_run,
    ) as pool:
        results = pool.map(
            _setting_seed,
            [full] * len(jobs),
            [name for name, _ in jobs],
            [seed for _, seed in jobs],
            [draws] * len(jobs),
        )
        units = dict(zip(jobs, results, strict=True))
    rows = [
        row
        for setting in setting_list
        for row in comparison_rows(
            setting,
            [unit for seed in seeds for unit in units[setting.name, seed]],
        )
    ]
    return setting_list, rows


def _draw_seed(seed: int, server_round: int, sampler_index: int) -> int:
    """Each sampler's own draws per captured round."""
    return int(
        np.random.SeedSequence([seed, server_round, sampler_index]).generate_state(1)[0]
    )


def comparison_rows(
    setting: Setting, units: Sequence[UnitResult]
) -> list[MechanismRow]:
    """Per comparison and model: one row per stage, then the pooled one."""
    num_models = len(next(iter(units[0].errors.values())))
    rows = []
    for method, baseline in setting.comparisons:
        for model_index in range(num_models):
            for stage in (*STAGES, POOLED):
                chosen = [unit for unit in units if stage in (POOLED, unit.stage)]
                method_errors = tuple(
                    unit.errors[method][model_index] for unit in chosen
                )
                base_errors = tuple(
                    unit.errors[baseline][model_index] for unit in chosen
                )
                rows.append(
                    MechanismRow(
                        setting=setting.name,
                        method=method,
                        baseline=baseline,
                        model_index=model_index if num_models > 1 else None,
                        stage=stage,
                        rounds=tuple(sorted({unit.server_round for unit in chosen})),
                        method_errors=method_errors,
                        baseline_errors=base_errors,
                        ratio=error_ratio(method_errors, base_errors),
                        unbiased=setting.samplers[method].unbiased,
                        claimed=setting.claimed,
                    )
                )
    return rows


def claim_rows(
    setting: Setting, rows: Sequence[MechanismRow], *, seeds: int
) -> list[ClaimRow]:
    """The pooled rows of a claimed setting, as claim-table rows.

    The first comparison's (first model's) row is the claim's main row.
    """
    if not setting.claimed:
        return []
    main_method, main_baseline = setting.comparisons[0]
    return [
        ClaimRow(
            paper=setting.paper,
            claim=setting.claim,
            comparison="mechanism, rounds "
            + ", ".join(str(value) for value in setting.rounds)
            + ("" if row.model_index is None else f", model {row.model_index}"),
            method=row.method,
            baseline=row.baseline,
            statistic=STATISTIC,
            direction="below",
            interval=row.ratio,
            data=setting.data,
            main=(row.method, row.baseline, row.model_index or 0)
            == (main_method, main_baseline, 0),
            seeds=seeds,
        )
        for row in rows
        if row.stage == POOLED and row.setting == setting.name
    ]


COLUMNS = [
    "setting",
    "method / baseline",
    "stage (rounds)",
    "method MSE / ‖full‖²",
    "baseline MSE / ‖full‖²",
    f"ratio [{LEVEL:.0%} CI]",
    "p",
    "detectable effect",
    "bias² / MSE",
    "verdict",
]


def markdown(
    setting_list: Sequence[Setting],
    rows: Sequence[MechanismRow],
    *,
    seeds: Sequence[int],
    draws: int,
    seconds: float,
) -> str:
    """The section: how it was measured, one table per setting."""
    parts = [
        "# The mechanism: aggregate error against full participation",
        f"Each sampler drawn {draws:,} times on every client's real update at an "
        f"early, a middle and a late round of each claim benchmark's run, seeds "
        f"{list(seeds)}: the mean of ‖aggregate - full-participation update‖² over "
        "the draws, at equal expected participation. Ratios are geometric means "
        "over the captured rounds of method / baseline, with a paired bootstrap "
        f"{LEVEL:.0%} interval over the rounds ({RESAMPLES} resamples, each "
        "round's Monte Carlo error included); p for ratio = 1 from the same "
        "bootstrap; the detectable effect is 2.8 bootstrap standard errors (80% "
        "power, two-sided 5%). Errors are shown relative to ‖full update‖² "
        "(medians over the rounds). Pooled rows of settings whose paper states a "
        f"lower error go to the claim table. Measured in {seconds:.0f} s.",
    ]
    for setting in setting_list:
        own = [row for row in rows if row.setting == setting.name]
        parts += [
            f"## {setting.name}",
            f"Claim ({setting.paper}): {setting.claim}.",
            f"Data: {setting.data}. Updates captured in the {setting.run} run; "
            f"m = {setting.participation} expected participants.",
            markdown_table(COLUMNS, [row.cells() for row in own]),
        ]
    return "\n\n".join(parts) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Capture, draw, compare; write ``summary.md``, ``results.json``, claims."""
    args, out = start_benchmark(benchmark_parser("mechanism", __doc__), argv)
    seeds = SEEDS_FULL if args.full else SEEDS
    draws = DRAWS_FULL if args.full else DRAWS
    started = time.perf_counter()
    setting_list, rows = evaluate_all(args.full, seeds=seeds, draws=draws)
    seconds = time.perf_counter() - started
    summary = markdown(setting_list, rows, seeds=seeds, draws=draws, seconds=seconds)
    write_outputs(
        out, summary, setting_list, rows, seeds=seeds, draws=draws, seconds=seconds
    )
    return 0


def write_outputs(
    out: Path,
    summary: str,
    setting_list: Sequence[Setting],
    rows: Sequence[MechanismRow],
    *,
    seeds: Sequence[int],
    draws: int,
    seconds: float,
) -> None:
    """``summary.md``, ``results.json`` and ``claims.json``; print the summary."""
    (out / "summary.md").write_text(summary)
    results = {
        "seeds": list(seeds),
        "draws": draws,
        "seconds": seconds,
        "settings": [
            {"name": setting.name, "run": setting.run, "rounds": list(setting.rounds)}
            for setting in setting_list
        ],
        "rows": [row.to_json() for row in rows],
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    write_claims(
        out / CLAIMS_FILE,
        [
            claim
            for setting in setting_list
            for claim in claim_rows(setting, rows, seeds=len(seeds))
        ],
    )
    print(summary)


if __name__ == "__main__":
    raise SystemExit(main())
