"""The pair ``make run`` shows: picked from the measured candidates by a rule."""

from __future__ import annotations

import doctest

from benchmarks import main_pair
from benchmarks.evidence import ClaimRow, RatioInterval


def row(comparison: str, low: float, high: float) -> ClaimRow:
    interval = RatioInterval(ratio=(low + high) / 2, low=low, high=high)
    return ClaimRow(
        paper="p",
        claim="c",
        comparison=comparison,
        method="clustered",
        baseline="md",
        statistic="rounds to target",
        direction="below",
        interval=interval,
        data="d",
    )


def test_the_rule_picks_the_interval_furthest_below_one() -> None:
    rows = [row("wide", 0.3, 0.95), row("tight", 0.6, 0.8), row("no", 0.5, 1.2)]
    picked = main_pair.recommended_pair(rows)
    assert picked is not None and picked.comparison == "tight"
    assert "*tight*" in main_pair.recommendation(rows)
    assert main_pair.RULE in main_pair.recommendation(rows)


def test_no_pair_is_recommended_without_an_as_the_paper_verdict() -> None:
    # Inside the 1% band around 1, or on the other side: neither qualifies.
    rows = [row("band", 0.9, 0.995), row("against", 1.1, 1.3)]
    assert main_pair.recommended_pair(rows) is None
    assert "not supported" in main_pair.recommendation(rows)


def test_the_module_examples_run() -> None:
    assert doctest.testmod(main_pair).failed == 0
