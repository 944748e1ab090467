"""CentralDP: its sensitivity, its noise, its accountant and its refusals.

The rounds run the library's strategies on canned replies
(:class:`~flwr_importance.tooling.testing.CannedReplyGrid`): only server work,
about 5 s for the module on one core.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable

import numpy as np
import pytest
from dp_accounting import dp_event, rdp
from flwr.app import Array, ArrayRecord, ConfigRecord, Message
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.privacy_accounting import GaussianPrivacyEvent
from numpy.typing import NDArray

from flwr_importance.strategies import FOLB, OptimalClientSampling
from flwr_importance.strategies.arrays import flatten
from flwr_importance.strategies.base import ImportanceStrategy
from flwr_importance.strategies.wrappers import (
    DP_DELTA_METRIC,
    DP_EPSILON_METRIC,
    CentralDP,
)
from flwr_importance.tooling.testing import CannedReplyGrid, Fleet, canned_responders
from flwr_importance.tooling.testing.canned import canned_strategy

NUM_NODES = 20
CLIENTS_PER_ROUND = 5
CLIPPING_NORM = 0.05
NOISE_MULTIPLIER = 1.3
DELTA = 1e-5
MODEL = ArrayRecord(
    {"w": Array(np.zeros((3, 2), np.float32)), "b": Array(np.zeros(2, np.float32))}
)
#: Standard errors allowed in the Monte Carlo checks.
Z = 5.0


def reply_model(seed: int) -> ArrayRecord:
    rng = np.random.default_rng(seed)
    return ArrayRecord(
        {
            key: Array(rng.normal(size=array.shape).astype(np.float32))
            for key, array in MODEL.items()
        }
    )


FLEET = Fleet.skewed(
    num_nodes=NUM_NODES, model=MODEL, reply_models=[reply_model(s) for s in range(7)]
)


class SpoilingGrid(CannedReplyGrid):
    """Canned replies; the lowest train node's reply spoiled (-1e6 times) or dropped."""

    change: str = "none"

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        replies = list(super().send_and_receive(messages, timeout=timeout))
        train = [reply for reply in replies if reply.metadata.message_type == "train"]
        if self.change == "none" or not train:
            return replies
        target = min(train, key=lambda reply: reply.metadata.src_node_id)
        if self.change == "drop":
            return [reply for reply in replies if reply is not target]
        for name, record in list(target.content.array_records.items()):
            target.content[name] = ArrayRecord(
                {
                    key: Array(array.numpy() * np.float32(-1e6))
                    for key, array in record.items()
                }
            )
        return replies


def build(method: str) -> ImportanceStrategy:
    if method == "ocs-uniform":
        return OptimalClientSampling(
            clients_per_round=CLIENTS_PER_ROUND, uniform=True, fraction_evaluate=0.0
        )
    strategy = canned_strategy(
        method, clients_per_round=CLIENTS_PER_ROUND, fleet=FLEET, projection_dim=4
    )
    assert isinstance(strategy, ImportanceStrategy)
    return strategy


def released(method: str, *, change: str, private: bool) -> NDArray[np.floating]:
    """Round 1's released model; the same sampling and noise draws every call."""
    responders = canned_responders(
        "ocs" if method == "ocs-uniform" else method,
        fleet=FLEET,
        node_index=lambda node: node - 2,
    )
    grid = SpoilingGrid(NUM_NODES, responders)
    grid.change = change
    strategy = build(method)
    outer = strategy
    if private:
        outer = CentralDP(
            strategy=strategy,
            noise_multiplier=NOISE_MULTIPLIER,
            clipping_norm=CLIPPING_NORM,
        )
        outer.noise_rng = np.random.default_rng(7)
    messages = list(outer.configure_train(1, MODEL, ConfigRecord(), grid))
    arrays, _ = outer.aggregate_train(1, grid.send_and_receive(messages))
    assert arrays is not None
    return flatten(arrays).astype(np.float64)


@pytest.mark.parametrize("method", ["ocs", "ocs-uniform", "md", "fedsampling"])
def test_one_client_moves_the_release_by_at_most_the_sensitivity(method: str) -> None:
    # The same noise draws in every run: the releases differ by exactly what
    # their pre-noise aggregates differ by.
    honest = released(method, change="none", private=True)
    tolerance = 1 + 1e-4
    # Adding or removing a client, the adjacency accounted: at most C.
    removed = np.linalg.norm(released(method, change="drop", private=True) - honest)
    assert 0 < removed <= CLIPPING_NORM * tolerance
    # Any change of its reply (a removal and an addition): at most 2 C.
    spoiled = np.linalg.norm(released(method, change="spoil", private=True) - honest)
    assert 0 < spoiled <= 2 * CLIPPING_NORM * tolerance
    # Without the clipping of each weighted contribution it moves far more.
    unclipped = np.linalg.norm(
        released(method, change="spoil", private=False)
        - released(method, change="none", private=False)
    )
    assert unclipped > 100 * CLIPPING_NORM


def test_the_noise_has_the_calibrated_std() -> None:
    wrapper = CentralDP(
        strategy=build("ocs"), noise_multiplier=NOISE_MULTIPLIER, clipping_norm=2.0
    )
    wrapper.noise_rng = np.random.default_rng(3)
    size = 20_000
    base = ArrayRecord({"w": Array(np.zeros(size, np.float64))})
    zero_update = ArrayRecord({"w": Array(np.zeros(size, np.float64))})
    noise = flatten(wrapper.release(base, [zero_update], np.ones(1)))
    sigma = NOISE_MULTIPLIER * 2.0
    assert wrapper.noise_std == pytest.approx(sigma)
    assert wrapper.sensitivity == 2.0
    # Standard errors of the sample mean and std of `size` normal draws.
    assert abs(noise.mean()) < Z * sigma / np.sqrt(size)
    assert abs(noise.std() - sigma) < Z * sigma / np.sqrt(2 * size)


def direct_epsilons(rounds: int, rate: float | None) -> list[float]:
    """Epsilon after each round, from dp-accounting called directly."""
    accountant = rdp.RdpAccountant()
    epsilons = []
    for _ in range(rounds):
        event: dp_event.DpEvent = dp_event.GaussianDpEvent(NOISE_MULTIPLIER)
        if rate is not None:
            event = dp_event.PoissonSampledDpEvent(rate, event)
        accountant.compose(event)
        epsilons.append(accountant.get_epsilon(DELTA))
    return epsilons


@pytest.mark.parametrize(
    ("method", "rate"), [("ocs", None), ("ocs-uniform", CLIENTS_PER_ROUND / NUM_NODES)]
)
def test_the_reported_epsilons_match_dp_accounting(
    method: str, rate: float | None
) -> None:
    grid = CannedReplyGrid(
        NUM_NODES, canned_responders("ocs", fleet=FLEET, node_index=lambda n: n - 2)
    )
    poisson = rate is not None
    wrapper = CentralDP(
        strategy=build(method),
        noise_multiplier=NOISE_MULTIPLIER,
        clipping_norm=CLIPPING_NORM,
        target_delta=DELTA,
        amplification="poisson" if poisson else "none",
        population_size=NUM_NODES if poisson else None,
    )
    reported = []
    arrays = MODEL
    for server_round in (1, 2, 3):
        messages = list(
            wrapper.configure_train(server_round, arrays, ConfigRecord(), grid)
        )
        new_arrays, metrics = wrapper.aggregate_train(
            server_round, grid.send_and_receive(messages)
        )
        assert metrics is not None and new_arrays is not None
        assert metrics[DP_DELTA_METRIC] == DELTA
        reported.append(metrics[DP_EPSILON_METRIC])
        arrays = new_arrays
    assert reported == pytest.approx(direct_epsilons(3, rate), rel=1e-9)
    assert reported[0] < reported[1] < reported[2]


def test_the_accountant_agrees_with_abadi_et_al() -> None:
    # Abadi et al., "Deep Learning with Differential Privacy" (CCS 2016),
    # Section 3.1: q = 0.01, sigma = 4, delta = 1e-5 and T = 10,000 steps give
    # epsilon ~ 1.26 with the moments accountant. RDP is the same bound on the
    # sampled Gaussian with a tighter conversion to (epsilon, delta): at most
    # 1.26, and not far below it.
    wrapper = CentralDP(
        strategy=build("ocs-uniform"),
        noise_multiplier=4.0,
        clipping_norm=1.0,
        target_delta=1e-5,
        amplification="poisson",
        population_size=100,
    )
    wrapper.accountant.compose(
        GaussianPrivacyEvent(noise_multiplier=4.0, sample_size=1, population_size=100),
        count=10_000,
    )
    assert 0.75 * 1.26 < wrapper.accountant.get_epsilon(1e-5) <= 1.26


def test_misuse_fails_at_construction() -> None:
    settings = {"noise_multiplier": 1.0, "clipping_norm": 1.0}
    with pytest.raises(ValueError, match="FOLB"):
        CentralDP(strategy=FOLB(clients_per_round=2), **settings)
    with pytest.raises(TypeError, match="Flower's FedAvg"):
        CentralDP(strategy=FedAvg(), **settings)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="noise_multiplier"):
        CentralDP(strategy=build("ocs"), noise_multiplier=-1.0, clipping_norm=1.0)
    with pytest.raises(ValueError, match="depend on what the clients report"):
        CentralDP(
            strategy=build("ocs"),
            amplification="poisson",
            population_size=NUM_NODES,
            **settings,
        )
    with pytest.raises(ValueError, match="population_size"):
        CentralDP(strategy=build("ocs-uniform"), amplification="poisson", **settings)
    with pytest.raises(ValueError, match="population_size applies only"):
        CentralDP(strategy=build("ocs"), population_size=NUM_NODES, **settings)
    strategy = build("md")
    CentralDP(strategy=strategy, **settings)
    with pytest.raises(ValueError, match="already wrapped"):
        CentralDP(strategy=strategy, **settings)


def test_dp_accounting_is_imported_only_when_used() -> None:
    code = (
        "import sys, flwr_importance.strategies, flwr_importance.strategies.wrappers;"
        "print('dp_accounting' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_a_poisson_round_that_samples_nobody_still_releases_noise() -> None:
    """Poisson amplification covers the mechanism that always releases.

    A round whose sample is empty releases the model plus noise and spends its
    epsilon; keeping the model would show that nobody was sampled. Without
    amplification the selection is taken as given, and such a round releases
    nothing.
    """
    responders = canned_responders("ocs", fleet=FLEET, node_index=lambda n: n - 2)
    for amplification, population in (("poisson", NUM_NODES), ("none", None)):
        strategy = CentralDP(
            strategy=build("ocs-uniform"),
            noise_multiplier=NOISE_MULTIPLIER,
            clipping_norm=CLIPPING_NORM,
            amplification=amplification,
            population_size=population,
        )
        grid = SpoilingGrid(NUM_NODES, responders)
        list(strategy.configure_train(1, MODEL, ConfigRecord(), grid))
        arrays, metrics = strategy.aggregate_train(1, [])
        if amplification == "none":
            assert metrics is None or DP_EPSILON_METRIC not in metrics
            assert arrays is None or np.array_equal(flatten(arrays), flatten(MODEL))
            continue
        assert arrays is not None and metrics is not None
        noise = flatten(arrays).astype(np.float64) - flatten(MODEL)
        # Every coordinate moved: noise of std z C was added (P[|N| < 1e-9] ~ 0).
        assert np.all(np.abs(noise) > 1e-9)
        assert metrics[DP_EPSILON_METRIC] > 0
        assert metrics["dp-clipped"] == 0
