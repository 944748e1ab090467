"""FedSampling under SecAgg+, in process: the example's apps and Flower's workflow.

The SecAgg+ example's strategy and ClientApp (``examples/secaggplus``) run
under Flower's own ``DefaultWorkflow`` with its ``SecAggPlusWorkflow`` (the
four stages, masks, Shamir shares, quantization) on an in-process grid that
serializes every message; the same run without SecAgg+ is the reference.
About 10 s in all. ``flwr run`` of the example is
``tests/e2e/examples/test_examples.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomllib
from flwr.app import MessageType
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow

from flwr_importance import compat
from flwr_importance.tooling.testing import InProcessGrid
from tests.model_bounds import (
    drift_beyond_bounds,
    fedsampling_step_bound,
)

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "secaggplus"
NUM_NODES = 4
ROUNDS = 2


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The example's package, importable as under ``flwr run``."""
    monkeypatch.syspath_prepend(str(EXAMPLE_DIR))
    import secaggplus_app.client_app
    import secaggplus_app.server_app

    return secaggplus_app


def run_config(**overrides: Any) -> dict[str, Any]:
    """The example's default run config for ``NUM_NODES`` nodes, with ``overrides``."""
    pyproject = tomllib.loads((EXAMPLE_DIR / "pyproject.toml").read_text())
    config = dict(pyproject["tool"]["flwr"]["app"]["config"])
    # Secure and plain runs are compared on the same seeded coins (unsafe for
    # privacy, docs/privacy.md).
    reproducible = {
        "fedsampling-unsafe-reproducible-coins": True,
        "secure-aocs-unsafe-public-draws": True,
    }
    return {**config, "num-supernodes": NUM_NODES, **reproducible, **overrides}


def run_workflow(
    example: Any,
    strategy: Strategy,
    fit_workflow: SecAggPlusWorkflow | None,
    config: dict[str, Any],
    num_nodes: int = NUM_NODES,
) -> InProcessGrid:
    """``ROUNDS`` rounds of Flower's legacy workflow on the example's ClientApp."""
    grid = InProcessGrid(example.client_app.app, num_nodes, config, seed=0)
    grid.run_legacy(strategy, num_rounds=ROUNDS, fit_workflow=fit_workflow)
    return grid


class RecordedModels:
    """The example's central evaluation, also keeping each round's global model."""

    def __init__(self, example: Any, config: dict[str, Any]) -> None:
        self.evaluate = example.server_app.central_evaluation(config, NUM_NODES)
        self.models: list[list[np.ndarray]] = []

    def __call__(self, server_round: int, weights: Any, fit_config: Any) -> Any:
        self.models.append([np.asarray(weight, np.float64) for weight in weights])
        return self.evaluate(server_round, weights, fit_config)


def fedsampling_run(
    example: Any, *, secure: bool, **overrides: Any
) -> tuple[RecordedModels, InProcessGrid]:
    """The example's FedSampling, with its SecAgg+ workflow or the plain one."""
    config = run_config(**overrides)
    workflow = example.server_app.secaggplus_workflow(config) if secure else None
    recorded = RecordedModels(example, config)
    strategy = example.server_app.fedsampling(config, NUM_NODES, workflow, recorded)
    grid = run_workflow(example, strategy, workflow, config)
    return recorded, grid


def test_secure_sum_gives_the_plain_model_within_the_quantization_bound(
    example: Any,
) -> None:
    """Each round's model is the plain run's, up to SecAgg+'s documented error.

    Same seeds, so the same kept samples and size replies: the runs differ
    only by SecAgg+'s stochastic rounding. After round 1, by less than
    ``eta n 2c/Q`` in every coordinate; after round ``t``, by less than
    ``t eta n 2c/Q sqrt(d)`` in Euclidean norm (docs/privacy.md). The
    server saw no node's ``G_c``: every train reply reached it without arrays.
    """
    secure, grid = fedsampling_run(example, secure=True)
    plain, _ = fedsampling_run(example, secure=False)

    step_bound = fedsampling_step_bound(run_config(), NUM_NODES)
    assert drift_beyond_bounds(secure.models, plain.models, step_bound) == []

    train_replies = [
        record.message()
        for record in grid.wire_log
        if record.direction == "to-server" and record.message_type == MessageType.TRAIN
    ]
    assert len(train_replies) == 4 * NUM_NODES * ROUNDS  # SecAgg+'s four stages
    assert all(
        not any(len(record) for record in reply.content.array_records.values())
        for reply in train_replies
    )


# Its nodes send weight 0, so Flower's unmask stage divides by zero.
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_secure_results_reaching_a_strategy_not_told_so_raise(example: Any) -> None:
    config = run_config()
    workflow = example.server_app.secaggplus_workflow(config)
    strategy = example.server_app.fedsampling(
        config, NUM_NODES, None, RecordedModels(example, config)
    )
    with pytest.raises(RuntimeError, match="secure_aggregation=SecAggPlusWorkflow"):
        run_workflow(example, strategy, workflow, config)


def test_plain_results_reaching_a_strategy_told_secure_raise(example: Any) -> None:
    config = run_config()
    workflow = example.server_app.secaggplus_workflow(config)
    strategy = example.server_app.fedsampling(
        config, NUM_NODES, workflow, RecordedModels(example, config)
    )
    with pytest.raises(RuntimeError, match="runs no SecAggPlusWorkflow"):
        run_workflow(example, strategy, None, config)


def test_a_round_of_one_node_is_skipped_and_a_wrapping_sum_refused(
    example: Any,
) -> None:
    """One node: no secure sum, the model stays; too many for ``Q``: an error."""
    # One node holds every sample: a size bound above them, a usable epsilon.
    config = run_config(
        **{
            "num-supernodes": 1,
            "fedsampling-max-size": 2048,
            "fedsampling-epsilon": 20.0,
        }
    )
    workflow = example.server_app.secaggplus_workflow(config)
    recorded = RecordedModels(example, config)
    strategy = example.server_app.fedsampling(config, 1, workflow, recorded)
    run_workflow(example, strategy, workflow, config, num_nodes=1)
    assert len(recorded.models) == ROUNDS + 1
    for model in recorded.models[1:]:
        for array, initial in zip(model, recorded.models[0], strict=True):
            np.testing.assert_array_equal(array, initial)

    # (2^32 - 1) // 2^31 = 1 reply at most: two nodes would wrap around.
    config = run_config(**{"quantization-range": 2**31})
    workflow = example.server_app.secaggplus_workflow(config)
    strategy = example.server_app.fedsampling(
        config, NUM_NODES, workflow, RecordedModels(example, config)
    )
    with pytest.raises(ValueError, match="wraps around above 1 replies"):
        run_workflow(example, strategy, workflow, config)


@pytest.mark.parametrize(
    ("workflow", "error", "match"),
    [
        ("not a workflow", TypeError, "must be the ServerApp's SecAggPlusWorkflow"),
        (SecAggPlusWorkflow(3, 2, max_weight=2.5), ValueError, "whole max_weight"),
    ],
)
def test_a_workflow_fedsampling_cannot_use_is_refused_at_construction(
    workflow: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        compat.FedSampling(samples_per_round=8, secure_aggregation=workflow)


def test_the_public_weight_travels_in_the_fit_config(example: Any) -> None:
    """Each fit carries ``secure-sum-weight = max_weight``; each reply that count.

    The count travels in the clear (SecAgg+ masks arrays only): it is the
    same public number on every node.
    """
    _, grid = fedsampling_run(example, secure=True, **{"max-weight": 7})
    messages = [
        (record.direction, record.message())
        for record in grid.wire_log
        if record.message_type == MessageType.TRAIN
    ]
    fit_configs = [
        message.content.config_records["fitins.config"]
        for direction, message in messages
        if direction == "to-node" and "fitins.config" in message.content.config_records
    ]
    counts = [
        message.content.metric_records["fitres.num_examples"]["num_examples"]
        for direction, message in messages
        if direction == "to-server"
        and "fitres.num_examples" in message.content.metric_records
    ]
    assert len(fit_configs) == len(counts) == NUM_NODES * ROUNDS
    assert {config["secure-sum-weight"] for config in fit_configs} == {7}
    assert set(counts) == {7}
