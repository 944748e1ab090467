"""Fair comparisons of a method with its paper's baseline, from one description.

Every convergence comparison in ``benchmarks/`` follows the same rules, and
this module is where they are enforced:

1. *Same randomness.* Within a seed every method gets the same data, initial
   model and local-work draws; a run function receives the seed and derives
   all of its randomness from it, so the methods of a comparison differ only
   in their overrides.
2. *Same step, or each at its best.* A :class:`Comparison` either runs every
   method at its given overrides (a *matched* step, or the paper's own
   setting) or is ``tuned``: each method, baseline included, picks its
   learning rate (and only that) from one grid by its result on tuning seeds
   (:func:`choose_learning_rate`), and is reported on other seeds.
3. *Enough seeds, misses counted, uncertainty shown.* At least
   :data:`MIN_REPORTED_SEEDS` reported seeds (``--full``:
   :data:`MIN_REPORTED_SEEDS_FULL`); a seed that never reaches the target
   counts as ``T + 1`` rounds (:func:`seed_rounds`), never dropped; every ratio
   is a ratio of medians with a paired bootstrap 95% interval
   (:func:`paired_ratio_interval`); a verdict is read off the interval
   (:func:`verdict`). The target is fixed from the baseline on the tuning
   seeds (:class:`TargetRule`), never from the reported runs.
4. *One claim table.* Each benchmark writes its claim rows to
   ``claims.json`` beside ``results.json`` (:func:`write_claims`);
   ``benchmarks/report.py`` collects them into the table that opens
   ``docs/results.md``.

Describing a comparison
-----------------------
One :class:`PaperComparison` per paper claim; a run function maps
``(overrides, seed)`` to a :class:`SeedRun` (the metric per round, round 0
first). :func:`run_comparisons` runs everything (each distinct run once), and the
:class:`Evaluation` it returns renders the tables and the claim rows::

    from benchmarks.evidence import (
        Comparison, PaperComparison, SeedRun, TargetRule, run_comparisons, write_claims,
    )
    from simulations.inprocess import load_preset, run_inprocess

    def run(overrides, seed):
        rows, _ = run_inprocess(
            {**load_preset("ocs-digits-lognormal"), **overrides, "seed": seed}
        )
        return SeedRun(curve=[row["accuracy"] for row in rows])

    methods = {"uniform": {"strategy": "fedavg"}, "ocs": {"strategy": "ocs"}}
    description = PaperComparison(
        title="OCS against uniform sampling",
        paper="Chen et al. 2022, Optimal client sampling for federated learning",
        claim="OCS reaches a target accuracy in fewer rounds than uniform sampling",
        direction="below",  # the paper's ratio method / baseline is below 1
        metric="test accuracy",
        higher_is_better=True,
        target=TargetRule(fraction=0.9),
        tuning_seeds=(100, 101),
        reported_seeds=(0, 1, 2, 3, 4),
        learning_rates=(0.03, 0.1, 0.3),
        learning_rate_key="local-lr",
        data="digits, log-normal client sizes: OCS gains where sizes differ",
        comparisons=(
            Comparison(name="same step", methods=methods, baseline="uniform",
                       claimed=("ocs",)),
            Comparison(name="tuned", methods=methods, baseline="uniform",
                       claimed=("ocs",), tuned=True),
        ),
    )
    evaluation = run_comparisons(description, run, full=False)
    print(evaluation.markdown())
    write_claims(output_dir / "claims.json", evaluation.claim_rows())

Each comparison gives one table and, per claimed method, one claim row.

The ``claims.json`` format
--------------------------
A JSON list (Python's ``json``: ``Infinity`` and ``NaN`` allowed), one object
per claim row, with exactly these keys (:meth:`ClaimRow.to_json`):

``paper``, ``claim``
    The paper and its claim in one line.
``comparison``
    Which comparison: ``"same step"``, ``"matched"``, ``"tuned"``,
    ``"paper's setting"``, ``"alpha 0.01"``...
``method``, ``baseline``
    The two methods the ratio divides.
``statistic``
    ``"rounds to target"`` or ``"final <metric>"``: what the ratio is of.
``direction``
    ``"below"`` or ``"above"``: where the paper puts the ratio against 1.
``ratio``, ``low``, ``high``
    The ratio of medians over the reported seeds and its 95% interval.
``bound``
    ``"exact"``, ``"lower bound"``, ``"upper bound"`` or ``"censored"``:
    whether seeds that missed the target make ``ratio`` a bound.
``verdict``
    ``"as the paper"``, ``"unlike the paper"`` or ``"inconclusive"``, as
    :func:`verdict` reads the interval (readers recompute it, never trust it).
``data``
    The data used and why it fits the claim.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import matplotlib.pyplot as plt
import numpy as np

from benchmarks.harness import markdown_table, rounds_to_target, save_figure

Direction = Literal["below", "above"]
Verdict = Literal["as the paper", "unlike the paper", "inconclusive"]
Bound = Literal["exact", "lower bound", "upper bound", "censored"]
Statistic = Literal["rounds to target", "final"]
Overrides = Mapping[str, bool | int | float | str]

#: Reported seeds at least, per method, in quick mode and with ``--full``.
MIN_REPORTED_SEEDS = 5
MIN_REPORTED_SEEDS_FULL = 10
#: The interval's coverage.
LEVEL = 0.95
#: Bootstrap resamples of the seeds.
RESAMPLES = 2000
CLAIMS_FILE = "claims.json"


# -- statistics ----------------------------------------------------------------
@dataclass(frozen=True)
class SeedRounds:
    """Rounds to target per seed, a seed that missed counted as ``horizon + 1``.

    Attributes
    ----------
    rounds : tuple[float, ...]
        Per seed, the first round reaching the target; ``horizon + 1`` for a
        miss (a lower bound on the rounds it needs).
    reached : tuple[bool, ...]
        Per seed, whether it reached the target.
    horizon : int
        The last round run (``T``).
    """

    rounds: tuple[float, ...]
    reached: tuple[bool, ...]
    horizon: int

    @property
    def median(self) -> float:
        """The median over all seeds, misses counted as ``T + 1``."""
        return float(np.median(self.rounds))

    @property
    def reached_share(self) -> float:
        """The share of seeds that reached the target."""
        return float(np.mean(self.reached))

    def median_text(self) -> str:
        """The median; ``> T`` past the horizon, ``≥ x`` if a miss moves it.

        Examples
        --------
        >>> SeedRounds((3.0, 5.0, 11.0), (True, True, False), 10).median_text()
        '5'
        >>> SeedRounds((3.0, 11.0), (True, False), 10).median_text()
        '≥ 7'
        >>> SeedRounds((3.0, 11.0, 11.0), (True, False, False), 10).median_text()
        '> 10'
        """
        median = self.median
        if median > self.horizon:
            return f"> {self.horizon}"
        worst = np.where(self.reached, self.rounds, np.inf)
        prefix = "" if np.median(worst) == median else "≥ "
        return f"{prefix}{median:g}"

    def reached_text(self) -> str:
        """``reached/seeds``, e.g. ``4/5``."""
        return f"{sum(self.reached)}/{len(self.reached)}"


def seed_rounds(
    curves: Sequence[Sequence[float]], target: float, *, higher_is_better: bool
) -> SeedRounds:
    """Each seed's first round reaching ``target``; a miss counts as ``T + 1``.

    Parameters
    ----------
    curves : Sequence[Sequence[float]]
        One curve per seed, the metric per round with round 0 (the initial
        model) first; all of the same length ``T + 1``.
    target : float
        The value to reach: at least it, or at most it if lower is better.
    higher_is_better : bool
        Whether larger values of the metric are better.

    Returns
    -------
    SeedRounds
        The rounds, which seeds reached, and ``T``.

    Raises
    ------
    ValueError
        If there is no curve or the curves differ in length.

    Examples
    --------
    >>> seed_rounds([[0.1, 0.5, 0.9], [0.1, 0.2, 0.4]], 0.8, higher_is_better=True)
    SeedRounds(rounds=(2.0, 3.0), reached=(True, False), horizon=2)
    >>> seed_rounds([[1.0, 0.05, 0.01]], 0.1, higher_is_better=False).rounds
    (1.0,)
    """
    lengths = {len(curve) for curve in curves}
    if len(lengths) != 1:
        raise ValueError(f"need curves of one length, got lengths {sorted(lengths)}")
    horizon = lengths.pop() - 1
    found = [
        rounds_to_target(curve, target, lower_is_better=not higher_is_better)
        for curve in curves
    ]
    reached = tuple(bool(np.isfinite(value)) for value in found)
    rounds = tuple(
        value if hit else float(horizon + 1)
        for value, hit in zip(found, reached, strict=True)
    )
    return SeedRounds(rounds, reached, horizon)


@dataclass(frozen=True)
class RatioInterval:
    """A ratio of medians (method / baseline) and its 95% interval.

    Attributes
    ----------
    ratio : float
        The median of the method's values over the baseline's.
    low, high : float
        The interval's ends.
    bound : Bound
        ``"exact"``; ``"lower bound"`` where misses of the method move its
        median (it needs at least that many rounds); ``"upper bound"`` where
        misses of the baseline move its median; ``"censored"`` where both do.
    """

    ratio: float
    low: float
    high: float
    bound: Bound = "exact"

    def text(self) -> str:
        """``0.82 [0.70, 0.95]``, with ``≥``/``≤`` for a bound, ``n/a`` for NaN.

        Examples
        --------
        >>> RatioInterval(0.8234, 0.7, 0.951).text()
        '0.82 [0.70, 0.95]'
        >>> RatioInterval(0.5, 0.0, 0.9, "upper bound").text()
        '≤ 0.50 [0.00, 0.90]'
        >>> RatioInterval(float("nan"), float("nan"), float("nan")).text()
        'n/a'
        """
        if not np.isfinite(self.ratio):
            return "n/a"
        prefix = {"lower bound": "≥ ", "upper bound": "≤ "}.get(self.bound, "")
        suffix = " (both censored)" if self.bound == "censored" else ""
        return (
            f"{prefix}{self.ratio:.2f} [{_number(self.low)}, {_number(self.high)}]"
            f"{suffix}"
        )


def _number(value: float) -> str:
    """Two decimals, ``∞`` for infinity."""
    return "∞" if value == np.inf else f"{value:.2f}"


def paired_ratio_interval(
    method: Sequence[float],
    baseline: Sequence[float],
    *,
    method_reached: Sequence[bool] | None = None,
    baseline_reached: Sequence[bool] | None = None,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> RatioInterval:
    """Ratio of medians with a paired percentile bootstrap interval over seeds.

    Entry ``i`` of ``method`` and of ``baseline`` come from the same seed
    (the same data and draws), so each resample draws seed indices once and
    applies them to both: the interval reflects the spread of the paired
    comparison, not of two independent samples.

    A value whose ``*_reached`` entry is False is a miss recorded as ``T + 1``,
    a lower bound on the truth. The low end is taken with the baseline's
    misses at infinity and the high end with the method's at infinity, so the
    interval holds whatever the missed seeds would have needed (a resample
    whose baseline median is a miss gives a low end of 0).

    Parameters
    ----------
    method, baseline : Sequence[float]
        One value per seed each (same seeds, same order).
    method_reached, baseline_reached : Sequence[bool], optional
        Per seed, False where the value is a miss; all True if omitted.
    resamples : int
        Bootstrap resamples of the seeds.
    level : float
        The interval's coverage.
    seed : int
        Seed of the resampling generator.

    Returns
    -------
    RatioInterval
        The ratio of the medians, the interval and whether misses make the
        ratio a bound. NaN where a median of the baseline is 0.

    Raises
    ------
    ValueError
        If the two sides differ in length or are empty.

    Examples
    --------
    Paired: a method at exactly twice the baseline on every seed has no spread.

    >>> paired_ratio_interval([2, 4, 6, 8, 10], [1, 2, 3, 4, 5]).text()
    '2.00 [2.00, 2.00]'

    A baseline that misses (``T + 1 = 31``) on 3 of 5 seeds: the ratio is an
    upper bound and the interval reaches down to 0.

    >>> paired_ratio_interval(
    ...     [10, 12, 11, 9, 10], [20, 31, 31, 31, 18],
    ...     baseline_reached=[True, False, False, False, True],
    ... ).text()
    '≤ 0.32 [0.00, 0.56]'
    """
    values = np.asarray(method, dtype=np.float64)
    base = np.asarray(baseline, dtype=np.float64)
    if values.shape != base.shape or values.ndim != 1 or values.size == 0:
        raise ValueError(
            f"need one value per seed on both sides, got {values.shape} and "
            f"{base.shape}"
        )
    # A miss at infinity: the largest the truth can be.
    values_worst = _misses_at_infinity(values, method_reached)
    base_worst = _misses_at_infinity(base, baseline_reached)
    ratio = _ratio(np.median(values), np.median(base))
    moved_up = _ratio(np.median(values_worst), np.median(base)) != ratio
    moved_down = _ratio(np.median(values), np.median(base_worst)) != ratio
    bound: Bound = (
        "censored"
        if moved_up and moved_down
        else "lower bound"
        if moved_up
        else "upper bound"
        if moved_down
        else "exact"
    )
    indices = np.random.default_rng(seed).integers(
        0, values.size, size=(resamples, values.size)
    )
    lowest = _ratio(
        np.median(values[indices], axis=1), np.median(base_worst[indices], axis=1)
    )
    highest = _ratio(
        np.median(values_worst[indices], axis=1), np.median(base[indices], axis=1)
    )
    tail = (1 - level) / 2
    # ``inverted_cdf`` picks a resample's ratio: no interpolation against an
    # infinite one.
    low = float(np.quantile(lowest, tail, method="inverted_cdf"))
    high = float(np.quantile(highest, 1 - tail, method="inverted_cdf"))
    return RatioInterval(float(ratio), low, high, bound)


def _misses_at_infinity(
    values: np.ndarray, reached: Sequence[bool] | None
) -> np.ndarray:
    """``values`` with the misses (``reached`` False) replaced by infinity."""
    if reached is None:
        return values
    hits = np.asarray(reached, dtype=bool)
    if hits.shape != values.shape:
        raise ValueError(f"need one reached flag per seed, got {hits.shape}")
    return np.where(hits, values, np.inf)


def _ratio(numerator: Any, denominator: Any) -> Any:
    """Elementwise ``numerator / denominator``: ``x / 0`` is infinite, ``0 / 0`` NaN."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.divide(numerator, denominator)


#: Ratios within this share of 1 count as no effect: a verdict needs its
#: interval to clear ``[1 - margin, 1 + margin]``, so that a difference no
#: table can show (an interval printed ``[1.00, 1.00]``) reads inconclusive.
NO_EFFECT_MARGIN = 0.01


def verdict(low: float, high: float, direction: Direction) -> Verdict:
    """What an interval of ``method / baseline`` says of the paper's claim.

    Parameters
    ----------
    low, high : float
        The interval of the ratio; NaN where there is none.
    direction : Direction
        ``"below"`` if the paper has the ratio below 1 (fewer rounds, lower
        loss), ``"above"`` if above.

    Returns
    -------
    Verdict
        ``"as the paper"`` only when the interval excludes 1, and the
        no-effect band of :data:`NO_EFFECT_MARGIN` around it, on the paper's
        side; ``"unlike the paper"`` only when it excludes them on the other;
        ``"inconclusive"`` otherwise (NaN included).

    Raises
    ------
    ValueError
        If ``low > high`` or ``direction`` is neither ``"below"`` nor ``"above"``.

    Examples
    --------
    >>> verdict(0.6, 0.9, "below"), verdict(0.6, 0.9, "above")
    ('as the paper', 'unlike the paper')
    >>> verdict(0.8, 1.2, "below"), verdict(1.001, 1.004, "below")
    ('inconclusive', 'inconclusive')
    """
    if direction not in get_args(Direction):
        raise ValueError(f"direction must be 'below' or 'above', got {direction!r}")
    if low > high:
        raise ValueError(f"interval [{low}, {high}] has its low end above its high")
    below, above = high < 1 - NO_EFFECT_MARGIN, low > 1 + NO_EFFECT_MARGIN
    if below or above:
        return "as the paper" if below == (direction == "below") else "unlike the paper"
    return "inconclusive"


@dataclass(frozen=True, kw_only=True)
class TargetRule:
    """The target a comparison measures rounds to, fixed from its baseline.

    Applied to the baseline's final values on the tuning seeds (never the
    reported ones): ``fraction`` of their median where higher is better
    (accuracy), their median over ``fraction`` where lower is better (loss,
    MSD), the mirrored rule.

    Parameters
    ----------
    fraction : float (default: 0.9)
        In (0, 1].

    Examples
    --------
    >>> rule = TargetRule(fraction=0.9)
    >>> round(rule.target([0.8, 0.9, 0.7], higher_is_better=True), 3)
    0.72
    >>> rule = TargetRule(fraction=0.5)
    >>> round(rule.target([0.01, 0.03], higher_is_better=False), 3)
    0.04
    """

    fraction: float = 0.9

    def __post_init__(self) -> None:
        """Check the fraction."""
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction}")

    def target(self, final_values: Sequence[float], *, higher_is_better: bool) -> float:
        """The target from the baseline's final values on the tuning seeds."""
        median = float(np.median(final_values))
        return self.fraction * median if higher_is_better else median / self.fraction

    def text(self, metric: str, baseline: str, higher_is_better: bool) -> str:
        """How the target was set, in words."""
        if higher_is_better:
            share = f"{self.fraction:.0%} of"
        else:
            share = f"{1 / self.fraction:.3g}x"
        return f"{share} {baseline}'s final median {metric} on the tuning seeds"


def curve_score(curve: Sequence[float]) -> float:
    """The mean of a curve over rounds 1..T (its area): how a step is tuned.

    It rewards both speed and the level reached; NaN where the run diverged.

    Examples
    --------
    >>> curve_score([0.1, 0.5, 0.7])
    0.6
    >>> curve_score([1.0, float("inf")])
    nan
    """
    score = float(np.mean(curve[1:]))
    return score if np.isfinite(score) else float("nan")


def choose_learning_rate(
    scores: Mapping[float, Sequence[float]], *, higher_is_better: bool
) -> float:
    """The learning rate whose median score over the tuning seeds is best.

    Parameters
    ----------
    scores : Mapping[float, Sequence[float]]
        Per learning rate of the grid, the tuning seeds' scores
        (:func:`curve_score`); NaN (a diverged run) is the worst score.
    higher_is_better : bool
        Whether a larger score is better.

    Returns
    -------
    float
        The best learning rate; the first in the grid among equals.

    Raises
    ------
    ValueError
        If ``scores`` is empty.

    Examples
    --------
    >>> nan = float("nan")
    >>> grid = {0.01: [0.5, 0.6], 0.1: [0.8, 0.7], 1.0: [0.9, nan]}
    >>> choose_learning_rate(grid, higher_is_better=True)
    0.1
    """
    if not scores:
        raise ValueError("need at least one learning rate")
    sign = 1.0 if higher_is_better else -1.0

    def merit(rate: float) -> float:
        median = float(np.median(scores[rate]))
        return sign * median if np.isfinite(median) else -np.inf

    return max(scores, key=merit)


# -- the description -------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Methods against a baseline under one step policy: one table, one row each.

    Parameters
    ----------
    name : str
        What makes the comparison fair: ``"matched"`` (the baseline takes the
        method's effective step), ``"tuned"``, ``"paper's setting"``, or the
        setting it is run in (``"alpha 0.01"``).
    methods : Mapping[str, Overrides]
        Method name -> run overrides, baseline included; in table order.
    baseline : str
        The method the others are divided by.
    claimed : tuple[str, ...]
        The methods the paper's claim is about: one claim row each.
    shared : Overrides (default: none)
        Overrides every method of this comparison runs with, before its own.
    tuned : bool (default: False)
        Whether each method picks its learning rate from the description's
        grid on the tuning seeds.
    note : str (default: "")
        One line under the table: what is matched and how.
    """

    name: str
    methods: Mapping[str, Overrides]
    baseline: str
    claimed: tuple[str, ...]
    shared: Overrides = field(default_factory=dict)
    tuned: bool = False
    note: str = ""

    def __post_init__(self) -> None:
        """Check that the baseline and the claimed methods are methods."""
        if self.baseline not in self.methods:
            raise ValueError(
                f"baseline {self.baseline!r} is not in {list(self.methods)}"
            )
        others = set(self.methods) - {self.baseline}
        unknown = set(self.claimed) - others
        if unknown:
            raise ValueError(
                f"claimed methods {sorted(unknown)} are not methods other than "
                f"the baseline {self.baseline!r}"
            )


@dataclass(frozen=True, kw_only=True)
class PaperComparison:
    """One paper claim and every comparison that tests it.

    Parameters
    ----------
    title : str
        The heading of its section.
    paper : str
        Authors, year and title (or venue).
    claim : str
        The claim in one line.
    direction : Direction
        Where the paper puts the claimed ratio (method / baseline) against 1.
    metric : str
        The curve's metric in words (``"test accuracy"``).
    higher_is_better : bool
        Whether larger values of the metric are better.
    target : TargetRule
        How the target is set from the baseline on the tuning seeds.
    tuning_seeds, reported_seeds : tuple[int, ...]
        Disjoint: steps and targets are chosen on the first, numbers reported
        on the second.
    data : str
        The data used and why it fits the claim.
    comparisons : tuple[Comparison, ...]
        One table and one claim row per claimed method each.
    statistic : Statistic (default: "rounds to target")
        What the claim's ratio is of: rounds to target, or the final metric.
    learning_rates : tuple[float, ...] (default: none)
        The grid of a ``tuned`` comparison.
    learning_rate_key : str (default: "local-lr")
        The run-config key the grid sets.
    """

    title: str
    paper: str
    claim: str
    direction: Direction
    metric: str
    higher_is_better: bool
    target: TargetRule
    tuning_seeds: tuple[int, ...]
    reported_seeds: tuple[int, ...]
    data: str
    comparisons: tuple[Comparison, ...]
    statistic: Statistic = "rounds to target"
    learning_rates: tuple[float, ...] = ()
    learning_rate_key: str = "local-lr"

    def __post_init__(self) -> None:
        """Check the seeds, the direction, and that tuning has a grid."""
        if self.direction not in get_args(Direction):
            raise ValueError(
                f"direction must be 'below' or 'above': {self.direction!r}"
            )
        if self.statistic not in get_args(Statistic):
            raise ValueError(f"unknown statistic {self.statistic!r}")
        if not self.tuning_seeds:
            raise ValueError("need tuning seeds: the target is fixed on them")
        shared = set(self.tuning_seeds) & set(self.reported_seeds)
        if shared:
            raise ValueError(f"seeds {sorted(shared)} are both tuning and reported")
        if len(self.reported_seeds) < MIN_REPORTED_SEEDS:
            raise ValueError(
                f"need at least {MIN_REPORTED_SEEDS} reported seeds, got "
                f"{len(self.reported_seeds)}"
            )
        if any(item.tuned for item in self.comparisons) and not self.learning_rates:
            raise ValueError("a tuned comparison needs a learning-rate grid")

    @property
    def statistic_text(self) -> str:
        """The claim's statistic in words: ``rounds to target``, ``final loss``."""
        return (
            self.statistic
            if self.statistic == "rounds to target"
            else f"final {self.metric}"
        )


# -- running ---------------------------------------------------------------------
@dataclass(frozen=True)
class SeedRun:
    """What a run function returns for one seed.

    Attributes
    ----------
    curve : list[float]
        The metric per round, round 0 (the initial model) first.
    extras : dict[str, float]
        Further numbers of the run (distinct clients per round...), reported
        as the median over the seeds in a column of their own; NaN: n/a.
    """

    curve: list[float]
    extras: dict[str, float] = field(default_factory=dict)


RunFunction = Callable[[Overrides, int], SeedRun]


@dataclass
class MethodOutcome:
    """One method of one comparison, on the reported seeds."""

    overrides: dict[str, bool | int | float | str]
    runs: list[SeedRun]
    rounds: SeedRounds
    #: Rounds to target over the baseline's, then the final metric's.
    rounds_ratio: RatioInterval
    final_ratio: RatioInterval
    learning_rate: float | None = None
    #: Per learning rate of the grid, the median tuning score (tuned only).
    tuning_scores: dict[float, float] = field(default_factory=dict)

    @property
    def finals(self) -> list[float]:
        """The final metric per seed."""
        return [run.curve[-1] for run in self.runs]


@dataclass
class ComparisonOutcome:
    """A comparison's target and its methods' outcomes."""

    comparison: Comparison
    target: float
    methods: dict[str, MethodOutcome]


class _Runner:
    """Runs ``(overrides, seed)`` pairs through a run function, each once."""

    def __init__(self, run: RunFunction) -> None:
        self._run = run
        self._done: dict[tuple[tuple[tuple[str, Any], ...], int], SeedRun] = {}

    def __call__(self, overrides: Overrides, seed: int) -> SeedRun:
        key = (tuple(sorted(overrides.items())), seed)
        if key not in self._done:
            self._done[key] = self._run(overrides, seed)
        return self._done[key]


def run_comparisons(
    description: PaperComparison, run: RunFunction, *, full: bool
) -> Evaluation:
    """Run every comparison of ``description`` and compute its statistics.

    Per comparison: a tuned one picks each method's learning rate on the
    tuning seeds (:func:`choose_learning_rate` of :func:`curve_score`); the
    target comes from the baseline's runs on the tuning seeds
    (:attr:`PaperComparison.target`); every method then runs the reported
    seeds, and each ratio to the baseline gets its paired interval. A run
    shared by several comparisons (the same overrides and seed) runs once.

    Parameters
    ----------
    description : PaperComparison
        The claim and its comparisons.
    run : RunFunction
        ``(overrides, seed) -> SeedRun``; all randomness from ``seed``.
    full : bool
        Paper-scale mode: at least :data:`MIN_REPORTED_SEEDS_FULL` reported seeds.

    Returns
    -------
    Evaluation
        The outcomes, ready to render.

    Raises
    ------
    ValueError
        If ``full`` and there are too few reported seeds.
    """
    if full and len(description.reported_seeds) < MIN_REPORTED_SEEDS_FULL:
        raise ValueError(
            f"--full needs at least {MIN_REPORTED_SEEDS_FULL} reported seeds, got "
            f"{len(description.reported_seeds)}"
        )
    runner = _Runner(run)
    return Evaluation(
        description,
        [
            _run_comparison(description, item, runner)
            for item in description.comparisons
        ],
    )


def _tuned_rate(
    description: PaperComparison,
    overrides: Overrides,
    runner: _Runner,
) -> tuple[float, dict[float, float]]:
    """The grid's best learning rate on the tuning seeds, and each rate's score.

    Returns
    -------
    tuple[float, dict[float, float]]
        The chosen rate (:func:`choose_learning_rate`) and, per rate, the
        median :func:`curve_score` over the tuning seeds.
    """
    key = description.learning_rate_key
    scores = {
        rate: [
            curve_score(runner({**overrides, key: rate}, seed).curve)
            for seed in description.tuning_seeds
        ]
        for rate in description.learning_rates
    }
    chosen = choose_learning_rate(scores, higher_is_better=description.higher_is_better)
    return chosen, {rate: float(np.median(values)) for rate, values in scores.items()}


def _run_comparison(
    description: PaperComparison, comparison: Comparison, runner: _Runner
) -> ComparisonOutcome:
    """One comparison: steps, target, reported runs, ratios."""
    settings: dict[str, dict[str, bool | int | float | str]] = {}
    tuning: dict[str, dict[float, float]] = {}
    for method, overrides in comparison.methods.items():
        settings[method] = {**comparison.shared, **overrides}
        if comparison.tuned:
            rate, tuning[method] = _tuned_rate(description, settings[method], runner)
            settings[method][description.learning_rate_key] = rate
    baseline_finals = [
        runner(settings[comparison.baseline], seed).curve[-1]
        for seed in description.tuning_seeds
    ]
    target = description.target.target(
        baseline_finals, higher_is_better=description.higher_is_better
    )
    reported = {
        method: [runner(overrides, seed) for seed in description.reported_seeds]
        for method, overrides in settings.items()
    }
    rounds = {
        method: seed_rounds(
            [run.curve for run in runs],
            target,
            higher_is_better=description.higher_is_better,
        )
        for method, runs in reported.items()
    }
    base_rounds = rounds[comparison.baseline]
    base_finals = [run.curve[-1] for run in reported[comparison.baseline]]
    outcomes = {}
    for method, runs in reported.items():
        outcomes[method] = MethodOutcome(
            overrides=settings[method],
            runs=runs,
            rounds=rounds[method],
            rounds_ratio=paired_ratio_interval(
                rounds[method].rounds,
                base_rounds.rounds,
                method_reached=rounds[method].reached,
                baseline_reached=base_rounds.reached,
            ),
            final_ratio=paired_ratio_interval(
                [run.curve[-1] for run in runs], base_finals
            ),
            learning_rate=(
                float(settings[method][description.learning_rate_key])
                if comparison.tuned
                else None
            ),
            tuning_scores=tuning.get(method, {}),
        )
    return ComparisonOutcome(comparison, target, outcomes)


# -- claim rows ------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ClaimRow:
    """One line of the claim table: a paper claim against our interval."""

    paper: str
    claim: str
    comparison: str
    method: str
    baseline: str
    statistic: str
    direction: Direction
    interval: RatioInterval
    data: str

    @property
    def verdict(self) -> Verdict:
        """:func:`verdict` of the interval, in the paper's direction."""
        return verdict(self.interval.low, self.interval.high, self.direction)

    def to_json(self) -> dict[str, Any]:
        """The ``claims.json`` object (see the module docstring)."""
        return {
            "paper": self.paper,
            "claim": self.claim,
            "comparison": self.comparison,
            "method": self.method,
            "baseline": self.baseline,
            "statistic": self.statistic,
            "direction": self.direction,
            "ratio": self.interval.ratio,
            "low": self.interval.low,
            "high": self.interval.high,
            "bound": self.interval.bound,
            "verdict": self.verdict,
            "data": self.data,
        }

    @classmethod
    def from_json(cls, item: Mapping[str, Any]) -> ClaimRow:
        """A row from its ``claims.json`` object; its ``verdict`` is recomputed."""
        if item["bound"] not in get_args(Bound):
            raise ValueError(f"unknown bound {item['bound']!r}")
        return cls(
            paper=str(item["paper"]),
            claim=str(item["claim"]),
            comparison=str(item["comparison"]),
            method=str(item["method"]),
            baseline=str(item["baseline"]),
            statistic=str(item["statistic"]),
            direction=item["direction"],
            interval=RatioInterval(
                float(item["ratio"]),
                float(item["low"]),
                float(item["high"]),
                item["bound"],
            ),
            data=str(item["data"]),
        )


def write_claims(path: Path, rows: Sequence[ClaimRow]) -> None:
    """Write ``rows`` as ``claims.json`` (the format of the module docstring)."""
    path.write_text(json.dumps([row.to_json() for row in rows], indent=1) + "\n")


def write_outputs(
    out: Path,
    summary: str,
    evaluations: Sequence[Evaluation],
    results: object = None,
    claims: bool = True,
) -> None:
    """Write a benchmark's ``summary.md``, ``results.json`` and claims; print it.

    ``results`` defaults to every evaluation's JSON, in order; ``claims=False``
    writes no ``claims.json`` (a benchmark whose comparisons claim nothing).
    """
    (out / "summary.md").write_text(summary + "\n")
    if results is None:
        results = [evaluation.to_json() for evaluation in evaluations]
    (out / "results.json").write_text(json.dumps(results, indent=1))
    if claims:
        write_claims(
            out / CLAIMS_FILE,
            [row for evaluation in evaluations for row in evaluation.claim_rows()],
        )
    print(summary)


def read_claims(path: Path) -> list[ClaimRow]:
    """The rows of a ``claims.json``; none if there is no such file."""
    if not path.is_file():
        return []
    return [ClaimRow.from_json(item) for item in json.loads(path.read_text())]


# -- rendering -------------------------------------------------------------------
@dataclass
class Evaluation:
    """The outcomes of a :class:`PaperComparison`: tables, claim rows, JSON."""

    description: PaperComparison
    outcomes: list[ComparisonOutcome]

    def claim_rows(self) -> list[ClaimRow]:
        """One row per comparison and claimed method."""
        description = self.description
        rows = []
        for outcome in self.outcomes:
            for method in outcome.comparison.claimed:
                result = outcome.methods[method]
                rows.append(
                    ClaimRow(
                        paper=description.paper,
                        claim=description.claim,
                        comparison=outcome.comparison.name,
                        method=method,
                        baseline=outcome.comparison.baseline,
                        statistic=description.statistic_text,
                        direction=description.direction,
                        interval=(
                            result.rounds_ratio
                            if description.statistic == "rounds to target"
                            else result.final_ratio
                        ),
                        data=description.data,
                    )
                )
        return rows

    def markdown(self, level: int = 2) -> str:
        """The section: the claim, the data, one table per comparison, verdicts.

        Parameters
        ----------
        level : int
            The heading level of the section's title; comparisons one below.
        """
        description = self.description
        parts = [
            f"{'#' * level} {description.title}",
            f"Claim ({description.paper}): {description.claim}.",
            f"Data: {description.data}.",
            f"Reported seeds {list(description.reported_seeds)}, the same for "
            "every method (same data, initial model and local work). Ratios are "
            "of medians over all reported seeds (method / baseline), with a "
            f"paired bootstrap {LEVEL:.0%} interval ({RESAMPLES} resamples of the "
            "seeds); a seed that never reaches the target counts as one round "
            "past the last, and where such seeds move a median its ratio is a "
            "bound (≤ or ≥).",
        ]
        for outcome in self.outcomes:
            parts += [
                f"{'#' * (level + 1)} {outcome.comparison.name}",
                self._method_text(outcome),
                self._table(outcome),
            ]
            if outcome.comparison.note:
                parts.append(outcome.comparison.note)
            verdicts = [
                f"{row.method} / {row.baseline}, {row.statistic}: "
                f"{row.interval.text()}, {row.verdict}"
                for row in self.claim_rows()
                if row.comparison == outcome.comparison.name
            ]
            parts.append(
                "Ours: " + "; ".join(verdicts) + "."
                if verdicts
                else "The paper makes no claim here."
            )
        return "\n\n".join(parts) + "\n"

    def _method_text(self, outcome: ComparisonOutcome) -> str:
        """The rounds, the target and how steps were chosen, in a paragraph."""
        description = self.description
        comparison = outcome.comparison
        relation = "≥" if description.higher_is_better else "≤"
        horizon = next(iter(outcome.methods.values())).rounds.horizon
        rule = description.target.text(
            description.metric, comparison.baseline, description.higher_is_better
        )
        text = (
            f"{horizon} rounds. Target: {description.metric} {relation} "
            f"{outcome.target:.4g} ({rule} {list(description.tuning_seeds)})."
        )
        if comparison.tuned:
            rates = ", ".join(f"{rate:g}" for rate in description.learning_rates)
            text += (
                f" Each method's `{description.learning_rate_key}` is picked from "
                f"{{{rates}}} by its median mean {description.metric} over the "
                "rounds on the tuning seeds."
            )
        return text

    def _table(self, outcome: ComparisonOutcome) -> str:
        """Per method: step, rounds, reached, ratios, final metric, extras."""
        description = self.description
        baseline = outcome.comparison.baseline
        extras = list(
            dict.fromkeys(
                key
                for result in outcome.methods.values()
                for run in result.runs
                for key in run.extras
            )
        )
        columns = [
            "method",
            *(["learning rate"] if outcome.comparison.tuned else []),
            "median rounds to target",
            "reached",
            f"rounds / {baseline} [95% CI]",
            f"final {description.metric} (median)",
            f"final / {baseline} [95% CI]",
            *extras,
        ]
        rows = []
        for method, result in outcome.methods.items():
            rows.append(
                [
                    method,
                    *(
                        [f"{result.learning_rate:g}"]
                        if result.learning_rate is not None
                        else []
                    ),
                    result.rounds.median_text(),
                    result.rounds.reached_text(),
                    "baseline" if method == baseline else result.rounds_ratio.text(),
                    f"{np.median(result.finals):.4g}",
                    "baseline" if method == baseline else result.final_ratio.text(),
                    *(
                        _median_text(
                            [run.extras.get(key, np.nan) for run in result.runs]
                        )
                        for key in extras
                    ),
                ]
            )
        return markdown_table(columns, rows)

    def to_json(self) -> dict[str, Any]:
        """Every number behind the tables, curves included, for ``results.json``."""
        return {
            "title": self.description.title,
            "tuning-seeds": list(self.description.tuning_seeds),
            "reported-seeds": list(self.description.reported_seeds),
            "comparisons": {
                outcome.comparison.name: {
                    "target": outcome.target,
                    "baseline": outcome.comparison.baseline,
                    "methods": {
                        method: {
                            "overrides": result.overrides,
                            "learning-rate": result.learning_rate,
                            "tuning-scores": {
                                f"{rate:g}": score
                                for rate, score in result.tuning_scores.items()
                            },
                            "rounds-to-target": list(result.rounds.rounds),
                            "reached": list(result.rounds.reached),
                            "rounds-ratio": _interval_json(result.rounds_ratio),
                            "final": result.finals,
                            "final-ratio": _interval_json(result.final_ratio),
                            "curves": [run.curve for run in result.runs],
                            "extras": [run.extras for run in result.runs],
                        }
                        for method, result in outcome.methods.items()
                    },
                }
                for outcome in self.outcomes
            },
        }

    def plot(self, path: Path) -> Path:
        """The median curve over the reported seeds per method, one panel each."""
        figure, axes = plt.subplots(
            1,
            len(self.outcomes),
            figsize=(4.5 * len(self.outcomes), 3.6),
            squeeze=False,
        )
        for axis, outcome in zip(axes[0], self.outcomes, strict=True):
            for method, result in outcome.methods.items():
                median = np.median([run.curve for run in result.runs], axis=0)
                axis.plot(np.arange(median.size), median, label=method)
            axis.axhline(outcome.target, color="grey", linestyle=":", linewidth=1)
            axis.set(title=outcome.comparison.name, xlabel="round")
            if not self.description.higher_is_better:
                axis.set_yscale("log")
        axes[0][0].set_ylabel(f"{self.description.metric} (median over seeds)")
        axes[0][0].legend(fontsize="small")
        figure.suptitle(self.description.title)
        save_figure(figure, path)
        return path


def _interval_json(interval: RatioInterval) -> dict[str, float | str]:
    """A ratio interval as a JSON object."""
    return {
        "ratio": interval.ratio,
        "low": interval.low,
        "high": interval.high,
        "bound": interval.bound,
    }


def _median_text(values: Sequence[float]) -> str:
    """The median of the finite values with 3 significant digits; ``n/a`` if none."""
    finite = [value for value in values if np.isfinite(value)]
    return f"{np.median(finite):.3g}" if finite else "n/a"
