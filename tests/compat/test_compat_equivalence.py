"""The legacy strategies give the Message-API strategies' models, round for round.

Each case runs both on the same seeded federation (same node ids, partitions,
initial model, strategy seed) for a few rounds. The legacy transport carries the
same arrays (float32, serialized losslessly by ``ndarrays_to_parameters``), the
same configs and the same metrics, and the replies reach the shared aggregation
in the order the messages were sent, so the models agree to float32 rounding:
``ATOL`` leaves room only for a different summation order, never for another
sample or another weight (one SGD step moves entries by ~1e-2).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from flwr.serverapp.strategy import Strategy

from flwr_importance import compat, strategies
from flwr_importance.clientapps import ClientHandler, TaskFactory
from flwr_importance.clientapps.clustered import make_clustered_handlers
from flwr_importance.clientapps.fedsampling import make_fedsampling_handlers
from flwr_importance.clientapps.folb import make_folb_handlers
from flwr_importance.clientapps.isfedavg import make_isfedavg_handlers
from flwr_importance.clientapps.optimal import make_ocs_handlers
from flwr_importance.compat.adapter import LegacyStrategyAdapter
from tests.compat.compat_harness import TwinFederation, max_difference, run_legacy

NUM_NODES = 6
NUM_ROUNDS = 3
#: float32 rounding of a differently ordered sum, far below one SGD step.
ATOL = 1e-6


@dataclass
class Case:
    """One method: both classes, their shared arguments, the client handlers."""

    strategy: str
    message_class: Callable[..., Strategy]
    legacy_class: Callable[..., LegacyStrategyAdapter]
    handlers: Callable[[TaskFactory], Mapping[str, ClientHandler]]
    arguments: dict[str, Any]


SHARED = {"seed": 3, "min_available_nodes": 1}
CASES = [
    Case(
        "isfedavg",
        strategies.ISFedAvg,
        compat.ISFedAvg,
        make_isfedavg_handlers,
        {"clients_per_round": 3, "fraction_evaluate": 0.0, **SHARED},
    ),
    Case(
        "folb",
        strategies.FOLB,
        compat.FOLB,
        make_folb_handlers,
        # Three distinct nodes a round (FOLB draws without replacement).
        {
            "clients_per_round": 3,
            "mode": "two-set",
            "fraction_evaluate": 0.0,
            **SHARED,
            "min_available_nodes": 3,
        },
    ),
    Case(
        "fedsampling",
        strategies.FedSampling,
        compat.FedSampling,
        make_fedsampling_handlers,
        {"samples_per_round": 64, "server_lr": 0.5, "min_available_nodes": 1},
    ),
    Case(
        "clustered",
        strategies.ClusteredSampling,
        compat.ClusteredSampling,
        make_clustered_handlers,
        {
            "clients_per_round": 3,
            "method": "similarity",
            "fraction_evaluate": 0.0,
            **SHARED,
        },
    ),
    Case(
        "md",
        strategies.MDSampling,
        compat.MDSampling,
        make_clustered_handlers,
        {"clients_per_round": 3, "fraction_evaluate": 0.0, **SHARED},
    ),
    Case(
        "ocs",
        strategies.OptimalClientSampling,
        compat.OptimalClientSampling,
        make_ocs_handlers,
        {"clients_per_round": 2, **SHARED},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.strategy for case in CASES])
def test_legacy_strategy_gives_the_message_api_model(case: Case) -> None:
    overrides: dict[str, bool | int | float | str] = {
        "strategy": case.strategy,
        "local-steps": 5,
        "samples-per-client": 40,
    }
    federation = TwinFederation(overrides, NUM_NODES)
    message_model = federation.run_message_api(
        case.message_class(**case.arguments), NUM_ROUNDS
    )
    legacy = case.legacy_class(legacy=federation.legacy_options(), **case.arguments)
    legacy_model = run_legacy(
        legacy, federation.legacy_client_manager(case.handlers), NUM_ROUNDS
    )

    assert max_difference(message_model, federation.initial) > 100 * ATOL
    assert max_difference(legacy_model, message_model) <= ATOL
