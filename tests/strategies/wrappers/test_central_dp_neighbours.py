"""CentralDP against an adversary who removes one node from the population.

Two grids differ by one node (with all its query replies, reports and train
reply): the full grid and the grid of N - 1 nodes. Every node keeps its own
participation draw on both (per-node coins, as Poisson sampling has), the
model's noise is the same draw, and every noisy report sum of the reduced run
outputs what it output on the full grid: the earlier releases held fixed, as
the adaptive composition proof conditions on them. The model's pre-noise
release may then move by at most the clipping norm, and each report sum's
input by at most its sensitivity. The fleet has a node holding most of the
data, which is also one that is not sampled, and the clipping norm is twice
the median weighted contribution, so that most contributions are not clipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from numpy.typing import NDArray

from flwr_importance.strategies import OptimalClientSampling, ocs
from flwr_importance.strategies.arrays import Release, flatten, linear_release
from flwr_importance.strategies.wrappers import CentralDP
from flwr_importance.tooling.testing import CannedReplyGrid, Fleet, canned_responders
from simulations.tooling import canned_variants

#: OCS's canned replies: the norm query and the kept update.
OCS_REPLIES = canned_variants()["ocs"][1].replies
NUM_NODES = 20
CLIENTS_PER_ROUND = 5
#: The node holding most of the data (5,000 of about 6,000 samples); its coin
#: keeps it out of the sample.
LARGE_NODE = 2
MODEL = ArrayRecord({"w": Array(np.zeros(8, np.float64))})
TOLERANCE = 1 + 1e-9


def fleet() -> Fleet:
    rng = np.random.default_rng(11)
    # Updates that share a direction, as clients' steps on one model do: the
    # moved terms add up instead of cancelling.
    direction = rng.normal(size=8)
    updates = [
        (direction + 0.3 * rng.normal(size=8)) * rng.lognormal(0.0, 0.7)
        for _ in range(NUM_NODES)
    ]
    sizes = rng.integers(30, 80, NUM_NODES)
    sizes[LARGE_NODE - 2] = 5_000
    return Fleet(
        model=MODEL,
        reply_models=tuple(ArrayRecord({"w": Array(update)}) for update in updates),
        sizes=sizes,
        norms=np.array([np.linalg.norm(update) for update in updates]),
    )


FLEET = fleet()
#: Each node's participation coin: sampled when its draw is below its p_i.
COINS = {node: np.random.default_rng(100 + node).random() for node in range(2, 22)}
COINS[LARGE_NODE] = 0.999


class PopulationGrid(CannedReplyGrid):
    """The canned fleet, less the nodes in ``removed``."""

    removed: frozenset[int] = frozenset()

    def get_node_ids(self) -> Iterable[int]:
        return [node for node in super().get_node_ids() if node not in self.removed]


class CoupledDP(CentralDP):
    """CentralDP whose noisy report sums can replay another run's outputs."""

    inputs: list[NDArray[np.float64]]
    sensitivities: list[float]
    outputs: list[NDArray[np.float64]]
    replay: list[NDArray[np.float64]] | None = None

    def noisy_sum(
        self, total: NDArray[np.float64], sensitivity: float
    ) -> NDArray[np.float64]:
        self.inputs.append(total.copy())
        self.sensitivities.append(sensitivity)
        # The draw and the accounting happen on both grids alike.
        output = super().noisy_sum(total, sensitivity)
        if self.replay is not None:
            output = self.replay[len(self.inputs) - 1]
        self.outputs.append(output)
        return output


@contextmanager
def coupled_coins(grid: PopulationGrid) -> Iterator[None]:
    """OCS's ``poisson_sample`` on each node's own coin, whichever nodes are there."""
    original = ocs.poisson_sample

    def per_node(probs: NDArray[np.float64], rng: object) -> NDArray[np.intp]:
        nodes = sorted(grid.get_node_ids())
        coins = np.array([COINS[node] for node in nodes])
        return np.flatnonzero(coins < probs)

    ocs.poisson_sample = per_node  # type: ignore[assignment]
    try:
        yield
    finally:
        ocs.poisson_sample = original


def build(mode: str) -> OptimalClientSampling:
    return OptimalClientSampling(
        clients_per_round=CLIENTS_PER_ROUND,
        uniform=mode.startswith("uniform"),
        approximate=mode == "aocs",
        fraction_evaluate=0.0,
    )


def recording_release(contributions: list[float]) -> Release:
    """``linear_release`` that keeps each weighted contribution's norm."""

    def release(
        base: ArrayRecord,
        terms: Sequence[ArrayRecord],
        weights: NDArray[np.float64],
        *,
        mean_of: float | None = None,
    ) -> ArrayRecord:
        contributions.extend(
            float(weight * np.linalg.norm(flatten(term)))
            for term, weight in zip(terms, weights, strict=True)
        )
        return linear_release(base, terms, weights, mean_of=mean_of)

    return release


def wrap(mode: str, clipping_norm: float) -> CoupledDP:
    amplification: Any = "poisson" if mode == "uniform-poisson" else "none"
    reports: dict[str, Any] = (
        {"report_noise_multiplier": 2.0, "report_clipping_norm": 2.0}
        if mode == "aocs"
        else {}
    )
    wrapper = CoupledDP(
        strategy=build(mode),
        noise_multiplier=1.0,
        clipping_norm=clipping_norm,
        amplification=amplification,
        population_size=NUM_NODES,
        **reports,
    )
    wrapper.inputs, wrapper.sensitivities, wrapper.outputs = [], [], []
    wrapper.noise_rng = np.random.default_rng(7)
    return wrapper


def one_round(
    wrapper: CentralDP, removed: frozenset[int]
) -> tuple[NDArray[np.float64], list[int]]:
    """Round 1's released model and the sampled nodes, on the grid less ``removed``."""
    grid = PopulationGrid(
        NUM_NODES,
        canned_responders(OCS_REPLIES, fleet=FLEET, node_index=lambda node: node - 2),
    )
    grid.removed = removed
    with coupled_coins(grid):
        messages = list(wrapper.configure_train(1, MODEL, ConfigRecord(), grid))
    sampled = [message.metadata.dst_node_id for message in messages]
    arrays, _ = wrapper.aggregate_train(1, grid.send_and_receive(messages))
    assert arrays is not None
    return flatten(arrays).astype(np.float64), sampled


def median_contribution(mode: str) -> float:
    """The median weighted contribution of the DP strategy's round, unclipped."""
    wrapper = wrap(mode, clipping_norm=1e9)
    contributions: list[float] = []
    wrapper.strategy.release = recording_release(contributions)
    one_round(wrapper, frozenset())
    return float(np.median(contributions))


@pytest.mark.parametrize("mode", ["uniform-none", "uniform-poisson", "aocs"])
@pytest.mark.parametrize("victim", [LARGE_NODE, 9])
def test_removing_a_node_moves_the_release_by_at_most_its_sensitivity(
    mode: str, victim: int
) -> None:
    clipping_norm = 2 * median_contribution(mode)
    full = wrap(mode, clipping_norm)
    released, sampled = one_round(full, frozenset())
    assert LARGE_NODE not in sampled and len(sampled) >= 3
    reduced = wrap(mode, clipping_norm)
    reduced.replay = full.outputs
    released_without, sampled_without = one_round(reduced, frozenset({victim}))
    assert set(sampled_without) == set(sampled) - {victim}
    # Each noisy sum's input moves by at most its sensitivity.
    # AOCS: the total of u_i = ||U_i|| / N (bound 2 / N), then (P, S) per step.
    assert reduced.sensitivities == full.sensitivities
    if mode == "aocs":
        assert full.sensitivities[0] == pytest.approx(2.0 / NUM_NODES)
        assert len(full.sensitivities) >= 2
        assert set(full.sensitivities[1:]) == {1.0}
    else:
        assert full.sensitivities == []
    for with_node, without_node, bound in zip(
        full.inputs, reduced.inputs, full.sensitivities, strict=True
    ):
        assert np.linalg.norm(with_node - without_node) <= bound * TOLERANCE
    # The same noise draw: the releases differ by their pre-noise difference.
    moved = np.linalg.norm(released - released_without)
    assert moved <= clipping_norm * TOLERANCE
    if victim not in sampled:
        # A node that was not sampled moves nothing but the sums it is in.
        assert moved == pytest.approx(0.0, abs=1e-12)
