"""What is specific to the FedSampling benchmark: vectorized replies, seeded runs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from benchmarks.fedsampling import (
    Setting,
    clipped_total,
    private_size_replies,
    run_seed,
    setting,
)
from flwr_importance.sampling.privacy import size_reply_probabilities

MAX_SIZE = 12
EPSILON = 2.0
DRAWS = 40_000


@pytest.mark.parametrize("size", [0, 4, 40])
def test_replies_follow_the_library_distribution(size: int) -> None:
    replies = private_size_replies(
        np.full(DRAWS, size), MAX_SIZE, EPSILON, np.random.default_rng(1)
    )
    expected = size_reply_probabilities(size, MAX_SIZE, EPSILON)
    observed = np.bincount(replies, minlength=MAX_SIZE)[1:] / DRAWS
    # Each frequency within 5 standard errors of its probability.
    tolerance = 5 * np.sqrt(expected * (1 - expected) / DRAWS)
    assert np.all(np.abs(observed - expected) <= tolerance)


def test_clipped_total_counts_each_client_in_one_to_m_minus_one() -> None:
    assert clipped_total(np.array([0, 5, 500]), 100) == 1 + 5 + 99


@pytest.fixture(scope="module")
def tiny() -> Setting:
    return dataclasses.replace(
        setting(full=False, clamp="k"), num_clients=300, mean_size=20, rounds=3
    )


@pytest.mark.parametrize(
    "overrides",
    [
        {"method": "fedavg"},
        {"method": "sizeweighted"},
        {"method": "fedsampling", "epsilon": 3.0},
        {"method": "centralized"},
    ],
)
def test_runs_are_seeded_and_finite(
    tiny: Setting, overrides: dict[str, str | float]
) -> None:
    overrides = {**overrides, "matched": True, "learning-rate": 0.1}
    first = run_seed(tiny, overrides, 5)
    assert len(first.curve) == tiny.rounds + 1 and np.all(np.isfinite(first.curve))
    assert run_seed(tiny, overrides, 5) == first
    assert run_seed(tiny, overrides, 6).curve != first.curve


def test_a_large_budget_estimates_the_clipped_total(tiny: Setting) -> None:
    run = run_seed(
        tiny,
        {
            "method": "fedsampling",
            "epsilon": 50.0,
            "matched": True,
            "learning-rate": 0.1,
        },
        5,
    )
    assert run.extras["N_tilde rms rel. error"] < 1e-3
    assert run.extras["rounds clamped"] == 0
