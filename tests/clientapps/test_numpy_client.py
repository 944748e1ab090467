"""The user's own NumPyClient on the legacy API: compat.importance_client_fn.

Unit tests drive :class:`~flwr_importance.compat.ImportanceClient` with the
calls the legacy transport makes (config keys ``compat-message-type`` and
``compat-array-layout``) around a NumPy-only client that counts its calls;
then Flower's legacy server loop runs the library's legacy strategies on such
clients, and the quickstart-pytorch-legacy example for every method it
serves, in process (the example under ``flwr run`` is
``tests/e2e/examples/test_legacy_numpyclient_example.py``).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from flwr.client import Client, NumPyClient
from flwr.common import (
    Code,
    EvaluateIns,
    FitIns,
    GetPropertiesIns,
    NDArrays,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)

from flwr_importance import compat, protocol
from flwr_importance.legacy_wire import ARRAY_LAYOUT_KEY, MESSAGE_TYPE_KEY
from tests.compat.compat_harness import run_legacy
from tests.examples.test_legacy import client_manager
from tests.test_server_side_imports import FORBIDDEN, loaded_in_fresh_interpreter

EXAMPLE_DIR = (
    Path(__file__).resolve().parents[2] / "examples" / "quickstart-pytorch-legacy"
)
#: The user's model: two arrays, as a NumPyClient sends them.
START = [np.array([1.0, -2.0], np.float32), np.array([[3.0]], np.float32)]
#: Each ``fit`` moves every weight halfway to this target.
TARGET = 5.0
TRAIN_SIZE = 7
VALIDATION_SIZE = 3


class CountingClient(NumPyClient):
    """A NumPy-only user client: a deterministic ``fit``; every call counted."""

    def __init__(self, calls: Counter[str], node_id: int = 1) -> None:
        self.calls = calls
        self.node_id = node_id

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """Halfway to TARGET; reports a train loss and a text metric."""
        self.calls["fit"] += 1
        self.calls[
            f"fit-{self.node_id}-round-{int(config.get('server-round', 0))}"
        ] += 1
        self.calls["config-keys"] = len(config)
        trained = [value + (TARGET - value) / 2 for value in parameters]
        return trained, TRAIN_SIZE, {"train_loss": 0.25, "note": "text"}

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        """The squared distance to TARGET as the loss."""
        self.calls["evaluate"] += 1
        loss = float(sum(np.sum((value - TARGET) ** 2) for value in parameters))
        return loss, VALIDATION_SIZE, {"accuracy": 0.5}


class ClientWithParameters(CountingClient):
    """The same client, able to say its initial parameters."""

    def get_parameters(self, config: dict[str, Scalar]) -> NDArrays:
        """The user's initial model."""
        return [value.copy() for value in START]


def wrapped(
    calls: Counter[str],
    client_class: type[CountingClient] = CountingClient,
    **options: Any,
) -> tuple[Client, Context]:
    """The wrapped client of a fresh node, and that node's context."""
    context = Context(
        run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={}
    )
    client_fn = compat.importance_client_fn(
        lambda ctx: client_class(calls).to_client(), **options
    )
    return client_fn(context), context


def compat_config(
    message_type: str, layout: list[list[Any]] | None = None, **config: Scalar
) -> dict[str, Scalar]:
    """The config of a legacy-transport call of ``message_type``."""
    keys: dict[str, Scalar] = {MESSAGE_TYPE_KEY: message_type, "server-round": 1}
    if layout is not None:
        keys[ARRAY_LAYOUT_KEY] = json.dumps(layout)
    return {**keys, **config}


def size_query(client: Client) -> dict[str, Scalar]:
    """The properties the client answers ``query.sizes`` with."""
    result = client.get_properties(GetPropertiesIns(compat_config("query.sizes")))
    assert result.status.code == Code.OK
    return result.properties


def norm_query(client: Client) -> dict[str, Scalar]:
    """The metrics of the client's ``query.norm`` reply (it returns no arrays)."""
    result = client.fit(
        FitIns(
            ndarrays_to_parameters(START),
            compat_config("query.norm", [["model-0", 2]], lr=0.1),
        )
    )
    assert parameters_to_ndarrays(result.parameters) == []
    return result.metrics


def kept_update_train(client: Client) -> tuple[NDArrays, dict[str, Scalar]]:
    """The arrays and metrics of the round's train call asking for the kept update."""
    result = client.fit(
        FitIns(
            ndarrays_to_parameters([]),
            compat_config("train", [], **{"model-index": 0, "kept-update": True}),
        )
    )
    return parameters_to_ndarrays(result.parameters), result.metrics


def test_the_wrapper_loads_no_ml_framework() -> None:
    """A TensorFlow, JAX or scikit-learn client can be wrapped without torch."""
    probe = f"""
import json, sys
from flwr_importance import compat
compat.importance_client_fn, compat.ImportanceClient
print(json.dumps(sorted(name for name in {FORBIDDEN!r} if name in sys.modules)))
"""
    assert loaded_in_fresh_interpreter(probe) == []


# -- sizes --------------------------------------------------------------------
def test_size_query_answers_num_examples_before_any_fit() -> None:
    calls: Counter[str] = Counter()
    client, _ = wrapped(calls, num_examples=lambda context: 11)

    assert size_query(client) == {protocol.NUM_EXAMPLES: 11}
    assert calls["fit"] == 0


def test_size_query_prefers_the_count_the_users_fit_reported() -> None:
    calls: Counter[str] = Counter()
    client, _ = wrapped(calls, num_examples=lambda context: 11)
    norm_query(client)

    assert size_query(client) == {protocol.NUM_EXAMPLES: TRAIN_SIZE}


def test_size_fallback_runs_the_users_fit_once_and_keeps_the_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: Counter[str] = Counter()
    client, context = wrapped(calls, ClientWithParameters)
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addHandler(caplog.handler)
    try:
        first = size_query(client)
        again = size_query(client)
    finally:
        flwr_logger.removeHandler(caplog.handler)

    assert first == again == {protocol.NUM_EXAMPLES: TRAIN_SIZE}
    assert calls["fit"] == 1
    assert "running the client's fit once" in caplog.text
    # A new client of the same node (Flower builds one per call) reuses it.
    rebuilt = compat.importance_client_fn(
        lambda ctx: ClientWithParameters(calls).to_client()
    )(context)
    assert size_query(rebuilt) == first
    assert calls["fit"] == 1


def test_size_fallback_without_get_parameters_asks_for_num_examples() -> None:
    client, _ = wrapped(Counter())

    with pytest.raises(ValueError, match="pass num_examples="):
        size_query(client)


# -- norms and the kept update ------------------------------------------------
def test_norm_query_trains_once_and_the_train_call_sends_the_kept_update() -> None:
    calls: Counter[str] = Counter()
    client, _ = wrapped(calls)
    expected_update = [(TARGET - value) / 2 for value in START]

    metrics = norm_query(client)
    update, train_metrics = kept_update_train(client)

    assert calls["fit"] == 1
    expected_norm = np.sqrt(
        sum(np.sum(value.astype(np.float64) ** 2) for value in expected_update)
    )
    assert metrics["update-norm-0"] == pytest.approx(expected_norm)
    assert metrics["num-examples-0"] == TRAIN_SIZE
    assert metrics["train-loss-0"] == 0.25
    assert json.loads(str(train_metrics[ARRAY_LAYOUT_KEY])) == [["update", 2]]
    for got, want in zip(update, expected_update, strict=True):
        np.testing.assert_allclose(got, want)
    assert train_metrics[protocol.NUM_EXAMPLES] == TRAIN_SIZE
    assert train_metrics[protocol.TRAIN_LOSS] == 0.25
    assert train_metrics[protocol.MODEL_INDEX] == 0


def test_the_users_fit_sees_the_servers_config_without_transport_keys() -> None:
    calls: Counter[str] = Counter()
    client, _ = wrapped(calls)
    norm_query(client)

    # server-round, lr and model-index; no compat-message-type or layout.
    assert calls["config-keys"] == 3


def test_a_fit_without_a_train_loss_still_answers_the_norm_query() -> None:
    # Flower's NumPyClient quickstart reports val_loss and val_accuracy only.
    client, _ = wrapped(Counter(), train_loss_key="loss_of_training")

    metrics = norm_query(client)
    _, train_metrics = kept_update_train(client)

    assert metrics["update-norm-0"] > 0
    assert "train-loss-0" not in metrics
    assert protocol.TRAIN_LOSS not in train_metrics
    assert train_metrics[protocol.NUM_EXAMPLES] == TRAIN_SIZE


def test_a_train_call_without_a_kept_update_fails() -> None:
    client, _ = wrapped(Counter())

    with pytest.raises(ValueError, match="no kept update"):
        kept_update_train(client)


# -- losses, train replies, pass-through, refusals ------------------------------
def test_loss_query_answers_the_users_evaluate_loss() -> None:
    calls: Counter[str] = Counter()
    client, _ = wrapped(calls)

    result = client.fit(
        FitIns(
            ndarrays_to_parameters(START), compat_config("query.loss", [["model-0", 2]])
        )
    )

    expected = float(sum(np.sum((value - TARGET) ** 2) for value in START))
    assert result.metrics["loss-0"] == pytest.approx(expected)
    assert result.metrics["num-examples-0"] == VALIDATION_SIZE
    assert calls == Counter({"evaluate": 1})


def test_a_methods_train_call_adds_num_examples_and_train_loss() -> None:
    calls: Counter[str] = Counter()
    client, _ = wrapped(calls)

    result = client.fit(
        FitIns(ndarrays_to_parameters(START), compat_config("train", [["arrays", 2]]))
    )

    assert result.num_examples == TRAIN_SIZE
    assert result.metrics[protocol.NUM_EXAMPLES] == TRAIN_SIZE
    assert result.metrics[protocol.TRAIN_LOSS] == 0.25
    for got, start in zip(
        parameters_to_ndarrays(result.parameters), START, strict=True
    ):
        np.testing.assert_allclose(got, start + (TARGET - start) / 2)


def test_plain_fit_evaluate_and_properties_pass_through_unchanged() -> None:
    calls: Counter[str] = Counter()
    client, _ = wrapped(calls)
    plain = CountingClient(Counter()).to_client()
    parameters = ndarrays_to_parameters(START)

    fit_res = client.fit(FitIns(parameters, {"lr": 0.1}))
    evaluate_res = client.evaluate(EvaluateIns(parameters, {}))
    properties = client.get_properties(GetPropertiesIns({}))

    expected_fit = plain.fit(FitIns(parameters, {"lr": 0.1}))
    assert (
        fit_res.metrics == expected_fit.metrics == {"train_loss": 0.25, "note": "text"}
    )
    assert fit_res.num_examples == TRAIN_SIZE
    assert fit_res.parameters == expected_fit.parameters
    assert evaluate_res == plain.evaluate(EvaluateIns(parameters, {}))
    assert properties.status == plain.get_properties(GetPropertiesIns({})).status
    assert calls["fit"] == 1 and calls["evaluate"] == 1


def test_an_unknown_message_type_fails_naming_it() -> None:
    client, _ = wrapped(Counter())

    with pytest.raises(ValueError, match=re.escape("message type 'query.gradient'")):
        client.fit(
            FitIns(
                ndarrays_to_parameters(START),
                compat_config("query.gradient", [["model-0", 2]]),
            )
        )


@pytest.mark.parametrize(
    ("message_type", "key", "method"),
    [
        ("query.sizes", protocol.FEDSAMPLING_EPSILON, "FedSampling"),
        ("train", protocol.ISFEDAVG_CLIENT_PROB, "ISFedAvg"),
        ("train", protocol.PROXIMAL_MU, "FOLB"),
    ],
)
def test_methods_that_need_more_than_fit_and_evaluate_are_refused(
    message_type: str, key: str, method: str
) -> None:
    client, _ = wrapped(Counter(), num_examples=lambda context: 11)
    config = compat_config(message_type, [["arrays", 2]], **{key: 0.5})

    with pytest.raises(ValueError, match=method):
        client.fit(FitIns(ndarrays_to_parameters(START), config))


# -- Flower's legacy server loop ------------------------------------------------
def counting_client_fn(calls: Counter[str]) -> Any:
    """Each node's CountingClient, wrapped, its calls counted by node and round."""
    return compat.importance_client_fn(
        lambda context: CountingClient(calls, context.node_id).to_client(),
        num_examples=lambda context: TRAIN_SIZE,
    )


def test_ocs_trains_each_node_once_per_round_through_the_legacy_loop() -> None:
    calls: Counter[str] = Counter()
    strategy = compat.OptimalClientSampling(
        clients_per_round=3,
        seed=0,
        initial_parameters=ndarrays_to_parameters(START),
    )

    final = run_legacy(strategy, client_manager(counting_client_fn(calls), {}), 2)

    per_node_and_round = {
        key: count for key, count in calls.items() if key.startswith("fit-")
    }
    # Every one of the 10 nodes trained at each round's norm query, and only then.
    assert len(per_node_and_round) == 20
    assert set(per_node_and_round.values()) == {1}
    assert any(not np.allclose(a, b) for a, b in zip(final, START, strict=True))


@pytest.mark.parametrize("method", ["md", "power-of-choice"])
def test_size_and_loss_methods_train_through_the_legacy_loop(method: str) -> None:
    calls: Counter[str] = Counter()
    strategy = compat.legacy_class(method)(
        clients_per_round=3, seed=0, initial_parameters=ndarrays_to_parameters(START)
    )

    final = run_legacy(strategy, client_manager(counting_client_fn(calls), {}), 2)

    assert 1 <= calls["fit"] <= 6
    assert any(not np.allclose(a, b) for a, b in zip(final, START, strict=True))


# -- the quickstart-pytorch-legacy example, in process ----------------------------
#: The example's methods, its server's ``METHODS``: each must train below.
EXAMPLE_METHODS = [
    "fedavg",
    "md",
    "clustered",
    "clustered-similarity",
    "ocs",
    "aocs",
    "power-of-choice",
]


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The example's server and client modules, importable as under ``flwr run``."""
    monkeypatch.syspath_prepend(str(EXAMPLE_DIR))
    from quickstart_legacy import client_app, server_app

    return server_app, client_app


def test_the_example_lists_the_methods_trained_here(example: Any) -> None:
    server_app, _ = example
    assert list(server_app.METHODS) == EXAMPLE_METHODS


@pytest.mark.parametrize("method", EXAMPLE_METHODS)
def test_every_method_trains_the_example_in_the_legacy_loop(
    example: Any, method: str
) -> None:
    import tomllib

    server_app, client_app = example
    run_config = dict(
        tomllib.loads((EXAMPLE_DIR / "pyproject.toml").read_text())["tool"]["flwr"][
            "app"
        ]["config"]
    )
    run_config.update(strategy=method, **{"num-server-rounds": 2})
    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    components = server_app.server_fn(context)
    initial = parameters_to_ndarrays(components.strategy.initial_parameters)
    client_fn = compat.importance_client_fn(
        client_app.client_fn, num_examples=client_app.train_size
    )

    final = run_legacy(components.strategy, client_manager(client_fn, run_config), 2)

    assert any(not np.allclose(a, b) for a, b in zip(initial, final, strict=True))
