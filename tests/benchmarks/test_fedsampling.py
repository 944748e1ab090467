"""What is specific to the FedSampling benchmark: the product's model, seeded runs.

The benchmark's pooled path must find the model that FedSampling and its
ready-made ClientApp find: same kept samples (the ClientApps' own per-node
streams), same size estimate, same step, every round.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.clientapp import ClientApp

from benchmarks.evidence import SeedRun
from benchmarks.fedsampling import (
    FEDADAM,
    FEDADAM_ETAS,
    LEARNING_RATE,
    SAMPLE_GRADIENTS,
    Setting,
    clipped_total,
    descriptions,
    fedadam_step,
    pick_fedadam_eta,
    pooled_data,
    run_seed,
    setting,
    train_rounds,
)
from flwr_importance.aggregation.server_optimizers import OptimizerState, ServerAdam
from flwr_importance.clientapps import LocalTask, register_handlers
from flwr_importance.clientapps.fedsampling import (
    UNSAFE_REPRODUCIBLE_COINS_KEY,
    make_fedsampling_handlers,
)
from flwr_importance.strategies import FedSampling
from flwr_importance.tasks import Objective, build_model
from flwr_importance.tooling.testing import InProcessGrid
from simulations.config import server_optimizer_of

#: The product's run: few clients, a few rounds (its cost is per message).
PRODUCT_SETTING = dataclasses.replace(
    setting(full=False, clamp="k"),
    num_clients=40,
    mean_size=20,
    rounds=4,
    samples_per_round=64,
)
#: float32 sums in another order (per client, then over clients, against one
#: sum over the pooled samples): the models agree to a few float32 epsilons of
#: the parameters' scale per round.
FLOAT_TOLERANCE = 1e-5


def product_models(
    setting: Setting, epsilon: float, lr: float, seed: int
) -> tuple[dict[int, dict[str, torch.Tensor]], dict[int, MetricRecord]]:
    """Global models and round metrics of FedSampling with its ClientApp, in process.

    The nodes hold the benchmark's partitions and node seeds; the initial
    model is the benchmark's.
    """
    data = pooled_data(setting, seed)
    split = data.split

    def task(context: Context) -> LocalTask:
        client = int(context.node_config["partition-id"])
        partition = split.partitions[client]
        return LocalTask(
            model=build_model("logreg", split.input_shape, split.num_outputs, seed),
            objective=Objective("classification"),
            x=partition.x,
            y=partition.y,
            lr=lr,
            batch_size=setting.batch_size,
            local_steps=1,
            seed=data.node_seeds[client],
        )

    app = register_handlers(ClientApp(), make_fedsampling_handlers(task))
    # The benchmark's pooled path draws the nodes' seeded coins: the run asks
    # the ClientApps for the same (unsafe for privacy) streams.
    run_config = {"fedsampling-epsilon": epsilon, UNSAFE_REPRODUCIBLE_COINS_KEY: True}
    grid = InProcessGrid(app, setting.num_clients, run_config, seed=seed)
    models: dict[int, dict[str, torch.Tensor]] = {}

    def keep_model(server_round: int, arrays: ArrayRecord) -> None:
        models[server_round] = arrays.to_torch_state_dict()

    strategy = FedSampling(
        samples_per_round=setting.samples_per_round,
        max_size=setting.max_size,
        epsilon=epsilon,
        server_lr=lr,
        min_available_nodes=setting.num_clients,
    )
    initial = build_model("logreg", split.input_shape, split.num_outputs, seed)
    result = strategy.start(
        grid,
        ArrayRecord(initial.state_dict()),
        num_rounds=setting.rounds,
        evaluate_fn=keep_model,
    )
    return models, result.train_metrics_clientapp


@pytest.mark.parametrize("epsilon", [3.0, 10.0])
def test_the_pooled_path_finds_the_products_model_every_round(epsilon: float) -> None:
    seed, lr = 2, 0.5
    models, metrics = product_models(PRODUCT_SETTING, epsilon, lr, seed)
    split = pooled_data(PRODUCT_SETTING, seed).split
    model = build_model("logreg", split.input_shape, split.num_outputs, seed)
    overrides: dict[str, bool | int | float | str] = {
        "method": "fedsampling",
        "epsilon": epsilon,
        "matched": True,
        LEARNING_RATE: lr,
    }
    rounds = train_rounds(PRODUCT_SETTING, overrides, seed, model)
    for server_round, trained in enumerate(rounds, start=1):
        # The same size replies: the same estimate, exactly.
        assert trained.size_estimate == metrics[server_round]["raw-size-estimate"]
        product = models[server_round]
        for name, parameter in model.state_dict().items():
            scale = float(product[name].abs().max())
            torch.testing.assert_close(
                parameter, product[name], rtol=0, atol=FLOAT_TOLERANCE * scale
            )
    assert set(models) == set(range(PRODUCT_SETTING.rounds + 1))
    # Not a trivial agreement: the model moved.
    assert any(
        not torch.equal(models[0][name], parameter)
        for name, parameter in model.state_dict().items()
    )


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
    # Each sample kept with probability K / N_clip: the round's count has mean
    # K N / N_clip and a variance below it (a sum of Bernoullis).
    data = pooled_data(tiny, 5)
    expected = (
        tiny.samples_per_round
        * data.sizes.sum()
        / clipped_total(data.sizes, tiny.max_size)
    )
    assert abs(run.extras[SAMPLE_GRADIENTS] - expected) <= 5 * np.sqrt(
        expected / tiny.rounds
    )
    assert expected > tiny.samples_per_round


def test_client_level_methods_spend_at_most_k_sample_gradients(tiny: Setting) -> None:
    for method in ("fedavg", "sizeweighted"):
        run = run_seed(
            tiny, {"method": method, "matched": True, "learning-rate": 0.1}, 5
        )
        assert run.extras[SAMPLE_GRADIENTS] <= tiny.samples_per_round
    reference = run_seed(
        tiny, {"method": "centralized", "matched": True, "learning-rate": 0.1}, 5
    )
    assert reference.extras[SAMPLE_GRADIENTS] == tiny.samples_per_round


def test_a_server_optimizer_steps_from_the_plain_round_update(tiny: Setting) -> None:
    """FedAdam's row: ServerAdam.step of the plain step's model, seeded runs."""
    plain: dict[str, str | float | bool] = {
        "method": "fedsampling",
        "epsilon": 3.0,
        "matched": True,
        LEARNING_RATE: 0.1,
    }
    overrides = {**plain, **fedadam_step(0.03)}
    optimizer = server_optimizer_of(overrides)
    assert isinstance(optimizer, ServerAdam)
    assert optimizer.eta == 0.03
    assert server_optimizer_of(plain) is None
    split = pooled_data(tiny, 5).split
    one_round = dataclasses.replace(tiny, rounds=1)
    models = [
        build_model("logreg", split.input_shape, split.num_outputs, 5) for _ in range(2)
    ]
    start = {k: v.detach().numpy().copy() for k, v in models[0].named_parameters()}
    next(train_rounds(one_round, plain, 5, models[0]))
    next(train_rounds(one_round, overrides, 5, models[1]))
    stepped, _ = optimizer.step(
        start,
        {k: v.detach().numpy() for k, v in models[0].named_parameters()},
        OptimizerState(),
        1,
    )
    for name, value in models[1].named_parameters():
        np.testing.assert_allclose(
            value.detach().numpy(),
            np.asarray(stepped[name], float),
            rtol=1e-6,
            atol=1e-7,
        )
    first = run_seed(tiny, overrides, 5)
    assert np.all(np.isfinite(first.curve)) and run_seed(tiny, overrides, 5) == first
    assert first.curve != run_seed(tiny, plain, 5).curve


def test_the_fedadam_row_shares_its_server_step(tiny: Setting) -> None:
    description = descriptions(tiny, full=False, fedadam_eta=0.03)[0]
    names = [comparison.name for comparison in description.comparisons]
    assert description.main_row == ("matched", "fedsampling eps=3")
    fedadam = next(item for item in description.comparisons if "FedAdam" in item.name)
    assert names.index(fedadam.name) > names.index("matched")
    assert fedadam.baseline == "fedavg"
    assert fedadam.claimed == ("fedsampling eps=3",)
    assert not fedadam.tuned
    # Both sides take the shared server step and override none of it.
    step = fedadam_step(0.03)
    assert {key: fedadam.shared[key] for key in step} == step
    assert fedadam.shared["server-optimizer"] == "adam"
    for overrides in fedadam.methods.values():
        assert not any(key.startswith("server-optimizer") for key in overrides)


def test_the_fedadam_eta_is_the_baselines_best_on_the_tuning_seeds(
    tiny: Setting,
) -> None:
    """Only the baseline on the tuning seeds, at every eta; the best mean final wins."""
    calls: list[tuple[str, float, int]] = []
    best = FEDADAM_ETAS[1]

    def run(overrides: Mapping[str, bool | int | float | str], seed: int) -> SeedRun:
        eta = float(overrides["server-optimizer-eta"])
        calls.append((str(overrides["method"]), eta, seed))
        assert {key: overrides[key] for key in FEDADAM} == FEDADAM
        # The first eta diverges (NaN): it must not win by comparing false.
        final = {0: float("nan"), 1: 0.9}.get(FEDADAM_ETAS.index(eta), 0.5)
        return SeedRun(curve=[0.1, final, final, final + 0.001 * (seed - 100)])

    assert pick_fedadam_eta(tiny, run) == best
    assert {method for method, _, _ in calls} == {"fedavg"}
    assert {(eta, seed) for _, eta, seed in calls} == {
        (eta, seed) for eta in FEDADAM_ETAS for seed in (100, 101)
    }
