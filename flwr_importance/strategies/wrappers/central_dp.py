"""Central differential privacy around a strategy of the library: :class:`CentralDP`."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Sequence
from logging import DEBUG, WARNING
from typing import Literal, get_args

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
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
    clipped_rows_sum,
    clipped_sum,
    noise_std,
    poisson_sample_size,
)
from flwr_importance.method_spec import MethodSpec
from flwr_importance.strategies.arrays import array_values, linear_release
from flwr_importance.strategies.base import ImportanceStrategy
from flwr_importance.strategies.ocs import OptimalClientSampling, PublicConstants
from flwr_importance.strategies.summary import log_settings

#: The round's cumulative epsilon, in the train metrics of each round.
DP_EPSILON_METRIC = "dp-epsilon"
#: The delta that epsilon is stated at (``target_delta``).
DP_DELTA_METRIC = "dp-delta"
#: The only train metrics a round publishes: both are public functions of the
#: settings and of how many rounds ran.
DP_METRICS = frozenset({DP_EPSILON_METRIC, DP_DELTA_METRIC})

#: ``"none"``: no amplification by sampling; ``"poisson"``: Poisson sampling.
Amplification = Literal["none", "poisson"]

#: A noisy report sum is clamped to at least this share of its sensitivity
#: before anything divides by it (post-processing of the noisy value).
REPORT_SUM_FLOOR = 0.01


class CentralDP(Strategy):
    """Central DP around OCS's uniform control or AOCS: clipped, noised, accounted.

    Implementation based on McMahan et al., "Learning Differentially Private
    Recurrent Language Models" (ICLR 2018, https://arxiv.org/abs/1710.17178),
    on Flower's clipping, ``compute_stdv`` and RDP accountant
    (``flwr.supercore.privacy_accounting``); see docs/privacy.md, section
    "Central differential privacy".

    **Neighbouring relation**: add or remove one client from the population,
    with its query replies, reports and train reply. **The rule enforced**:
    every weight and every probability in a released model is a function of
    that client's own data, of public constants (the arguments below) or of
    an earlier release that is itself noised and charged to the same
    accountant. Hence the wrapped strategy runs with public weights
    ``d_k = 1 / population_size`` (sizes do not enter), and:

    - **uniform control** (``OptimalClientSampling(uniform=True)``): each
      connected node is sampled on its own coin with
      ``p = m / population_size``; a sampled client's contribution is
      ``server_lr U_k / m``;
    - **DP-AOCS** (``OptimalClientSampling(approximate=True)``): AOCS's sums
      (the total of ``u_i = ||U_i|| / population_size`` clipped to
      ``report_clipping_norm / population_size``, then per iteration ``P``
      and ``S``, sensitivity 1) are each released with Gaussian noise of
      ``report_noise_multiplier`` times their sensitivity and charged to the
      accountant, clamped to ``REPORT_SUM_FLOOR`` times their sensitivity
      before dividing; each client's ``p_i`` depends on its own ``u_i`` and
      on those noisy sums only.

    The wrapped strategy releases ``base + sum_k c_k`` (its ``release`` seam,
    :class:`~flwr_importance.strategies.arrays.Release`); each weighted
    contribution ``c_k`` is clipped to L2 norm ``clipping_norm`` and
    ``N(0, (z C)^2)`` is added to the sum. As every other client's weight is
    fixed given the earlier releases, one client moves the pre-noise release
    by at most ``C``. Every round releases the model plus noise and is
    accounted, also a round in which nobody was sampled or answered.

    Every other method, exact OCS, a ``pool_size`` and a ``report_cap`` are
    refused at construction, with the reason.

    **Published**: each round's model and the train metrics ``dp-epsilon``
    (cumulative, after the round) and ``dp-delta`` only. The wrapped
    strategy's train metrics, and the federated evaluate metrics unless
    ``federated_evaluate_metrics``, go to the DEBUG log, which is not private.

    Parameters
    ----------
    strategy : OptimalClientSampling
        With ``uniform=True`` or ``approximate=True``, no ``pool_size``, no
        ``report_cap``, not already wrapped. Its ``release`` and
        ``report_sum`` are replaced.
    noise_multiplier : float
        ``z > 0``: the model noise's std over ``clipping_norm``.
    clipping_norm : float
        ``C > 0``: each weighted contribution's largest L2 norm.
    population_size : int
        The public population (need not be the exact count): the estimator's
        fixed denominator and the accountant's population.
    target_delta : float (default: 1e-5)
        The delta the reported epsilon is stated at, in ``(0, 1)``.
    amplification : {"none", "poisson"} (default: "none")
        ``"poisson"`` (uniform control only): the model event is accounted
        as Poisson-subsampled at rate ``m / population_size``, and the
        sampling generator is reseeded from the OS.
    report_noise_multiplier : float or None (default: None)
        DP-AOCS only (required there): ``z_r > 0`` for every report sum.
    report_clipping_norm : float or None (default: None)
        DP-AOCS only (required there): the public bound each reported update
        norm is clipped to in the sums.
    max_epsilon : float or None (default: None)
        Budget stop: a round whose accounting could take epsilon above it is
        not started (logged); the model stays the last released one.
    federated_evaluate_metrics : bool (default: False)
        Publish the federated evaluate metrics, which are NOT covered by the
        guarantee (aggregates of the clients' own evaluations).

    Raises
    ------
    TypeError
        ``strategy`` is not a strategy of the library.
    ValueError
        A refused method or mode, a strategy already wrapped, a setting out
        of range or missing, or one that does not apply to the mode.
    ImportError
        ``dp-accounting`` is not installed (``pip install ".[dp]"``).
    """

    def __init__(
        self,
        *,
        strategy: Strategy,
        noise_multiplier: float,
        clipping_norm: float,
        population_size: int,
        target_delta: float = 1e-5,
        amplification: Amplification = "none",
        report_noise_multiplier: float | None = None,
        report_clipping_norm: float | None = None,
        max_epsilon: float | None = None,
        federated_evaluate_metrics: bool = False,
    ) -> None:
        self.strategy = _wrappable(strategy)
        self.noise_multiplier = _positive("noise_multiplier", noise_multiplier)
        self.clipping_norm = _positive("clipping_norm", clipping_norm)
        if not 0.0 < target_delta < 1.0:
            raise ValueError(f"target_delta must lie in (0, 1), got {target_delta}")
        self.target_delta = float(target_delta)
        if (
            isinstance(population_size, bool)
            or not isinstance(population_size, int)
            or population_size < 1
        ):
            raise ValueError(
                "population_size (the public population, the estimator's fixed "
                f"denominator) must be a positive int, got {population_size!r}"
            )
        self.population_size = population_size
        self.amplification = _checked_amplification(self.strategy, amplification)
        self.report_noise_multiplier, self.report_clipping_norm = _report_settings(
            self.strategy, report_noise_multiplier, report_clipping_norm
        )
        self.max_epsilon = (
            None if max_epsilon is None else _positive("max_epsilon", max_epsilon)
        )
        self.federated_evaluate_metrics = federated_evaluate_metrics
        #: The noise's generator, from the OS: a seed would let anyone who
        #: knows it subtract the noise.
        self.noise_rng = np.random.default_rng()
        if self.amplification == "poisson":
            self.strategy.rng = np.random.default_rng()
        self.accountant = self.new_accountant()
        self._released = False
        #: How many noisy report sums the current round has taken (accounted
        #: with its model event).
        self.round_report_sums = 0
        self._round_arrays: ArrayRecord | None = None
        self._stopped = False
        self.strategy.release = self.release
        self.strategy.report_sum = self.report_sum
        self.strategy.public_constants = PublicConstants(
            population_size=population_size,
            score_bound=self.report_clipping_norm or math.inf,
        )

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

        if len(terms) > 0:
            total, _ = clipped_sum(
                (
                    contribution(term, float(w))
                    for term, w in zip(terms, weights, strict=True)
                ),
                self.clipping_norm,
            )
        else:
            total = [np.zeros(array.shape) for array in origin]
        self._released = True
        add_gaussian_noise(total, self.noise_std, self.noise_rng)
        return ArrayRecord(
            {
                key: Array((start + step).astype(template.dtype))
                for (key, template), start, step in zip(
                    base.items(), origin, total, strict=True
                )
            }
        )

    def report_sum(
        self, rows: NDArray[np.float64], row_bound: float
    ) -> NDArray[np.float64]:
        """A noisy sum of the clients' report rows (:data:`.ReportSum`).

        Each row is clipped to L2 norm ``row_bound``, the rows are summed
        (one client moves the sum by at most ``row_bound``) and
        :meth:`noisy_sum` adds the noise and charges the event.
        """
        total = clipped_rows_sum(rows, row_bound)
        return np.maximum(
            self.noisy_sum(total, row_bound), REPORT_SUM_FLOOR * row_bound
        )

    def noisy_sum(
        self, total: NDArray[np.float64], sensitivity: float
    ) -> NDArray[np.float64]:
        """``total + N(0, (z_r sensitivity)^2)``, one Gaussian event for the round."""
        if self.report_noise_multiplier is None:
            raise RuntimeError("report sums need report_noise_multiplier (DP-AOCS)")
        self.round_report_sums += 1
        noisy = [total.astype(np.float64)]
        add_gaussian_noise(
            noisy, self.report_noise_multiplier * sensitivity, self.noise_rng
        )
        return noisy[0]

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
        """The model's Gaussian event; with Poisson at the public rate ``m / N``."""
        sample_size = self.population_size
        if self.amplification == "poisson":
            rate = min(self.strategy.clients_per_round, self.population_size)
            sample_size = poisson_sample_size(
                rate / self.population_size, self.population_size
            )
        return GaussianPrivacyEvent(
            noise_multiplier=self.noise_multiplier,
            sample_size=sample_size,
            population_size=self.population_size,
        )

    def report_event(self) -> GaussianPrivacyEvent:
        """One report sum's Gaussian event: no amplification (every client is in it)."""
        assert self.report_noise_multiplier is not None
        return GaussianPrivacyEvent(
            noise_multiplier=self.report_noise_multiplier,
            sample_size=self.population_size,
            population_size=self.population_size,
        )

    def max_report_sums(self) -> int:
        """The most report sums a round can take: DP-AOCS's total and iterations."""
        if self.report_noise_multiplier is None:
            return 0
        return 1 + self.strategy.aocs_iterations

    def next_round_epsilon(self) -> float:
        """The epsilon after one more round at the most it can spend, not composed."""
        projected = self.new_accountant()
        projected.load_state_dict(self.accountant.state_dict())
        projected.compose(self.round_event())
        if self.max_report_sums():
            projected.compose(self.report_event(), count=self.max_report_sums())
        return projected.get_epsilon(self.target_delta)

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
        self._stopped = False
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
        """The wrapped strategy's ``configure_train``, unless the budget stops it.

        The budget check comes before any message (the query included).
        """
        self._round_arrays = None
        self.round_report_sums = 0
        if self.max_epsilon is not None and not self._stopped:
            epsilon = self.next_round_epsilon()
            if epsilon > self.max_epsilon:
                self._stopped = True
                log(
                    WARNING,
                    "CentralDP budget stop: round %d could reach epsilon %.4g > "
                    "max_epsilon %.4g; no further round trains (the model stays "
                    "the last released one)",
                    server_round,
                    epsilon,
                    self.max_epsilon,
                )
        if self._stopped:
            return []
        self._round_arrays = arrays
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The private release and the round's epsilon; nothing else is published.

        Every configured round releases the model plus noise and is
        accounted, whatever came back: keeping the model would show that
        nothing usable arrived, an event whose odds differ between
        neighbouring populations.
        """
        if self._round_arrays is None:
            return None, None
        self._released = False
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        log(
            DEBUG,
            "CentralDP: the wrapped strategy's metrics (not private): %s",
            metrics,
        )
        if not self._released:
            plan = self.strategy.plan
            arrays = self.release(self._round_arrays, [], np.zeros(0))
            if plan is not None and plan.server_round == server_round:
                arrays = self.strategy.server_step(plan, arrays)
        self.accountant.compose(self.round_event())
        if self.round_report_sums:
            self.accountant.compose(self.report_event(), count=self.round_report_sums)
        return arrays, MetricRecord(
            {
                DP_EPSILON_METRIC: self.accountant.get_epsilon(self.target_delta),
                DP_DELTA_METRIC: self.target_delta,
            }
        )

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's ``configure_evaluate``."""
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """The wrapped strategy's, published with ``federated_evaluate_metrics``."""
        metrics = self.strategy.aggregate_evaluate(server_round, replies)
        if self.federated_evaluate_metrics:
            return metrics
        log(DEBUG, "CentralDP: federated evaluate metrics (not private): %s", metrics)
        return None

    def summary(self) -> None:
        """Log the DP settings, then the wrapped strategy's summary."""
        log_settings(
            "Central DP",
            {
                "Noise multiplier": f"{self.noise_multiplier:g}",
                "Clipping norm (per weighted contribution)": f"{self.clipping_norm:g}",
                "Target delta": f"{self.target_delta:g}",
                "Amplification by sampling": self.amplification,
                "Population (public)": self.population_size,
                "Report noise multiplier": f"{self.report_noise_multiplier}",
                "Report clipping norm": f"{self.report_clipping_norm}",
                "Max epsilon": f"{self.max_epsilon}",
            },
        )
        self.strategy.summary()


def _wrappable(strategy: object) -> OptimalClientSampling:
    """``strategy``, if :class:`CentralDP` can wrap it; else the reason, raised."""
    if not isinstance(strategy, ImportanceStrategy):
        raise TypeError(
            f"CentralDP wraps the library's strategies, got {type(strategy).__name__};"
            " for Flower's FedAvg use Flower's DifferentialPrivacyServerSideFixed"
            "Clipping"
        )
    name = type(strategy).__name__
    refusal = _spec_of(strategy).central_dp_refusal
    if refusal is not None:
        raise ValueError(f"CentralDP cannot wrap {name}: {refusal}")
    if not isinstance(strategy, OptimalClientSampling):
        raise ValueError(
            f"CentralDP cannot wrap {name}: only OptimalClientSampling's uniform "
            "control and AOCS have a proven sensitivity (docs/privacy.md)"
        )
    if not (strategy.uniform or strategy.approximate):
        raise ValueError(
            "CentralDP cannot wrap exact OCS: its probabilities water-fill over "
            "every client's individual norm (a sort), so one client moves the "
            "others' probabilities; use approximate=True (DP-AOCS, noisy sums) "
            "or uniform=True"
        )
    if strategy.pool_size is not None:
        raise ValueError(
            "CentralDP cannot wrap a strategy with pool_size: the pool is drawn "
            "among the connected nodes, so one node's presence changes which "
            "others are queried and sampled (and it is not Poisson sampling); "
            "use pool_size=None"
        )
    if strategy.report_cap is not None:
        raise ValueError(
            "CentralDP cannot wrap a strategy with report_cap: it clips each "
            "report at the round's median, a function of every client's report; "
            "use report_cap=None (DP-AOCS clips at report_clipping_norm)"
        )
    if strategy.release is not linear_release:
        raise ValueError(f"{name} is already wrapped")
    return strategy


def _positive(name: str, value: float) -> float:
    """``value`` as a float, if positive and finite; else the reason, raised."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be positive and finite, got {value}")
    return float(value)


def _checked_amplification(
    strategy: OptimalClientSampling, amplification: str
) -> Amplification:
    """``amplification``, checked against the strategy's mode."""
    choices = get_args(Amplification)
    if amplification not in choices:
        raise ValueError(
            f"amplification must be one of {choices}, got {amplification!r}"
        )
    if amplification == "poisson" and not strategy.uniform:
        raise ValueError(
            "AOCS's sampling probabilities depend on what the clients report "
            "(it does not with uniform=True): no amplification by sampling; use "
            "amplification='none'"
        )
    return "poisson" if amplification == "poisson" else "none"


def _report_settings(
    strategy: OptimalClientSampling,
    report_noise_multiplier: float | None,
    report_clipping_norm: float | None,
) -> tuple[float | None, float | None]:
    """The report noise and bound: both for DP-AOCS, neither for the control."""
    given = (report_noise_multiplier, report_clipping_norm)
    if strategy.uniform:
        if given != (None, None):
            raise ValueError(
                "report_noise_multiplier and report_clipping_norm apply to DP-AOCS "
                "only: the uniform control's probabilities use no report"
            )
        return None, None
    if None in given:
        raise ValueError(
            "DP-AOCS needs report_noise_multiplier and report_clipping_norm: "
            "AOCS's sums of the clients' norms are released with noise"
        )
    return (
        _positive("report_noise_multiplier", float(report_noise_multiplier or 0)),
        _positive("report_clipping_norm", float(report_clipping_norm or 0)),
    )


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
