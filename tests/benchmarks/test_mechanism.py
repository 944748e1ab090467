"""The mechanism benchmark: samplers' errors on updates whose answer is known."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks.evidence import CLAIMS_FILE, read_claims, verdict
from benchmarks.mechanism import (
    POOLED,
    STAGES,
    STATISTIC,
    AggregateError,
    Setting,
    UnitResult,
    claim_rows,
    clustered_by_similarity,
    clustered_by_size,
    comparison_rows,
    error_ratio,
    evaluate_setting,
    full_participation,
    isfedavg_client_level,
    md,
    measure,
    mmfl,
    ocs,
    power_of_choice,
    random_assignment,
    uniform_fedavg,
    uniform_independent,
    write_outputs,
)
from benchmarks.mechanism_capture import CapturedRound, capture_rounds
from flwr_importance.aggregation.variance_reduced import unbiased_update
from flwr_importance.sampling.clustered import (
    aggregation_weight_variance,
    clustered_distributions_by_size,
)
from flwr_importance.sampling.variance_reduced import (
    estimator_variance,
    optimal_client_probs,
)
from simulations.config import ExperimentConfig
from simulations.inprocess import resolve_run_config
from simulations.task import federated_data

DRAWS = 20_000
#: Systematic sampling draws one sample per call: fewer draws, same tolerance rule.
SYSTEMATIC_DRAWS = 5_000
#: Monte Carlo tolerance: an estimate within this many standard errors.
STANDARD_ERRORS = 4.0
#: Float rounding of a quadratic form ``e^T G e``, relative to ``||full||^2``.
ROUNDING = 1e-12
#: A tiny run of the app: a few clients, a few rounds, seconds.
TINY_RUN: dict[str, bool | int | float | str] = {
    "num-supernodes": 6,
    "strategy": "fedavg",
    "dataset": "digits",
    "partitioning": "lognormal",
    "lognormal-sigma": 1.0,
    "model": "logreg",
    "clients-per-round": 2,
    "local-steps": 3,
    "batch-size": 8,
    "local-lr": 0.1,
}


def captured(
    updates: np.ndarray,
    sizes: np.ndarray,
    *,
    losses: Sequence[float] | None = None,
    model_index: int = 0,
) -> CapturedRound:
    """A captured round built from given updates (previous round: the same)."""
    return CapturedRound(
        seed=0,
        server_round=2,
        model_index=model_index,
        updates=np.asarray(updates, dtype=np.float64),
        sizes=np.asarray(sizes, dtype=np.int64),
        losses=(
            np.linspace(1.0, 2.0, len(sizes))
            if losses is None
            else np.asarray(losses, dtype=np.float64)
        ),
        previous_updates=np.asarray(updates, dtype=np.float64),
    )


def random_round(seed: int, clients: int = 10, dimension: int = 6) -> CapturedRound:
    """Updates of unequal norms and unequal sizes."""
    rng = np.random.default_rng(seed)
    scales = rng.lognormal(0.0, 1.0, size=(clients, 1))
    return captured(
        rng.normal(size=(clients, dimension)) * scales,
        rng.integers(5, 50, size=clients),
    )


def test_full_participation_has_no_error() -> None:
    model = random_round(0)
    (error,) = measure(full_participation(), [model], draws=100, seed=0)
    assert error.mse == pytest.approx(0.0, abs=ROUNDING * error.full_norm2)
    assert error.squared_bias == pytest.approx(0.0, abs=ROUNDING * error.full_norm2)


def test_independent_sampling_matches_its_closed_form_variance() -> None:
    # sum_i (1 - p_i) / p_i ||d_i U_i||^2 (estimator_variance), for OCS's and
    # for uniform probabilities.
    model = random_round(1)
    m = 3
    for sampler, probs in (
        (ocs(m), optimal_client_probs(model.weighted_norms, m)),
        (uniform_independent(m), np.full(model.num_clients, m / model.num_clients)),
    ):
        (error,) = measure(sampler, [model], draws=DRAWS, seed=2)
        expected = estimator_variance(model.weighted_norms, probs)
        assert abs(error.mse - expected) < STANDARD_ERRORS * error.standard_error
        # Unbiased: its squared bias is the variance of a mean of DRAWS draws.
        assert error.squared_bias < STANDARD_ERRORS**2 * expected / DRAWS


def test_ocs_beats_uniform_on_unequal_norms() -> None:
    model = random_round(3)
    (method,) = measure(ocs(3), [model], draws=DRAWS, seed=4)
    (baseline,) = measure(uniform_independent(3), [model], draws=DRAWS, seed=5)
    assert method.mse < baseline.mse


def test_equal_updates_and_sizes_give_ocs_uniform_errors_and_md_none() -> None:
    # Equal norms make OCS's probabilities uniform: the same draws from the
    # same seed, the same error. A mean of m equal updates is exact.
    model = captured(np.ones((8, 3)), np.full(8, 10))
    (method,) = measure(ocs(3), [model], draws=2_000, seed=6)
    (baseline,) = measure(uniform_independent(3), [model], draws=2_000, seed=6)
    assert method.mse == pytest.approx(baseline.mse, rel=1e-12)
    for sampler in (md(3), clustered_by_size(3), clustered_by_similarity(3)):
        (error,) = measure(sampler, [model], draws=500, seed=7)
        assert error.mse == pytest.approx(0.0, abs=ROUNDING * error.full_norm2)


def test_md_matches_its_closed_form_variance() -> None:
    # m i.i.d. draws with p = d: E||mean - sum d U||^2 = (sum d ||U||^2 -
    # ||sum d U||^2) / m.
    model = random_round(8)
    m = 4
    (error,) = measure(md(m), [model], draws=DRAWS, seed=9)
    norms2 = np.sum(model.updates**2, axis=1)
    expected = (model.fractions @ norms2 - model.full_update @ model.full_update) / m
    assert abs(error.mse - expected) < STANDARD_ERRORS * error.standard_error


def test_clustered_weights_have_the_variance_of_eq_16() -> None:
    # omega_i = (times drawn) / m: Var = sum_k r_ki (1 - r_ki) / m^2 (eq. 16).
    model = random_round(18, clients=12)
    m = 4
    (weights,) = clustered_by_size(m).draw([model], np.random.default_rng(19), DRAWS)
    expected = aggregation_weight_variance(
        clustered_distributions_by_size(model.sizes, m)
    )
    # The variance of a sample variance of a bounded weight: at most E[w^4].
    tolerance = STANDARD_ERRORS * np.sqrt(np.mean(weights**4, axis=0) / DRAWS)
    assert np.all(np.abs(weights.var(axis=0) - expected) <= tolerance)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0)


def test_isfedavg_uniform_client_level_is_sampling_without_replacement() -> None:
    # L of K equal probabilities (K / L whole): a uniform L-subset, whose mean
    # has E||mean - full||^2 = (1 - L/K) S^2 / L, S^2 the updates' variance.
    model = captured(random_round(20, clients=12).updates, np.full(12, 10))
    clients = 3
    sampler = isfedavg_client_level(clients, uniform=True)
    (error,) = measure(sampler, [model], draws=SYSTEMATIC_DRAWS, seed=21)
    spread = np.sum((model.updates - model.full_update) ** 2) / (12 - 1)
    expected = (1 - clients / 12) * spread / clients
    assert abs(error.mse - expected) < STANDARD_ERRORS * error.standard_error


def test_isfedavg_client_level_is_unbiased_at_its_probabilities() -> None:
    base = random_round(22, clients=8)
    probs = np.linspace(1.0, 3.0, 8)
    model = CapturedRound(
        seed=0,
        server_round=2,
        model_index=0,
        updates=base.updates,
        sizes=np.full(8, 10),
        losses=base.losses,
        client_probs=probs / probs.sum(),
    )
    (weights,) = isfedavg_client_level(3).draw(
        [model], np.random.default_rng(23), SYSTEMATIC_DRAWS
    )
    spread = weights.std(axis=0) / np.sqrt(SYSTEMATIC_DRAWS)
    assert np.all(np.count_nonzero(weights, axis=1) == 3)
    assert np.all(
        np.abs(weights.mean(axis=0) - model.fractions) <= STANDARD_ERRORS * spread
    )


def test_the_aggregate_is_the_strategy_estimator() -> None:
    # One OCS draw's weights give unbiased_update's sum (d/p) U over the sample.
    model = random_round(10)
    m = 3
    probs = optimal_client_probs(model.weighted_norms, m)
    (weights,) = ocs(m).draw([model], np.random.default_rng(11), 1)
    chosen = np.flatnonzero(weights[0])
    np.testing.assert_allclose(
        weights[0] @ model.updates,
        unbiased_update(model.updates[chosen], model.fractions[chosen], probs[chosen]),
    )


def test_power_of_choice_is_biased_towards_high_losses() -> None:
    # Client 0 has the highest loss: pow-d picks it whenever it is a candidate.
    updates = np.eye(5)
    model = captured(updates, np.full(5, 10), losses=[9.0, 1.0, 1.0, 1.0, 1.0])
    (error,) = measure(power_of_choice(1, 3), [model], draws=5_000, seed=12)
    (weights,) = power_of_choice(1, 3).draw([model], np.random.default_rng(13), 5_000)
    # Candidate 0 is among 3 of 5 equal sizes with probability 3/5.
    share = weights[:, 0].mean()
    assert abs(share - 0.6) < STANDARD_ERRORS * np.sqrt(0.6 * 0.4 / 5_000)
    assert error.squared_bias > 0.1 * error.mse


def test_uniform_fedavg_weights_by_size() -> None:
    model = captured(np.eye(4), np.array([10, 20, 30, 40]))
    (weights,) = uniform_fedavg(2).draw([model], np.random.default_rng(14), 50)
    assert np.all(np.count_nonzero(weights, axis=1) == 2)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0)


def test_mmfl_and_random_assignment_are_unbiased_per_model() -> None:
    models = [
        captured(
            random_round(15 + index).updates,
            random_round(15 + index).sizes,
            model_index=index,
        )
        for index in range(2)
    ]
    random_weights = random_assignment(3).draw(models, np.random.default_rng(16), 100)
    active = sum(np.count_nonzero(weights, axis=1) for weights in random_weights)
    np.testing.assert_array_equal(active, 3)
    for sampler in (mmfl(3), mmfl(3, by_loss=True), random_assignment(3)):
        for model, weights in zip(
            models, sampler.draw(models, np.random.default_rng(17), DRAWS), strict=True
        ):
            # Each weight averages to d_i; its spread bounds the tolerance.
            spread = weights.std(axis=0) / np.sqrt(DRAWS)
            assert np.all(
                np.abs(weights.mean(axis=0) - model.fractions)
                <= STANDARD_ERRORS * spread + 1e-12
            )


def errors(values: list[float]) -> list[AggregateError]:
    """Errors with a small Monte Carlo standard error."""
    return [AggregateError(value, value * 1e-3, 0.0, 1.0) for value in values]


def test_error_ratio_reads_half_the_error_as_below() -> None:
    interval = error_ratio(errors([0.5, 1.0, 2.0]), errors([1.0, 2.0, 4.0]))
    assert interval.ratio == pytest.approx(0.5)
    assert interval.low < 0.5 < interval.high < 0.51
    assert verdict(interval.low, interval.high, "below") == "as the paper"
    assert interval.p_value is not None and interval.p_value < 0.01
    assert interval.detectable_effect is not None and interval.detectable_effect < 0.01


def test_error_ratio_of_equal_errors_is_no_effect() -> None:
    interval = error_ratio(errors([1.0, 3.0]), errors([1.0, 3.0]))
    assert interval.ratio == pytest.approx(1.0)
    assert interval.p_value is not None and interval.p_value > 0.5
    assert verdict(interval.low, interval.high, "below").startswith("no effect")


def test_error_ratio_needs_paired_rounds() -> None:
    with pytest.raises(ValueError, match="one error per captured round"):
        error_ratio(errors([1.0]), errors([1.0, 2.0]))


def test_rows_per_stage_and_pooled_and_claims_only_where_claimed() -> None:
    units = [
        UnitResult(seed, stage, server_round, {"a": errors([1.0]), "b": errors([2.0])})
        for seed in (0, 1)
        for stage, server_round in zip(STAGES, (2, 5, 9), strict=True)
    ]
    claimed = Setting(
        name="S",
        paper="p",
        claim="c",
        data="d",
        overrides={},
        run="r",
        rounds=(2, 5, 9),
        participation=1,
        samplers={"a": md(1), "b": md(1)},
        comparisons=(("a", "b"),),
    )
    rows = comparison_rows(claimed, units)
    assert [row.stage for row in rows] == [*STAGES, POOLED]
    assert [len(row.method_errors) for row in rows] == [2, 2, 2, 6]
    assert rows[-1].rounds == (2, 5, 9)
    assert {row.verdict for row in rows} == {"as the paper"}
    (claim,) = claim_rows(claimed, rows, seeds=2)
    assert claim.main and claim.seeds == 2 and claim.comparison.endswith("2, 5, 9")
    unclaimed = replace(claimed, claimed=False)
    rows = comparison_rows(unclaimed, units)
    assert {row.verdict for row in rows} == {"lower"}
    assert claim_rows(unclaimed, rows, seeds=2) == []


def test_capture_returns_every_clients_update_at_the_requested_rounds() -> None:
    captures = capture_rounds(TINY_RUN, seed=3, rounds=(2, 3), previous=True)
    assert [capture.server_round for capture in captures] == [2, 3]
    config = ExperimentConfig.from_run_config(
        resolve_run_config({**TINY_RUN, "seed": 3})
    )
    partitions = federated_data(config, 6).partitions
    for capture in captures:
        assert capture.updates.shape[0] == capture.num_clients == 6
        np.testing.assert_array_equal(
            capture.sizes, [len(part.x) for part in partitions]
        )
        assert np.all(np.linalg.norm(capture.updates, axis=1) > 0)
        assert np.all(np.isfinite(capture.losses))
    # Round 3's previous updates are round 2's, trained by the same nodes.
    np.testing.assert_array_equal(captures[1].previous_updates, captures[0].updates)


def test_an_isfedavg_capture_keeps_its_client_probabilities() -> None:
    run = {
        **TINY_RUN,
        "strategy": "isfedavg",
        "dataset": "isfedavg-logistic",
        "samples-per-client": 20,
        "l2": 0.001,
    }
    for key in ("partitioning", "lognormal-sigma", "local-steps", "batch-size"):
        del run[key]
    (capture,) = capture_rounds(run, seed=4, rounds=(3,))
    assert capture.client_probs is not None
    assert capture.client_probs.sum() == pytest.approx(1.0)
    # Eq. 28 moved them from uniform after two rounds.
    assert np.ptp(capture.client_probs) > 0
    assert capture.updates.shape[0] == 6 and capture.previous_updates is None
    assert np.all(np.linalg.norm(capture.updates, axis=1) > 0)


def test_a_tiny_benchmark_run_writes_well_formed_claim_rows(tmp_path: Path) -> None:
    setting = Setting(
        name="OCS",
        paper="a paper",
        claim="a lower error",
        data="tiny digits",
        overrides=TINY_RUN,
        run="uniform FedAvg",
        rounds=(2, 3, 4),
        participation=2,
        samplers={
            "ocs": ocs(2),
            "uniform": uniform_independent(2),
            "md": md(2),
        },
        comparisons=(("ocs", "uniform"), ("md", "uniform")),
    )
    rows = evaluate_setting(setting, seeds=(0,), draws=500)
    assert [(row.method, row.stage) for row in rows] == [
        (method, stage) for method in ("ocs", "md") for stage in (*STAGES, POOLED)
    ]
    write_outputs(
        tmp_path, "summary\n", [setting], rows, seeds=(0,), draws=500, seconds=1.0
    )
    claims = read_claims(tmp_path / CLAIMS_FILE)
    assert len(claims) == 2
    for claim in claims:
        assert claim.statistic == STATISTIC and claim.direction == "below"
        assert claim.interval.low <= claim.interval.ratio <= claim.interval.high
        assert claim.p_value is not None and 0 < claim.p_value <= 1
        assert claim.detectable_effect is not None
        assert claim.seeds == 1
    assert [claim.main for claim in claims] == [True, False]
    assert (tmp_path / "results.json").is_file()
