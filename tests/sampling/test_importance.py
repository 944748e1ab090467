"""ISFedAvg per-sample importance batches and the eq. 29 probability update.

Statistical checks use fixed seeds and tolerances derived from the number of
draws.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from numpy.typing import NDArray

from flwr_importance.sampling.importance import importance_batch, update_sample_probs
from flwr_importance.sampling.pips import capped_inclusion_probs

#: Standard errors allowed between an empirical frequency and its target.
Z = 5.0


def binomial_tolerance(target: NDArray[np.float64], draws: int) -> NDArray[np.float64]:
    """``Z`` standard errors of a frequency with success probability ``target``."""
    return Z * np.sqrt(target * (1 - target) / draws) + 1e-12


# --- importance_batch ----------------------------------------------------------


def test_importance_batch_inclusion_matches_capped_targets() -> None:
    sample_probs = np.array([0.4, 0.2, 0.1, 0.1, 0.08, 0.06, 0.04, 0.02, 0.0])
    batch_size = 3
    # B p_0 = 1.2 is capped at 1 and the excess shared by the others.
    targets = capped_inclusion_probs(sample_probs, batch_size)
    assert targets[0] == 1.0
    assert np.all(targets[1:] > batch_size * sample_probs[1:] - 1e-12)
    rng = np.random.default_rng(20)
    draws = 20_000
    counts = np.zeros(sample_probs.size)
    for _ in range(draws):
        batch = importance_batch(sample_probs, batch_size, rng)
        assert batch.size == batch_size
        counts[batch] += 1
    frequencies = counts / draws
    assert np.all(np.abs(frequencies - targets) <= binomial_tolerance(targets, draws))


def test_importance_batch_uniform_probs_give_b_over_n() -> None:
    rng = np.random.default_rng(21)
    draws = 10_000
    counts = np.zeros(10)
    for _ in range(draws):
        counts[importance_batch(np.full(10, 0.1), 4, rng)] += 1
    target = np.full(10, 0.4)
    assert np.all(np.abs(counts / draws - target) <= binomial_tolerance(target, draws))


@pytest.mark.parametrize(
    ("sample_probs", "batch_size", "message"),
    [
        ([0.5, 0.6], 1, "sum to 1"),
        ([1.5, -0.5], 1, "negative"),
        ([0.5, np.nan], 1, "NaN"),
        ([0.5, 0.5], 3, r"\[0, 2\]"),
        ([1.0, 0.0], 2, "positive"),
    ],
)
def test_importance_batch_rejects(
    sample_probs: object, batch_size: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        importance_batch(sample_probs, batch_size, np.random.default_rng(0))  # type: ignore[arg-type]


# --- update_sample_probs -------------------------------------------------------


def test_update_sample_probs_hand_computed() -> None:
    # The batch {1, 3} holds 0.2 + 0.4 = 0.6 = 1 - (0.1 + 0.3); eq. 29 shares
    # it in proportion to the norms 1 : 3, i.e. 0.15 and 0.45.
    sample_probs = np.array([0.1, 0.2, 0.3, 0.4])
    updated = update_sample_probs(sample_probs, [3, 1], [3.0, 1.0])
    np.testing.assert_allclose(updated, [0.1, 0.15, 0.3, 0.45], rtol=1e-12)
    assert updated.sum() == pytest.approx(1.0, abs=1e-15)
    assert np.array_equal(sample_probs, [0.1, 0.2, 0.3, 0.4])  # input untouched


def test_update_sample_probs_keeps_old_batch_probs_for_zero_norms() -> None:
    sample_probs = np.array([0.1, 0.2, 0.3, 0.4])
    updated = update_sample_probs(sample_probs, [0, 2], [0.0, 0.0])
    np.testing.assert_allclose(updated, sample_probs, rtol=1e-12)


def test_update_sample_probs_floors_and_renormalizes() -> None:
    # Eq. 29 gives (1, 0); the floor 1e-6 / 2 lifts the second, then the
    # vector is renormalized.
    floor = 1e-6 / 2
    updated = update_sample_probs([0.5, 0.5], [0, 1], [2.0, 0.0])
    np.testing.assert_allclose(
        updated, [1 / (1 + floor), floor / (1 + floor)], rtol=1e-12
    )
    assert updated.sum() == pytest.approx(1.0, abs=1e-15)
    unfloored = update_sample_probs([0.5, 0.5], [0, 1], [2.0, 0.0], 0.0)
    np.testing.assert_array_equal(unfloored, [1.0, 0.0])


def test_update_sample_probs_with_an_empty_batch_changes_nothing() -> None:
    sample_probs = np.array([0.25, 0.75])
    np.testing.assert_allclose(update_sample_probs(sample_probs, [], []), sample_probs)


@pytest.mark.parametrize(
    ("sample_probs", "batch", "grad_norms", "min_relative_prob", "message"),
    [
        ([0.5, 0.6], [0], [1.0], 1e-6, "sum to 1"),
        ([0.5, 0.5], [0, 0], [1.0, 1.0], 1e-6, "repeated"),
        ([0.5, 0.5], [2], [1.0], 1e-6, r"\[0, 2\)"),
        ([0.5, 0.5], [-1], [1.0], 1e-6, r"\[0, 2\)"),
        ([0.5, 0.5], [[0]], [1.0], 1e-6, "1-D"),
        ([0.5, 0.5], [0, 1], [1.0], 1e-6, "one entry per batch index"),
        ([0.5, 0.5], [0], [-1.0], 1e-6, "negative"),
        ([0.5, 0.5], [0], [np.nan], 1e-6, "NaN"),
        ([0.5, 0.5], [0], [1.0], -0.1, "min_relative_prob"),
        ([0.5, 0.5], [0], [1.0], 2.0, "min_relative_prob"),
    ],
)
def test_update_sample_probs_rejects(
    sample_probs: object,
    batch: object,
    grad_norms: object,
    min_relative_prob: float,
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message):
        update_sample_probs(sample_probs, batch, grad_norms, min_relative_prob)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: importance_batch([0.5, 0.5], 1.5, np.random.default_rng(0)),  # type: ignore[arg-type]
            "must be an int",
        ),
        (
            lambda: update_sample_probs([0.5, 0.5], [0.0], [1.0], 1e-6),
            "must hold integers",
        ),
    ],
)
def test_an_input_of_the_wrong_type_raises_type_error(
    call: Callable[[], object], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        call()
