"""CentralDP: its sensitivity, its noise, its accountant and its refusals.

The rounds run the library's strategies on canned replies
(:class:`~flwr_importance.tooling.testing.CannedReplyGrid`): only server work,
about 5 s for the module on one core.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest
from dp_accounting import dp_event, rdp
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, Strategy
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
from simulations.tooling import canned_variants

#: Every canned variant of every registry method, by name.
VARIANTS = canned_variants()
#: OCS's canned replies: the norm query and the kept update.
OCS_REPLIES = VARIANTS["ocs"][1].replies
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
    """Canned replies; the lowest train node's reply spoiled (-1e6 times) or dropped.

    ``change = "lose"``: no reply to any message comes back.
    """

    change: str = "none"

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        if self.change == "lose":
            return []
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


#: DP-AOCS's report settings.
REPORTS: dict[str, Any] = {"report_noise_multiplier": 2.0, "report_clipping_norm": 5.0}


def build(method: str) -> ImportanceStrategy:
    if method in ("ocs-uniform", "aocs"):
        return OptimalClientSampling(
            clients_per_round=CLIENTS_PER_ROUND,
            uniform=method == "ocs-uniform",
            approximate=method == "aocs",
            fraction_evaluate=0.0,
        )
    strategy = canned_strategy(
        *VARIANTS[method],
        clients_per_round=CLIENTS_PER_ROUND,
        fleet=FLEET,
        projection_dim=4,
    )
    assert isinstance(strategy, ImportanceStrategy)
    return strategy


def released(method: str, *, change: str, private: bool) -> NDArray[np.floating]:
    """Round 1's released model; the same sampling and noise draws every call."""
    responders = canned_responders(
        OCS_REPLIES, fleet=FLEET, node_index=lambda node: node - 2
    )
    grid = SpoilingGrid(NUM_NODES, responders)
    grid.change = change
    strategy = build(method)
    outer: Strategy = strategy
    if private:
        outer = wrapper = CentralDP(
            strategy=strategy,
            noise_multiplier=NOISE_MULTIPLIER,
            clipping_norm=CLIPPING_NORM,
            population_size=NUM_NODES,
            **(REPORTS if method == "aocs" else {}),
        )
        wrapper.noise_rng = np.random.default_rng(7)
    messages = list(outer.configure_train(1, MODEL, ConfigRecord(), grid))
    arrays, _ = outer.aggregate_train(1, grid.send_and_receive(messages))
    assert arrays is not None
    return flatten(arrays).astype(np.float64)


@pytest.mark.parametrize("method", ["ocs-uniform", "aocs"])
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
        strategy=build("ocs-uniform"),
        noise_multiplier=NOISE_MULTIPLIER,
        clipping_norm=2.0,
        population_size=NUM_NODES,
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


def direct_epsilons(report_sums: list[int], rate: float | None) -> list[float]:
    """Epsilon after each round, from dp-accounting called directly.

    Each round composes the model's Gaussian event (Poisson-subsampled at
    ``rate`` if any) and, per report sum it took, a Gaussian event of the
    report noise multiplier.
    """
    accountant = rdp.RdpAccountant()
    epsilons = []
    for count in report_sums:
        event: dp_event.DpEvent = dp_event.GaussianDpEvent(NOISE_MULTIPLIER)
        if rate is not None:
            event = dp_event.PoissonSampledDpEvent(rate, event)
        accountant.compose(event)
        report = dp_event.GaussianDpEvent(REPORTS["report_noise_multiplier"])
        for _ in range(count):
            accountant.compose(report)
        epsilons.append(accountant.get_epsilon(DELTA))
    return epsilons


def wrapper_for(method: str, **settings: Any) -> CentralDP:
    return CentralDP(
        strategy=build(method),
        noise_multiplier=NOISE_MULTIPLIER,
        clipping_norm=CLIPPING_NORM,
        target_delta=DELTA,
        population_size=NUM_NODES,
        **(REPORTS if method == "aocs" else {}),
        **settings,
    )


def ocs_grid() -> CannedReplyGrid:
    return CannedReplyGrid(
        NUM_NODES,
        canned_responders(OCS_REPLIES, fleet=FLEET, node_index=lambda n: n - 2),
    )


@pytest.mark.parametrize(
    ("method", "rate"),
    [
        ("aocs", None),
        ("ocs-uniform", None),
        ("ocs-uniform", CLIENTS_PER_ROUND / NUM_NODES),
    ],
)
def test_the_reported_epsilons_match_dp_accounting(
    method: str, rate: float | None
) -> None:
    grid = ocs_grid()
    wrapper = wrapper_for(method, amplification="none" if rate is None else "poisson")
    reported: list[float] = []
    report_sums: list[int] = []
    arrays = MODEL
    for server_round in (1, 2, 3):
        messages = list(
            wrapper.configure_train(server_round, arrays, ConfigRecord(), grid)
        )
        new_arrays, metrics = wrapper.aggregate_train(
            server_round, grid.send_and_receive(messages)
        )
        assert metrics is not None and new_arrays is not None
        assert set(metrics) == {DP_EPSILON_METRIC, DP_DELTA_METRIC}
        assert metrics[DP_DELTA_METRIC] == DELTA
        reported.append(float(metrics[DP_EPSILON_METRIC]))  # type: ignore[arg-type]
        report_sums.append(wrapper.round_report_sums)
        arrays = new_arrays
    # DP-AOCS: the norms' total and at least one (P, S) pair each round.
    assert all(count >= 2 for count in report_sums) == (method == "aocs")
    assert reported == pytest.approx(direct_epsilons(report_sums, rate), rel=1e-9)
    assert reported[0] < reported[1] < reported[2]


def test_the_budget_stop_ends_the_run_before_exceeding_max_epsilon() -> None:
    epsilons = direct_epsilons([0, 0, 0, 0], None)
    grid = ocs_grid()
    # Room for two rounds, not three.
    wrapper = wrapper_for("ocs-uniform", max_epsilon=(epsilons[1] + epsilons[2]) / 2)
    arrays = MODEL
    released = []
    for server_round in (1, 2, 3, 4):
        messages = list(
            wrapper.configure_train(server_round, arrays, ConfigRecord(), grid)
        )
        if server_round > 2:
            assert messages == []
        new_arrays, metrics = wrapper.aggregate_train(
            server_round, grid.send_and_receive(messages)
        )
        if new_arrays is None:
            assert metrics is None
            continue
        assert metrics is not None
        released.append(metrics[DP_EPSILON_METRIC])
        arrays = new_arrays
    assert len(released) == 2
    assert released[-1] <= wrapper.max_epsilon  # type: ignore[operator]
    # Nothing more was composed after the stop.
    assert wrapper.accountant.get_epsilon(DELTA) == released[-1]


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
    settings: dict[str, Any] = {
        "noise_multiplier": 1.0,
        "clipping_norm": 1.0,
        "population_size": 20,
    }
    with pytest.raises(ValueError, match="FOLB"):
        CentralDP(strategy=FOLB(clients_per_round=2), **settings)
    with pytest.raises(TypeError, match="Flower's FedAvg"):
        CentralDP(strategy=FedAvg(), **settings)
    with pytest.raises(ValueError, match="noise_multiplier"):
        CentralDP(
            strategy=build("ocs-uniform"),
            noise_multiplier=-1.0,
            clipping_norm=1.0,
            population_size=20,
        )
    with pytest.raises(ValueError, match="population_size"):
        CentralDP(strategy=build("ocs-uniform"), **{**settings, "population_size": 0})
    # Exact OCS water-fills over individual norms: DP-AOCS is the fix.
    with pytest.raises(ValueError, match=r"exact OCS.*approximate=True"):
        CentralDP(strategy=build("ocs"), **settings)
    with pytest.raises(ValueError, match="depend on what the clients report"):
        CentralDP(
            strategy=build("aocs"), amplification="poisson", **REPORTS, **settings
        )
    with pytest.raises(ValueError, match="needs report_noise_multiplier"):
        CentralDP(strategy=build("aocs"), **settings)
    with pytest.raises(ValueError, match="apply to DP-AOCS only"):
        CentralDP(strategy=build("ocs-uniform"), **REPORTS, **settings)
    pooled = OptimalClientSampling(clients_per_round=2, uniform=True, pool_size=4)
    with pytest.raises(ValueError, match=r"pool_size.*not Poisson"):
        CentralDP(strategy=pooled, amplification="poisson", **settings)
    capped = OptimalClientSampling(clients_per_round=2, uniform=True, report_cap=3.0)
    with pytest.raises(ValueError, match=r"report_cap.*median"):
        CentralDP(strategy=capped, **settings)
    refusals = {
        "mmfl": "water-fill",
        "md": "n_k / sum_j n_j",
        "clustered-size": "clusters",
        "isfedavg": "normalised",
        "power-of-choice": "ranks",
        "fedsampling": "N_tilde",
    }
    for method, reason in refusals.items():
        with pytest.raises(ValueError, match=reason):
            CentralDP(strategy=build(method), **settings)
    strategy = build("ocs-uniform")
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


@pytest.mark.parametrize(
    ("method", "amplification"),
    [("ocs-uniform", "poisson"), ("ocs-uniform", "none"), ("aocs", "none")],
)
@pytest.mark.parametrize("lost", ["every reply", "the train replies"])
def test_a_round_with_nothing_usable_still_releases_noise(
    method: str, amplification: str, lost: str
) -> None:
    """Every round releases model + noise and is accounted, in both modes.

    With every query reply lost (nobody answered: the Poisson case that
    crashed on an empty maximum) or every train reply lost.
    """
    responders = canned_responders(OCS_REPLIES, fleet=FLEET, node_index=lambda n: n - 2)
    strategy = wrapper_for(method, amplification=amplification)
    grid = SpoilingGrid(NUM_NODES, responders)
    grid.change = "lose" if lost == "every reply" else "none"
    list(strategy.configure_train(1, MODEL, ConfigRecord(), grid))
    arrays, metrics = strategy.aggregate_train(1, [])
    assert arrays is not None and metrics is not None
    noise = flatten(arrays).astype(np.float64) - flatten(MODEL)
    # Every coordinate moved: noise of std z C was added (P[|N| < 1e-9] ~ 0).
    assert np.all(np.abs(noise) > 1e-9)
    assert set(metrics) == {DP_EPSILON_METRIC, DP_DELTA_METRIC}
    epsilon = metrics[DP_EPSILON_METRIC]
    assert isinstance(epsilon, float) and epsilon > 0


def test_federated_evaluate_metrics_are_published_only_on_request() -> None:
    reply = Message(
        RecordDict({"metrics": MetricRecord({"num-examples": 5, "accuracy": 0.5})}),
        dst_node_id=2,
        message_type="evaluate",
    )
    for opt_in in (False, True):
        wrapper = CentralDP(
            strategy=OptimalClientSampling(clients_per_round=2, uniform=True),
            noise_multiplier=NOISE_MULTIPLIER,
            clipping_norm=CLIPPING_NORM,
            population_size=NUM_NODES,
            federated_evaluate_metrics=opt_in,
        )
        metrics = wrapper.aggregate_evaluate(1, [reply])
        assert (metrics is not None) == opt_in
