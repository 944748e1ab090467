"""Flower's legacy ``FedAvg`` arguments on the legacy strategies.

A project swapping ``FedAvg(...)`` for one of ours keeps the arguments that
can apply (initial model, central and federated evaluation, fit config,
metric aggregation) and gets a ``TypeError`` naming the replacement for those
that cannot (``fraction_fit``: the method chooses its own clients).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from flwr.common import Scalar, ndarrays_to_parameters
from flwr.server import Server

from flwr_importance import compat
from flwr_importance.clientapps.isfedavg import make_isfedavg_handlers
from flwr_importance.compat.adapter import LegacyStrategyAdapter
from tests.compat.compat_harness import TwinFederation

#: Each legacy class and the argument that sets the round's size.
CLASSES: dict[str, tuple[Callable[..., LegacyStrategyAdapter], dict[str, int]]] = {
    "isfedavg": (compat.ISFedAvg, {"clients_per_round": 3}),
    "folb": (compat.FOLB, {"clients_per_round": 3}),
    "clustered": (compat.ClusteredSampling, {"clients_per_round": 3}),
    "md": (compat.MDSampling, {"clients_per_round": 3}),
    "ocs": (compat.OptimalClientSampling, {"clients_per_round": 3}),
    "fedsampling": (compat.FedSampling, {"samples_per_round": 64}),
}
INITIAL = ndarrays_to_parameters([np.zeros(3, np.float32)])


#: What ``fit_metrics_aggregation_fn`` and its evaluate twin receive.
ClientMetrics = list[tuple[int, dict[str, Scalar]]]


def weighted_accuracy(metrics: ClientMetrics) -> dict[str, Scalar]:
    """The quickstart's metric aggregation."""
    total = sum(num_examples for num_examples, _ in metrics)
    return {"accuracy": sum(n * float(m["accuracy"]) for n, m in metrics) / total}


def central_evaluation(
    server_round: int, weights: Any, config: dict[str, Scalar]
) -> tuple[float, dict[str, Scalar]]:
    return 0.0, {}


def quickstart_arguments(federated_evaluation: bool) -> dict[str, Any]:
    """What Flower's quickstart passes to ``FedAvg``, less ``fraction_fit``."""
    arguments: dict[str, Any] = {
        "min_available_clients": 3,
        "initial_parameters": INITIAL,
        "evaluate_fn": central_evaluation,
        "on_fit_config_fn": lambda server_round: {"lr": 0.1},
    }
    if federated_evaluation:
        arguments |= {
            "fraction_evaluate": 0.5,
            "min_evaluate_clients": 2,
            "evaluate_metrics_aggregation_fn": weighted_accuracy,
        }
    return arguments


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_quickstart_fedavg_arguments_are_taken(name: str) -> None:
    cls, size = CLASSES[name]
    evaluation = name != "fedsampling"
    strategy = cls(**size, **quickstart_arguments(federated_evaluation=evaluation))
    assert strategy.initial_parameters is INITIAL
    assert strategy.evaluate_fn is central_evaluation
    assert strategy.on_fit_config_fn is not None
    # min_available_clients is the method's own wait for nodes.
    assert strategy.strategy.min_available_nodes == 3


@pytest.mark.parametrize("name", sorted(CLASSES))
@pytest.mark.parametrize("argument", ["fraction_fit", "min_fit_clients"])
def test_client_selection_arguments_are_refused_naming_the_replacement(
    name: str, argument: str
) -> None:
    cls, size = CLASSES[name]
    replacement = "samples_per_round" if name == "fedsampling" else "clients_per_round"
    with pytest.raises(TypeError, match=f"`{argument}` does not apply") as raised:
        cls(**size, **{argument: 1.0})
    assert replacement in str(raised.value)


def test_inplace_is_refused_with_the_reason() -> None:
    with pytest.raises(TypeError, match="aggregates with its own weights"):
        compat.MDSampling(clients_per_round=3, inplace=False)


def test_evaluation_options_without_federated_evaluation_are_refused() -> None:
    with pytest.raises(TypeError, match="evaluate_metrics_aggregation_fn` has no"):
        compat.ISFedAvg(
            clients_per_round=3, evaluate_metrics_aggregation_fn=weighted_accuracy
        )


def test_min_available_clients_and_nodes_disagreeing_are_refused() -> None:
    with pytest.raises(TypeError, match="name the same setting"):
        compat.ISFedAvg(
            clients_per_round=3, min_available_clients=4, min_available_nodes=2
        )


def test_legacy_fedsampling_refuses_federated_evaluation_with_the_reason() -> None:
    with pytest.raises(ValueError, match="no federated evaluation by design"):
        compat.FedSampling(samples_per_round=64, fraction_evaluate=0.5)
    with pytest.raises(TypeError, match="carry no metrics"):
        compat.FedSampling(
            samples_per_round=64, fit_metrics_aggregation_fn=weighted_accuracy
        )


@pytest.mark.parametrize("name", ["ocs", "isfedavg"])
def test_legacy_evaluation_is_what_the_method_announces(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Federated evaluation asked for: no "will be skipped", and it is sent."""
    cls, size = CLASSES[name]
    with caplog.at_level(logging.WARNING):
        strategy = cls(**size, fraction_evaluate=0.5)
    assert "Federated evaluation will be skipped" not in caplog.text
    assert strategy.strategy.fraction_evaluate == strategy.fraction_evaluate == 0.5
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        silent = cls(**size)
    assert "Federated evaluation will be skipped" in caplog.text
    assert silent.fraction_evaluate == 0.0


def test_legacy_isfedavg_evaluates_merges_fit_config_and_metrics() -> None:
    """The quickstart's arguments run: federated and central evaluation happen,
    the fit config reaches the clients, fit metrics are aggregated."""
    federation = TwinFederation(
        {"strategy": "isfedavg", "local-steps": 2, "samples-per-client": 20}, 4
    )
    central_rounds: list[int] = []
    fit_metrics: list[ClientMetrics] = []

    def evaluate_fn(
        server_round: int, weights: Any, config: dict[str, Scalar]
    ) -> tuple[float, dict[str, Scalar]]:
        central_rounds.append(server_round)
        return 1.0, {}

    def count_fits(metrics: ClientMetrics) -> dict[str, Scalar]:
        fit_metrics.append(metrics)
        return {"fit-results": len(metrics)}

    strategy = compat.ISFedAvg(
        clients_per_round=2,
        seed=0,
        fraction_evaluate=0.5,
        min_evaluate_clients=2,
        min_available_clients=4,
        initial_parameters=ndarrays_to_parameters(federation.initial),
        evaluate_fn=evaluate_fn,
        on_fit_config_fn=lambda server_round: {"user-setting": server_round},
        evaluate_metrics_aggregation_fn=weighted_accuracy,
        fit_metrics_aggregation_fn=count_fits,
    )
    manager = federation.legacy_client_manager(make_isfedavg_handlers)
    instructions = strategy.configure_fit(1, strategy.initial_parameters, manager)
    assert [ins.config["user-setting"] for _, ins in instructions] == [1, 1]

    history, _ = Server(client_manager=manager, strategy=strategy).fit(2, timeout=None)

    assert [server_round for server_round, _ in history.losses_distributed] == [1, 2]
    assert set(history.metrics_distributed) == {"accuracy"}
    assert central_rounds == [0, 1, 2]
    assert history.metrics_distributed_fit["fit-results"] == [(1, 2), (2, 2)]
    # The transport's array layout is not the user's metric.
    assert all("compat-array-layout" not in m for _, m in fit_metrics[0])


def test_accept_failures_false_keeps_the_model_after_a_failure() -> None:
    strategy = compat.MDSampling(clients_per_round=3, accept_failures=False)
    assert strategy.aggregate_fit(1, [], [RuntimeError("node lost")]) == (None, {})


def test_legacy_options_are_exported_and_also_taken_bundled() -> None:
    options = compat.LegacyOptions(initial_parameters=INITIAL, fraction_evaluate=0.5)
    strategy = compat.ClusteredSampling(
        clients_per_round=3, legacy=options, min_evaluate_clients=3
    )
    assert strategy.initial_parameters is INITIAL
    assert (strategy.fraction_evaluate, strategy.min_evaluate_clients) == (0.5, 3)
    assert strategy.strategy.min_evaluate_nodes == 3


#: A legacy option the method refuses, its legacy and its Message-API name.
REFUSED_LEGACY_OPTIONS: list[tuple[dict[str, Any], str, str]] = [
    ({"min_available_clients": 0}, "min_available_clients", "min_available_nodes"),
    (
        {"fraction_evaluate": 0.5, "min_evaluate_clients": -1},
        "min_evaluate_clients",
        "min_evaluate_nodes",
    ),
]


@pytest.mark.parametrize(
    ("name", "arguments", "legacy_name", "message_api_name"),
    [
        (name, *case)
        for name in sorted(CLASSES)
        for case in REFUSED_LEGACY_OPTIONS
        # FedSampling refuses federated evaluation itself, before the count.
        if not (name == "fedsampling" and "fraction_evaluate" in case[0])
    ],
)
def test_the_method_refusing_a_legacy_option_names_the_legacy_parameter(
    name: str, arguments: dict[str, Any], legacy_name: str, message_api_name: str
) -> None:
    cls, size = CLASSES[name]
    with pytest.raises(ValueError) as raised:
        cls(**size, **arguments)
    assert legacy_name in str(raised.value)
    assert message_api_name not in str(raised.value)


def test_a_message_api_name_keeps_its_name_in_the_error() -> None:
    with pytest.raises(ValueError, match="min_available_nodes must be >= 1"):
        compat.FOLB(clients_per_round=3, min_available_nodes=0)
