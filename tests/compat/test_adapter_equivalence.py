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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from flwr_importance.clientapps import ClientHandler, TaskFactory
from flwr_importance.clientapps.standard import method_handlers
from flwr_importance.compat import legacy_class
from flwr_importance.registry import MethodSpec, method, methods
from flwr_importance.strategies import ServerAdam
from flwr_importance.tooling.declarations import CannedSetup
from simulations.tooling import canned, canned_variants
from tests.compat.compat_harness import TwinFederation, max_difference, run_legacy

NUM_NODES = 6
NUM_ROUNDS = 3
#: float32 rounding of a differently ordered sum, far below one SGD step.
ATOL = 1e-6


@dataclass
class Case:
    """One method variant: both classes, their shared arguments, the client side."""

    name: str
    spec: MethodSpec
    arguments: dict[str, Any]

    def handlers(self, task_factory: TaskFactory) -> Mapping[str, ClientHandler]:
        """The method's ready-made client handlers."""
        return method_handlers(self.spec, task_factory)


SAMPLES_PER_CLIENT = 40
#: Every canned variant of every method that runs on the legacy API, with
#: three clients a round (OCS: in expectation), default seeds.
SETUP = CannedSetup(
    clients_per_round=3,
    total_size=NUM_NODES * SAMPLES_PER_CLIENT,
    max_size=100,
    projection_dim=1024,
)
CASES = [
    Case(variant.name, spec, dict(variant.arguments(SETUP)))
    for spec in methods()
    if spec.legacy_api
    for variant in canned(spec)
] + [
    # FOLB's two-set mode adds a gradient query: a legacy round trip of its own.
    Case(
        "folb-two-set",
        method("folb"),
        {
            **canned_variants()["folb"][1].arguments(SETUP),
            "mode": "two-set",
        },
    )
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_legacy_strategy_gives_the_message_api_model(case: Case) -> None:
    overrides: dict[str, bool | int | float | str] = {
        "strategy": case.spec.name,
        "local-steps": 5,
        "samples-per-client": SAMPLES_PER_CLIENT,
    }
    federation = TwinFederation(overrides, NUM_NODES)
    message_model = federation.run_message_api(
        case.spec.build(**case.arguments), NUM_ROUNDS
    )
    legacy = legacy_class(case.spec.name)(
        legacy=federation.legacy_options(), **case.arguments
    )
    legacy_model = run_legacy(
        legacy, federation.legacy_client_manager(case.handlers), NUM_ROUNDS
    )

    assert max_difference(message_model, federation.initial) > 100 * ATOL
    assert max_difference(legacy_model, message_model) <= ATOL


#: One case per legacy method (its plain configuration), under a server optimizer.
OPTIMIZED_CASES = list({case.spec.name: case for case in reversed(CASES)}.values())


@pytest.mark.parametrize(
    "case", OPTIMIZED_CASES, ids=[case.spec.name for case in OPTIMIZED_CASES]
)
def test_legacy_strategy_with_a_server_optimizer_gives_the_message_api_model(
    case: Case,
) -> None:
    overrides: dict[str, bool | int | float | str] = {
        "strategy": case.spec.name,
        "local-steps": 5,
        "samples-per-client": SAMPLES_PER_CLIENT,
    }
    optimizer = ServerAdam(eta=0.01)
    arguments = {**case.arguments, "server_optimizer": optimizer}
    # A federation per run: nodes keep state between rounds (ISFedAvg's sampler).
    plain_model = TwinFederation(overrides, NUM_NODES).run_message_api(
        case.spec.build(**case.arguments), NUM_ROUNDS
    )
    federation = TwinFederation(overrides, NUM_NODES)
    message_model = federation.run_message_api(case.spec.build(**arguments), NUM_ROUNDS)
    legacy = legacy_class(case.spec.name)(
        legacy=federation.legacy_options(), **arguments
    )
    legacy_model = run_legacy(
        legacy, federation.legacy_client_manager(case.handlers), NUM_ROUNDS
    )

    assert max_difference(message_model, plain_model) > 100 * ATOL
    assert max_difference(legacy_model, message_model) <= ATOL
