"""FOLB's aggregation weights (eqs. 9-10, 13, 18) against hand computations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from flwr_importance.aggregation.folb import (
    estimated_global_gradient,
    folb_weights,
    heterogeneity_aware_weights,
    single_set_weights,
    two_set_weights,
)

# Three devices in 2-D: gS = (1, 1/3); c = (1, -1/3, 8/3) by hand.
GRADIENTS = [np.array([1.0, 0.0]), np.array([0.0, -1.0]), np.array([2.0, 2.0])]
INNER_PRODUCTS = np.array([1.0, -1.0 / 3.0, 8.0 / 3.0])


def test_global_gradient_is_the_multiset_mean() -> None:
    np.testing.assert_allclose(estimated_global_gradient(GRADIENTS), [1.0, 1.0 / 3.0])
    np.testing.assert_allclose(
        estimated_global_gradient(GRADIENTS, [2, 0, 1]), [4.0 / 3.0, 2.0 / 3.0]
    )


def test_eq13_flips_negative_devices_with_absolute_denominator() -> None:
    result = single_set_weights(GRADIENTS)
    assert result.fallback_reason is None
    np.testing.assert_allclose(result.scores, INNER_PRODUCTS)
    np.testing.assert_allclose(result.weights, INNER_PRODUCTS / 4.0)


def test_eq13_signed_denominator() -> None:
    result = single_set_weights(GRADIENTS, denominator="signed")
    np.testing.assert_allclose(result.weights, INNER_PRODUCTS / (10.0 / 3.0))


def test_eq9_drop_leaves_negative_devices_out_of_both_sums() -> None:
    result = single_set_weights(GRADIENTS, negative="drop")
    np.testing.assert_allclose(result.weights, [3.0 / 11.0, 0.0, 8.0 / 11.0])


def test_eq9_10_uses_the_second_set_for_the_global_gradient() -> None:
    reference = [np.array([0.0, 1.0]), np.array([0.0, 3.0])]  # gS2 = (0, 2)
    result = two_set_weights(GRADIENTS[:2], reference)
    np.testing.assert_allclose(result.scores, [0.0, -2.0])
    np.testing.assert_allclose(result.weights, [0.0, -1.0])
    weighted = two_set_weights(GRADIENTS[:2], reference, [1, 1], [3, 1])
    np.testing.assert_allclose(weighted.scores, [0.0, -1.5])  # gS2 = (0, 1.5)


def test_eq18_norm_product_penalty_by_hand() -> None:
    gammas = np.array([0.5, 0.0, 1.0])
    psi = 0.1
    global_norm = np.sqrt(1.0 + 1.0 / 9.0)
    norms = np.array([1.0, 1.0, np.sqrt(8.0)])
    scores = INNER_PRODUCTS - psi * gammas * norms * global_norm
    result = heterogeneity_aware_weights(GRADIENTS, gammas, psi)
    np.testing.assert_allclose(result.scores, scores)
    np.testing.assert_allclose(result.weights, scores / np.abs(scores).sum())


def test_eq18_global_norm_penalty_by_hand() -> None:
    gammas = np.array([0.5, 0.0, 1.0])
    scores = INNER_PRODUCTS - 2.0 * gammas * (1.0 + 1.0 / 9.0)
    result = heterogeneity_aware_weights(GRADIENTS, gammas, 2.0, penalty="global-norm")
    np.testing.assert_allclose(result.weights, scores / np.abs(scores).sum())


def test_eq18_with_psi_zero_is_eq13() -> None:
    result = heterogeneity_aware_weights(GRADIENTS, [1.0, 1.0, 1.0], 0.0)
    np.testing.assert_allclose(result.weights, single_set_weights(GRADIENTS).weights)


@settings(max_examples=50, deadline=None)
@given(
    vectors=arrays(np.float64, (4, 3), elements=st.floats(-10, 10)),
    counts=st.lists(st.integers(1, 3), min_size=4, max_size=4),
    negative=st.sampled_from(["flip", "drop"]),
)
def test_a_device_drawn_m_times_weighs_as_m_copies(
    vectors: np.ndarray, counts: list[int], negative: str
) -> None:
    gradients = list(vectors)
    expanded = [g for g, m in zip(gradients, counts, strict=True) for _ in range(m)]
    grouped = folb_weights(gradients, counts, negative=negative)  # type: ignore[arg-type]
    copies = folb_weights(expanded, negative=negative)  # type: ignore[arg-type]
    summed = np.add.reduceat(copies.weights, np.cumsum([0, *counts[:-1]]))
    assert (grouped.fallback_reason is None) == (copies.fallback_reason is None)
    np.testing.assert_allclose(grouped.weights, summed, atol=1e-12)


def test_weights_sum_to_one_in_abs_value_when_not_degenerate() -> None:
    rng = np.random.default_rng(0)
    gradients = list(rng.normal(size=(10, 5)))
    result = single_set_weights(gradients)
    assert np.abs(result.weights).sum() == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("gradients", "reason"),
    [
        ([np.zeros(2), np.zeros(2)], "zero"),
        ([np.array([1.0, 0.0]), np.array([-1.0, 0.0])], "zero"),  # gS = 0
        ([np.array([1.0, 2.0])], "single"),
        ([np.array([1.0, np.nan]), np.array([1.0, 2.0]), np.ones(2)], "NaN"),
    ],
)
def test_degenerate_rounds_fall_back_to_the_mean_of_valid_updates(
    gradients: list[np.ndarray], reason: str
) -> None:
    result = single_set_weights(gradients)
    assert result.fallback_reason is not None and reason in result.fallback_reason
    finite = np.array([np.all(np.isfinite(g)) for g in gradients])
    np.testing.assert_allclose(result.weights, finite / finite.sum())


def test_drop_with_only_negative_scores_falls_back() -> None:
    reference = [np.array([-1.0, 0.0])]
    result = two_set_weights(
        [np.array([1.0, 0.0]), np.ones(2)], reference, negative="drop"
    )
    assert result.fallback_reason is not None and "drop" in result.fallback_reason
    np.testing.assert_allclose(result.weights, [0.5, 0.5])


def test_empty_second_set_falls_back() -> None:
    result = two_set_weights(GRADIENTS, [])
    assert result.fallback_reason is not None
    np.testing.assert_allclose(result.weights, np.full(3, 1.0 / 3.0))


def test_signed_denominator_that_is_negative_falls_back() -> None:
    reference = [np.array([-1.0, 0.0])]
    gradients = [np.array([1.0, 0.0]), np.array([0.5, 0.0])]
    result = two_set_weights(gradients, reference, denominator="signed")
    assert result.fallback_reason is not None and "signed" in result.fallback_reason


def test_all_gradients_nan_gives_zero_weights() -> None:
    result = single_set_weights([np.full(2, np.nan), np.full(2, np.inf)])
    assert result.fallback_reason is not None
    np.testing.assert_array_equal(result.weights, [0.0, 0.0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"psi": -1.0, "inexactness": [0.0, 0.0, 0.0]}, "psi"),
        ({"psi": 0.1}, "inexactness"),
        ({"psi": 0.1, "inexactness": [0.0, 2.0, 0.0]}, r"\[0, 1\]"),
        ({"negative": "ignore"}, "negative"),
        ({"denominator": "l2"}, "denominator"),
        ({"penalty": "square"}, "penalty"),
        ({"multiplicities": [1, -1, 1]}, "multiplicities"),
        ({"multiplicities": [1, 1]}, "multiplicities"),
        ({"reference_gradients": [np.ones(3)]}, "length"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        folb_weights(GRADIENTS, **kwargs)


def test_no_device_raises() -> None:
    with pytest.raises(ValueError, match="at least one"):
        folb_weights([])
