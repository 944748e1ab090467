"""Power-of-Choice's maths: the size-proportional candidate draw and the top-m rule."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from flwr_importance.sampling.power_of_choice import draw_candidates, select_highest

SIZES = np.array([40.0, 25.0, 15.0, 12.0, 8.0, 0.0])
DRAWS = 6_000
#: Standard errors a frequency may stray: with 6 frequencies a fixed seed, far
#: beyond any plausible fluctuation (two-sided 4.5 sigma: p ~ 7e-6 each).
SIGMAS = 4.5


def exact_inclusion(sizes: np.ndarray, d: int) -> np.ndarray:
    """P(k in A) for successive size-proportional draws without replacement.

    Enumerates every ordered sequence of ``d`` distinct positions: each draw
    picks among those left with probability proportional to size.
    """
    inclusion = np.zeros(len(sizes))
    for sequence in itertools.permutations(range(len(sizes)), d):
        probability, left = 1.0, sizes.sum()
        for position in sequence:
            probability *= sizes[position] / left
            left -= sizes[position]
        for position in sequence:
            inclusion[position] += probability
    return inclusion


def test_candidate_draw_matches_successive_sampling_probabilities() -> None:
    rng = np.random.default_rng(2022)
    d = 3
    included = np.zeros(len(SIZES))
    first = np.zeros(len(SIZES))
    for _ in range(DRAWS):
        drawn = draw_candidates(SIZES, d, rng)
        assert len(set(drawn.tolist())) == d  # without replacement
        included[drawn] += 1
        first[drawn[0]] += 1
    expected = exact_inclusion(SIZES, d)
    assert expected.sum() == pytest.approx(d)
    tolerance = SIGMAS * np.sqrt(expected * (1 - expected) / DRAWS)
    np.testing.assert_array_less(np.abs(included / DRAWS - expected), tolerance + 1e-12)
    # The first draw is the plain size share p_k = n_k / n.
    share = SIZES / SIZES.sum()
    first_tolerance = SIGMAS * np.sqrt(share * (1 - share) / DRAWS)
    np.testing.assert_array_less(np.abs(first / DRAWS - share), first_tolerance + 1e-12)
    assert included[-1] == 0  # a client without samples is never a candidate


def test_d_equal_to_m_with_a_plain_mean_is_not_the_papers_rand() -> None:
    """``d = m`` is not ``rand``: without repeats the plain mean is biased.

    The paper's ``rand`` (the authors' code) draws ``m`` clients with
    replacement by ``p_k`` and takes the plain mean, whose expected weight
    of client ``k`` is its share ``p_k`` (MD sampling). With ``d = m`` every candidate
    trains, so the weight is ``P(k in A) / m`` (the draw matches
    :func:`exact_inclusion`, tested above): the largest client gets 0.29
    against its share 0.40, the smaller ones more than theirs.
    """
    m = 3
    share = SIZES / SIZES.sum()
    weight = exact_inclusion(SIZES, m) / m
    assert weight[0] == pytest.approx(0.293, abs=5e-4)
    assert share[0] == pytest.approx(0.40)
    assert np.all(weight[1:5] > share[1:5])


def test_candidate_draw_is_reproducible_and_takes_every_positive_size() -> None:
    one = draw_candidates(SIZES, 4, np.random.default_rng(7))
    two = draw_candidates(SIZES, 4, np.random.default_rng(7))
    np.testing.assert_array_equal(one, two)
    everyone = draw_candidates(SIZES, 5, np.random.default_rng(0))
    assert sorted(everyone.tolist()) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("sizes", "d", "error", "match"),
    [
        (SIZES, 6, ValueError, "cannot draw 6 distinct candidates from 5"),
        (SIZES, 0, ValueError, "d must be >= 1"),
        (SIZES, 2.0, TypeError, "d must be an int"),
        ([1.0, -1.0, 3.0], 1, ValueError, "non-negative"),
        ([1.0, np.nan], 1, ValueError, "finite"),
        ([[1.0, 2.0]], 1, ValueError, "vector"),
    ],
)
def test_candidate_draw_rejects_bad_input(
    sizes: object, d: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        draw_candidates(sizes, d, np.random.default_rng(0))  # type: ignore[arg-type]


def test_select_highest_keeps_the_m_largest_highest_first() -> None:
    losses = [0.3, 2.0, 0.1, 1.5, 0.7]
    assert select_highest(losses, 3).tolist() == [1, 3, 4]
    assert select_highest(losses, 1).tolist() == [1]


def test_select_highest_breaks_ties_by_position_and_ranks_unknown_first() -> None:
    # Equal losses: the earlier position (the candidate drawn first) wins.
    assert select_highest([1.0, 2.0, 2.0, 2.0], 2).tolist() == [1, 2]
    inf = float("inf")
    assert select_highest([0.5, inf, 3.0, inf], 3).tolist() == [1, 3, 2]


def test_select_highest_with_fewer_losses_than_m_keeps_them_all() -> None:
    assert select_highest([0.2, 0.4], 5).tolist() == [1, 0]
    assert select_highest([], 3).tolist() == []


@pytest.mark.parametrize(
    ("losses", "m", "match"),
    [([1.0, float("nan")], 1, "NaN"), ([[1.0]], 1, "vector"), ([1.0], 0, ">= 1")],
)
def test_select_highest_rejects_bad_input(losses: object, m: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        select_highest(losses, m)  # type: ignore[arg-type]
