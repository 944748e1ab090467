"""Central DP from the simulation app's run config, through Flower's own loop.

Each run is the simulation app in this process (``simulations.inprocess``):
OCS's ``uniform`` control (and MMFL over two models) on the digits with a
logistic regression, a few nodes, three rounds, ``strategy.start`` as
``flwr run`` calls it. About 7 s for the module on one core.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from dp_accounting import dp_event, rdp
from numpy.typing import NDArray

from flwr_importance.strategies.arrays import flatten
from flwr_importance.tooling.testing import InProcessGrid
from simulations.client_app import app as client_app
from simulations.config import CentralDPSettings, ExperimentConfig, central_dp_of
from simulations.inprocess import resolve_run_config, run_inprocess
from simulations.report import PRIVACY_LEDGER, HistoryRow
from simulations.server_app import run_experiment

NUM_NODES, CLIENTS_PER_ROUND, ROUNDS = 10, 8, 3
#: The task of every run: the digits, a logistic regression, a few rounds.
DIGITS_TASK: dict[str, bool | int | float | str] = {
    "dataset": "digits",
    "model": "logreg",
    "num-server-rounds": ROUNDS,
    "clients-per-round": CLIENTS_PER_ROUND,
    "local-steps": 5,
    "samples-per-client": 40,
}
#: OCS's uniform control: each node with m / N, whatever it reports.
OCS_UNIFORM = {**DIGITS_TASK, "strategy": "ocs", "ocs-uniform": True}
#: Standard errors allowed in the noise check.
Z = 5.0


def run(tmp_path: Path, **central_dp: bool | int | float | str) -> InProcessGrid:
    """The app on OCS_UNIFORM with the ``central-dp-*`` keys given (``_`` for ``-``)."""
    overrides = {
        f"central-dp-{key.replace('_', '-')}": value
        for key, value in central_dp.items()
    }
    output_dir = tmp_path / "-".join(f"{k}={v}" for k, v in overrides.items())
    _, grid = run_inprocess(
        {**OCS_UNIFORM, **overrides, "output-dir": str(output_dir)},
        num_clients=NUM_NODES,
    )
    return grid


def history(grid: InProcessGrid) -> list[HistoryRow]:
    """The ``history.json`` rows the run wrote."""
    output_dir = Path(str(grid.run_config["output-dir"]))
    return list(json.loads((output_dir / "history.json").read_text()))


def round_models(grid: InProcessGrid) -> dict[int, NDArray[np.floating]]:
    """The model each round started from: the first one sent to a node that round."""
    models: dict[int, NDArray[np.floating]] = {}
    for record in grid.wire_log:
        if record.direction != "to-node":
            continue
        content = record.message().content
        server_round = int(content.config_records["config"]["server-round"])  # type: ignore[arg-type]
        for arrays in content.array_records.values():
            models.setdefault(server_round, flatten(arrays).astype(np.float64))
    return models


def test_history_reports_the_epsilon_dp_accounting_gives(tmp_path: Path) -> None:
    noise_multiplier, delta = 1.3, 1e-6
    grid = run(
        tmp_path,
        noise_multiplier=noise_multiplier,
        clipping_norm=1.0,
        delta=delta,
        amplification="poisson",
    )
    rows = history(grid)
    assert [row["round"] for row in rows] == list(range(ROUNDS + 1))
    # Each round samples each of the N nodes with m / N, Poisson; all 10 stay
    # out of a round with probability 0.2^10, about 1e-7.
    accountant = rdp.RdpAccountant()
    expected = []
    for _ in range(ROUNDS):
        accountant.compose(
            dp_event.PoissonSampledDpEvent(
                CLIENTS_PER_ROUND / NUM_NODES,
                dp_event.GaussianDpEvent(noise_multiplier),
            )
        )
        expected.append(accountant.get_epsilon(delta))
    ledgers = [row[PRIVACY_LEDGER] for row in rows[1:]]
    assert PRIVACY_LEDGER not in rows[0]
    assert [ledger["dp-delta"] for ledger in ledgers] == [delta] * ROUNDS
    reported = [ledger["dp-epsilon"] for ledger in ledgers]
    assert reported == pytest.approx(expected, rel=1e-9)
    assert reported[0] < reported[1] < reported[2]
    # Poisson amplification is what was accounted: without it, more.
    unamplified = rdp.RdpAccountant()
    unamplified.compose(dp_event.GaussianDpEvent(noise_multiplier), ROUNDS)
    assert reported[-1] < unamplified.get_epsilon(delta)


def test_noise_is_added_at_its_std_and_a_zero_multiplier_changes_nothing(
    tmp_path: Path,
) -> None:
    plain = run(tmp_path)
    # Off: the other keys are not read; the run is the plain one, bit for bit.
    off = run(
        tmp_path, noise_multiplier=0.0, clipping_norm=1.0, amplification="poisson"
    )
    plain_rows, plain_models = history(plain), round_models(plain)
    off_rows = history(off)
    assert off_rows == plain_rows
    assert all(PRIVACY_LEDGER not in row for row in plain_rows)
    np.testing.assert_array_equal(round_models(off)[ROUNDS], plain_models[ROUNDS])
    # On, without amplification: the uniform sample is the seeded one of the
    # plain run, and with C above every weighted contribution nothing is
    # clipped, so round 1's release differs from the plain one by the noise.
    noise_multiplier, clipping_norm = 0.05, 1.0
    private = run(
        tmp_path, noise_multiplier=noise_multiplier, clipping_norm=clipping_norm
    )
    private_rows = history(private)
    noise = round_models(private)[2] - plain_models[2]
    sigma = noise_multiplier * clipping_norm
    assert abs(noise.mean()) < Z * sigma / np.sqrt(noise.size)
    assert abs(noise.std() - sigma) < Z * sigma / np.sqrt(2 * noise.size)
    assert all(
        mine["loss"] != theirs["loss"]
        for mine, theirs in zip(private_rows[1:], plain_rows[1:], strict=True)
    )


def test_dp_aocs_runs_from_the_apps_keys(tmp_path: Path) -> None:
    """DP-AOCS from the app's keys: each round's epsilon composes its events.

    The model's Gaussian and at least two report sums (the norms' total and
    one (P, S) pair) per round, none amplified: the reported epsilon lies
    between that of model + 2 report sums and model + 1 + aocs-iterations.
    """
    noise_multiplier, report_noise, delta = 2.0, 5.0, 1e-5
    _, grid = run_inprocess(
        {
            **DIGITS_TASK,
            "strategy": "ocs",
            "ocs-approximate": True,
            "central-dp-noise-multiplier": noise_multiplier,
            "central-dp-clipping-norm": 1.0,
            "central-dp-delta": delta,
            "central-dp-report-noise-multiplier": report_noise,
            "central-dp-report-clipping-norm": 10.0,
            "output-dir": str(tmp_path),
        },
        num_clients=NUM_NODES,
    )
    rows = history(grid)
    assert [row["round"] for row in rows] == list(range(ROUNDS + 1))
    reported = [row[PRIVACY_LEDGER]["dp-epsilon"] for row in rows[1:]]
    for report_sums, compare in ((2, "above"), (5, "below")):
        accountant = rdp.RdpAccountant()
        bounds = []
        for _ in range(ROUNDS):
            accountant.compose(dp_event.GaussianDpEvent(noise_multiplier))
            accountant.compose(dp_event.GaussianDpEvent(report_noise), report_sums)
            bounds.append(accountant.get_epsilon(delta))
        for epsilon, bound in zip(reported, bounds, strict=True):
            assert (
                epsilon >= bound * (1 - 1e-9)
                if compare == "above"
                else (epsilon <= bound * (1 + 1e-9))
            )


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"strategy": "folb"}, "CentralDP cannot wrap FOLB"),
        ({"strategy": "fedavg"}, "for Flower's FedAvg use Flower's"),
        ({"strategy": "fedprox"}, "for Flower's FedAvg use Flower's"),
        ({"strategy": "mmfl"}, "CentralDP cannot wrap MultiModelSampling"),
        ({"strategy": "ocs"}, "CentralDP cannot wrap exact OCS"),
        (
            {
                "strategy": "ocs",
                "ocs-approximate": True,
                "central-dp-amplification": "poisson",
            },
            "depend on what the clients report",
        ),
    ],
)
def test_a_method_central_dp_cannot_wrap_fails_before_round_1(
    tmp_path: Path, overrides: dict[str, str], reason: str
) -> None:
    run_config = resolve_run_config(
        {
            **overrides,
            "central-dp-noise-multiplier": 1.0,
            "central-dp-clipping-norm": 1.0,
            "output-dir": str(tmp_path),
        }
    )
    grid = InProcessGrid(client_app, 4, run_config)
    config = ExperimentConfig.from_run_config(run_config)
    with pytest.raises(ValueError, match=reason) as refusal:
        run_experiment(grid, config, num_clients=4)
    assert "central-dp-noise-multiplier" in str(refusal.value)
    assert grid.wire_log == []
    assert not (tmp_path / "history.json").exists()


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"central-dp-noise-multiplier": -1.0}, "central-dp-noise-multiplier"),
        ({"central-dp-noise-multiplier": float("nan")}, "central-dp-noise-multiplier"),
        ({"central-dp-clipping-norm": 0.0}, "central-dp-clipping-norm"),
        ({"central-dp-delta": 1.0}, "central-dp-delta"),
        ({"central-dp-amplification": "binomial"}, "central-dp-amplification"),
    ],
)
def test_impossible_central_dp_keys_are_refused_by_name(
    overrides: dict[str, float | str], key: str
) -> None:
    settings = {
        "central-dp-noise-multiplier": 1.0,
        "central-dp-clipping-norm": 1.0,
        "central-dp-delta": 1e-5,
        "central-dp-amplification": "none",
    }
    with pytest.raises(ValueError, match=key):
        central_dp_of({**settings, **overrides})


def test_the_app_defaults_are_off_and_the_keys_are_read() -> None:
    assert central_dp_of(resolve_run_config({})) is None
    assert central_dp_of({}) is None
    on = resolve_run_config(
        {
            "central-dp-noise-multiplier": 0.7,
            "central-dp-clipping-norm": 2.0,
            "central-dp-delta": 1e-6,
            "central-dp-amplification": "poisson",
        }
    )
    assert ExperimentConfig.from_run_config(on).central_dp() == CentralDPSettings(
        noise_multiplier=0.7,
        clipping_norm=2.0,
        target_delta=1e-6,
        amplification="poisson",
    )
