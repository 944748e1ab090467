"""What every strategy inherits from ``ImportanceStrategy``.

Keyword-only constructors with the same checked settings and defaults, a round
plan that only its own round may use, replies from nodes that were not sent a
message dropped, messages under the configured record keys, and a summary that
logs only the settings that apply.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message

from flwr_importance.method_spec import MethodSpec
from flwr_importance.protocol import NUM_EXAMPLES
from flwr_importance.registry import methods
from flwr_importance.strategies import (
    FOLB,
    ClusteredSampling,
    FedSampling,
    ISFedAvg,
    MDSampling,
    MultiModelSampling,
    OptimalClientSampling,
    PowerOfChoice,
    pack_models,
)
from flwr_importance.strategies.base import ImportanceStrategy
from flwr_importance.tooling.testing import InProcessGrid
from tests.strategies.test_plumbing import reply
from tests.strategies.test_server_warnings import MODEL
from tests.strategies.test_server_warnings import app as query_app

#: Each strategy with its required arguments; keyword arguments are added.
BUILDERS: dict[str, Callable[..., ImportanceStrategy[Any]]] = {
    "isfedavg": lambda **kw: ISFedAvg(clients_per_round=3, **kw),
    "folb": lambda **kw: FOLB(clients_per_round=3, **kw),
    "fedsampling": lambda **kw: FedSampling(samples_per_round=16, **kw),
    "md": lambda **kw: MDSampling(clients_per_round=3, **kw),
    "clustered": lambda **kw: ClusteredSampling(clients_per_round=3, **kw),
    "ocs": lambda **kw: OptimalClientSampling(clients_per_round=3, **kw),
    "mmfl": lambda **kw: MultiModelSampling(num_models=1, clients_per_round=3, **kw),
    "power-of-choice": lambda **kw: PowerOfChoice(clients_per_round=3, **kw),
}

#: The first required argument of each class, given positionally.
POSITIONAL: dict[str, Callable[[], object]] = {
    "isfedavg": lambda: ISFedAvg(3),  # type: ignore[misc]
    "folb": lambda: FOLB(3),  # type: ignore[misc]
    "fedsampling": lambda: FedSampling(16),  # type: ignore[misc]
    "md": lambda: MDSampling(3),  # type: ignore[misc]
    "clustered": lambda: ClusteredSampling(3),  # type: ignore[misc]
    "ocs": lambda: OptimalClientSampling(3),  # type: ignore[misc]
    "mmfl": lambda: MultiModelSampling(1, 3),  # type: ignore[misc]
    "power-of-choice": lambda: PowerOfChoice(3),  # type: ignore[misc]
}

#: The defaults a class states as its own, with the reason in its docstring.
STATED_DIFFERENCES: dict[str, dict[str, object]] = {
    # Evaluation would reveal the sizes; S packed models are evaluated centrally.
    # FedAvg zeroes min_evaluate_nodes when evaluation is off.
    "fedsampling": {"fraction_evaluate": 0.0, "min_evaluate_nodes": 0},
    "mmfl": {"fraction_evaluate": 0.0, "min_evaluate_nodes": 0},
}

SHARED_DEFAULTS: dict[str, object] = {
    "seed": 0,
    "query_timeout": 600.0,
    "fraction_evaluate": 1.0,
    "min_evaluate_nodes": 2,
    "min_available_nodes": 1,
    "weighted_by_key": NUM_EXAMPLES,
    "arrayrecord_key": "arrays",
    "configrecord_key": "config",
}


@pytest.mark.parametrize("name", sorted(POSITIONAL))
def test_constructors_are_keyword_only(name: str) -> None:
    with pytest.raises(TypeError, match="positional"):
        POSITIONAL[name]()


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_shared_settings_have_the_same_defaults_everywhere(name: str) -> None:
    strategy = BUILDERS[name]()
    expected = {**SHARED_DEFAULTS, **STATED_DIFFERENCES.get(name, {})}
    assert {key: getattr(strategy, key) for key in expected} == expected


@pytest.mark.parametrize("name", sorted(BUILDERS))
@pytest.mark.parametrize(
    ("setting", "error", "message"),
    [
        ({"seed": -1}, ValueError, "seed must be >= 0"),
        ({"seed": 1.5}, TypeError, "seed must be an int"),
        ({"query_timeout": 0}, ValueError, "query_timeout must be finite and > 0"),
        ({"query_timeout": "10"}, TypeError, "query_timeout must be a number"),
        ({"fraction_evaluate": 1.5}, ValueError, r"fraction_evaluate must lie in"),
        ({"min_evaluate_nodes": -1}, ValueError, "min_evaluate_nodes must be >= 0"),
        ({"min_available_nodes": 0}, ValueError, "min_available_nodes must be >= 1"),
        ({"configrecord_key": "arrays"}, ValueError, "need their own keys"),
        ({"arrayrecord_key": 3}, TypeError, "keys must be str"),
        ({"weighted_by_key": ""}, ValueError, "must not be empty"),
        ({"evaluate_metrics_aggr_fn": "mean"}, TypeError, "must be callable"),
    ],
)
def test_bad_shared_settings_raise_naming_the_setting(
    name: str, setting: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        BUILDERS[name](**setting)


@pytest.mark.parametrize("name", ["fedsampling", "mmfl"])
def test_federated_evaluation_is_refused_with_the_reason(name: str) -> None:
    with pytest.raises(ValueError, match=r"fraction_evaluate=0\.5: .*evaluate"):
        BUILDERS[name](fraction_evaluate=0.5)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_summary_logs_only_what_applies(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    strategy = BUILDERS[name]()
    with caplog.at_level(logging.INFO):
        strategy.summary()
    text = caplog.text
    # FedAvg's train sampling (fraction_train, min_train_nodes) never applies.
    assert "train (" not in text and "Fraction: train" not in text
    assert "Minimum available nodes: " in text
    assert ("Seed: 0" in text) == (name != "fedsampling")
    assert ("Query timeout" in text) == (name not in ("isfedavg", "folb"))
    assert ("ArrayRecord: 'arrays'" in text) == (name != "mmfl")
    if strategy.fraction_evaluate == 0:
        assert "Off: " in text and "Minimum nodes" not in text
    else:
        assert "Fraction: 1.00" in text


def test_summary_logs_the_query_timeout_only_where_queries_are_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO):
        FOLB(clients_per_round=3, mode="two-set").summary()
    assert "Query timeout: 600 s" in caplog.text


def test_a_plan_is_used_only_by_its_own_round(caplog: pytest.LogCaptureFixture) -> None:
    strategy = MDSampling(clients_per_round=2, fraction_evaluate=0.0)
    grid = InProcessGrid(query_app, num_nodes=4)
    messages = list(strategy.configure_train(1, MODEL, ConfigRecord(), grid))
    replies = [
        reply(message.metadata.dst_node_id, MODEL, {NUM_EXAMPLES: 10})
        for message in messages
    ]
    with caplog.at_level(logging.WARNING):
        assert strategy.aggregate_train(2, replies) == (None, None)
    assert "the kept plan is round 1's, not round 2's" in caplog.text
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None


def test_no_plan_leaves_the_model_unchanged(caplog: pytest.LogCaptureFixture) -> None:
    for name, build in BUILDERS.items():
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert build().aggregate_train(1, []) == (None, None), name
        assert "no plan for round 1" in caplog.text, name


def test_replies_from_nodes_not_sent_a_message_are_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = MDSampling(clients_per_round=2, fraction_evaluate=0.0)
    grid = InProcessGrid(query_app, num_nodes=4)
    messages = list(strategy.configure_train(1, MODEL, ConfigRecord(), grid))
    sent = {message.metadata.dst_node_id for message in messages}
    stranger = min(set(grid.get_node_ids()) - sent)
    replies = [reply(node, MODEL, {NUM_EXAMPLES: 10}) for node in sorted(sent)]
    # A well-formed reply, from a node that was not drawn: it must not count.
    far_off = ArrayRecord([np.full(3, 1e6, np.float32)])
    replies.append(reply(stranger, far_off, {NUM_EXAMPLES: 10}))
    with caplog.at_level(logging.WARNING):
        arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None
    np.testing.assert_array_equal(arrays.to_numpy_ndarrays()[0], np.zeros(3))
    assert f"node {stranger} excluded: it was not sent a message" in caplog.text


class RecordingGrid(InProcessGrid):
    """An in-process grid that keeps every message sent, queries included."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[Message] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Keep ``messages``, then deliver them."""
        messages = list(messages)
        self.sent += messages
        return super().push_messages(messages)


@pytest.mark.parametrize(
    "name", ["md", "ocs", "mmfl", "power-of-choice", "fedsampling"]
)
def test_every_message_honours_the_record_keys(name: str) -> None:
    strategy = BUILDERS[name](configrecord_key="cfg", arrayrecord_key="model")
    arrays = pack_models([MODEL]) if name == "mmfl" else MODEL
    grid = RecordingGrid(query_app, num_nodes=4)
    sent = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    sent += strategy.configure_evaluate(1, arrays, ConfigRecord(), grid)
    sent += grid.sent  # the queries too
    assert sent
    for message in sent:
        assert list(message.content.config_records) == ["cfg"], message.metadata
        # One model travels under arrayrecord_key, a query's under the
        # protocol's model-0.
        assert set(message.content.array_records) <= {"model", "model-0"}


#: The argument that sizes each class's rounds, named by its refusals.
ROUND_SIZE = {"fedsampling": "samples_per_round"}


@pytest.mark.parametrize("name", sorted(BUILDERS))
@pytest.mark.parametrize(
    ("argument", "value"), [("fraction_train", 0.5), ("min_train_nodes", 2)]
)
def test_fedavg_round_size_arguments_are_refused_naming_the_replacement(
    name: str, argument: str, value: float
) -> None:
    replacement = ROUND_SIZE.get(name, "clients_per_round")
    with pytest.raises(TypeError) as raised:
        BUILDERS[name](**{argument: value})
    message = str(raised.value)
    assert message.startswith(f"{argument} does not apply to ")
    assert f"pass {replacement}=..." in message


@pytest.mark.parametrize("spec", methods(), ids=lambda spec: spec.name)
def test_fedavg_round_size_argument_alone_is_refused_naming_the_replacement(
    spec: MethodSpec,
) -> None:
    """``FedAvg(fraction_train=0.5)`` swapped for a method, nothing else changed:
    the refusal names the replacement, not Python's missing argument."""
    replacement = ROUND_SIZE.get(spec.name, "clients_per_round")
    with pytest.raises(TypeError) as raised:
        spec.strategy(fraction_train=0.5)
    message = str(raised.value)
    assert message.startswith("fraction_train does not apply to ")
    assert f"pass {replacement}=..." in message


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_train_metrics_aggr_fn_only_where_it_averages(name: str) -> None:
    def mean(contents: list[Any], key: str) -> Any:
        raise AssertionError("not called here")

    if name in ("isfedavg", "folb"):
        assert BUILDERS[name](train_metrics_aggr_fn=mean).train_metrics_aggr_fn is mean
        return
    with pytest.raises(TypeError, match="train_metrics_aggr_fn does not apply to"):
        BUILDERS[name](train_metrics_aggr_fn=mean)


def test_an_unknown_keyword_is_refused_as_python_would() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'fraction_trian'"):
        MDSampling(clients_per_round=3, fraction_trian=0.5)  # type: ignore[call-arg]
