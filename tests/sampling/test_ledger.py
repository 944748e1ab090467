"""Composition of FedSampling's size replies and the per-node privacy ledger."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from flwr_importance.sampling.ledger import DEFAULT_DELTA_PRIME, PrivacyLedger
from flwr_importance.sampling.privacy import (
    advanced_composition_crossover,
    advanced_composition_epsilon,
    basic_composition_epsilon,
)


def test_basic_composition_is_k_times_epsilon() -> None:
    assert basic_composition_epsilon(0.25, [0, 1, 4, 40]).tolist() == [
        0.0,
        0.25,
        1.0,
        10.0,
    ]


def test_advanced_composition_matches_hand_derived_value() -> None:
    # eps = 1/2, k = 4, delta' = e^-2: sqrt(2 * 4 * 2) * 1/2 = 2, plus
    # k eps (e^eps - 1) = 2 (e^0.5 - 1).
    expected = 2 + 2 * (math.exp(0.5) - 1)
    assert advanced_composition_epsilon(0.5, 4, math.exp(-2)) == pytest.approx(
        expected, rel=1e-12
    )


def test_advanced_composition_matches_the_theorem_formula() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        eps, k = float(rng.uniform(0.01, 3)), int(rng.integers(0, 10_000))
        delta = float(10 ** rng.uniform(-12, -1))
        theorem = math.sqrt(2 * k * math.log(1 / delta)) * eps + k * eps * (
            math.exp(eps) - 1
        )
        assert advanced_composition_epsilon(eps, k, delta) == pytest.approx(
            theorem, rel=1e-12, abs=1e-15
        )


@pytest.mark.parametrize("eps", [0.05, 0.1, 0.3, 0.6])
def test_advanced_beats_basic_exactly_from_the_crossover(eps: float) -> None:
    crossover = advanced_composition_crossover(eps, 1e-6)
    assert crossover is not None
    counts = np.arange(1, 4 * crossover)
    below = advanced_composition_epsilon(eps, counts, 1e-6) < basic_composition_epsilon(
        eps, counts
    )
    assert not below[: crossover - 1].any()
    assert below[crossover - 1 :].all()


@pytest.mark.parametrize("eps", [math.log(2), 1.0, 3.0])
def test_advanced_never_beats_basic_from_ln_2(eps: float) -> None:
    assert advanced_composition_crossover(eps, 1e-6) is None
    counts = np.unique(np.logspace(0, 7, 200).astype(int))
    assert np.all(
        advanced_composition_epsilon(eps, counts, 1e-6)
        >= basic_composition_epsilon(eps, counts)
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda: basic_composition_epsilon(0.0, 1),
        lambda: basic_composition_epsilon(1.0, -1),
        lambda: basic_composition_epsilon(1.0, 1.5),
        lambda: basic_composition_epsilon(1.0, math.inf),
        lambda: advanced_composition_epsilon(1.0, 1, 0.0),
        lambda: advanced_composition_epsilon(1.0, 1, 1.0),
        lambda: advanced_composition_crossover(math.nan, 1e-6),
        lambda: PrivacyLedger(epsilon=-1.0),
        lambda: PrivacyLedger(epsilon=1.0, delta_prime=2.0),
    ],
)
def test_invalid_input_is_refused(call: object) -> None:
    with pytest.raises(ValueError):
        call()  # type: ignore[operator]


def test_ledger_counts_answers_per_node_by_round() -> None:
    big, small = 2**64 - 1, 3
    ledger = PrivacyLedger(epsilon=0.1)
    assert ledger.delta_prime == DEFAULT_DELTA_PRIME
    ledger.record(1, [big, small])
    ledger.record(2, [small])  # big silent in round 2
    # Round 3 skipped (no query); two queries in round 4.
    for _ in range(2):
        ledger.record(4, [big, small])
    assert ledger.answers(0) == {}
    assert ledger.answers(1) == {big: 1, small: 1}
    assert ledger.answers(3) == {big: 1, small: 2}
    assert ledger.answers(4) == {big: 3, small: 4}
    spend = ledger.spend(4)
    assert spend.node_ids == (small, big)
    assert spend.size_queries == (4, 3)
    assert spend.basic_epsilon == pytest.approx((0.4, 0.3))
    # Below the crossover (35 answers at eps 0.1) the columns agree.
    assert ledger.advanced_from == 35
    assert spend.advanced_epsilon == spend.basic_epsilon
    # Node ids stay exact through JSON.
    assert json.loads(json.dumps(spend.node_ids)) == [small, big]


def test_ledger_advanced_column_is_the_smaller_bound() -> None:
    ledger = PrivacyLedger(epsilon=0.1, delta_prime=1e-6)
    for server_round in range(1, 101):
        ledger.record(server_round, [7])
    spend = ledger.spend(100)
    theorem = float(advanced_composition_epsilon(0.1, 100, 1e-6))
    assert theorem < 10.0
    assert spend.advanced_epsilon == pytest.approx((theorem,))
    assert spend.basic_epsilon == pytest.approx((10.0,))


def test_ledger_refuses_misuse() -> None:
    ledger = PrivacyLedger(epsilon=1.0)
    ledger.record(2, [1])
    with pytest.raises(ValueError, match="in order"):
        ledger.record(1, [1])
    with pytest.raises(ValueError, match="once"):
        ledger.record(2, [5, 5])
    with pytest.raises(ValueError, match="2\\*\\*64"):
        ledger.record(2, [2**64])
    with pytest.raises(TypeError):
        ledger.record(2, [1.0])  # type: ignore[list-item]
    assert ledger.answers(2) == {1: 1}
