"""AOCS under SecAgg+: its client/server steps, and the workflow in process.

The app of ``tests/compat/aocs_app`` (a NumPyClient wrapped by
``importance_client_fn``, inside ``importance_secaggplus_mod`` and
``secure_aocs_mod``) runs under Flower's own ``DefaultWorkflow`` and
``SecAggPlusWorkflow`` (four stages, masks, shares, quantization) on an
in-process grid that serializes every message; the same app without SecAgg+
is the reference. About 5 s in all; ``test_wire_capture.py`` compares the
SecAgg+ example's secure and plain AOCS runs on one deployment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.server.workflow import SecAggPlusWorkflow

from flwr_importance import protocol
from flwr_importance.compat.secure_aocs import SecureAOCSWorkflow
from flwr_importance.sampling.variance_reduced import (
    aocs_client_probs,
    aocs_mass_terms,
    aocs_next_scale,
    aocs_probs,
    aocs_start_factor,
)
from flwr_importance.tooling.testing import InProcessGrid

APP_DIR = Path(__file__).resolve().parent / "aocs_app"
NUM_NODES = 5
RUN_CONFIG = {
    "num-server-rounds": 3,
    "clients-per-round": 3,
    "aocs-iterations": 4,
    "seed": 5,
    # The secure run takes the plain run's participation draws (unsafe).
    "secure-aocs-unsafe-public-draws": True,
}
#: The per-node keys of OCS's plaintext norm reply, none of which may reach
#: the server under SecAgg+.
PRIVATE_KEYS = {
    protocol.per_model_key(key, 0)
    for key in (protocol.UPDATE_NORM, protocol.NUM_EXAMPLES, protocol.TRAIN_LOSS)
}


@pytest.mark.parametrize("budget", [1, 3, 7])
@pytest.mark.parametrize("iterations", [0, 1, 4, 12])
def test_client_and_server_steps_one_client_at_a_time_are_aocs(
    budget: int, iterations: int
) -> None:
    """Each client on its own score, the server on the sums: ``aocs_probs``.

    The clients' shares are added as ``aocs_probs`` adds them (one NumPy sum):
    the steps then give the same floats; under SecAgg+ the sums differ only
    by its quantization.
    """
    rng = np.random.default_rng(budget * 100 + iterations)
    scores = np.concatenate([rng.lognormal(0.0, 2.0, 9), [0.0]])
    start = aocs_start_factor(float(np.sum(scores)), budget)
    scales: list[float] = []
    for _ in range(iterations):
        shares = [aocs_mass_terms(aocs_client_probs(s, start, scales)) for s in scores]
        mass = np.array([share for share, _ in shares]).sum()
        num_below_one = np.array([below for _, below in shares]).sum()
        scale = aocs_next_scale(float(mass), int(num_below_one), scores.size, budget)
        if scale is None:
            break
        scales.append(scale)
    clients = [float(aocs_client_probs(s, start, scales)) for s in scores]
    np.testing.assert_array_equal(clients, aocs_probs(scores, budget, iterations))


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The test app's package, importable as under ``flwr run``."""
    monkeypatch.syspath_prepend(str(APP_DIR))
    import secure_aocs_app.client_app
    import secure_aocs_app.server_app

    return secure_aocs_app


def run(app: Any, *, secure: bool) -> tuple[dict[str, Any], InProcessGrid]:
    """The app's AOCS run on a fresh in-process federation (same node ids)."""
    grid = InProcessGrid(app.client_app.app, NUM_NODES, RUN_CONFIG, seed=0)
    return app.server_app.run_aocs(grid, grid.server_context(), secure=secure), grid


def round_metric(run_result: dict[str, Any], key: str) -> list[float]:
    """A round metric of a run, in round order."""
    return [value for _, value in run_result["metrics"][key]]


def test_secure_aocs_gives_the_plain_model_and_the_server_sees_no_value(
    app: Any,
) -> None:
    """Each round's model is the plain run's within the bounds; nothing leaks.

    Round 1 starts both runs from the same model, so its difference is
    within its logged ``quantization-bound`` (docs/privacy.md); a later
    round's also carries the earlier differences through local training,
    which this task's small steps keep from growing: within the sum of the
    bounds so far. No node reply reaching the server carries an array, a
    norm, a size or a loss in the clear.
    """
    secure, grid = run(app, secure=True)
    plain, _ = run(app, secure=False)
    sampled = round_metric(secure, "num-sampled")
    assert sampled == round_metric(plain, "num-sampled")
    assert min(sampled) >= 2  # every round steps in both runs
    bounds = np.cumsum(round_metric(secure, "quantization-bound"))
    differences = [
        max(
            float(np.max(np.abs(np.subtract(a, b))))
            for a, b in zip(secure_model, plain_model, strict=True)
        )
        for secure_model, plain_model in zip(
            secure["models"][1:], plain["models"][1:], strict=True
        )
    ]
    assert all(difference > 0 for difference in differences)  # it was quantized
    assert np.all(np.asarray(differences) <= bounds), (differences, bounds)
    steps = [
        float(np.max(np.abs(np.subtract(a, b))))
        for a, b in zip(plain["models"][1][0], plain["models"][0][0], strict=True)
    ]
    assert bounds[0] < 0.01 * max(steps)  # the bound is far below a step
    to_server = [record.message() for record in grid.wire_log]
    to_server = [
        message
        for record, message in zip(grid.wire_log, to_server, strict=True)
        if record.direction == "to-server"
    ]
    for message in to_server:
        # Flower sends no parameters as one data-less placeholder array.
        arrays = message.content.array_records.values()
        assert not any(array.data for record in arrays for array in record.values())
        for record in (
            *message.content.config_records.values(),
            *message.content.metric_records.values(),
        ):
            assert not PRIVATE_KEYS & set(record)


def test_a_workflow_secure_aocs_cannot_use_is_refused_at_construction() -> None:
    """Each node sends ``max_weight`` as its weight: it must be a whole number."""
    with pytest.raises(ValueError, match="max_weight"):
        SecureAOCSWorkflow(
            secure_aggregation=SecAggPlusWorkflow(
                num_shares=3, reconstruction_threshold=2, max_weight=0.5
            )
        )
