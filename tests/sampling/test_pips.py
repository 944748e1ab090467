"""Pi-ps inclusion probabilities and the systematic, Poisson and MD samplers.

Statistical checks use fixed seeds and tolerances derived from the number of
draws: a frequency estimated from ``n`` draws is accepted within ``Z`` standard
errors of its target.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from numpy.typing import NDArray

from flwr_importance.sampling.pips import (
    capped_inclusion_probs,
    md_sample,
    poisson_sample,
    systematic_sample,
)

#: Standard errors allowed between an empirical frequency and its target.
Z = 5.0


def binomial_tolerance(target: NDArray[np.float64], draws: int) -> NDArray[np.float64]:
    """``Z`` standard errors of a frequency with success probability ``target``."""
    return Z * np.sqrt(target * (1 - target) / draws) + 1e-12


def iterative_capping(weights: NDArray[np.float64], m: int) -> NDArray[np.float64]:
    """Slow reference: cap shares above 1, redistribute the rest, repeat."""
    capped = np.zeros(weights.size, dtype=bool)
    while True:
        free = (weights > 0) & ~capped
        probs = capped.astype(np.float64)
        if free.any():
            probs[free] = (m - capped.sum()) * weights[free] / weights[free].sum()
        newly_capped = free & (probs >= 1.0)
        if not newly_capped.any():
            return probs
        capped |= newly_capped


def systematic_frequencies(
    inclusion_probs: NDArray[np.float64], draws: int, seed: int
) -> NDArray[np.float64]:
    """Empirical inclusion frequency of each unit over ``draws`` samples."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(inclusion_probs.size)
    for _ in range(draws):
        counts[systematic_sample(inclusion_probs, rng)] += 1
    return counts / draws


weight_vectors = arrays(
    np.float64,
    st.integers(1, 40),
    elements=st.one_of(
        st.just(0.0), st.floats(1e-6, 1e6, allow_nan=False, allow_infinity=False)
    ),
)


# --- capped_inclusion_probs ----------------------------------------------------


def test_capped_inclusion_probs_proportional_without_capping() -> None:
    np.testing.assert_allclose(
        capped_inclusion_probs([1.0, 2.0, 3.0, 4.0], 2), [0.2, 0.4, 0.6, 0.8]
    )


def test_capped_inclusion_probs_caps_in_several_rounds() -> None:
    # First pass: 3 * 100 / 154 > 1 caps unit 0; second: 2 * 50 / 54 > 1 caps
    # unit 1; the last unit of budget is shared by the four small ones.
    np.testing.assert_allclose(
        capped_inclusion_probs([100.0, 50.0, 1.0, 1.0, 1.0, 1.0], 3),
        [1.0, 1.0, 0.25, 0.25, 0.25, 0.25],
    )


def test_capped_inclusion_probs_boundaries() -> None:
    assert np.array_equal(capped_inclusion_probs([0.0, 3.0, 1.0], 0), np.zeros(3))
    assert np.array_equal(capped_inclusion_probs([5.0, 3.0, 1.0], 3), np.ones(3))
    assert np.array_equal(capped_inclusion_probs([0.0, 3.0, 1.0], 2), [0, 1, 1])
    huge = np.finfo(np.float64).max
    np.testing.assert_allclose(capped_inclusion_probs([huge, huge], 1), [0.5, 0.5])


def test_capped_inclusion_probs_saturates_exactly_when_m_is_every_unit() -> None:
    """m = number of positive weights: exactly 1 each (hypothesis found equal
    weights for which k w / (k w) rounded to 1 - 2.2e-16)."""
    weights = np.array([764.0625, *[361.61843003] * 18, 0.0])
    probs = capped_inclusion_probs(weights, 19)
    assert probs.tolist() == [1.0] * 19 + [0.0]


@settings(max_examples=200, deadline=None)
@given(weights=weight_vectors, data=st.data())
def test_capped_inclusion_probs_matches_iterative_capping(
    weights: NDArray[np.float64], data: st.DataObject
) -> None:
    positive = int(np.count_nonzero(weights))
    m = data.draw(st.integers(0, positive))
    probs = capped_inclusion_probs(weights, m)
    assert np.all((probs >= 0) & (probs <= 1))
    assert probs.sum() == pytest.approx(m, rel=1e-12, abs=1e-12)
    assert np.all(probs[weights == 0] == 0)
    if m > 0:
        np.testing.assert_allclose(
            probs, iterative_capping(weights, m), rtol=1e-9, atol=1e-12
        )


@pytest.mark.parametrize(
    ("weights", "m", "message"),
    [
        ([1.0, -1.0, 2.0], 1, "negative"),
        ([1.0, np.nan], 1, "NaN"),
        ([[1.0, 2.0]], 1, "1-D"),
        ([1.0, 2.0], 3, r"\[0, 2\]"),
        ([1.0, 2.0], -1, ">= 0"),
        ([1.0, 0.0, 0.0], 2, "positive"),
    ],
)
def test_capped_inclusion_probs_rejects(
    weights: object, m: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        capped_inclusion_probs(weights, m)  # type: ignore[arg-type]


# --- systematic_sample ---------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(weights=weight_vectors, data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_systematic_sample_returns_exactly_n_distinct(
    weights: NDArray[np.float64], data: st.DataObject, seed: int
) -> None:
    m = data.draw(st.integers(0, int(np.count_nonzero(weights))))
    probs = capped_inclusion_probs(weights, m)
    sample = systematic_sample(probs, np.random.default_rng(seed))
    assert sample.size == m
    assert np.array_equal(sample, np.unique(sample))
    assert np.all(probs[sample] > 0)
    assert set(np.flatnonzero(probs == 1.0)) <= set(sample.tolist())


@settings(max_examples=200, deadline=None)
@given(
    weights=weight_vectors,
    data=st.data(),
    drift=st.floats(-9e-7, 9e-7),
    seed=st.integers(0, 2**32 - 1),
)
def test_systematic_sample_exact_size_despite_tolerated_drift(
    weights: NDArray[np.float64], data: st.DataObject, drift: float, seed: int
) -> None:
    m = data.draw(st.integers(1, max(1, int(np.count_nonzero(weights)))))
    assume(np.count_nonzero(weights) >= m)
    probs = capped_inclusion_probs(weights, m)
    below_one = probs < 1.0
    assume(probs[below_one].sum() > 1e-3)
    probs[below_one] *= 1 + drift / probs[below_one].sum()
    assume(probs.max() <= 1.0)
    sample = systematic_sample(probs, np.random.default_rng(seed))
    assert sample.size == m
    assert np.unique(sample).size == m
    assert np.all(probs[sample] > 0)


def test_systematic_sample_inclusion_frequencies() -> None:
    probs = np.array([0.05, 0.1, 0.2, 0.3, 0.45, 0.5, 0.6, 0.8, 0.0, 0.0])
    draws = 20_000
    frequencies = systematic_frequencies(probs, draws, seed=1)
    assert np.all(np.abs(frequencies - probs) <= binomial_tolerance(probs, draws))


def test_systematic_sample_frequencies_with_capped_uneven_weights() -> None:
    weights = np.random.default_rng(2).lognormal(0.0, 2.5, size=30)
    probs = capped_inclusion_probs(weights, 8)
    assert np.count_nonzero(probs == 1.0) >= 2  # the case under test
    assert probs.min() < 0.01
    draws = 20_000
    frequencies = systematic_frequencies(probs, draws, seed=3)
    assert np.all(frequencies[probs == 1.0] == 1.0)
    assert np.all(np.abs(frequencies - probs) <= binomial_tolerance(probs, draws))


def test_systematic_sample_shuffles_the_order() -> None:
    # In a fixed order, d < 0.5 selects {0, 2} and d >= 0.5 selects {1, 3}:
    # neighbours would never be drawn together. Shuffled, every pair is
    # possible; with four units of 1/2 each pair has probability 1/6.
    rng = np.random.default_rng(4)
    draws = 6_000
    together = sum(
        np.array_equal(systematic_sample([0.5] * 4, rng), [0, 1]) for _ in range(draws)
    )
    target = np.array(1 / 6)
    assert abs(together / draws - target) <= binomial_tolerance(target, draws)


def test_systematic_sample_absorbs_tolerated_drift_near_one() -> None:
    # The total is 2 - 5.1e-7, within tolerance; rescaling it to 2 pushes the
    # first unit past 1. The grid caps it, hands the excess on, and still
    # returns exactly two distinct units, the first among them every time.
    probs = np.array([1 - 1e-8, 1 - 6e-7, 5e-8, 5e-8])
    assert 0 < 2 - probs.sum() < 1e-6
    assert probs[0] * 2 / probs.sum() > 1
    rng = np.random.default_rng(5)
    for _ in range(2_000):
        sample = systematic_sample(probs, rng)
        assert sample.size == 2
        assert sample[0] == 0
        assert sample[1] != 0


def test_systematic_sample_at_a_million_units() -> None:
    # Speed is measured in benchmarks/sampling_overhead.py; here only correctness.
    rng = np.random.default_rng(6)
    probs = capped_inclusion_probs(rng.lognormal(0.0, 2.0, size=1_000_000), 10_000)
    sample = systematic_sample(probs, rng)
    assert sample.size == 10_000
    assert np.unique(sample).size == 10_000
    assert np.all(np.isin(np.flatnonzero(probs == 1.0), sample))


@pytest.mark.parametrize(
    ("probs", "message"),
    [
        ([0.5, 0.7], "integer"),
        ([0.5, 1.5], r"\[0, 1\]"),
        ([-0.5, 1.5], r"\[0, 1\]"),
        ([np.nan, 1.0], "NaN"),
        ([[0.5, 0.5]], "1-D"),
    ],
)
def test_systematic_sample_rejects(probs: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        systematic_sample(probs, np.random.default_rng(0))  # type: ignore[arg-type]


# --- poisson_sample ------------------------------------------------------------


def test_poisson_sample_inclusion_frequencies() -> None:
    probs = np.array([0.0, 0.01, 0.2, 0.5, 0.73, 0.99, 1.0])
    draws = 50_000
    # One call on the probabilities repeated draws times is draws independent
    # rounds, since every unit is an independent Bernoulli.
    selected = poisson_sample(np.tile(probs, draws), np.random.default_rng(7))
    frequencies = np.bincount(selected % probs.size, minlength=probs.size) / draws
    assert np.all(np.abs(frequencies - probs) <= binomial_tolerance(probs, draws))


@pytest.mark.parametrize(
    ("probs", "message"),
    [([0.5, 1.2], r"\[0, 1\]"), ([np.nan], "NaN"), ([[0.5]], "1-D")],
)
def test_poisson_sample_rejects(probs: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        poisson_sample(probs, np.random.default_rng(0))  # type: ignore[arg-type]


# --- md_sample -----------------------------------------------------------------


def test_md_sample_mean_counts() -> None:
    p = np.array([0.0, 0.05, 0.15, 0.3, 0.5])
    m, rounds = 4, 50_000
    rng = np.random.default_rng(8)
    assert md_sample(p, m, rng).size == m
    assert md_sample(p, 12, rng).size == 12  # with replacement, m may exceed N
    # The m draws of a round are i.i.d., so rounds x m draws in one call give
    # the same per-round counts; a count has variance m p (1 - p).
    counts = np.bincount(md_sample(p, m * rounds, rng), minlength=p.size) / rounds
    tolerance = Z * np.sqrt(m * p * (1 - p) / rounds) + 1e-12
    assert np.all(np.abs(counts - m * p) <= tolerance)


@pytest.mark.parametrize(
    ("p", "m", "message"),
    [
        ([0.5, 0.6], 1, "sum to 1"),
        ([1.5, -0.5], 1, "negative"),
        ([0.5, np.nan], 1, "NaN"),
        ([0.5, 0.5], -1, ">= 0"),
    ],
)
def test_md_sample_rejects(p: object, m: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        md_sample(p, m, np.random.default_rng(0))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "call",
    [
        lambda: capped_inclusion_probs([1.0, 2.0], 1.5),  # type: ignore[arg-type]
        lambda: md_sample([0.5, 0.5], 1.5, np.random.default_rng(0)),  # type: ignore[arg-type]
    ],
)
def test_a_count_of_the_wrong_type_raises_type_error(
    call: Callable[[], object],
) -> None:
    with pytest.raises(TypeError, match="must be an int"):
        call()
