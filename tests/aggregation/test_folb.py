"""FOLB's aggregation weights (eqs. 9-10, 13, 18) against hand computations."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from flwr_importance.aggregation import _streaming, folb
from flwr_importance.aggregation.folb import (
    SplitVector,
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
    grouped = folb_weights(gradients, counts, mode="single-set", negative=negative)  # type: ignore[arg-type]
    copies = folb_weights(expanded, mode="single-set", negative=negative)  # type: ignore[arg-type]
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
        ({"mode": "two-set", "reference_gradients": [np.ones(3)]}, "length"),
        ({"mode": "eq13"}, "mode must be one of"),
        ({"reference_gradients": [np.ones(2)]}, "reference_gradients belong to"),
        ({"reference_sample_counts": [1.0]}, "reference_sample_counts belong to"),
        ({"mode": "two-set"}, "two-set' needs reference_gradients"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        folb_weights(GRADIENTS, **{"mode": "single-set", **kwargs})


def test_no_device_raises() -> None:
    with pytest.raises(ValueError, match="at least one"):
        folb_weights([], mode="single-set")


def dense_scores(
    gradients: np.ndarray,
    counts: np.ndarray,
    reference: np.ndarray,
    reference_counts: np.ndarray,
    gammas: np.ndarray,
    psi: float,
    penalty: str,
) -> np.ndarray:
    """Eqs. 9-10, 13, 18 on K x d float64 matrices, as written."""
    global_gradient = reference_counts @ reference / reference_counts.sum()
    global_norm = np.linalg.norm(global_gradient)
    if penalty == "norm-product":
        penalties = psi * gammas * np.linalg.norm(gradients, axis=1) * global_norm
    else:
        penalties = psi * gammas * global_norm**2
    return gradients @ global_gradient - penalties


def read_only_float32(matrix: np.ndarray) -> list[np.ndarray]:
    """The rows of ``matrix`` as read-only float32 views, as a reply's bytes."""
    values = np.ascontiguousarray(matrix, dtype=np.float32)
    values.flags.writeable = False
    return list(values)


def split(vector: np.ndarray, sizes: list[int]) -> SplitVector:
    """``vector`` as consecutive pieces of ``sizes`` (the last one 2-D)."""
    pieces = np.split(vector, np.cumsum(sizes)[:-1])
    return SplitVector((*pieces[:-1], pieces[-1].reshape(-1, 1)))


@pytest.mark.parametrize("two_set", [False, True])
@pytest.mark.parametrize(
    ("psi", "penalty"),
    [(0.0, "norm-product"), (0.3, "norm-product"), (0.3, "global-norm")],
)
def test_streamed_float32_gradients_match_the_dense_formulas(
    monkeypatch: pytest.MonkeyPatch, two_set: bool, psi: float, penalty: str
) -> None:
    # Chunks of 7 entries: every chunk, piece and layout boundary case at d = 50.
    monkeypatch.setattr(_streaming, "CHUNK_SIZE", 7)
    rng = np.random.default_rng(3)
    dimension, k = 50, 6
    gradients = read_only_float32(rng.normal(0.2, 1.0, size=(k, dimension)))
    reference = read_only_float32(rng.normal(0.2, 1.0, size=(4, dimension)))
    counts = np.array([1, 3, 1, 2, 1, 1])
    reference_counts = np.array([2, 1, 0, 1])
    gammas = rng.uniform(size=k)
    as_float64 = np.array(gradients, dtype=np.float64)
    expected = dense_scores(
        as_float64,
        counts,
        np.array(reference, dtype=np.float64) if two_set else as_float64,
        reference_counts if two_set else counts,
        gammas,
        psi,
        penalty,
    )
    layouts: list[list[Any]] = [
        gradients,
        [split(g, [11, 0, 7, 32]) for g in gradients],
        # Whole and split vectors, split differently, in one call.
        [g if i % 2 else split(g, [3, 47]) for i, g in enumerate(gradients)],
    ]
    for vectors in layouts:
        result = folb_weights(
            vectors,
            counts,
            mode="two-set" if two_set else "single-set",
            reference_gradients=(
                [split(g, [20, 30]) for g in reference] if two_set else None
            ),
            reference_multiplicities=reference_counts if two_set else None,
            inexactness=gammas,
            psi=psi,
            penalty=penalty,  # type: ignore[arg-type]
        )
        assert result.fallback_reason is None
        np.testing.assert_allclose(result.scores, expected, rtol=1e-12)
        np.testing.assert_allclose(
            result.weights,
            counts * expected / (counts @ np.abs(expected)),
            rtol=1e-12,
        )
    np.testing.assert_allclose(
        estimated_global_gradient([split(g, [49, 1]) for g in gradients], counts),
        counts @ as_float64 / counts.sum(),
        rtol=1e-12,
    )


def test_a_nan_reference_gradient_is_left_out_of_the_estimate() -> None:
    reference = [np.array([0.0, 1.0]), np.array([np.nan, 0.0]), np.array([0.0, 3.0])]
    with_nan = two_set_weights(GRADIENTS, reference, None, [1, 5, 1])
    without = two_set_weights(GRADIENTS, reference[::2])
    assert with_nan.fallback_reason is None
    np.testing.assert_allclose(with_nan.scores, without.scores)
    np.testing.assert_allclose(with_nan.weights, without.weights)


def test_a_nan_gradient_drawn_zero_times_is_still_left_out() -> None:
    gradients = [*GRADIENTS, np.array([np.inf, 0.0])]
    result = single_set_weights(gradients, [1, 1, 1, 0])
    assert result.fallback_reason is not None and "NaN" in result.fallback_reason
    np.testing.assert_allclose(result.scores, [*INNER_PRODUCTS, np.nan])
    np.testing.assert_allclose(result.weights, [1 / 3, 1 / 3, 1 / 3, 0.0])


def test_finite_gradients_too_large_to_square_are_not_called_nan() -> None:
    with np.errstate(over="ignore", invalid="ignore"):
        result = single_set_weights([np.array([1e200, 0.0]), np.array([1e200, 1.0])])
    assert result.fallback_reason is not None
    assert "NaN" not in result.fallback_reason


# -- the sample-weighted objective (the paper's n_k / n) ---------------------------
SAMPLE_COUNTS = np.array([1.0, 3.0, 6.0])


def test_sample_weighted_eq13_by_hand() -> None:
    # gS = (1 * (1, 0) + 3 * (0, -1) + 6 * (2, 2)) / 10 = (1.3, 0.9).
    result = single_set_weights(GRADIENTS, sample_counts=SAMPLE_COUNTS)
    scores = np.array([1.3, -0.9, 4.4])
    np.testing.assert_allclose(result.scores, scores)
    np.testing.assert_allclose(
        result.weights, SAMPLE_COUNTS * scores / (SAMPLE_COUNTS @ np.abs(scores))
    )
    np.testing.assert_allclose(
        estimated_global_gradient(GRADIENTS, sample_counts=SAMPLE_COUNTS), [1.3, 0.9]
    )


@pytest.mark.parametrize("mode", ["single-set", "two-set", "eq18"])
def test_identical_gradients_give_fedprox_sample_weighted_mean(mode: str) -> None:
    gradient = np.array([0.3, -1.2, 2.0])
    counts = np.array([7.0, 1.0, 30.0, 2.0])
    multiplicities = np.array([1.0, 2.0, 1.0, 1.0])
    same = [gradient.copy() for _ in counts]
    result = folb_weights(
        same,
        multiplicities,
        mode="two-set" if mode == "two-set" else "single-set",
        sample_counts=counts,
        reference_gradients=same[:2] if mode == "two-set" else None,
        reference_sample_counts=counts[:2] if mode == "two-set" else None,
        inexactness=np.full(4, 0.4) if mode == "eq18" else None,
        psi=0.5 if mode == "eq18" else 0.0,
    )
    assert result.fallback_reason is None
    # FedProx's aggregate: sum_k n_k w_k / sum_k n_k, a device drawn twice twice.
    fedprox = multiplicities * counts / (multiplicities @ counts)
    # Equal in exact arithmetic: c_k n_k / sum n_i c_i against n_k / sum n_i
    # differ by float rounding only (a few units in the last place).
    np.testing.assert_allclose(
        result.weights, fedprox, rtol=4 * np.finfo(np.float64).eps, atol=0
    )


@settings(max_examples=50, deadline=None)
@given(
    vectors=arrays(np.float64, (4, 3), elements=st.floats(-10, 10)),
    counts=st.lists(st.integers(1, 4), min_size=4, max_size=4),
)
def test_a_device_with_n_samples_weighs_as_n_draws(
    vectors: np.ndarray, counts: list[int]
) -> None:
    by_samples = folb_weights(list(vectors), mode="single-set", sample_counts=counts)
    by_draws = folb_weights(list(vectors), counts, mode="single-set")
    assert by_samples.fallback_reason == by_draws.fallback_reason
    np.testing.assert_allclose(by_samples.weights, by_draws.weights, atol=1e-12)


def test_a_device_without_samples_gets_no_weight() -> None:
    result = single_set_weights(GRADIENTS, sample_counts=[0.0, 3.0, 6.0])
    assert result.weights[0] == 0.0
    np.testing.assert_allclose(
        result.weights[1:],
        single_set_weights(GRADIENTS[1:], sample_counts=[3.0, 6.0]).weights,
    )


def test_degenerate_rounds_fall_back_to_the_sample_weighted_mean() -> None:
    gradients = [np.array([1.0, np.nan]), np.array([1.0, 2.0]), np.ones(2)]
    result = single_set_weights(gradients, sample_counts=SAMPLE_COUNTS)
    assert result.fallback_reason is not None and "NaN" in result.fallback_reason
    np.testing.assert_allclose(result.weights, [0.0, 3.0 / 9.0, 6.0 / 9.0])


def test_sample_counts_for_one_set_only_are_rejected() -> None:
    with pytest.raises(ValueError, match="both sets"):
        two_set_weights(GRADIENTS, GRADIENTS, sample_counts=SAMPLE_COUNTS)
    with pytest.raises(ValueError, match="sample_counts"):
        single_set_weights(GRADIENTS, sample_counts=[1.0, -2.0, 1.0])


@pytest.mark.parametrize("psi", [0.0, 0.4])
def test_the_scale_of_the_global_estimate_cancels_in_the_weights(psi: float) -> None:
    # Why a ratio estimator serves: scaling gS2 (e.g. into the unbiased
    # (N / (K n)) sum n_j g_j) scales every score, and the weights divide
    # scores by scores.
    rng = np.random.default_rng(11)
    gradients = list(rng.normal(0.5, 1.0, size=(5, 4)))
    reference = list(rng.normal(0.5, 1.0, size=(3, 4)))
    gammas = rng.uniform(size=5)

    def weights(references: list[np.ndarray]) -> folb.FolbWeights:
        return folb_weights(
            gradients,
            mode="two-set",
            sample_counts=np.arange(1, 6),
            reference_gradients=references,
            reference_sample_counts=[2, 5, 1],
            inexactness=gammas,
            psi=psi,
        )

    base = weights(reference)
    scaled = weights([3.7 * g for g in reference])
    assert base.fallback_reason is None
    np.testing.assert_allclose(scaled.scores, 3.7 * base.scores, rtol=1e-12)
    np.testing.assert_allclose(scaled.weights, base.weights, rtol=1e-12)
