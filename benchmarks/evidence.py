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
   learning rate (and only that) from one grid by the claim's own statistic
   on tuning seeds (:func:`tune_learning_rate`: a best rate at the grid's
   edge extends the grid), and is reported on other seeds.
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
5. *Power before verdicts.* Every ratio carries its detectable effect
   (:func:`detectable_effect`: 80% power at a two-sided 5% level) and its
   p-value for a ratio of 1 (:func:`bootstrap_p_value`), both from the same
   paired resampling as its interval. A claim's main row
   (:attr:`PaperComparison.main_row`) adds seeds until it detects a 20%
   effect or reaches :attr:`PaperComparison.powered_seeds`; ``--full``
   powers every row. Four verdicts (:func:`verdict`: *as the paper*, *unlike
   the paper*, *no effect larger than X%*, *inconclusive*) and one per claim
   (:func:`claim_verdict`, Holm's step-down over its rows).
6. *The statistic is the claim's.* A final value is the mean over the last
   10% of rounds, at least 3 (:func:`final_value`), and tuning scores a rate
   by the claim's statistic.

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
    ``"rounds to target"`` or ``"final <metric>"`` (a final value: the mean
    over the last 10% of rounds), or what else the ratio is of (the
    mechanism's ``"aggregate MSE vs full participation"``).
``direction``
    ``"below"`` or ``"above"``: where the paper puts the ratio against 1.
``ratio``, ``low``, ``high``
    The ratio of medians over the reported seeds and its 95% interval.
``bound``
    ``"exact"``, ``"lower bound"``, ``"upper bound"`` or ``"censored"``:
    whether seeds that missed the target make ``ratio`` a bound.
``p_value``, ``detectable_effect``
    The p-value for a ratio of 1 and the effect detectable with 80% power (a
    share: 0.2 is 20%); ``null`` where the writer computed none.
``verdict``
    ``"as the paper"``, ``"unlike the paper"``, ``"no effect larger than
    X%"`` or ``"inconclusive"``, as :func:`verdict` reads the interval
    (readers recompute it, never trust it).
``main``, ``seeds``
    Whether the row is its claim's main row, and its number of reported
    seeds (``null``: not said).
``data``
    The data used and why it fits the claim.

A file without the keys added later (``p_value``, ``detectable_effect``,
``main``, ``seeds``) still reads (:meth:`ClaimRow.from_json`).
"""

from __future__ import annotations

import itertools
import json
import math
import multiprocessing
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import matplotlib.pyplot as plt
import numpy as np

from benchmarks.harness import (
    markdown_table,
    prepare_run,
    rounds_to_target,
    save_figure,
)

Direction = Literal["below", "above"]
#: ``"as the paper"``, ``"unlike the paper"``, ``"no effect larger than X%"``,
#: ``"inconclusive"`` (:func:`verdict`); a claim also ``"mixed"``.
Verdict = str
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
    p_value : float or None
        The paired bootstrap's p-value for "ratio = 1"
        (:func:`paired_ratio_interval`); None where none was computed.
    detectable_effect : float or None
        The smallest effect the design detects with 80% power at a two-sided
        5% level, as a share of the ratio (0.2: 20%); None where none was
        computed.
    """

    ratio: float
    low: float
    high: float
    bound: Bound = "exact"
    p_value: float | None = None
    detectable_effect: float | None = None

    def text(self) -> str:
        """``<ratio> [<low>, <high>]``, with ``≥``/``≤`` for a bound, ``n/a`` for NaN.

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
    point = _ratio(np.median(values[indices], axis=1), np.median(base[indices], axis=1))
    return RatioInterval(
        float(ratio),
        low,
        high,
        bound,
        p_value=bootstrap_p_value(lowest, highest, seeds=values.size),
        detectable_effect=detectable_effect(point),
    )


#: ``z_{0.975} + z_{0.80}``: an effect this many standard errors from 0 is
#: found by a two-sided 5% test with 80% power.
POWER_STANDARD_ERRORS = 2.8
#: The detectable effect a comparison should reach (rule 7 of the evidence
#: rules): seeds rise until it is at most this share.
POWER_TARGET = 0.2
#: The family-wise error rate of a claim's rows (Holm's step-down).
FAMILY_LEVEL = 0.05


def seeds_for_power(
    effect: float, seeds: int, target: float = POWER_TARGET
) -> int | None:
    """About how many seeds detect ``target`` where ``seeds`` detect ``effect``.

    The standard error of the log ratio falls as ``1 / sqrt(seeds)``, so the
    seeds grow by ``(log(1 + effect) / log(1 + target))^2``; None where the
    effect is infinite (no standard error to scale).

    Examples
    --------
    >>> seeds_for_power(0.59, 20)
    130
    >>> seeds_for_power(0.1, 20), seeds_for_power(float("inf"), 20)
    (20, None)
    """
    if not np.isfinite(effect):
        return None
    factor = (np.log1p(effect) / np.log1p(target)) ** 2
    return max(seeds, math.ceil(seeds * factor))


def decisive_seeds(rows: int, *, level: float = FAMILY_LEVEL) -> int:
    """The fewest seeds whose p-value floor passes Holm's first step over ``rows``.

    :func:`bootstrap_p_value` is never below ``2^(1 - n)`` for ``n`` seeds,
    and Holm's first step needs ``p <= level / rows``.

    Examples
    --------
    >>> decisive_seeds(1), decisive_seeds(3), decisive_seeds(6)
    (6, 7, 8)
    """
    return 1 + math.ceil(math.log2(max(rows, 1) / level))


def bootstrap_p_value(lowest: Any, highest: Any, *, seeds: int | None = None) -> float:
    """The smallest level whose paired bootstrap interval excludes 1, two-sided.

    The interval at level ``1 - a`` is the ``a/2`` quantile of ``lowest`` to
    the ``1 - a/2`` quantile of ``highest`` (:func:`paired_ratio_interval`), so
    it lies below 1 once fewer than ``a/2`` of ``highest`` reach 1, above 1
    once fewer than ``a/2`` of ``lowest`` are at most 1. Counted with one
    added to both numerator and denominator, so that a finite number of
    resamples never gives 0.

    This, rather than a sign-flip permutation test on per-seed log ratios,
    because it is the test the interval shown inverts: misses enter through
    the same worst-case ends, the statistic is the ratio of medians the table
    prints, and a p-value below 5% means the 95% interval excludes 1. But few
    seeds make the bootstrap's tails too thin (5 seeds all on one side give
    no resample on the other), so the p-value is never below ``2^(1 - n)``
    for ``n`` seeds: the smallest any test that treats the paired seeds' signs
    as exchangeable can give (6.25% at 5 seeds, 0.78% at 8). A claim is then
    decided by rows with the seeds to decide it: its powered main row, not 5
    seeds whose every resample agrees.

    Parameters
    ----------
    lowest, highest : array_like
        Per resample, the ratio with misses at their most favourable and least
        favourable to the method (both equal when nothing missed).
    seeds : int, optional
        The number of paired seeds resampled; the floor above. None: no floor.

    Returns
    -------
    float
        In ``(0, 1]``.

    Examples
    --------
    >>> ratios = np.linspace(0.5, 0.99, 99)
    >>> round(bootstrap_p_value(ratios, ratios), 2)
    0.02
    >>> bootstrap_p_value(ratios, ratios, seeds=5)
    0.0625
    >>> bootstrap_p_value(np.linspace(0.5, 1.5, 99), np.linspace(0.5, 1.5, 99))
    1.0
    """
    low_side, high_side = np.asarray(lowest), np.asarray(highest)
    at_least_one = int(np.sum(~(high_side < 1)))
    at_most_one = int(np.sum(~(low_side > 1)))
    count = min(at_least_one, at_most_one)
    floor = 0.0 if seeds is None else 2.0 ** (1 - seeds)
    return float(min(1.0, max(floor, 2 * (count + 1) / (high_side.size + 1))))


def detectable_effect(ratios: Any) -> float:
    """The effect the design detects: ``exp(2.8 SE) - 1`` of the log ratio.

    ``SE`` is the standard deviation of the log ratio over the paired
    bootstrap's resamples (misses at ``T + 1``); 2.8 standard errors
    (:data:`POWER_STANDARD_ERRORS`) is the distance at which a two-sided 5%
    test rejects with 80% power.

    Parameters
    ----------
    ratios : array_like
        The ratio of medians of each resample.

    Returns
    -------
    float
        A share (0.2: a 20% change of the ratio); infinite where a resample's
        ratio is 0, infinite or NaN (no log).

    Examples
    --------
    >>> round(detectable_effect(np.exp([-0.05, 0.05, -0.05, 0.05])), 3)
    0.175
    >>> detectable_effect([0.5, 0.0])
    inf
    """
    values = np.asarray(ratios, dtype=np.float64)
    if values.size < 2 or not np.all(np.isfinite(values) & (values > 0)):
        return float("inf")
    spread = float(np.std(np.log(values), ddof=1))
    return float(np.expm1(POWER_STANDARD_ERRORS * spread))


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


#: The widest no-effect bound a verdict reports (rule 7): an interval that
#: meets 1 but reaches further from it says nothing.
NO_EFFECT_LIMIT = 0.2
#: How a no-effect verdict begins (the bound follows).
NO_EFFECT = "no effect larger than"


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
        ``"no effect larger than X%"`` when it meets that band and both its
        ends lie within :data:`NO_EFFECT_LIMIT` of 1 (``X`` the larger
        distance of an end from 1, rounded up to a whole percent: a measured
        bound, not a chosen margin); ``"inconclusive"`` otherwise (NaN
        included). An interval inside the band but clear of 1 itself
        (``[1.001, 1.004]``) reads as no effect: the band is what counts as
        none.

    Raises
    ------
    ValueError
        If ``low > high`` or ``direction`` is neither ``"below"`` nor ``"above"``.

    Examples
    --------
    >>> verdict(0.6, 0.9, "below"), verdict(0.6, 0.9, "above")
    ('as the paper', 'unlike the paper')
    >>> verdict(0.8, 1.2, "below"), verdict(0.79, 1.1, "below")
    ('no effect larger than 20%', 'inconclusive')
    >>> verdict(1.001, 1.004, "below"), verdict(float("nan"), 1.0, "below")
    ('no effect larger than 1%', 'inconclusive')
    """
    if direction not in get_args(Direction):
        raise ValueError(f"direction must be 'below' or 'above', got {direction!r}")
    if low > high:
        raise ValueError(f"interval [{low}, {high}] has its low end above its high")
    below, above = high < 1 - NO_EFFECT_MARGIN, low > 1 + NO_EFFECT_MARGIN
    if below or above:
        return "as the paper" if below == (direction == "below") else "unlike the paper"
    reach = max(1 - low, high - 1)
    # The tolerance keeps 1 - 0.8 (0.19999999999999996) and 1.2 - 1 at 20%.
    if np.isfinite(reach) and reach <= NO_EFFECT_LIMIT + 1e-12:
        return f"{NO_EFFECT} {_percent_up(reach)}"
    return "inconclusive"


def _percent_up(share: float) -> str:
    """``share`` as a whole percent rounded up (a bound stays a bound): ``12%``."""
    # Rounded first, so that 0.2 (20.000000000000004%) stays 20%.
    return f"{max(0, math.ceil(round(100 * share, 6))):d}%"


def effect_text(share: float | None) -> str:
    """A detectable effect as a whole percent (``20%``); ``∞``, or ``n/a``.

    Examples
    --------
    >>> effect_text(0.123), effect_text(float("inf")), effect_text(None)
    ('13%', '∞', 'n/a')
    """
    if share is None or np.isnan(share):
        return "n/a"
    return "∞" if share == np.inf else _percent_up(share)


def holm_survivors(
    p_values: Sequence[float | None], *, level: float = FAMILY_LEVEL
) -> list[bool]:
    """Which hypotheses Holm's step-down rejects at family-wise ``level``.

    The p-values are taken from the smallest up; the ``k``-th smallest (from
    0) of ``m`` is rejected while it is at most ``level / (m - k)``, and the
    first that is not stops the steps. A missing p-value (None, NaN) counts as
    1: it never survives, and still counts in ``m``.

    Parameters
    ----------
    p_values : Sequence[float | None]
        One per row of a claim.
    level : float
        The family-wise error rate.

    Returns
    -------
    list[bool]
        Per row, in the order given, whether it survives.

    Examples
    --------
    0.03 alone would pass at 5%, but it is the second smallest of three: it
    must be at most 0.05 / 2.

    >>> holm_survivors([0.01, 0.03, 0.5])
    [True, False, False]
    >>> holm_survivors([0.02, 0.024, None])
    [False, False, False]
    """
    values = [
        1.0 if value is None or not np.isfinite(value) else float(value)
        for value in p_values
    ]
    survived = [False] * len(values)
    order = sorted(range(len(values)), key=lambda index: values[index])
    for rank, index in enumerate(order):
        if values[index] > level / (len(values) - rank):
            break
        survived[index] = True
    return survived


def claim_verdict(rows: Sequence[ClaimRow]) -> Verdict:
    """One verdict for a claim from its rows (rule 7), Holm-corrected.

    Holm's step-down (:func:`holm_survivors`) at :data:`FAMILY_LEVEL` over the
    rows' p-values; a surviving row counts on the side of 1 its interval lies
    (its ratio where the interval meets 1, which a survivor's rarely does).

    Returns
    -------
    Verdict
        ``"as the paper"`` if a row on the paper's side survives and none on
        the other, ``"unlike the paper"`` in the mirror case, ``"mixed"`` if
        both; otherwise the tightest ``"no effect larger than X%"`` among the
        rows' verdicts, else ``"inconclusive"`` (no rows included).
    """
    toward = against = False
    for row, survived in zip(
        rows, holm_survivors([row.p_value for row in rows]), strict=True
    ):
        if not survived:
            continue
        side = row.side
        toward |= side == row.direction
        against |= side is not None and side != row.direction
    if toward and against:
        return "mixed"
    if toward or against:
        return "as the paper" if toward else "unlike the paper"
    bounds = [
        (max(1 - row.interval.low, row.interval.high - 1), row.verdict)
        for row in rows
        if row.verdict.startswith(NO_EFFECT)
    ]
    return min(bounds)[1] if bounds else "inconclusive"


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


#: A "final" value is the mean over this share of the last rounds (rule 8) ...
FINAL_SHARE = 0.1
#: ... and over at least this many rounds.
MIN_FINAL_ROUNDS = 3


def final_value(curve: Sequence[float]) -> float:
    """A run's final value: the mean over its last 10% of rounds, at least 3.

    One last round of a noisy curve is one draw of its noise; the mean over
    the last ``max(3, ceil(T / 10))`` rounds of ``1..T`` (round 0, the initial
    model, never counts) is the level the run ended at.

    Parameters
    ----------
    curve : Sequence[float]
        The metric per round, round 0 first.

    Returns
    -------
    float
        The mean; NaN where one of those rounds is not finite (a diverged
        run) or there is no round past 0.

    Examples
    --------
    40 rounds: the last 4.

    >>> final_value([9.0] * 37 + [1.0, 2.0, 3.0, 4.0])
    2.5
    >>> final_value([0.0, 1.0, 2.0, 4.0, 6.0])
    4.0
    >>> final_value([1.0, float("inf"), 0.5, 0.5])
    nan
    """
    rounds = len(curve) - 1
    if rounds < 1:
        return float("nan")
    count = min(rounds, max(MIN_FINAL_ROUNDS, math.ceil(FINAL_SHARE * rounds)))
    value = float(np.mean(np.asarray(curve[-count:], dtype=np.float64)))
    return value if np.isfinite(value) else float("nan")


def choose_learning_rate(
    scores: Mapping[float, Sequence[float]], *, higher_is_better: bool
) -> float:
    """The learning rate whose median score over the tuning seeds is best.

    Parameters
    ----------
    scores : Mapping[float, Sequence[float]]
        Per learning rate, the tuning seeds' scores: the claim's statistic
        (:func:`final_value`, or rounds to target); NaN (a diverged run) is the
        worst score.
    higher_is_better : bool
        Whether a larger score is better.

    Returns
    -------
    float
        The best learning rate; the first in the mapping among equals.

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


#: How far a grid extends past an edge (rule 8): at most this many steps on
#: each side, each a grid step (the ratio of the two edge rates) further.
MAX_GRID_EXTENSIONS = 3


def tune_learning_rate(
    scores_at: Callable[[float], Sequence[float]],
    grid: Sequence[float],
    *,
    higher_is_better: bool,
    max_extensions: int = MAX_GRID_EXTENSIONS,
) -> tuple[float, dict[float, list[float]]]:
    """The best learning rate of ``grid``, extending the grid past an edge best.

    When the best rate (:func:`choose_learning_rate`) is the smallest or the
    largest tried, one more rate is tried a grid step beyond it (the ratio of
    the grid's two rates at that edge); repeated until the best is interior,
    or ``max_extensions`` steps were taken on that side (a best rate still at
    the edge then is reported as it is, and its scores show it).

    Parameters
    ----------
    scores_at : Callable[[float], Sequence[float]]
        A learning rate -> its tuning seeds' scores (the claim's statistic).
    grid : Sequence[float]
        The rates to try first, at least two for the grid to extend.
    higher_is_better : bool
        Whether a larger score is better.
    max_extensions : int
        Extra rates at most on each side.

    Returns
    -------
    tuple[float, dict[float, list[float]]]
        The chosen rate and the scores of every rate tried, in increasing rate.

    Examples
    --------
    The score peaks at 1.0, past the grid's top: the grid grows by factors of
    3 (0.1 -> 0.3), and 0.9 (interior) is chosen after 2.7 scores worse.

    >>> rate, scores = tune_learning_rate(
    ...     lambda rate: [-abs(np.log(rate))], [0.03, 0.1, 0.3], higher_is_better=True
    ... )
    >>> round(rate, 3), [round(tried, 3) for tried in scores]
    (0.9, [0.03, 0.1, 0.3, 0.9, 2.7])
    """
    rates = sorted(grid)
    scores = {rate: list(scores_at(rate)) for rate in rates}
    extended = {"low": 0, "high": 0}
    while True:
        chosen = choose_learning_rate(
            dict(sorted(scores.items())), higher_is_better=higher_is_better
        )
        tried = sorted(scores)
        if len(tried) < 2 or tried[0] < chosen < tried[-1]:
            break
        side = "high" if chosen == tried[-1] else "low"
        if extended[side] >= max_extensions:
            break
        edge, inner = (tried[-1], tried[-2]) if side == "high" else (tried[0], tried[1])
        extended[side] += 1
        # 12 digits: 0.3 * 3 is 0.9, not 0.8999999999999999, in tables and keys.
        rate = float(f"{edge * (edge / inner):.12g}")
        scores[rate] = list(scores_at(rate))
    return chosen, dict(sorted(scores.items()))


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
    main_row : tuple[str, str] or None (default: None)
        The claim's main row, ``(comparison name, claimed method)``: the one
        quick mode gives the seeds its power needs; None: the first
        comparison's first claimed method.
    powered_seeds : int (default: 0)
        The most reported seeds a powered row rises to (quick mode: the main
        row; ``--full``: every row): seeds are added, two at a time, while
        its detectable effect is above :data:`POWER_TARGET`. At most the
        reported seeds: no row rises.
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
    main_row: tuple[str, str] | None = None
    powered_seeds: int = 0

    def __post_init__(self) -> None:
        """Check the seeds, the direction, the main row, that tuning has a grid."""
        rows = [
            (comparison.name, method)
            for comparison in self.comparisons
            for method in comparison.claimed
        ]
        if self.main_row is not None and self.main_row not in rows:
            raise ValueError(f"main row {self.main_row} is not one of {rows}")
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
    def main(self) -> tuple[str, str] | None:
        """The main row, ``(comparison, method)``; None if nothing is claimed."""
        if self.main_row is not None:
            return self.main_row
        return next(
            (
                (comparison.name, comparison.claimed[0])
                for comparison in self.comparisons
                if comparison.claimed
            ),
            None,
        )

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
    """One method of one comparison, on its reported seeds."""

    overrides: dict[str, bool | int | float | str]
    #: The reported seeds this method ran, in order: the description's, and
    #: more where the row is powered (the baseline: the most of any method).
    seeds: tuple[int, ...]
    runs: list[SeedRun]
    rounds: SeedRounds
    #: Rounds to target over the baseline's, then the final metric's, on this
    #: method's seeds.
    rounds_ratio: RatioInterval
    final_ratio: RatioInterval
    learning_rate: float | None = None
    #: Per learning rate tried, the median tuning score (tuned only).
    tuning_scores: dict[float, float] = field(default_factory=dict)

    @property
    def finals(self) -> list[float]:
        """The final metric per seed (:func:`final_value`)."""
        return [final_value(run.curve) for run in self.runs]


@dataclass
class ComparisonOutcome:
    """A comparison's target and its methods' outcomes."""

    comparison: Comparison
    target: float
    methods: dict[str, MethodOutcome]


#: Seeds a powered row adds at a time: one per worker of two.
SEED_BATCH = 2
#: Worker processes at most: the report's machine has 2 cores.
MAX_WORKERS = 2
_RunKey = tuple[tuple[tuple[str, Any], ...], int]


class _Runner:
    """Runs ``(overrides, seed)`` pairs through a run function, each once.

    With ``workers > 1``, :meth:`prefetch` runs the pairs it is given in that
    many processes (started with ``spawn``: a fresh interpreter each, no
    state forked from this one); every run still derives all of its
    randomness from its seed, so it gives the same numbers in any process.
    """

    def __init__(self, run: RunFunction, workers: int = 1) -> None:
        self._run = run
        self._workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._done: dict[_RunKey, SeedRun] = {}

    def __call__(self, overrides: Overrides, seed: int) -> SeedRun:
        key = _run_key(overrides, seed)
        if key not in self._done:
            self._done[key] = self._run(overrides, seed)
        return self._done[key]

    def prefetch(self, pairs: Iterable[tuple[Overrides, int]]) -> None:
        """Run the pairs not run yet, in the worker processes if there are any."""
        missing: dict[_RunKey, tuple[Overrides, int]] = {}
        for overrides, seed in pairs:
            key = _run_key(overrides, seed)
            if key not in self._done:
                missing.setdefault(key, (dict(overrides), seed))
        if self._workers < 2 or len(missing) < 2:
            for overrides, seed in missing.values():
                self(overrides, seed)
            return
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self._workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=prepare_run,
            )
        arguments = list(missing.values())
        results = self._pool.map(
            self._run,
            [overrides for overrides, _ in arguments],
            [seed for _, seed in arguments],
        )
        for key, result in zip(missing, results, strict=True):
            self._done[key] = result

    def close(self) -> None:
        """Stop the worker processes, if any were started."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def _run_key(overrides: Overrides, seed: int) -> _RunKey:
    """What identifies a run: its sorted overrides and its seed."""
    return tuple(sorted(overrides.items())), seed


def run_comparisons(
    description: PaperComparison,
    run: RunFunction,
    *,
    full: bool,
    workers: int = 1,
) -> Evaluation:
    """Run every comparison of ``description`` and compute its statistics.

    Per comparison: a tuned one picks each method's learning rate on the
    tuning seeds by the claim's statistic (:func:`tune_learning_rate`: the
    final value, :func:`final_value`, for a final-value claim; rounds to the
    target for a rounds claim, the target then fixed first from the
    baseline's best final level over its grid); an untuned one takes the
    target from the baseline's final values on the tuning seeds
    (:attr:`PaperComparison.target`). Every method then runs the reported
    seeds, a powered row more (:attr:`PaperComparison.powered_seeds`: the
    main row in quick mode, every row with ``full``), and each ratio to the
    baseline gets its paired interval. A run shared by several comparisons
    (the same overrides and seed) runs once.

    Parameters
    ----------
    description : PaperComparison
        The claim and its comparisons.
    run : RunFunction
        ``(overrides, seed) -> SeedRun``; all randomness from ``seed``. With
        ``workers > 1`` it must pickle (a module-level function, or a
        :func:`functools.partial` of one).
    full : bool
        Paper-scale mode: at least :data:`MIN_REPORTED_SEEDS_FULL` reported
        seeds, and every row powered.
    workers : int (default: 1)
        Processes that run seeds side by side, at most :data:`MAX_WORKERS`.

    Returns
    -------
    Evaluation
        The outcomes, ready to render.

    Raises
    ------
    ValueError
        If ``full`` and there are too few reported seeds, or ``workers`` is
        not in ``1..MAX_WORKERS``.
    """
    if full and len(description.reported_seeds) < MIN_REPORTED_SEEDS_FULL:
        raise ValueError(
            f"--full needs at least {MIN_REPORTED_SEEDS_FULL} reported seeds, got "
            f"{len(description.reported_seeds)}"
        )
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers must be in 1..{MAX_WORKERS}, got {workers}")
    runner = _Runner(run, workers)
    try:
        outcomes = [
            _run_comparison(description, item, runner, full=full)
            for item in description.comparisons
        ]
    finally:
        runner.close()
    return Evaluation(description, outcomes, full=full)


def _tuning_finals(
    description: PaperComparison, overrides: Overrides, runner: _Runner
) -> Callable[[float], list[float]]:
    """A learning rate -> the final value of ``overrides`` at it, per tuning seed."""

    def finals(rate: float) -> list[float]:
        settings = {**overrides, description.learning_rate_key: rate}
        runner.prefetch((settings, seed) for seed in description.tuning_seeds)
        return [
            final_value(runner(settings, seed).curve)
            for seed in description.tuning_seeds
        ]

    return finals


def _tuning_rounds(
    description: PaperComparison, overrides: Overrides, runner: _Runner, target: float
) -> Callable[[float], list[float]]:
    """A learning rate -> rounds to ``target`` at it per tuning seed.

    A miss counts as ``T + 1``; a run that diverged (its final value is not a
    number) scores NaN, the worst, whenever it passed the target before.
    """
    finals = _tuning_finals(description, overrides, runner)

    def rounds(rate: float) -> list[float]:
        ended = finals(rate)  # runs the seeds, side by side where there are workers
        settings = {**overrides, description.learning_rate_key: rate}
        reached = seed_rounds(
            [runner(settings, seed).curve for seed in description.tuning_seeds],
            target,
            higher_is_better=description.higher_is_better,
        ).rounds
        return [
            value if np.isfinite(final) else float("nan")
            for value, final in zip(reached, ended, strict=True)
        ]

    return rounds


def _tune(
    description: PaperComparison,
    comparison: Comparison,
    settings: dict[str, dict[str, bool | int | float | str]],
    runner: _Runner,
) -> tuple[float, dict[str, dict[float, float]]]:
    """Set each method's learning rate by the claim's statistic; the target.

    Returns
    -------
    tuple[float, dict[str, dict[float, float]]]
        The target, and per method the median score of each rate tried.
    """
    key, grid = description.learning_rate_key, description.learning_rates
    higher = description.higher_is_better
    runner.prefetch(
        ({**overrides, key: rate}, seed)
        for overrides in settings.values()
        for rate in grid
        for seed in description.tuning_seeds
    )
    baseline = settings[comparison.baseline]
    scores: dict[str, dict[float, list[float]]] = {}
    if description.statistic == "final":
        for method, overrides in settings.items():
            rate, scores[method] = tune_learning_rate(
                _tuning_finals(description, overrides, runner),
                grid,
                higher_is_better=higher,
            )
            overrides[key] = rate
        target = description.target.target(
            scores[comparison.baseline][float(baseline[key])], higher_is_better=higher
        )
    else:
        # Rounds need a target before any rate is chosen: the baseline's best
        # final level over its grid, on the tuning seeds.
        best, base_finals = tune_learning_rate(
            _tuning_finals(description, baseline, runner), grid, higher_is_better=higher
        )
        target = description.target.target(base_finals[best], higher_is_better=higher)
        for method, overrides in settings.items():
            rate, scores[method] = tune_learning_rate(
                _tuning_rounds(description, overrides, runner, target),
                grid,
                higher_is_better=False,
            )
            overrides[key] = rate
    medians = {
        method: {rate: float(np.median(values)) for rate, values in tried.items()}
        for method, tried in scores.items()
    }
    return target, medians


def _ratios(
    description: PaperComparison,
    runs: Sequence[SeedRun],
    base_runs: Sequence[SeedRun],
    target: float,
) -> tuple[RatioInterval, RatioInterval]:
    """Rounds to target and final value of ``runs`` over ``base_runs``, paired."""
    higher = description.higher_is_better
    rounds = seed_rounds([run.curve for run in runs], target, higher_is_better=higher)
    base = seed_rounds(
        [run.curve for run in base_runs], target, higher_is_better=higher
    )
    return (
        paired_ratio_interval(
            rounds.rounds,
            base.rounds,
            method_reached=rounds.reached,
            baseline_reached=base.reached,
        ),
        paired_ratio_interval(
            [final_value(run.curve) for run in runs],
            [final_value(run.curve) for run in base_runs],
        ),
    )


def _powered_seeds(
    description: PaperComparison,
    settings: Mapping[str, Overrides],
    method: str,
    baseline: str,
    target: float,
    runner: _Runner,
) -> tuple[int, ...]:
    """The reported seeds, and more until the row can decide its claim, or the cap.

    A row can decide once it detects a 20% effect (:data:`POWER_TARGET`) and
    has the seeds (:func:`decisive_seeds`) for its p-value to pass Holm's
    step over the claim's rows.
    """
    seeds = list(description.reported_seeds)
    taken = {*seeds, *description.tuning_seeds}
    fresh = (seed for seed in itertools.count(max(seeds) + 1) if seed not in taken)
    statistic = 0 if description.statistic == "rounds to target" else 1
    least = decisive_seeds(
        sum(len(comparison.claimed) for comparison in description.comparisons)
    )
    while len(seeds) < description.powered_seeds:
        interval = _ratios(
            description,
            [runner(settings[method], seed) for seed in seeds],
            [runner(settings[baseline], seed) for seed in seeds],
            target,
        )[statistic]
        effect = interval.detectable_effect
        if effect is not None and effect <= POWER_TARGET and len(seeds) >= least:
            break
        batch = [
            next(fresh)
            for _ in range(min(SEED_BATCH, description.powered_seeds - len(seeds)))
        ]
        runner.prefetch(
            (settings[name], seed) for name in (method, baseline) for seed in batch
        )
        seeds += batch
    return tuple(seeds)


def _run_comparison(
    description: PaperComparison,
    comparison: Comparison,
    runner: _Runner,
    *,
    full: bool,
) -> ComparisonOutcome:
    """One comparison: steps, target, reported (and powered) runs, ratios."""
    settings: dict[str, dict[str, bool | int | float | str]] = {
        method: {**comparison.shared, **overrides}
        for method, overrides in comparison.methods.items()
    }
    tuning: dict[str, dict[float, float]] = {}
    baseline = comparison.baseline
    if comparison.tuned:
        target, tuning = _tune(description, comparison, settings, runner)
    else:
        runner.prefetch((settings[baseline], seed) for seed in description.tuning_seeds)
        target = description.target.target(
            [
                final_value(runner(settings[baseline], seed).curve)
                for seed in description.tuning_seeds
            ],
            higher_is_better=description.higher_is_better,
        )
    runner.prefetch(
        (overrides, seed)
        for overrides in settings.values()
        for seed in description.reported_seeds
    )
    seeds = {method: tuple(description.reported_seeds) for method in settings}
    for method in _powered_methods(description, comparison, full=full):
        seeds[method] = _powered_seeds(
            description, settings, method, baseline, target, runner
        )
    # Powered seeds extend the reported ones: the longest list holds them all.
    seeds[baseline] = max(seeds.values(), key=len)
    outcomes = {}
    for method, overrides in settings.items():
        runs = [runner(overrides, seed) for seed in seeds[method]]
        base_runs = [runner(settings[baseline], seed) for seed in seeds[method]]
        rounds_ratio, final_ratio = _ratios(description, runs, base_runs, target)
        outcomes[method] = MethodOutcome(
            overrides=overrides,
            seeds=seeds[method],
            runs=runs,
            rounds=seed_rounds(
                [run.curve for run in runs],
                target,
                higher_is_better=description.higher_is_better,
            ),
            rounds_ratio=rounds_ratio,
            final_ratio=final_ratio,
            learning_rate=(
                float(overrides[description.learning_rate_key])
                if comparison.tuned
                else None
            ),
            tuning_scores=tuning.get(method, {}),
        )
    return ComparisonOutcome(comparison, target, outcomes)


def _powered_methods(
    description: PaperComparison, comparison: Comparison, *, full: bool
) -> tuple[str, ...]:
    """The claimed methods of ``comparison`` whose rows get more seeds."""
    if len(description.reported_seeds) >= description.powered_seeds:
        return ()
    if full:
        return comparison.claimed
    main = description.main
    return (main[1],) if main is not None and main[0] == comparison.name else ()


# -- claim rows ------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ClaimRow:
    """One line of the claim table: a paper claim against our interval.

    ``interval`` carries the row's p-value and detectable effect (None where
    the writer computed none: such a row never survives Holm's step, and its
    detectable effect reads n/a). ``main`` marks the claim's main row, the one
    quick mode powers; ``seeds`` is the number of reported seeds behind the
    row (None: not said).
    """

    paper: str
    claim: str
    comparison: str
    method: str
    baseline: str
    statistic: str
    direction: Direction
    interval: RatioInterval
    data: str
    main: bool = False
    seeds: int | None = None

    @property
    def verdict(self) -> Verdict:
        """:func:`verdict` of the interval, in the paper's direction."""
        return verdict(self.interval.low, self.interval.high, self.direction)

    @property
    def p_value(self) -> float | None:
        """The p-value of "ratio = 1" (:func:`bootstrap_p_value`), if computed."""
        return self.interval.p_value

    @property
    def detectable_effect(self) -> float | None:
        """The effect detectable with 80% power (:func:`detectable_effect`)."""
        return self.interval.detectable_effect

    @property
    def side(self) -> Direction | None:
        """Where the interval lies against 1; the ratio's side if it meets 1.

        None where the ratio is 1 or not a number.
        """
        interval = self.interval
        if interval.high < 1 or (interval.low <= 1 and interval.ratio < 1):
            return "below"
        if interval.low > 1 or (interval.high >= 1 and interval.ratio > 1):
            return "above"
        return None

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
            "p_value": self.p_value,
            "detectable_effect": self.detectable_effect,
            "verdict": self.verdict,
            "main": self.main,
            "seeds": self.seeds,
            "data": self.data,
        }

    @classmethod
    def from_json(cls, item: Mapping[str, Any]) -> ClaimRow:
        """A row from its ``claims.json`` object; its ``verdict`` is recomputed.

        The keys this format gained later (``p_value``, ``detectable_effect``,
        ``main``, ``seeds``) may be missing: their defaults then.
        """
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
                p_value=_optional_float(item.get("p_value")),
                detectable_effect=_optional_float(item.get("detectable_effect")),
            ),
            data=str(item["data"]),
            main=bool(item.get("main", False)),
            seeds=None if item.get("seeds") is None else int(item["seeds"]),
        )


def _optional_float(value: Any) -> float | None:
    """``value`` as a float; None stays None."""
    return None if value is None else float(value)


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
    #: Whether the runs were ``--full`` ones (every row powered).
    full: bool = False

    def claim_rows(self) -> list[ClaimRow]:
        """One row per comparison and claimed method, the main row marked."""
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
                        main=(outcome.comparison.name, method) == description.main,
                        seeds=len(result.seeds),
                    )
                )
        return rows

    def power_text(self) -> str:
        """Which rows got the seeds their power needs, in a sentence."""
        description = self.description
        target = effect_text(POWER_TARGET)
        if len(description.reported_seeds) >= description.powered_seeds:
            return (
                f"No row adds seeds for power here; each row's detectable effect "
                f"(80% power, two-sided 5%) is shown beside it ({target} is the aim)."
            )
        rows = sum(len(item.claimed) for item in description.comparisons)
        rule = (
            f"seeds are added two at a time, up to {description.powered_seeds}, "
            f"while its detectable effect (80% power, two-sided 5%) is above "
            f"{target} or it has fewer than {decisive_seeds(rows)} seeds (the "
            f"fewest whose p-value can pass Holm's step over the claim's {rows} "
            "rows)"
        )
        if self.full:
            return f"Every row is powered: {rule}."
        main = description.main
        assert main is not None  # a PaperComparison with powered seeds claims a row
        baseline = next(
            item.baseline for item in description.comparisons if item.name == main[0]
        )
        text = (
            f"The main row ({main[1]} / {baseline}, *{main[0]}*) is powered: "
            f"{rule}; the other rows keep the {len(description.reported_seeds)} "
            "reported seeds, and `--full` powers them too. Each ratio pairs a "
            "method's seeds with the same seeds of the baseline."
        )
        row = next(row for row in self.claim_rows() if row.main)
        effect = row.detectable_effect
        if row.seeds is not None and effect is not None and effect > POWER_TARGET:
            needed = seeds_for_power(effect, row.seeds)
            text += (
                f" It stopped at {row.seeds} seeds with a detectable effect of "
                f"{effect_text(effect)}; "
                + (
                    f"{target} would take about {needed} seeds."
                    if needed is not None
                    else "its resamples give no finite standard error to scale."
                )
            )
        return text

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
            "seeds), its p-value for a ratio of 1 and its detectable effect; a "
            "seed that never reaches the target counts as one round past the "
            "last, and where such seeds move a median its ratio is a bound (≤ or "
            f"≥). A final value is the mean over the last {FINAL_SHARE:.0%} of "
            f"rounds (at least {MIN_FINAL_ROUNDS}).",
            self.power_text(),
            f"Claim verdict (Holm's step-down at {FAMILY_LEVEL:.0%} over its "
            f"rows): {claim_verdict(self.claim_rows())}.",
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
                f"{row.interval.text()} (p = {p_value_text(row.p_value)}, "
                f"detectable effect {effect_text(row.detectable_effect)}, "
                f"{row.seeds} seeds), {row.verdict}"
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
            score = (
                f"final {description.metric}"
                if description.statistic == "final"
                else "rounds to the target (fixed first from the baseline's best "
                "final level over its grid)"
            )
            text += (
                f" Each method's `{description.learning_rate_key}` is picked from "
                f"{{{rates}}} by its median {score} on the tuning seeds, the "
                "claim's own statistic; a best rate at the grid's edge extends the "
                f"grid one step at a time (at most {MAX_GRID_EXTENSIONS} a side)."
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
            "seeds",
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
                    len(result.seeds),
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
                            "seeds": list(result.seeds),
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


def _interval_json(interval: RatioInterval) -> dict[str, float | str | None]:
    """A ratio interval as a JSON object."""
    return {
        "ratio": interval.ratio,
        "low": interval.low,
        "high": interval.high,
        "bound": interval.bound,
        "p-value": interval.p_value,
        "detectable-effect": interval.detectable_effect,
    }


def p_value_text(value: float | None) -> str:
    """A p-value in two significant digits, ``< 0.001`` below; ``n/a`` if none.

    Examples
    --------
    >>> p_value_text(0.0432), p_value_text(0.0004), p_value_text(None)
    ('0.043', '< 0.001', 'n/a')
    """
    if value is None or np.isnan(value):
        return "n/a"
    return "< 0.001" if value < 0.001 else f"{value:.2g}"


def _median_text(values: Sequence[float]) -> str:
    """The median of the finite values with 3 significant digits; ``n/a`` if none."""
    finite = [value for value in values if np.isfinite(value)]
    return f"{np.median(finite):.3g}" if finite else "n/a"
