"""Secure AOCS against a server that would learn more than the sums.

Each test is an attack the old code let through: a pool whose SecAgg+ sum
wraps around (the unmasked sum is garbage, silently), a server that picks a
node's participation draw (the answer then pins ``v_i`` down), a server that
asks for the same sum twice, and public values that change within a round.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, Metadata, RecordDict
from flwr.common.secure_aggregation.quantization import dequantize, quantize
from flwr.server.workflow import SecAggPlusWorkflow

from flwr_importance import compat, protocol
from flwr_importance.aggregation.secure_sum import check_no_wraparound
from flwr_importance.clientapps.secure_aocs import KEPT_SCORE_KEY, secure_aocs_mod
from flwr_importance.tooling.testing import InProcessGrid

#: Flower's SecAggPlusWorkflow defaults.
CLIPPING_RANGE, QUANTIZATION_RANGE, MODULUS_RANGE = 8.0, 2**22, 2**32
SERVER_ROUND = 2
#: The node's kept ``v_i`` and ``n_i``; with start factor 0.5 its p_i is 0.5.
SCORE, SIZE = 1.0, 10.0


def test_flowers_arithmetic_wraps_at_1024_nodes_and_the_guard_refuses() -> None:
    """1,024 replies of SecAgg+'s largest value unmask to garbage; 1,023 do not."""

    def unmasked_sum(num_nodes: int) -> float:
        (value,) = quantize(
            [np.array([CLIPPING_RANGE])], CLIPPING_RANGE, QUANTIZATION_RANGE
        )
        total = np.mod(num_nodes * value.astype(np.int64), MODULUS_RANGE)
        (mean,) = dequantize([total], CLIPPING_RANGE, QUANTIZATION_RANGE)
        return float(mean[0]) - (num_nodes - 1) * CLIPPING_RANGE

    assert unmasked_sum(1023) == pytest.approx(1023 * CLIPPING_RANGE)
    assert unmasked_sum(1024) != pytest.approx(1024 * CLIPPING_RANGE, rel=0.1)
    check_no_wraparound(1023, QUANTIZATION_RANGE, MODULUS_RANGE, what="1023 nodes")
    with pytest.raises(ValueError, match="wraps around above 1023 replies"):
        check_no_wraparound(1024, QUANTIZATION_RANGE, MODULUS_RANGE, what="1024")


@pytest.mark.parametrize("pool_size", [None, 1024])
def test_the_workflow_refuses_a_pool_above_the_limit_before_any_sum(
    pool_size: int | None,
) -> None:
    """A 1,024-node pool at Flower's defaults, or 3 nodes where the limit is 1."""
    quantization = QUANTIZATION_RANGE if pool_size else MODULUS_RANGE // 2
    workflow = compat.SecureAOCSWorkflow(
        secure_aggregation=SecAggPlusWorkflow(
            num_shares=3,
            reconstruction_threshold=2,
            max_weight=1,
            quantization_range=quantization,
            modulus_range=MODULUS_RANGE,
        )
    )
    strategy = compat.OptimalClientSampling(
        clients_per_round=2,
        approximate=True,
        pool_size=pool_size,
        initial_parameters=compat_parameters(),
    )
    grid = InProcessGrid(_noop_app(), 3, {}, seed=0)
    with pytest.raises(ValueError, match="wraps around"):
        grid.run_legacy(strategy, num_rounds=1, fit_workflow=workflow)
    secure_sums = [
        entry for entry in grid.wire_log if "secaggplus" in str(entry.message().content)
    ]
    assert secure_sums == []


def compat_parameters() -> Any:
    from flwr.common import ndarrays_to_parameters

    return ndarrays_to_parameters([np.zeros(2, np.float32)])


def _noop_app() -> Any:
    from flwr.client import ClientApp, NumPyClient

    class Client(NumPyClient):
        def fit(self, parameters, config):  # type: ignore[no-untyped-def]
            return parameters, 1, {}

    return ClientApp(client_fn=lambda context: Client().to_client())


def node_context(run_config: dict[str, Any] | None = None) -> Context:
    state = RecordDict(
        {
            KEPT_SCORE_KEY: ConfigRecord(
                {
                    protocol.SERVER_ROUND: SERVER_ROUND,
                    protocol.UPDATE_NORM: SCORE,
                    protocol.NUM_EXAMPLES: SIZE,
                }
            )
        }
    )
    return Context(0, 1, {}, state, run_config or {})


def step_message(step: str, **values: Any) -> Message:
    config = ConfigRecord(
        {
            protocol.SECURE_AOCS_STEP: step,
            protocol.SERVER_ROUND: SERVER_ROUND,
            protocol.CLIPPING_RANGE: CLIPPING_RANGE,
            protocol.SECURE_SUM_WEIGHT: 1,
            protocol.AOCS_START_FACTOR: 0.5,
            protocol.AOCS_SCALES: json.dumps([]),
            **values,
        }
    )
    metadata = Metadata(0, "m", 0, 1, "", "1", 0.0, 3600.0, "query.participation")
    return Message(metadata=metadata, content=RecordDict({"config": config}))


def _never_called(message: Message, context: Context) -> Message:
    raise AssertionError("the mod answers the step itself")


def participates(message: Message, context: Context) -> bool:
    reply = secure_aocs_mod(message, context, _never_called)
    return any(
        record.get(protocol.PARTICIPATES) == 1
        for record in reply.content.config_records.values()
    )


def test_the_node_draws_its_own_participation_coin() -> None:
    """A server draw of 0 would make every node with p_i > 0 take part."""
    trials = 400
    taken = sum(
        participates(
            step_message(
                protocol.AOCS_PARTICIPATION_STEP, **{protocol.PARTICIPATION_DRAW: 0.0}
            ),
            node_context(),
        )
        for _ in range(trials)
    )
    # p_i = 0.5: within 4 binomial standard errors of trials / 2.
    assert abs(taken - trials / 2) < 4 * np.sqrt(trials / 4)


def test_the_servers_draw_is_taken_only_as_the_unsafe_test_option() -> None:
    context = node_context({protocol.SECURE_AOCS_UNSAFE_PUBLIC_DRAWS: True})
    message = step_message(
        protocol.AOCS_PARTICIPATION_STEP, **{protocol.PARTICIPATION_DRAW: 0.0}
    )
    assert participates(message, context)


@pytest.mark.parametrize(
    "step",
    [
        protocol.AOCS_MASS_STEP,
        protocol.AOCS_PARTICIPATION_STEP,
    ],
)
def test_a_step_is_answered_once_per_round(step: str) -> None:
    context = node_context()
    message = step_message(step)
    secure_aocs_mod(message, context, _never_called)
    with pytest.raises(ValueError, match="already answered"):
        secure_aocs_mod(message, context, _never_called)


def test_a_new_iteration_is_answered_and_the_totals_only_over_new_bounds() -> None:
    context = node_context()
    secure_aocs_mod(step_message(protocol.AOCS_MASS_STEP), context, _never_called)
    scales = json.dumps([1.5])
    next_iteration = step_message(
        protocol.AOCS_MASS_STEP, **{protocol.AOCS_SCALES: scales}
    )
    secure_aocs_mod(next_iteration, context, _never_called)
    bounds = {protocol.SCORE_BOUND: 4.0, protocol.SIZE_BOUND: 16.0}
    totals = step_message(protocol.AOCS_TOTALS_STEP, **bounds)
    secure_aocs_mod(totals, context, _never_called)
    with pytest.raises(ValueError, match="already answered"):
        secure_aocs_mod(totals, context, _never_called)


@pytest.mark.parametrize(
    "values",
    [
        {protocol.AOCS_SCALES: json.dumps([0.5])},  # a rescaling AOCS never makes
        {protocol.AOCS_START_FACTOR: float("inf")},
        {protocol.AOCS_START_FACTOR: -1.0},
    ],
)
def test_public_values_aocs_never_makes_are_refused(values: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="not"):
        secure_aocs_mod(
            step_message(protocol.AOCS_MASS_STEP, **values),
            node_context(),
            _never_called,
        )


def test_public_values_that_change_within_a_round_are_refused() -> None:
    """A start factor sent higher to one message than to another singles p_i out."""
    context = node_context()
    secure_aocs_mod(step_message(protocol.AOCS_MASS_STEP), context, _never_called)
    changed = step_message(
        protocol.AOCS_PARTICIPATION_STEP, **{protocol.AOCS_START_FACTOR: 0.9}
    )
    with pytest.raises(ValueError, match="changed between messages"):
        secure_aocs_mod(changed, context, _never_called)
