"""AOCS in the SecAgg+ example, in process: its own apps and Flower's workflows.

The example's ``main`` (``examples/secaggplus``, ``strategy = "aocs"``) runs
Flower's ``DefaultWorkflow`` around ``SecureAOCSWorkflow`` and Flower's
``SecAggPlusWorkflow`` on an in-process grid that serializes every message,
its ClientApp (the digits MLP, ``handler_client_fn`` with
``make_ocs_handlers``, inside ``importance_secaggplus_mod`` and
``secure_aocs_mod``) answering; then the same app under the plain workflow.
The exact secure-against-plain comparison is ``test_secure_aocs.py`` (in
process) and ``test_wire_capture.py`` (two ``flwr run``s on one deployment).
About 10 s.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, Message

from flwr_importance.tooling.testing import InProcessGrid
from tests.compat.test_secure_aocs import PRIVATE_KEYS
from tests.examples.test_secaggplus import (
    EXAMPLE_DIR,
    NUM_NODES,
    ROUNDS,
    run_config,
)


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The example's package, importable as under ``flwr run``."""
    monkeypatch.syspath_prepend(str(EXAMPLE_DIR))
    import secaggplus_app.client_app
    import secaggplus_app.server_app

    return secaggplus_app


def federation(
    example: Any, config: dict[str, Any], num_nodes: int = NUM_NODES
) -> tuple[InProcessGrid, Context]:
    """A fresh federation of the example's ClientApp, and the server's context."""
    grid = InProcessGrid(example.client_app.app, num_nodes, config, seed=0)
    return grid, grid.server_context()


def run_main(example: Any, config: dict[str, Any]) -> InProcessGrid:
    """The example's ServerApp ``main`` on a fresh federation."""
    grid, context = federation(example, config)
    example.server_app.main(grid, context)
    return grid


def aocs_config(output_dir: Path, *, secure: bool) -> dict[str, Any]:
    """The example's config for AOCS, ``ROUNDS`` rounds, one AOCS iteration."""
    return run_config(
        **{
            "strategy": "aocs",
            "secure-aggregation": secure,
            "num-server-rounds": ROUNDS,
            "aocs-iterations": 1,
            "output-dir": str(output_dir),
        }
    )


def round_models(output_dir: Path) -> list[list[np.ndarray]]:
    """Each round's global model, as the example wrote it."""
    return [
        list(np.load(output_dir / f"round-{server_round}.npz").values())
        for server_round in range(ROUNDS + 1)
    ]


def largest_change(model: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """The largest absolute difference of two models, over every coordinate."""
    return max(
        float(np.max(np.abs(a - b))) for a, b in zip(model, reference, strict=True)
    )


def reveals_a_private_value(message: Message) -> bool:
    """A reply holding an array with data, or a node's norm, size or loss.

    Flower sends "no parameters" as one data-less placeholder array.
    """
    arrays = message.content.array_records.values()
    if any(array.data for record in arrays for array in record.values()):
        return True
    records = (
        *message.content.config_records.values(),
        *message.content.metric_records.values(),
    )
    return any(PRIVATE_KEYS & set(record) for record in records)


def replies_to_server(grid: InProcessGrid) -> list[Message]:
    """Every reply that reached the server."""
    return [
        record.message() for record in grid.wire_log if record.direction == "to-server"
    ]


def test_the_example_runs_aocs_under_secaggplus_and_in_the_clear(
    example: Any, tmp_path: Path
) -> None:
    """The model steps each round; under SecAgg+ no reply reveals a value.

    The plain run's replies carry the norms and updates that the secure run's
    hide. The secure-against-plain comparison of models is
    ``test_secure_aocs.py`` (the AOCS test app, in process) and
    ``test_wire_capture.py`` (this example, two ``flwr run``s on one
    deployment): here the two runs follow each other in one process, and in
    a CI run they once trained differently (0.02 apart, a third of the step).
    """
    secure_dir, plain_dir = tmp_path / "secure", tmp_path / "plain"
    secure_grid = run_main(example, aocs_config(secure_dir, secure=True))
    plain_grid = run_main(example, aocs_config(plain_dir, secure=False))

    secure, plain = round_models(secure_dir), round_models(plain_dir)
    for models in (secure, plain):
        assert all(
            largest_change(after, before) > 0
            for before, after in itertools.pairwise(models)
        )
    history = json.loads((secure_dir / "history.json").read_text())
    assert [row["round"] for row in history] == list(range(ROUNDS + 1))

    secure_replies = replies_to_server(secure_grid)
    assert secure_replies
    assert not any(reveals_a_private_value(reply) for reply in secure_replies)
    assert any(
        reveals_a_private_value(reply) for reply in replies_to_server(plain_grid)
    )


@pytest.mark.parametrize(
    ("overrides", "num_nodes", "match"),
    [
        ({"aocs-clients-per-round": 1}, NUM_NODES, "aocs-clients-per-round >= 2"),
        ({}, 1, "at least 2 nodes"),
        ({"max-weight": 2.5}, NUM_NODES, "max_weight must be a whole number"),
    ],
)
def test_settings_secure_aocs_cannot_run_fail_before_round_1(
    example: Any,
    tmp_path: Path,
    overrides: dict[str, Any],
    num_nodes: int,
    match: str,
) -> None:
    config = {
        **aocs_config(tmp_path, secure=True),
        "num-supernodes": num_nodes,
        **overrides,
    }
    grid, context = federation(example, config, num_nodes)
    with pytest.raises(ValueError, match=match):
        example.server_app.main(grid, context)
    assert grid.wire_log == []
