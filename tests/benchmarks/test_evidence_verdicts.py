"""Rules 7 and 8 of the evidence on constructed inputs whose answer is known.

The four verdicts, the detectable effect, the p-value, Holm's step-down and the
claim's verdict; the final value, tuning by the claim's statistic, the grid's
extension at an edge, the powered main row and seeds run in worker processes.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks.evidence import (
    CLAIMS_FILE,
    MAX_GRID_EXTENSIONS,
    POWER_STANDARD_ERRORS,
    POWER_TARGET,
    RESAMPLES,
    ClaimRow,
    Comparison,
    Direction,
    Overrides,
    PaperComparison,
    RatioInterval,
    SeedRun,
    TargetRule,
    bootstrap_p_value,
    claim_verdict,
    decisive_seeds,
    detectable_effect,
    final_value,
    holm_survivors,
    paired_ratio_interval,
    read_claims,
    run_comparisons,
    tune_learning_rate,
    verdict,
    write_claims,
)

SMALLEST_P = 2 / (RESAMPLES + 1)


# -- the four verdicts -------------------------------------------------------------
@pytest.mark.parametrize(
    ("low", "high", "direction", "expected"),
    [
        (0.5, 0.9, "below", "as the paper"),
        (0.5, 0.9, "above", "unlike the paper"),
        (1.2, 1.5, "above", "as the paper"),
        (1.2, 1.5, "below", "unlike the paper"),
        # Meets 1: a bound on the effect, the larger distance of an end.
        (0.95, 1.08, "below", "no effect larger than 8%"),
        (0.8, 1.2, "below", "no effect larger than 20%"),
        (0.85, 1.2, "above", "no effect larger than 20%"),
        (0.9, 1.0, "below", "no effect larger than 10%"),
        (1.0, 1.0, "above", "no effect larger than 0%"),
        # Just beyond 20%: no bound worth the name.
        (0.799, 1.1, "below", "inconclusive"),
        (0.9, 1.201, "below", "inconclusive"),
        (0.3, 2.5, "above", "inconclusive"),
        # Clear of 1 but inside the 1% band: no effect, as small as measured.
        (1.001, 1.004, "below", "no effect larger than 1%"),
        (0.995, 1.3, "below", "inconclusive"),
        (math.nan, math.nan, "below", "inconclusive"),
        (0.0, math.inf, "below", "inconclusive"),
    ],
)
def test_the_four_verdicts(
    low: float, high: float, direction: Direction, expected: str
) -> None:
    assert verdict(low, high, direction) == expected


# -- the detectable effect ---------------------------------------------------------
def test_the_detectable_effect_is_2_8_standard_errors_of_the_log_ratio() -> None:
    log_ratios = np.array([-0.1, 0.1] * 50)
    spread = float(np.std(log_ratios, ddof=1))
    assert detectable_effect(np.exp(log_ratios)) == pytest.approx(
        math.expm1(POWER_STANDARD_ERRORS * spread)
    )
    assert detectable_effect([1.0, 0.0, 1.0]) == math.inf


def test_pairing_removes_the_spread_the_seeds_share() -> None:
    # Seeds differ 100-fold, but the method is 0.8x the baseline on each.
    baseline = np.geomspace(1, 100, 8)
    paired = paired_ratio_interval(0.8 * baseline, baseline)
    assert paired.detectable_effect == pytest.approx(0.0, abs=1e-9)
    # Every resample is below 1; 8 seeds floor the p-value at 2^-7.
    assert paired.p_value == pytest.approx(2.0**-7)
    # The same per-seed noise of +-10% in the log ratio: the detectable effect
    # is about 2.8 bootstrap SEs of the median log ratio, and 4x the seeds
    # halve it (SE ~ 1 / sqrt(n)).
    rng = np.random.default_rng(3)
    noise = rng.normal(0.0, 0.1, size=40)
    ten = paired_ratio_interval(np.exp(noise[:10]), np.ones(10))
    forty = paired_ratio_interval(np.exp(noise), np.ones(40))
    assert ten.detectable_effect is not None and forty.detectable_effect is not None
    assert 0.1 < ten.detectable_effect < 0.6
    assert 0.3 < forty.detectable_effect / ten.detectable_effect < 0.75


# -- the p-value -------------------------------------------------------------------
def test_the_p_value_counts_the_resamples_on_the_far_side_of_1() -> None:
    below = np.full(999, 0.8)
    assert bootstrap_p_value(below, below) == pytest.approx(2 / 1000)
    # 24 of 999 resamples at or above 1 on the high end: p = 2 (24 + 1) / 1000.
    high = np.concatenate([np.full(975, 0.8), np.full(24, 1.2)])
    assert bootstrap_p_value(below, high) == pytest.approx(0.05)
    mixed = np.linspace(0.5, 1.5, 999)
    assert bootstrap_p_value(mixed, mixed) == 1.0


def test_few_seeds_floor_the_p_value_at_the_sign_flip_minimum() -> None:
    # 5 seeds all at 0.8x: no resample reaches 1, yet 5 signs cannot say more
    # than 2 / 2^5.
    five = paired_ratio_interval([8, 16, 24, 32, 40], [10, 20, 30, 40, 50])
    assert five.high < 1 and five.p_value == 2 / 2**5
    twenty = paired_ratio_interval(0.8 * np.arange(1, 21), np.arange(1, 21))
    assert twenty.p_value == pytest.approx(SMALLEST_P)
    # So a claim of 5-seed rows cannot pass Holm's step, however clear.
    assert claim_verdict([row(0.8, 0.8, 0.8, five.p_value)]) != "as the paper"


def test_a_p_value_below_5_percent_means_the_interval_excludes_1() -> None:
    rng = np.random.default_rng(11)
    for _ in range(40):
        effect = rng.uniform(-0.3, 0.3)
        baseline = rng.uniform(10, 20, size=6)
        method = baseline * np.exp(effect + rng.normal(0, 0.2, size=6))
        interval = paired_ratio_interval(method, baseline, seed=int(rng.integers(99)))
        assert interval.p_value is not None
        if interval.p_value < 0.05:
            assert interval.high < 1 or interval.low > 1


# -- Holm's step-down and the claim's verdict --------------------------------------
def test_holm_steps_down_from_the_smallest_p_value() -> None:
    # 0.03 survives alone (0.03 <= 0.05), not as the second smallest of three
    # (0.03 > 0.05 / 2); 0.012 passes 0.05 / 3 ... and then 0.02 passes 0.05 / 2.
    assert holm_survivors([0.5, 0.03, 0.01]) == [False, False, True]
    assert holm_survivors([0.03]) == [True]
    assert holm_survivors([0.012, 0.02, 0.6]) == [True, True, False]
    # A step that fails stops the steps: 0.02 would pass 0.05 / 1 on its own.
    assert holm_survivors([0.02, 0.02, 0.02]) == [False, False, False]
    assert holm_survivors([]) == []


def row(
    ratio: float,
    low: float,
    high: float,
    p_value: float | None,
    direction: Direction = "below",
) -> ClaimRow:
    """A claim row with the given interval and p-value."""
    return ClaimRow(
        paper="Someone et al. 2020",
        claim="fast needs fewer rounds than slow",
        comparison=f"setting {ratio}",
        method="fast",
        baseline="slow",
        statistic="rounds to target",
        direction=direction,
        interval=RatioInterval(ratio, low, high, p_value=p_value),
        data="made up",
    )


def test_a_row_that_survives_only_without_correction_decides_nothing() -> None:
    alone = row(0.7, 0.5, 0.95, 0.03)
    assert alone.verdict == "as the paper"
    assert claim_verdict([alone]) == "as the paper"
    others = [row(1.02, 0.6, 1.6, 0.7), row(0.9, 0.5, 1.5, 0.6)]
    assert claim_verdict([alone, *others]) == "inconclusive"


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([row(0.6, 0.5, 0.7, 0.001), row(0.9, 0.5, 1.5, 0.6)], "as the paper"),
        ([row(1.4, 1.2, 1.6, 0.001), row(0.9, 0.5, 1.5, 0.6)], "unlike the paper"),
        ([row(0.6, 0.5, 0.7, 0.001), row(1.4, 1.2, 1.6, 0.002)], "mixed"),
        (
            [
                row(1.0, 0.9, 1.15, 0.8),
                row(1.0, 0.95, 1.04, 0.9),
                row(1.0, 0.5, 1.5, 0.9),
            ],
            "no effect larger than 5%",
        ),
        ([row(1.0, 0.5, 1.5, 0.9), row(0.8, 0.6, 1.3, 0.2)], "inconclusive"),
        # Without a p-value no row survives, whatever its interval.
        ([row(0.6, 0.5, 0.7, None)], "inconclusive"),
        ([], "inconclusive"),
    ],
)
def test_the_claims_verdict(rows: list[ClaimRow], expected: str) -> None:
    assert claim_verdict(rows) == expected


def test_the_paper_direction_decides_which_side_agrees() -> None:
    higher = row(1.4, 1.2, 1.6, 0.001, direction="above")
    assert claim_verdict([higher]) == "as the paper"
    assert claim_verdict([dataclasses.replace(higher, direction="below")]) == (
        "unlike the paper"
    )


# -- the final value ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rounds", "averaged"), [(2, 2), (3, 3), (10, 3), (30, 3), (40, 4), (100, 10)]
)
def test_final_is_the_mean_of_the_last_tenth_of_rounds_at_least_3(
    rounds: int, averaged: int
) -> None:
    # Round r holds r: the mean of the last k of 1..T is T - (k - 1) / 2.
    curve = [float(value) for value in range(rounds + 1)]
    assert final_value(curve) == pytest.approx(rounds - (averaged - 1) / 2)


def test_a_final_value_of_a_diverged_run_is_not_a_number() -> None:
    assert math.isnan(final_value([1.0, 0.5, math.nan, 0.4]))
    assert math.isnan(final_value([1.0]))


# -- tuning by the claim's statistic and the grid's extension ------------------------
def test_the_grid_extends_past_an_edge_until_the_best_is_interior() -> None:
    asked: list[float] = []

    def peak_at(best: float) -> object:
        def scores(rate: float) -> list[float]:
            asked.append(rate)
            return [-abs(math.log(rate / best))]

        return scores

    rate, scores = tune_learning_rate(
        peak_at(0.01), [0.1, 0.3, 1.0], higher_is_better=True
    )
    # Downwards by the bottom step (0.1 / 0.3): 0.0333, then 0.0111, then 0.0037.
    assert rate == pytest.approx(0.1 / 9)
    assert list(scores) == sorted(scores) and len(scores) == 6
    assert asked[3:] == pytest.approx([0.1 / 3, 0.1 / 9, 0.1 / 27])
    # No further than the limit: the best stays at the edge and is reported.
    asked.clear()
    rate, scores = tune_learning_rate(peak_at(1e6), [0.1, 1.0], higher_is_better=True)
    assert len(scores) == 2 + MAX_GRID_EXTENSIONS
    assert rate == max(scores) == pytest.approx(10.0**MAX_GRID_EXTENSIONS)
    # An interior best asks nothing more.
    asked.clear()
    tune_learning_rate(peak_at(0.3), [0.1, 0.3, 1.0], higher_is_better=True)
    assert asked == [0.1, 0.3, 1.0]


def test_a_diverging_extension_ends_the_extension() -> None:
    def scores(rate: float) -> list[float]:
        return [math.nan] if rate > 1 else [rate]

    rate, tried = tune_learning_rate(scores, [0.1, 0.3, 1.0], higher_is_better=True)
    assert rate == 1.0 and max(tried) == pytest.approx(10 / 3)


TUNING_SEEDS, REPORTED_SEEDS = (100, 101), (0, 1, 2, 3, 4)


def tradeoff_run(overrides: Overrides, seed: int) -> SeedRun:
    """Loss curves: a larger rate falls faster but to a higher floor.

    ``loss_t = rate / 10 + exp(-rate t)`` over 40 rounds: rate 0.3 ends lowest
    (0.03; 0.1 is still falling), rate 1 reaches 0.15 first (round 3, against
    round 8 at 0.3; rate 3 never does). Seeds scale a curve by under 1%.
    """
    rate = float(overrides["local-lr"]) * float(overrides["speed"])
    rounds = np.arange(41)
    curve = (rate / 10 + np.exp(-rate * rounds)) * (1 + 0.001 * (seed % 7))
    return SeedRun(curve=curve.tolist())


def tradeoff_description(statistic: str) -> PaperComparison:
    """A tuned comparison of two methods on :func:`tradeoff_run`."""
    return PaperComparison(
        title="Trade-off",
        paper="Someone et al. 2020",
        claim="b beats a",
        direction="below",
        metric="loss",
        higher_is_better=False,
        target=TargetRule(fraction=0.2),
        tuning_seeds=TUNING_SEEDS,
        reported_seeds=REPORTED_SEEDS,
        learning_rates=(0.3, 1.0, 3.0),
        statistic=statistic,  # type: ignore[arg-type]
        data="made up",
        comparisons=(
            Comparison(
                name="tuned",
                methods={"a": {"speed": 1.0}, "b": {"speed": 1.0}},
                baseline="a",
                claimed=("b",),
                tuned=True,
            ),
        ),
    )


def test_tuning_picks_the_rate_by_the_claims_own_statistic() -> None:
    final = run_comparisons(tradeoff_description("final"), tradeoff_run, full=False)
    tuned = final.outcomes[0].methods["a"]
    # The lowest final loss is at the grid's bottom, 0.3: the grid extends
    # down a bottom step (0.3 / (1 / 0.3) = 0.09), which ends higher, so 0.3
    # is interior and chosen.
    assert tuned.learning_rate == 0.3
    assert sorted(tuned.tuning_scores) == pytest.approx([0.09, 0.3, 1.0, 3.0])
    rounds = run_comparisons(
        tradeoff_description("rounds to target"), tradeoff_run, full=False
    )
    outcome = rounds.outcomes[0]
    # The target is fixed first from the baseline's best final level (at 0.3)
    # on the tuning seeds; then rate 1 reaches it first.
    best_finals = [
        final_value(tradeoff_run({"speed": 1.0, "local-lr": 0.3}, seed).curve)
        for seed in TUNING_SEEDS
    ]
    assert outcome.target == pytest.approx(float(np.median(best_finals)) / 0.2)
    assert outcome.methods["a"].learning_rate == 1.0
    assert outcome.methods["a"].tuning_scores[1.0] == 3.0
    assert "by its median rounds to the target" in rounds.markdown()


# -- power: the main row's seeds ------------------------------------------------------
def noisy_run(overrides: Overrides, seed: int) -> SeedRun:
    """Accuracy curves whose speed varies by seed, ``noise`` wide."""
    rng = np.random.default_rng([seed, int(1000 * float(overrides["speed"]))])
    speed = float(overrides["speed"]) * np.exp(rng.normal(0, float(overrides["noise"])))
    rounds = np.arange(31)
    return SeedRun(curve=(0.9 * (1 - np.exp(-speed * rounds))).tolist())


def power_description(
    *, powered_seeds: int, main_row: tuple[str, str] | None
) -> PaperComparison:
    """Two comparisons of a noisy method against a steady baseline."""
    methods = {
        "base": {"speed": 0.2, "noise": 0.0},
        "quiet": {"speed": 0.3, "noise": 0.05},
        "loud": {"speed": 0.3, "noise": 0.6},
    }
    return PaperComparison(
        title="Power",
        paper="Someone et al. 2020",
        claim="quiet and loud need fewer rounds than base",
        direction="below",
        metric="accuracy",
        higher_is_better=True,
        target=TargetRule(fraction=0.9),
        tuning_seeds=TUNING_SEEDS,
        reported_seeds=REPORTED_SEEDS,
        data="made up",
        comparisons=(
            Comparison(
                name="first",
                methods=methods,
                baseline="base",
                claimed=("quiet", "loud"),
                shared={"local-lr": 1.0},
            ),
            Comparison(
                name="second",
                methods={"base": methods["base"], "loud": methods["loud"]},
                baseline="base",
                claimed=("loud",),
                shared={"local-lr": 1.0, "extra": 1},
            ),
        ),
        main_row=main_row,
        powered_seeds=powered_seeds,
    )


def test_quick_mode_powers_the_main_row_only_and_says_so() -> None:
    description = power_description(powered_seeds=11, main_row=("first", "loud"))
    evaluation = run_comparisons(description, noisy_run, full=False)
    first, second = evaluation.outcomes
    loud = first.methods["loud"]
    # The loud row needs more than 5 seeds for a 20% effect; it gets the cap,
    # added two at a time (then one), past the tuning seeds.
    assert loud.seeds == (*REPORTED_SEEDS, 5, 6, 7, 8, 9, 10)
    assert loud.rounds_ratio.detectable_effect is not None
    assert first.methods["base"].seeds == loud.seeds
    assert first.methods["quiet"].seeds == REPORTED_SEEDS
    assert second.methods["loud"].seeds == REPORTED_SEEDS
    rows = evaluation.claim_rows()
    assert [(item.comparison, item.method, item.main, item.seeds) for item in rows] == [
        ("first", "quiet", False, 5),
        ("first", "loud", True, 11),
        ("second", "loud", False, 5),
    ]
    text = evaluation.markdown()
    assert "The main row (loud / base, *first*) is powered" in text
    assert "`--full` powers them too" in text
    assert "It stopped at 11 seeds with a detectable effect of" in text
    assert "20% would take about" in text
    assert "| seeds |" in text and "detectable effect" in text


def test_a_row_stops_adding_seeds_once_it_detects_20_percent() -> None:
    description = power_description(powered_seeds=30, main_row=("first", "quiet"))
    quiet = run_comparisons(description, noisy_run, full=False).outcomes[0]
    outcome = quiet.methods["quiet"]
    # The quiet row detects 20% with the reported seeds, but 5 seeds floor its
    # p-value at 2^-4, above Holm's 0.05 / 3: it stops at 7 seeds.
    assert outcome.rounds_ratio.detectable_effect is not None
    assert outcome.rounds_ratio.detectable_effect <= POWER_TARGET
    assert decisive_seeds(3) == 7
    assert outcome.seeds == (*REPORTED_SEEDS, 5, 6)


def test_full_mode_powers_every_row() -> None:
    description = dataclasses.replace(
        power_description(powered_seeds=14, main_row=None),
        reported_seeds=tuple(range(10)),
    )
    evaluation = run_comparisons(description, noisy_run, full=True)
    assert [row.seeds for row in evaluation.claim_rows()] == [10, 14, 14]
    assert evaluation.claim_rows()[0].main  # the default main row: the first
    assert "Every row is powered" in evaluation.markdown()


def test_seeds_run_in_worker_processes_give_the_same_numbers() -> None:
    description = power_description(powered_seeds=7, main_row=("first", "loud"))
    alone = run_comparisons(description, noisy_run, full=False)
    side_by_side = run_comparisons(description, noisy_run, full=False, workers=2)
    assert side_by_side.to_json() == alone.to_json()
    with pytest.raises(ValueError, match="workers"):
        run_comparisons(description, noisy_run, full=False, workers=3)


# -- claims.json --------------------------------------------------------------------
def test_claim_rows_keep_their_new_fields_through_claims_json(tmp_path: Path) -> None:
    powered = dataclasses.replace(row(0.7, 0.5, 0.95, 0.004), main=True, seeds=14)
    powered = dataclasses.replace(
        powered,
        interval=dataclasses.replace(powered.interval, detectable_effect=0.18),
    )
    path = tmp_path / CLAIMS_FILE
    write_claims(path, [powered, row(1.0, 0.9, 1.1, None)])
    assert read_claims(path) == [powered, row(1.0, 0.9, 1.1, None)]
    # A file written before these fields existed still reads, with defaults.
    old = {
        key: value
        for key, value in powered.to_json().items()
        if key not in {"p_value", "detectable_effect", "main", "seeds"}
    }
    path.write_text(json.dumps([old]))
    (read,) = read_claims(path)
    assert (read.p_value, read.detectable_effect, read.main, read.seeds) == (
        None,
        None,
        False,
        None,
    )
    assert read.verdict == "as the paper"
