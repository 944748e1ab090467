"""DP-AOCS against the DP uniform control at the same epsilon, through the real app.

Both methods run in :class:`~flwr_importance.strategies.wrappers.CentralDP`
(the app's ``central-dp-*`` keys) on the digits split log-normally by size,
with the same sampling budget ``m``, clipping norm, rounds, seeds and local
work:

- the *uniform control* (``ocs-uniform``): each node sampled with
  ``p = m / N``, McMahan's fixed-denominator estimator, the model noised at
  multiplier ``z_u``;
- *DP-AOCS* (``ocs-approximate``, one rescaling): its probabilities come from
  two noisy report sums a round (the norms' total, then ``(P, S)``), each at
  multiplier ``z_r``, and its model is noised at ``z_a``.

The noise multipliers are calibrated before any run with the accountant the
wrapper uses (:meth:`CentralDP.new_accountant`, its ``round_event`` and
``report_event``): ``z_a`` and ``z_r = REPORT_NOISE_RATIO * z_a`` give
:data:`TARGET_EPSILON` after the rounds, and ``z_u`` is solved so that the
control's epsilon after as many rounds equals DP-AOCS's. Each run checks the
``dp-epsilon`` it published against that value. With one rescaling, DP-AOCS
takes exactly two report sums a round, so its epsilon is fixed in advance.

The clipping norm is the median weighted contribution ``||U_i|| / m`` of the
control in a pilot run without noise on the first tuning seed (so about half
the control's contributions are clipped), and DP-AOCS's report bound the 90th
percentile of the pilot's update norms. The noise generator of each run is
seeded from its seed (the wrapper draws it from the OS; a seeded one is no
privacy, and is only for reproducible benchmark numbers).

Usage: ``python -m benchmarks.central_dp [--full] [--output-dir DIR]``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import matplotlib

matplotlib.use("Agg")

import numpy as np

from benchmarks.evidence import (
    Comparison,
    Evaluation,
    Overrides,
    PaperComparison,
    RunFunction,
    SeedRun,
    TargetRule,
    run_comparisons,
    write_outputs,
)
from benchmarks.harness import benchmark_parser, start_benchmark
from flwr_importance.strategies.ocs import OptimalClientSampling
from flwr_importance.strategies.wrappers import CentralDP
from simulations import server_app
from simulations.config import ExperimentConfig
from simulations.inprocess import run_inprocess
from simulations.report import PRIVACY_LEDGER

#: The section title of this benchmark in docs/results.md.
TITLE = "DP-AOCS vs the DP uniform control at equal epsilon (central DP)"

TUNING_SEEDS = (100, 101)
#: The epsilon both methods reach after the last round, at :data:`DELTA`.
TARGET_EPSILON = 8.0
DELTA = 1e-5
#: DP-AOCS's report noise multiplier over its model noise multiplier.
REPORT_NOISE_RATIO = 3.0
#: DP-AOCS's rescalings: one, so exactly two report sums a round.
AOCS_ITERATIONS = 1
#: The quantile of the pilot's update norms DP-AOCS's reports are clipped to.
REPORT_BOUND_QUANTILE = 0.9
#: The relative tolerance the two final epsilons must match within.
EPSILON_TOLERANCE = 1e-6
#: The noise stream of a run: its seed and this (rule 1: derived from the seed).
NOISE_STREAM = 7
EPSILON = "final dp-epsilon"
SAMPLED = "sampled / round"


@dataclass(frozen=True)
class Setting:
    """The task both methods run: the app's overrides but the DP keys."""

    clients: int
    clients_per_round: int
    rounds: int
    #: The same step of both methods (the tuned comparison's grid centre).
    local_lr: float = 0.3

    def overrides(self) -> dict[str, bool | int | float | str]:
        """Digits, log-normal sizes, logistic regression, OCS's local work."""
        return {
            "strategy": "ocs",
            "num-supernodes": self.clients,
            "dataset": "digits",
            "partitioning": "lognormal",
            "lognormal-sigma": 1.8,
            "model": "logreg",
            "local-steps": 10,
            "batch-size": 16,
            "local-lr": self.local_lr,
            "num-server-rounds": self.rounds,
            "clients-per-round": self.clients_per_round,
        }


#: The setting of both modes (``--full`` runs more seeds): half the nodes
#: expected per round, where the control still learns at this epsilon.
SETTING = Setting(clients=40, clients_per_round=20, rounds=15)


@dataclass(frozen=True)
class Calibration:
    """The DP settings of both methods, from the pilot and the accountant."""

    clipping_norm: float
    report_clipping_norm: float
    aocs_noise: float
    report_noise: float
    uniform_noise: float
    aocs_epsilon: float
    uniform_epsilon: float

    def uniform(self) -> dict[str, bool | int | float | str]:
        """The control's overrides."""
        return {
            "ocs-uniform": True,
            "ocs-approximate": False,
            "central-dp-noise-multiplier": self.uniform_noise,
            "central-dp-clipping-norm": self.clipping_norm,
            "central-dp-delta": DELTA,
        }

    def aocs(self) -> dict[str, bool | int | float | str]:
        """DP-AOCS's overrides."""
        return {
            "ocs-uniform": False,
            "ocs-approximate": True,
            "ocs-aocs-iterations": AOCS_ITERATIONS,
            "central-dp-noise-multiplier": self.aocs_noise,
            "central-dp-clipping-norm": self.clipping_norm,
            "central-dp-delta": DELTA,
            "central-dp-report-noise-multiplier": self.report_noise,
            "central-dp-report-clipping-norm": self.report_clipping_norm,
        }


# -- accounting -------------------------------------------------------------------
def wrapper(
    setting: Setting,
    noise_multiplier: float,
    report_noise_multiplier: float | None = None,
) -> CentralDP:
    """A CentralDP as the app builds it: its accountant is the one the runs use."""
    aocs = report_noise_multiplier is not None
    strategy = OptimalClientSampling(
        clients_per_round=setting.clients_per_round,
        approximate=aocs,
        uniform=not aocs,
        aocs_iterations=AOCS_ITERATIONS,
    )
    return CentralDP(
        strategy=strategy,
        noise_multiplier=noise_multiplier,
        clipping_norm=1.0,
        population_size=setting.clients,
        target_delta=DELTA,
        report_noise_multiplier=report_noise_multiplier,
        report_clipping_norm=1.0 if aocs else None,
    )


def final_epsilon(dp: CentralDP, rounds: int) -> float:
    """The ``dp-epsilon`` ``dp`` publishes after ``rounds`` rounds.

    Composed as its ``aggregate_train`` composes a round: the model's event,
    then DP-AOCS's ``1 + AOCS_ITERATIONS`` report sums (none for the control).
    """
    accountant = dp.new_accountant()
    report_sums = dp.max_report_sums()
    for _ in range(rounds):
        accountant.compose(dp.round_event())
        if report_sums:
            accountant.compose(dp.report_event(), count=report_sums)
    return accountant.get_epsilon(dp.target_delta)


def solve_noise(epsilon_of: Callable[[float], float], target: float) -> float:
    """The noise multiplier whose epsilon is ``target`` (bisection, log scale).

    ``epsilon_of`` decreases in the multiplier.

    Examples
    --------
    >>> round(solve_noise(lambda z: 10.0 / z, 4.0), 6)
    2.5
    """
    low, high = 1e-3, 1e3
    for _ in range(200):
        middle = math.sqrt(low * high)
        if epsilon_of(middle) > target:
            low = middle
        else:
            high = middle
        if high / low < 1 + 1e-12:
            break
    return math.sqrt(low * high)


def noise_multipliers(setting: Setting) -> tuple[float, float, float, float, float]:
    """``(z_a, z_r, z_u, eps_aocs, eps_uniform)`` at :data:`TARGET_EPSILON`.

    Raises
    ------
    AssertionError
        If the two final epsilons differ by more than :data:`EPSILON_TOLERANCE`.
    """

    def aocs_epsilon(z: float) -> float:
        return final_epsilon(
            wrapper(setting, z, REPORT_NOISE_RATIO * z), setting.rounds
        )

    def uniform_epsilon(z: float) -> float:
        return final_epsilon(wrapper(setting, z), setting.rounds)

    aocs_noise = solve_noise(aocs_epsilon, TARGET_EPSILON)
    epsilon = aocs_epsilon(aocs_noise)
    uniform_noise = solve_noise(uniform_epsilon, epsilon)
    uniform = uniform_epsilon(uniform_noise)
    assert math.isclose(uniform, epsilon, rel_tol=EPSILON_TOLERANCE), (
        uniform,
        epsilon,
    )
    return aocs_noise, REPORT_NOISE_RATIO * aocs_noise, uniform_noise, epsilon, uniform


# -- runs -------------------------------------------------------------------------
@dataclass
class Record:
    """What a run's strategy did, beyond its published metrics."""

    #: Per round, every queried node's update norm (the pilot's).
    norms: list[np.ndarray]
    #: Per round, how many nodes were sampled.
    sampled: list[int]


@contextmanager
def seeded_and_recorded(seed: int) -> Iterator[Record]:
    """Build the app's CentralDP with a seeded noise generator; record its plans.

    The plans' scores are ``||U_i|| / N`` under central DP (public equal
    weights), so the record holds every queried node's update norm.
    """
    record = Record(norms=[], sampled=[])
    build = server_app.build_strategy

    def seeded_build(config: ExperimentConfig, num_clients: int) -> Any:
        strategy = build(config, num_clients)
        if not isinstance(strategy, CentralDP):
            raise ValueError("the benchmark runs every method in CentralDP")
        strategy.noise_rng = np.random.default_rng([seed, NOISE_STREAM])
        inner = strategy.strategy
        keep_plan = inner.keep_plan

        def recording_keep_plan(plan: Any) -> None:
            if plan.scores is not None:
                record.norms.append(np.asarray(plan.scores)[:, 0] * num_clients)
            record.sampled.append(len(plan.assigned))
            keep_plan(plan)

        inner.keep_plan = recording_keep_plan  # type: ignore[method-assign]
        return strategy

    with mock.patch.object(server_app, "build_strategy", seeded_build):
        yield record


def pilot(setting: Setting, seed: int, output_dir: Path) -> tuple[float, float]:
    """The clipping norm and the report bound, from a run without noise to speak of.

    The control at a negligible noise multiplier and a clipping norm no
    contribution reaches: the median over rounds and nodes of ``||U_i|| / m``
    (a control's weighted contribution), and the
    :data:`REPORT_BOUND_QUANTILE` quantile of ``||U_i||``.
    """
    overrides = {
        **setting.overrides(),
        "ocs-uniform": True,
        "central-dp-noise-multiplier": 1e-9,
        "central-dp-clipping-norm": 1e9,
        "central-dp-delta": DELTA,
        "seed": seed,
        "output-dir": str(output_dir / "pilot"),
    }
    with seeded_and_recorded(seed) as record:
        run_inprocess(overrides)
    norms = np.concatenate(record.norms)
    clipping_norm = float(np.median(norms)) / setting.clients_per_round
    return clipping_norm, float(np.quantile(norms, REPORT_BOUND_QUANTILE))


def calibrate(setting: Setting, output_dir: Path) -> Calibration:
    """The pilot's norms and the accountant's noise multipliers."""
    clipping_norm, report_bound = pilot(setting, TUNING_SEEDS[0], output_dir)
    aocs_noise, report_noise, uniform_noise, aocs_eps, uniform_eps = noise_multipliers(
        setting
    )
    return Calibration(
        clipping_norm=clipping_norm,
        report_clipping_norm=report_bound,
        aocs_noise=aocs_noise,
        report_noise=report_noise,
        uniform_noise=uniform_noise,
        aocs_epsilon=aocs_eps,
        uniform_epsilon=uniform_eps,
    )


def run_function(output_dir: Path, calibration: Calibration) -> RunFunction:
    """``(overrides, seed) -> SeedRun``: test accuracy, the final epsilon checked."""
    expected = {
        True: calibration.uniform_epsilon,
        False: calibration.aocs_epsilon,
    }

    def run(overrides: Overrides, seed: int) -> SeedRun:
        with seeded_and_recorded(seed) as record:
            rows, _ = run_inprocess(
                {**overrides, "seed": seed, "output-dir": str(output_dir / "runs")}
            )
        epsilon = float(rows[-1][PRIVACY_LEDGER]["dp-epsilon"])
        target = expected[bool(overrides["ocs-uniform"])]
        if not math.isclose(epsilon, target, rel_tol=EPSILON_TOLERANCE):
            raise AssertionError(
                f"run published epsilon {epsilon}, calibrated for {target}"
            )
        print(
            f"  {'uniform' if overrides['ocs-uniform'] else 'dp-aocs'} seed {seed} "
            f"lr {overrides['local-lr']}: final accuracy "
            f"{rows[-1]['accuracy']:.3f}, epsilon {epsilon:.3f}",
            flush=True,
        )
        return SeedRun(
            curve=[row["accuracy"] for row in rows],
            extras={
                EPSILON: epsilon,
                SAMPLED: statistics.fmean(record.sampled),
            },
        )

    return run


def description(
    setting: Setting, calibration: Calibration, full: bool
) -> PaperComparison:
    """The claim: DP-AOCS's final accuracy above the control's at equal epsilon."""
    reported = 10 if full else 5
    methods: dict[str, Overrides] = {
        "dp-uniform": calibration.uniform(),
        "dp-aocs": calibration.aocs(),
    }
    c = calibration
    note = (
        f"Both at epsilon {c.aocs_epsilon:.3g} (delta {DELTA:g}) after "
        f"{setting.rounds} rounds, accounted without amplification: DP-AOCS's "
        f"model noise multiplier {c.aocs_noise:.3f} and its two report sums a "
        f"round at {c.report_noise:.3f} (report bound {c.report_clipping_norm:.3g}), "
        f"the control's model noise multiplier {c.uniform_noise:.3f}, solved with "
        "the same accountant so that its epsilon after as many rounds is "
        f"DP-AOCS's; clipping norm {c.clipping_norm:.3g} for both (the median "
        "weighted contribution of the control in a noiseless pilot). Same "
        "seeds: same data, initial model, local work and sampling generator. "
        "Sampled / round: DP-AOCS's rescaling applies only when its noisy "
        "`(m - S) / P` exceeds 1, so report noise can only raise its "
        "probabilities (the column shows by how much); the control samples `m` "
        "in expectation."
    )
    return PaperComparison(
        title=f"{setting.clients} clients, log-normal sizes, m = "
        f"{setting.clients_per_round}, epsilon {c.aocs_epsilon:.3g}",
        paper="this project's DP-AOCS (docs/privacy.md), after Chen, Horváth and "
        "Richtárik, TMLR 2022 (AOCS) and McMahan et al., ICLR 2018 (central DP)",
        claim="under central DP at equal epsilon, DP-AOCS (noisy report sums) "
        "reaches a higher final test accuracy than the DP uniform control",
        direction="above",
        metric="test accuracy",
        higher_is_better=True,
        target=TargetRule(fraction=0.9),
        statistic="final",
        tuning_seeds=TUNING_SEEDS,
        reported_seeds=tuple(range(reported)),
        data=f"digits (1,437 images, 8x8) over {setting.clients} clients with "
        "log-normal sizes (sigma 1.8), logistic regression: unequal sizes give "
        "unequal update norms, where AOCS's probabilities differ from uniform",
        comparisons=(
            Comparison(
                name="same step",
                shared=setting.overrides(),
                methods=methods,
                baseline="dp-uniform",
                claimed=("dp-aocs",),
                note=note,
            ),
            Comparison(
                name="tuned",
                shared=setting.overrides(),
                methods=methods,
                baseline="dp-uniform",
                claimed=("dp-aocs",),
                tuned=True,
                note="Each method picks its local learning rate on the tuning "
                "seeds by its final accuracy; the DP settings are those above.",
            ),
        ),
        learning_rates=(setting.local_lr / 3, setting.local_lr, setting.local_lr * 3),
        learning_rate_key="local-lr",
        main_row=("same step", "dp-aocs"),
        powered_seeds=20 if full else 8,
    )


def evaluate(
    setting: Setting, output_dir: Path, *, full: bool
) -> tuple[Calibration, Evaluation]:
    """Calibrate (:func:`calibrate`), then run and evaluate the comparisons."""
    calibration = calibrate(setting, output_dir)
    claim = description(setting, calibration, full)
    run = run_function(output_dir, calibration)
    return calibration, run_comparisons(claim, run, full=full)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; write the summary, results, claims and plot."""
    args, out = start_benchmark(benchmark_parser("central_dp", __doc__), argv)
    _, evaluation = evaluate(SETTING, out, full=args.full)
    evaluation.plot(out / "central_dp.png")
    summary = "\n".join(
        [
            "# DP-AOCS against the DP uniform control, equal epsilon",
            "",
            evaluation.markdown(level=2),
        ]
    )
    write_outputs(out, summary, [evaluation])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
