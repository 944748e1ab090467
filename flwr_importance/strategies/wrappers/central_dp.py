"""Central differential privacy around a strategy of the library: :class:`CentralDP`."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Literal, get_args

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore.privacy_accounting import (
    GaussianPrivacyEvent,
    NeighboringRelation,
    PrivacyConfig,
    SamplingMethod,
)
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant
from numpy.typing import NDArray

from flwr_importance.aggregation.central_dp import (
    Contribution,
    add_gaussian_noise,
    clipped_sum,
    noise_std,
    poisson_sample_size,
)
from flwr_importance.method_spec import MethodSpec
from flwr_importance.strategies.arrays import array_values, linear_release
from flwr_importance.strategies.base import ImportanceStrategy
from flwr_importance.strategies.summary import log_settings
from flwr_importance.strategies.unbiased_sampling import SamplePlan

#: The round's cumulative epsilon, in the train metrics of each round.
DP_EPSILON_METRIC = "dp-epsilon"
#: The delta that epsilon is stated at (``target_delta``).
DP_DELTA_METRIC = "dp-delta"
#: How many weighted contributions the round clipped.
DP_CLIPPED_METRIC = "dp-clipped"

#: ``"none"``: no amplification by sampling; ``"poisson"``: Poisson sampling.
Amplification = Literal["none", "poisson"]


class CentralDP(Strategy):
    """Central DP around a strategy of the library: clipped, noised, accounted.

    Implementation based on McMahan et al., "Learning Differentially Private
    Recurrent Language Models" (ICLR 2018, https://arxiv.org/abs/1710.17178),
    on Flower's clipping, ``compute_stdv`` and RDP accountant
    (``flwr.supercore.privacy_accounting``); see docs/privacy.md.

    The wrapped strategy releases ``base + sum_k c_k`` (its ``release`` seam,
    :class:`~flwr_importance.strategies.arrays.Release`), ``c_k`` client
    ``k``'s *weighted* contribution (``lr d_k / p_k U_k`` for OCS). Here each
    ``c_k`` is clipped to L2 norm ``clipping_norm`` and ``N(0, (z C)^2)`` is
    added to the sum.

    **Decision: clip the weighted contribution, not bound ``p_min``.** An
    importance weight ``1 / (m p_k)`` is unbounded as ``p_k`` shrinks; noise
    for ``max_k weight * C`` would grow with the round's smallest probability
    (and itself reveal it). Clipping ``c_k`` fixes the sensitivity at ``C``
    whatever the weights, negative ones included; the price is bias where a
    large weight meets a large update. For sampled means (MD, clustered,
    Power-of-Choice, ISFedAvg) the weights are the plan's (``draws / m``),
    not renormalised over the replies that came: a missing reply must not
    move the others' terms.

    **Amplification.** Only a method whose spec names a
    ``uniform_sampling_option`` that is on (OCS's ``uniform=True``: each
    client with ``m / N``, whatever it reports) may claim ``"poisson"``; its
    sampling generator is then reseeded from the OS (a known seed reveals the
    sample). Every other sampler (OCS, AOCS, MMFL, Power-of-Choice, ISFedAvg,
    MD, clustered, FedSampling) is accounted with no amplification.

    What is covered: the released models, with add-or-remove-one-client
    adjacency, the round's selection and weights taken as given. Not
    covered: the reports the sampling reads (sizes, norms, losses) and the
    round's train metrics, which reach the server unnoised.

    Parameters
    ----------
    strategy : Strategy
        The strategy to wrap: one of the library's (not FOLB, whose spec
        refuses; not one already wrapped). Its ``release`` is replaced.
    noise_multiplier : float
        ``z > 0``: the noise's std over the sensitivity.
    clipping_norm : float
        ``C > 0``: each weighted contribution's largest L2 norm, the
        release's sensitivity.
    target_delta : float (default: 1e-5)
        The delta the reported epsilon is stated at, in ``(0, 1)``.
    amplification : {"none", "poisson"} (default: "none")
        See above.
    population_size : int or None (default: None)
        With ``"poisson"`` only (required): the stable population the round's
        rate is stated against (Flower's ``PrivacyConfig``).

    Round metrics added to the wrapped strategy's: ``dp-epsilon`` (cumulative
    epsilon after the round), ``dp-delta`` and ``dp-clipped``. A round that
    releases nothing spends nothing and adds none, except under ``"poisson"``:
    a round that sampled nobody releases the model plus noise, and is
    accounted, as the Poisson-subsampled Gaussian mechanism assumes.

    Raises
    ------
    TypeError
        ``strategy`` is not a strategy of the library.
    ValueError
        A refused method, a strategy already wrapped, a setting out of range,
        ``"poisson"`` for a data-dependent sampler, or ``population_size``
        missing or not applicable.
    ImportError
        ``dp-accounting`` is not installed (``pip install ".[dp]"``).
    """

    def __init__(
        self,
        *,
        strategy: Strategy,
        noise_multiplier: float,
        clipping_norm: float,
        target_delta: float = 1e-5,
        amplification: Amplification = "none",
        population_size: int | None = None,
    ) -> None:
        self.strategy = _wrappable(strategy)
        for name, value in (
            ("noise_multiplier", noise_multiplier),
            ("clipping_norm", clipping_norm),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be positive and finite, got {value}")
        if not 0.0 < target_delta < 1.0:
            raise ValueError(f"target_delta must lie in (0, 1), got {target_delta}")
        self.noise_multiplier = float(noise_multiplier)
        self.clipping_norm = float(clipping_norm)
        self.target_delta = float(target_delta)
        self.amplification = _checked_amplification(
            self.strategy, amplification, population_size
        )
        self.population_size = population_size or 1
        #: The noise's generator, from the OS: a seed would let anyone who
        #: knows it subtract the noise.
        self.noise_rng = np.random.default_rng()
        if self.amplification == "poisson":
            self.strategy.rng = np.random.default_rng()
        self.accountant = self.new_accountant()
        self._clipped: int | None = None
        self._round_arrays: ArrayRecord | None = None
        self.strategy.release = self.release

    # -- the release -------------------------------------------------------------
    @property
    def sensitivity(self) -> float:
        """The L2 sensitivity the noise is calibrated for: ``clipping_norm``.

        Adding or removing one client (the accounted adjacency) moves the
        pre-noise release by at most this; changing one client's reply, a
        removal and an addition, by at most twice this.
        """
        return self.clipping_norm

    @property
    def noise_std(self) -> float:
        """The noise's standard deviation, ``noise_multiplier * clipping_norm``."""
        return noise_std(self.noise_multiplier, self.clipping_norm)

    def release(
        self,
        base: ArrayRecord,
        terms: Sequence[ArrayRecord],
        weights: NDArray[np.float64],
        *,
        mean_of: float | None = None,
    ) -> ArrayRecord:
        """``base + sum_k clip(c_k) + noise`` (:class:`.arrays.Release`).

        ``c_k = weights[k] * terms[k]``, or with ``mean_of`` (sampled means)
        ``weights[k] / mean_of * (terms[k] - base)``.
        """
        origin = [array_values(array) for array in base.values()]
        scale = 1.0 if mean_of is None else 1.0 / mean_of

        def contribution(term: ArrayRecord, weight: float) -> Contribution:
            values = [array_values(term[key]) for key in base]
            if mean_of is None:
                return [weight * array.astype(np.float64) for array in values]
            return [
                weight * scale * (array - start)
                for array, start in zip(values, origin, strict=True)
            ]

        if terms:
            total, clipped = clipped_sum(
                (
                    contribution(term, float(w))
                    for term, w in zip(terms, weights, strict=True)
                ),
                self.clipping_norm,
            )
        else:
            total, clipped = [np.zeros(array.shape) for array in origin], 0
        # MMFL releases one model per client group in a round.
        self._clipped = (self._clipped or 0) + clipped
        add_gaussian_noise(total, self.noise_std, self.noise_rng)
        return ArrayRecord(
            {
                key: Array((start + step).astype(template.dtype))
                for (key, template), start, step in zip(
                    base.items(), origin, total, strict=True
                )
            }
        )

    # -- accounting ----------------------------------------------------------------
    def new_accountant(self) -> RdpAccountant:
        """A fresh RDP accountant for this wrapper's settings (Flower's)."""
        sampling = (
            SamplingMethod.POISSON
            if self.amplification == "poisson"
            else SamplingMethod.NO_AMPLIFICATION
        )
        config = PrivacyConfig(
            target_delta=self.target_delta,
            population_size=self.population_size,
            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
            sampling_method=sampling,
        )
        return RdpAccountant(config)

    def round_event(self) -> GaussianPrivacyEvent:
        """The round's Gaussian event; with Poisson, at the round's largest rate."""
        sample_size = self.population_size
        plan = self.strategy.plan
        if self.amplification == "poisson" and isinstance(plan, SamplePlan):
            rate = float(np.max(plan.probs))
            sample_size = poisson_sample_size(rate, self.population_size)
        return GaussianPrivacyEvent(
            noise_multiplier=self.noise_multiplier,
            sample_size=sample_size,
            population_size=self.population_size,
        )

    # -- Flower's Strategy API ---------------------------------------------------
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Flower's ``Strategy.start`` from a fresh accountant, in the wrapped run."""
        self.accountant = self.new_accountant()
        with self.strategy.run_scope():
            return super().start(
                grid,
                initial_arrays,
                num_rounds=num_rounds,
                timeout=timeout,
                train_config=train_config,
                evaluate_config=evaluate_config,
                evaluate_fn=evaluate_fn,
            )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's ``configure_train``; keeps the round's model."""
        self._round_arrays = arrays
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The wrapped strategy's, its release private; the round's epsilon added."""
        self._clipped = None
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        if self._clipped is None:
            if self.amplification != "poisson" or self._round_arrays is None:
                return arrays, metrics
            # Poisson amplification is stated for the mechanism that releases
            # base + noise whatever the sample: keeping the model when nobody
            # was sampled would show that the sample was empty, an event whose
            # odds differ between neighbouring populations.
            arrays = self.release(self._round_arrays, [], np.zeros(0))
        # MMFL releases one model per client group: disjoint groups, one event.
        self.accountant.compose(self.round_event())
        metrics = MetricRecord() if metrics is None else metrics
        metrics[DP_EPSILON_METRIC] = self.accountant.get_epsilon(self.target_delta)
        metrics[DP_DELTA_METRIC] = self.target_delta
        metrics[DP_CLIPPED_METRIC] = self._clipped or 0
        return arrays, metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's ``configure_evaluate``."""
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """The wrapped strategy's ``aggregate_evaluate``."""
        return self.strategy.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        """Log the DP settings, then the wrapped strategy's summary."""
        log_settings(
            "Central DP",
            {
                "Noise multiplier": f"{self.noise_multiplier:g}",
                "Clipping norm (per weighted contribution)": f"{self.clipping_norm:g}",
                "Target delta": f"{self.target_delta:g}",
                "Amplification by sampling": self.amplification,
            },
        )
        self.strategy.summary()


def _wrappable(strategy: object) -> ImportanceStrategy:
    """``strategy``, if :class:`CentralDP` can wrap it; else the reason, raised."""
    if not isinstance(strategy, ImportanceStrategy):
        raise TypeError(
            f"CentralDP wraps the library's strategies, got {type(strategy).__name__};"
            " for Flower's FedAvg use Flower's DifferentialPrivacyServerSideFixed"
            "Clipping"
        )
    refusal = _spec_of(strategy).central_dp_refusal
    if refusal is not None:
        raise ValueError(f"CentralDP cannot wrap {type(strategy).__name__}: {refusal}")
    if strategy.release is not linear_release:
        raise ValueError(f"{type(strategy).__name__} is already wrapped")
    return strategy


def _checked_amplification(
    strategy: ImportanceStrategy,
    amplification: str,
    population_size: int | None,
) -> Amplification:
    """``amplification``, checked against the method and ``population_size``."""
    choices = get_args(Amplification)
    if amplification not in choices:
        raise ValueError(
            f"amplification must be one of {choices}, got {amplification!r}"
        )
    if amplification == "none":
        if population_size is not None:
            raise ValueError("population_size applies only to amplification='poisson'")
        return "none"
    option = _spec_of(strategy).uniform_sampling_option
    if option is None or getattr(strategy, option, False) is not True:
        hint = "" if option is None else f" (it does with {option}=True)"
        raise ValueError(
            f"{type(strategy).__name__}'s sampling probabilities depend on what the "
            f"clients report{hint}: no amplification by sampling; use "
            "amplification='none'"
        )
    if not isinstance(population_size, int) or population_size < 1:
        raise ValueError(
            "amplification='poisson' needs population_size, a positive int, "
            f"got {population_size!r}"
        )
    return "poisson"


def _spec_of(strategy: Strategy) -> MethodSpec:
    """The spec of ``strategy``'s method: its nearest class's ``METHOD``.

    Read from the class's module, as :mod:`flwr_importance.registry` collects
    the declarations (strategies never import the registry).
    """
    for cls in type(strategy).__mro__:
        spec = getattr(sys.modules[cls.__module__], "METHOD", None)
        if isinstance(spec, MethodSpec) and spec.strategy is cls:
            return spec
    raise TypeError(f"{type(strategy).__name__} is no declared method")
