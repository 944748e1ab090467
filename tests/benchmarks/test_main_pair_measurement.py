"""The measurement behind ``make run``'s pair (``benchmarks.main_pair``)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.main_pair import MAIN_PRESET, descriptions, run_function
from simulations.inprocess import load_preset


def test_the_main_comparison_runs_the_main_preset() -> None:
    clustered, ocs = descriptions()
    main, default = clustered.comparisons
    # The preset with each method's own strategy: what `make run` runs.
    assert dict(main.shared) == MAIN_PRESET
    for method in ("md", "clustered"):
        assert {**main.shared, **main.methods[method]} == {
            **load_preset("main"),
            "strategy": method,
        }
    assert set(main.methods) == set(default.methods) == {"md", "clustered"}
    assert set(ocs.comparisons[0].methods) == {"fedavg", "ocs"}


def test_run_function_returns_the_accuracy_per_round(tmp_path: Path) -> None:
    run = run_function(tmp_path)
    overrides = {**MAIN_PRESET, "strategy": "md", "num-server-rounds": 2}
    first, again = run(overrides, 3), run(overrides, 3)
    assert len(first.curve) == 3
    assert all(0.0 <= value <= 1.0 for value in first.curve)
    assert first.curve == again.curve  # all randomness from the seed
