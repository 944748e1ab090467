"""The central-DP benchmark: equal epsilons, and its smallest setting runs.

The calibration runs the wrapper's own accountant; the run test is the
benchmark's pilot and one seed of each method over 2 rounds on 10 nodes
(a few seconds on one core).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.central_dp import (
    EPSILON,
    EPSILON_TOLERANCE,
    SAMPLED,
    SETTING,
    TARGET_EPSILON,
    Setting,
    calibrate,
    description,
    final_epsilon,
    noise_multipliers,
    run_function,
    wrapper,
)

SMALL = Setting(clients=10, clients_per_round=3, rounds=2)


@pytest.mark.parametrize("setting", [SMALL, SETTING])
def test_both_methods_reach_the_target_epsilon_together(setting: Setting) -> None:
    aocs, report, uniform, aocs_eps, uniform_eps = noise_multipliers(setting)
    assert aocs_eps == pytest.approx(TARGET_EPSILON, rel=1e-6)
    assert uniform_eps == pytest.approx(aocs_eps, rel=EPSILON_TOLERANCE)
    # The reports cost budget: the control affords less model noise.
    assert uniform < aocs < report
    # The same accountant the wrapper runs: recomputed from fresh wrappers.
    assert final_epsilon(wrapper(setting, aocs, report), setting.rounds) == (
        pytest.approx(aocs_eps, rel=1e-12)
    )
    assert final_epsilon(wrapper(setting, uniform), setting.rounds) == (
        pytest.approx(uniform_eps, rel=1e-12)
    )


def test_the_smallest_setting_runs_both_methods_at_equal_epsilon(
    tmp_path: Path,
) -> None:
    calibration = calibrate(SMALL, tmp_path)
    assert 0 < calibration.clipping_norm < calibration.report_clipping_norm
    run = run_function(tmp_path, calibration)
    claim = description(SMALL, calibration, full=False)
    comparison = claim.comparisons[0]
    runs = {
        name: run({**comparison.shared, **overrides}, 0)
        for name, overrides in comparison.methods.items()
    }
    assert set(runs) == {"dp-uniform", "dp-aocs"}
    for seed_run in runs.values():
        assert len(seed_run.curve) == SMALL.rounds + 1
        assert all(0.0 <= value <= 1.0 for value in seed_run.curve)
        assert seed_run.extras[SAMPLED] >= 0
    # Each run checked its published epsilon against the calibration; the two
    # published ones match.
    assert math.isclose(
        runs["dp-uniform"].extras[EPSILON],
        runs["dp-aocs"].extras[EPSILON],
        rel_tol=EPSILON_TOLERANCE,
    )
    # The same seed gives the same numbers (the noise is seeded from it).
    again = run({**comparison.shared, **comparison.methods["dp-aocs"]}, 0)
    assert again.curve == runs["dp-aocs"].curve
