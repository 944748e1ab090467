"""The benchmarks' shared helpers and the evidence rules of every comparison."""

from __future__ import annotations

import dataclasses
import doctest
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import evidence
from benchmarks.evidence import (
    CLAIMS_FILE,
    LEVEL,
    NO_EFFECT_LIMIT,
    NO_EFFECT_MARGIN,
    ClaimRow,
    Comparison,
    Direction,
    Overrides,
    PaperComparison,
    RatioInterval,
    SeedRounds,
    SeedRun,
    TargetRule,
    choose_learning_rate,
    final_value,
    paired_ratio_interval,
    read_claims,
    run_comparisons,
    seed_rounds,
    verdict,
    write_claims,
)
from benchmarks.harness import (
    finite_mean,
    format_ratio,
    markdown_table,
    mean_ratio,
    mean_std,
    rounds_to_target,
    save_figure,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_markdown_table_writes_header_separator_and_rows() -> None:
    table = markdown_table(["method", "accuracy"], [["fedavg", 0.5], ["md", "0.25"]])

    assert table == (
        "| method | accuracy |\n|---|---|\n| fedavg | 0.5 |\n| md | 0.25 |"
    )


def test_markdown_table_keeps_empty_cells() -> None:
    assert markdown_table(["a", "b"], [["", "x"]]).splitlines()[-1] == "|  | x |"


def test_markdown_table_rejects_a_row_of_the_wrong_length() -> None:
    with pytest.raises(ValueError, match="row 2 has 3 cells for 2 columns"):
        markdown_table(["a", "b"], [[1, 2], [1, 2, 3]])


def test_save_figure_writes_a_png_and_closes_the_figure(tmp_path: Path) -> None:
    figure, axes = plt.subplots()
    axes.plot([0, 1], [1, 0])
    path = tmp_path / "figure.png"

    save_figure(figure, path, dpi=50)

    assert path.read_bytes().startswith(PNG_SIGNATURE)
    assert figure.number not in plt.get_fignums()


def test_rounds_to_target_is_the_first_round_reaching_it() -> None:
    accuracy = [0.1, 0.5, 0.8, 0.7, 0.9]
    assert rounds_to_target(accuracy, 0.8) == 2.0
    assert rounds_to_target(accuracy, 0.1) == 0.0
    assert math.isnan(rounds_to_target(accuracy, 0.95))
    msd = [1.0, 0.2, 0.05, 0.01]
    assert rounds_to_target(msd, 0.05, lower_is_better=True) == 2.0
    assert math.isnan(rounds_to_target(msd, 0.001, lower_is_better=True))


def test_mean_std_counts_the_seeds_that_missed() -> None:
    assert mean_std([1.0, 3.0]) == "2.000 ± 1.000"
    assert mean_std([1.0, 3.0, math.nan], digits=1) == "2.0 ± 1.0 (1 of 3 not reached)"
    assert mean_std([math.nan, math.nan], missing="never") == "never"


def test_mean_ratio_divides_the_means_of_the_seeds_that_reached() -> None:
    assert mean_ratio([3.0, math.nan, 5.0], [2.0, 2.0]) == 2.0
    assert math.isnan(mean_ratio([3.0], [0.0]))
    assert math.isnan(mean_ratio([math.nan], [2.0]))
    assert math.isnan(mean_ratio([3.0], [math.nan, math.nan]))


def test_finite_mean_skips_the_seeds_that_missed() -> None:
    assert finite_mean([2.0, math.nan, 4.0]) == 3.0
    assert math.isnan(finite_mean([math.nan]))


def test_format_ratio_writes_nan_as_not_available() -> None:
    assert format_ratio(0.754) == "0.75"
    assert format_ratio(1.5, prefix="x") == "x1.50"
    assert format_ratio(math.nan, prefix="x") == "n/a"


# -- evidence: the statistics and the comparison runner --------------------------
def test_the_evidence_docstring_examples_hold() -> None:
    failures, tried = doctest.testmod(evidence)
    assert tried > 0 and failures == 0


def test_a_seed_that_misses_counts_as_one_round_past_the_horizon() -> None:
    curves = [[0.0, 0.5, 0.9, 0.9], [0.0, 0.2, 0.3, 0.4], [0.0, 0.9, 0.9, 0.9]]
    rounds = seed_rounds(curves, 0.8, higher_is_better=True)
    assert rounds.rounds == (2.0, 4.0, 1.0)
    assert rounds.reached == (True, False, True)
    assert rounds.horizon == 3
    assert rounds.median_text() == "2"
    assert rounds.reached_text() == "2/3"
    with pytest.raises(ValueError, match="one length"):
        seed_rounds([[0.0, 1.0], [0.0]], 0.5, higher_is_better=True)


def test_misses_stay_in_the_ratio_and_make_it_a_bound() -> None:
    # The baseline misses 3 of 5 seeds (T = 30): counted as 31, never dropped
    # (dropping them would give 5 / 10 = 0.5 from its two lucky seeds).
    method_rounds = [5.0, 5.0, 5.0, 5.0, 5.0]
    baseline = SeedRounds(
        (10.0, 10.0, 31.0, 31.0, 31.0), (True, True, False, False, False), 30
    )
    interval = paired_ratio_interval(
        method_rounds,
        baseline.rounds,
        baseline_reached=baseline.reached,
    )
    assert interval.ratio == pytest.approx(5 / 31)
    assert interval.bound == "upper bound"
    assert interval.low == 0.0
    assert interval.high < 1
    assert baseline.median_text() == "> 30"
    # The method missing instead: at least that ratio, and no upper end.
    flipped = paired_ratio_interval(
        baseline.rounds, method_rounds, method_reached=baseline.reached
    )
    assert flipped.bound == "lower bound"
    assert flipped.ratio == pytest.approx(31 / 5)
    assert flipped.high == math.inf
    assert flipped.text().startswith("≥ 6.20 [")


def test_the_bootstrap_resamples_the_same_seeds_for_both_methods() -> None:
    # Per seed the method takes 0.7x the baseline's rounds, whose spread over
    # the seeds is wide: resampled together, every resample's ratio is 0.7;
    # resampled apart, the seeds' spread would leak into the interval.
    baseline = [10.0, 40.0, 20.0, 80.0, 15.0, 60.0]
    method = [0.7 * value for value in baseline]
    interval = paired_ratio_interval(method, baseline, resamples=500, seed=3)
    assert interval.low == pytest.approx(0.7)
    assert interval.high == pytest.approx(0.7)


def test_the_bootstrap_is_reproducible_and_rejects_unpaired_input() -> None:
    method, baseline = [3.0, 5.0, 4.0, 6.0, 2.0], [4.0, 5.0, 6.0, 5.0, 4.0]
    first = paired_ratio_interval(method, baseline, seed=7)
    assert paired_ratio_interval(method, baseline, seed=7) == first
    assert first.low <= first.ratio <= first.high
    with pytest.raises(ValueError, match="one value per seed"):
        paired_ratio_interval([1.0, 2.0], [1.0])


def test_the_paired_bootstrap_interval_covers_the_true_ratio_at_the_nominal_rate() -> (
    None
):
    # Log-normal rounds, correlated across the two methods as runs sharing a
    # seed are: the true ratio of medians is exp(0.2).
    rng = np.random.default_rng(2024)
    seeds, replications, correlation = 10, 1000, 0.9
    true_ratio = math.exp(0.2)
    covered = 0
    for replication in range(replications):
        shared, own = rng.standard_normal((2, seeds))
        method = np.exp(0.3 * shared)
        baseline = np.exp(
            -0.2 + 0.3 * (correlation * shared + math.sqrt(1 - correlation**2) * own)
        )
        interval = paired_ratio_interval(
            method, baseline, resamples=1000, seed=replication
        )
        covered += interval.low <= true_ratio <= interval.high
    # Three Monte Carlo standard errors, plus 0.02 for the percentile
    # interval's own small-sample error on a median of 10 seeds (slightly
    # conservative: the resampled medians take few values). An unpaired
    # bootstrap covers ~0.999 here and fails.
    standard_error = math.sqrt(LEVEL * (1 - LEVEL) / replications)
    assert abs(covered / replications - LEVEL) <= 3 * standard_error + 0.02


@given(
    ends=st.lists(
        st.floats(min_value=0, max_value=math.inf, allow_nan=False),
        min_size=2,
        max_size=2,
    ),
    direction=st.sampled_from(["below", "above"]),
)
def test_an_interval_holding_1_is_never_read_as_the_paper(
    ends: list[float], direction: Direction
) -> None:
    low, high = sorted(ends)
    result = verdict(low, high, direction)
    if result == "as the paper":
        assert high < 1 if direction == "below" else low > 1
    if result == "unlike the paper":
        assert low > 1 if direction == "below" else high < 1
    if low <= 1 + NO_EFFECT_MARGIN and high >= 1 - NO_EFFECT_MARGIN:
        # Touching the no-effect band around 1 is no finding either way: at
        # most a bound on the effect, and only a bound the interval measured.
        reach = max(1 - low, high - 1)
        if reach <= NO_EFFECT_LIMIT + 1e-12:
            assert (
                result == f"no effect larger than {math.ceil(round(100 * reach, 6))}%"
            )
        else:
            assert result == "inconclusive"


def test_a_verdict_needs_an_interval() -> None:
    assert verdict(math.nan, math.nan, "below") == "inconclusive"
    assert verdict(0.2, math.nan, "below") == "inconclusive"
    with pytest.raises(ValueError, match="low end above"):
        verdict(2.0, 1.0, "below")
    with pytest.raises(ValueError, match="direction"):
        verdict(0.5, 0.6, "faster")  # type: ignore[arg-type]


def test_the_target_mirrors_for_lower_is_better_metrics() -> None:
    rule = TargetRule(fraction=0.8)
    assert rule.target([0.5, 0.9, 0.7], higher_is_better=True) == pytest.approx(0.56)
    assert rule.target([0.1, 0.3], higher_is_better=False) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="fraction"):
        TargetRule(fraction=1.5)


def test_the_learning_rate_is_the_best_median_score_and_divergence_loses() -> None:
    scores = {0.01: [1.0, 0.9], 0.1: [0.3, 0.5], 1.0: [math.nan, 0.01]}
    assert choose_learning_rate(scores, higher_is_better=False) == 0.1
    assert choose_learning_rate(scores, higher_is_better=True) == 0.01
    assert choose_learning_rate({0.5: [1.0], 0.2: [1.0]}, higher_is_better=True) == 0.5


TUNING_SEEDS, REPORTED_SEEDS = (100, 101), (0, 1, 2, 3, 4)


class FakeRuns:
    """Accuracy curves ``level (1 - exp(-speed lr t))``, counting the runs.

    Tuning seeds level off at 0.8, reported ones at 0.75, so a target taken
    from the wrong seeds is another number; a learning rate above 1 diverges.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[tuple[str, object], ...], int]] = []

    def __call__(self, overrides: Overrides, seed: int) -> SeedRun:
        self.calls.append((tuple(sorted(overrides.items())), seed))
        rate = float(overrides["local-lr"]) * float(overrides["speed"])
        level = 0.8 if seed in TUNING_SEEDS else 0.75
        rounds = np.arange(21)
        curve = level * (1 - np.exp(-rate * (1 + 0.01 * seed) * rounds))
        if float(overrides["local-lr"]) > 1:
            curve[5:] = math.nan
        return SeedRun(
            curve=curve.tolist(), extras={"speed": float(overrides["speed"])}
        )


def fake_description(*comparisons: Comparison) -> PaperComparison:
    """A claim that ``fast`` needs fewer rounds than ``slow``."""
    return PaperComparison(
        title="Fake",
        paper="Someone et al. 2020",
        claim="fast needs fewer rounds than slow",
        direction="below",
        metric="accuracy",
        higher_is_better=True,
        target=TargetRule(fraction=0.9),
        tuning_seeds=TUNING_SEEDS,
        reported_seeds=REPORTED_SEEDS,
        learning_rates=(0.03, 0.3, 3.0),
        data="curves made up for the test",
        comparisons=comparisons,
    )


METHODS = {"slow": {"speed": 0.5}, "fast": {"speed": 2.0}}


def test_steps_and_target_come_from_tuning_seeds_numbers_from_reported_ones() -> None:
    matched = Comparison(
        name="matched",
        methods=METHODS,
        baseline="slow",
        claimed=("fast",),
        shared={"local-lr": 0.3},
    )
    tuned = Comparison(
        name="tuned", methods=METHODS, baseline="slow", claimed=("fast",), tuned=True
    )
    runs = FakeRuns()
    evaluation = run_comparisons(fake_description(matched, tuned), runs, full=False)
    matched_outcome, tuned_outcome = evaluation.outcomes

    # Target: 90% of the baseline's final median on the tuning seeds.
    def baseline_finals(seeds: tuple[int, ...]) -> float:
        finals = [
            final_value(FakeRuns()({**METHODS["slow"], "local-lr": 0.3}, seed).curve)
            for seed in seeds
        ]
        return 0.9 * float(np.median(finals))

    assert matched_outcome.target == baseline_finals(TUNING_SEEDS)
    assert matched_outcome.target != baseline_finals(REPORTED_SEEDS)
    # Tuned: the largest rate that does not diverge, for both methods.
    assert tuned_outcome.methods["slow"].learning_rate == 0.3
    assert tuned_outcome.methods["fast"].learning_rate == 0.3
    assert math.isnan(tuned_outcome.methods["fast"].tuning_scores[3.0])
    # Reported on the reported seeds only; every distinct run once (the tuned
    # comparison's runs at 0.3 are the matched one's).
    reported = [run for run in matched_outcome.methods["fast"].runs]
    assert len(reported) == len(REPORTED_SEEDS)
    assert len(runs.calls) == len(set(runs.calls))
    assert {seed for _, seed in runs.calls} == {*TUNING_SEEDS, *REPORTED_SEEDS}
    assert len(runs.calls) == 2 * (3 * len(TUNING_SEEDS) + len(REPORTED_SEEDS))

    rows = evaluation.claim_rows()
    assert [(row.comparison, row.method, row.baseline) for row in rows] == [
        ("matched", "fast", "slow"),
        ("tuned", "fast", "slow"),
    ]
    assert all(row.verdict == "as the paper" for row in rows)
    assert all(row.interval.high < 1 for row in rows)
    text = evaluation.markdown(level=3)
    assert text.startswith("### Fake\n")
    assert "#### tuned" in text and "| learning rate |" in text
    assert "rounds / slow [95% CI]" in text and "| speed |" in text
    assert "5/5" in text


def test_run_comparisons_counts_the_reported_seeds_that_miss_a_tuning_target() -> None:
    # The baseline at a tiny step gets nowhere near the tuning seeds' level
    # on the reported seeds: its misses are in the ratio, as a bound.
    slow_start = Comparison(
        name="paper's setting",
        methods={"slow": {"speed": 0.05}, "fast": {"speed": 2.0}},
        baseline="slow",
        claimed=("fast",),
        shared={"local-lr": 0.3},
    )
    outcome = run_comparisons(fake_description(slow_start), FakeRuns(), full=False)
    slow = outcome.outcomes[0].methods["slow"]
    assert slow.rounds.reached_share == 0.0
    assert slow.rounds.rounds == (21.0,) * len(REPORTED_SEEDS)
    assert outcome.outcomes[0].methods["fast"].rounds_ratio.bound == "upper bound"


def test_descriptions_refuse_too_few_or_shared_seeds() -> None:
    comparison = Comparison(
        name="matched", methods=METHODS, baseline="slow", claimed=("fast",)
    )
    description = fake_description(comparison)
    with pytest.raises(ValueError, match="at least 5 reported seeds"):
        dataclasses.replace(description, reported_seeds=(0, 1, 2))
    with pytest.raises(ValueError, match="both tuning and reported"):
        dataclasses.replace(description, tuning_seeds=(0,))
    with pytest.raises(ValueError, match="--full needs at least 10"):
        run_comparisons(description, FakeRuns(), full=True)
    with pytest.raises(ValueError, match="claimed methods"):
        Comparison(name="x", methods=METHODS, baseline="slow", claimed=("slow",))
    with pytest.raises(ValueError, match="grid"):
        dataclasses.replace(
            description,
            learning_rates=(),
            comparisons=(dataclasses.replace(comparison, tuned=True),),
        )


def test_claim_rows_round_trip_through_claims_json(tmp_path: Path) -> None:
    row = ClaimRow(
        paper="Someone et al. 2020",
        claim="fast needs fewer rounds",
        comparison="tuned",
        method="fast",
        baseline="slow",
        statistic="rounds to target",
        direction="below",
        interval=RatioInterval(0.5, 0.0, math.inf, "censored"),
        data="made up",
    )
    path = tmp_path / CLAIMS_FILE
    write_claims(path, [row])
    assert read_claims(path) == [row]
    assert json.loads(path.read_text().replace("Infinity", "1e999"))[0]["verdict"] == (
        "inconclusive"
    )
    assert read_claims(tmp_path / "missing.json") == []
