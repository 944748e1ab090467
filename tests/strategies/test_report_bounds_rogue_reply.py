"""One dishonest node cannot capture a round when ``report_cap`` is on.

A rogue node answers like the others but reports a size, an update norm, a
loss or ISFedAvg's statistics 10^6 times theirs. Its share of a round's
aggregate weight is its inclusion probability times its weight in the update,
read off the strategy's round plan: exactly (OCS, MMFL: the expected weight
``p_i * d_i / p_i``) or by Monte Carlo over rounds (the draw-based methods),
with a tolerance of 4 standard errors. With ``report_cap = c`` that share is
at most what a node honestly reporting ``c`` times the median gets (the same
plans, draw for draw, for the same seed) and, where it has a closed form,
below it; with the bound off (the default) the lie captures the round, so
each test can fail. docs/deployment.md, section "A dishonest node's reach",
states the same per method; the registry test at the end fails when a method
that samples by a reported quantity has no case here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MetricRecord,
    RecordDict,
)

from flwr_importance.compat import legacy_class
from flwr_importance.registry import methods
from flwr_importance.sampling.variance_reduced import optimal_client_probs
from flwr_importance.strategies import (
    ISFedAvg,
    MDSampling,
    MultiModelSampling,
    OptimalClientSampling,
    PowerOfChoice,
)
from flwr_importance.strategies.clustered import ClusteredSampling
from flwr_importance.strategies.mmfl import pack_models
from flwr_importance.tooling.testing.canned import CannedReplyGrid

DEPLOYMENT_DOC = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"

ROGUE = 2  # the first node id of a CannedReplyGrid
LIE = 1e6
CAP = 3.0
HONEST_SIZE = 100
MODEL = ArrayRecord.from_array_dict({"w": Array(np.zeros(3, dtype=np.float32))})


@dataclass(frozen=True)
class Reports:
    """What each node reports; the rogue reports ``rogue`` times the others."""

    quantity: str  # "size", "norm" (norms and losses) or "statistics" (ISFedAvg)
    rogue: float

    def value(self, node_id: int, quantity: str, honest: float) -> float:
        return (
            honest * self.rogue
            if node_id == ROGUE and quantity == self.quantity
            else honest
        )


def responder(reports: Reports) -> Callable[[Message], RecordDict]:
    """Replies to every message type the covered strategies send."""

    def respond(message: Message) -> RecordDict:
        node = message.metadata.dst_node_id
        size = reports.value(node, "size", HONEST_SIZE)
        score = reports.value(node, "norm", 1.0)
        content = RecordDict()
        message_type = message.metadata.message_type
        config = message.content.config_records.get("config", ConfigRecord())
        num_models = int(config.get("num-models", 2))  # type: ignore[arg-type]
        if message_type == "query.sizes":
            if "num-models" in config:
                per_model = {f"num-examples-{s}": size for s in range(num_models)}
                content["metrics"] = MetricRecord(per_model)  # type: ignore[arg-type]
            else:
                content["metrics"] = MetricRecord({"num-examples": size})
        elif message_type.startswith("query."):
            models = [
                key for key in message.content.array_records if key.startswith("model-")
            ]
            metrics: dict[str, float] = {}
            for s in range(len(models)):
                metrics.update(
                    {
                        f"update-norm-{s}": score,
                        f"loss-{s}": score,
                        f"num-examples-{s}": size,
                    }
                )
            content["metrics"] = MetricRecord(metrics)  # type: ignore[arg-type]
        else:  # train
            statistic = reports.value(node, "statistics", 1.0)
            metrics = {"num-examples": size, "train-loss": score}
            if "model-index" in config:
                metrics["model-index"] = int(config["model-index"])  # type: ignore[arg-type]
                content["update"] = MODEL
            else:
                content["arrays"] = MODEL
            metrics.update({"isfedavg-sigma2": statistic, "isfedavg-g2": statistic})
            content["metrics"] = MetricRecord(metrics)  # type: ignore[arg-type]
        return content

    return respond


def rounds(
    strategy: Any,
    reports: Reports,
    num_nodes: int,
    num_rounds: int,
    arrays: ArrayRecord = MODEL,
) -> Iterator[Any]:
    """Run ``num_rounds`` rounds on canned replies, yielding each round's plan."""
    respond = responder(reports)
    grid = CannedReplyGrid(
        num_nodes,
        dict.fromkeys(["train", "query.sizes", "query.norm", "query.loss"], respond),
    )
    for server_round in range(1, num_rounds + 1):
        messages = list(
            strategy.configure_train(server_round, arrays, ConfigRecord(), grid)
        )
        yield strategy.plan
        strategy.aggregate_train(server_round, grid.send_and_receive(messages))


# -- the share of the aggregate weight, per kind of plan ---------------------------
def unbiased_share(plan: Any) -> tuple[float, float]:
    """OCS/MMFL: (the rogue's expected share ``sum_s p d / p / S``, its max ``p``)."""
    row = plan.row_of(ROGUE)
    probs, fractions = plan.probs[row], plan.fractions[row]
    weight = np.where(probs > 0, probs * fractions / np.where(probs > 0, probs, 1), 0)
    return float(weight.sum() / plan.fractions.shape[1]), float(probs.sum())


def draw_share(plan: Any) -> float:
    """MD, clustered sampling, Power-of-Choice: the rogue's draws over all draws."""
    return plan.drawn[ROGUE] / sum(plan.drawn.values())


def mean_share(plan: Any) -> float:
    """ISFedAvg: the plain mean of the selected nodes' models (eq. 5)."""
    return (ROGUE in plan.nodes) / len(plan.nodes)


def monte_carlo(shares: list[float], spread: float) -> tuple[float, float]:
    """The mean share and 4 standard errors (``spread``: a bound on its std)."""
    return float(np.mean(shares)), 4 * spread / np.sqrt(len(shares))


# -- the cases ---------------------------------------------------------------------
@pytest.mark.parametrize("quantity", ["size", "norm"])
@pytest.mark.parametrize("name", ["ocs", "mmfl"])
def test_variance_reduced_sampling(name: str, quantity: str) -> None:
    num_nodes, m = 10, 3

    def plan(report_cap: float | None, rogue: float) -> Any:
        if name == "ocs":
            strategy: Any = OptimalClientSampling(
                clients_per_round=m, report_cap=report_cap
            )
            arrays = MODEL
        else:
            strategy = MultiModelSampling(
                num_models=2, clients_per_round=m, report_cap=report_cap
            )
            arrays = pack_models([MODEL, MODEL])
        return next(rounds(strategy, Reports(quantity, rogue), num_nodes, 1, arrays))

    capped_share, capped_prob = unbiased_share(plan(CAP, LIE))
    assert (capped_share, capped_prob) == unbiased_share(plan(None, CAP))
    open_share, open_prob = unbiased_share(plan(None, LIE))
    if quantity == "size":
        # d_i = c n / (c n + (N - 1) n) with the cap; -> 1 without.
        assert capped_share == pytest.approx(CAP / (CAP + num_nodes - 1))
        assert open_share > 0.99
    else:
        # The weight stays d_i = 1/N (p cancels); the lie buys participation.
        assert capped_share == pytest.approx(1 / num_nodes)
        assert open_share == pytest.approx(1 / num_nodes)
        scores = np.array([CAP] + [1.0] * (num_nodes - 1)) / num_nodes
        bound = optimal_client_probs(scores, m)[0] if name == "ocs" else capped_prob
        assert capped_prob == pytest.approx(bound)
        assert capped_prob < 0.9 < open_prob


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(
            lambda cap: MDSampling(clients_per_round=4, report_cap=cap), id="md"
        ),
        pytest.param(
            lambda cap: ClusteredSampling(
                clients_per_round=4, method="size", **{"report_cap": cap}
            ),
            id="clustered",
        ),
    ],
)
def test_size_proportional_draws(build: Callable[[float | None], Any]) -> None:
    num_nodes, m, num_rounds = 10, 4, 400

    def shares(report_cap: float | None, rogue: float) -> list[float]:
        reports = Reports("size", rogue)
        return [
            draw_share(plan)
            for plan in rounds(build(report_cap), reports, num_nodes, num_rounds)
        ]

    capped = shares(CAP, LIE)
    assert capped == shares(None, CAP)
    q = CAP / (CAP + num_nodes - 1)  # E[share] = the rogue's size fraction
    mean, tolerance = monte_carlo(capped, np.sqrt(q * (1 - q) / m))
    assert mean <= q + tolerance
    assert np.mean(shares(None, LIE)) > 0.99


def test_power_of_choice() -> None:
    num_nodes, d, m, num_rounds = 40, 4, 2, 300

    def shares(report_cap: float | None, reports: Reports) -> list[float]:
        strategy = PowerOfChoice(
            clients_per_round=m, candidates=d, report_cap=report_cap
        )
        return [
            draw_share(plan)
            for plan in rounds(strategy, reports, num_nodes, num_rounds)
        ]

    # The worst rogue lies about both: a huge loss wins every rank it enters,
    # so its share is P(candidate) / m, and the cap bounds only P(candidate).
    both = Reports("size", LIE)
    capped = shares(CAP, both)
    # Each of the d draws picks it with probability <= c / (c + N - d).
    bound = d * CAP / (CAP + num_nodes - d) / m
    mean, tolerance = monte_carlo(capped, 1 / (2 * m))
    assert mean <= bound + tolerance
    assert capped == shares(None, Reports("size", CAP))
    assert np.mean(shares(None, both)) > 0.99 / m


def test_isfedavg() -> None:
    num_nodes, clients, num_rounds = 10, 2, 300

    def shares(report_cap: float | None, rogue: float) -> list[float]:
        strategy = ISFedAvg(clients_per_round=clients, report_cap=report_cap)
        reports = Reports("statistics", rogue)
        return [
            mean_share(plan)
            for plan in rounds(strategy, reports, num_nodes, num_rounds)
        ]

    capped = shares(CAP, LIE)
    assert capped == shares(None, CAP)
    capped_mean, tolerance = monte_carlo(capped, 1 / (2 * clients))
    open_mean, _ = monte_carlo(shares(None, LIE), 1 / (2 * clients))
    # Without the cap it is in nearly every round: share -> 1/L.
    assert open_mean > 0.9 / clients
    assert capped_mean + 2 * tolerance < open_mean


# -- the option itself ------------------------------------------------------------
COVERED = {
    "ocs": test_variance_reduced_sampling,
    "mmfl": test_variance_reduced_sampling,
    "md": test_size_proportional_draws,
    "clustered": test_size_proportional_draws,
    "power-of-choice": test_power_of_choice,
    "isfedavg": test_isfedavg,
}
#: Methods that sample by no reported quantity, and why (their exposure is
#: stated in docs/deployment.md all the same).
NOT_SAMPLED_BY_REPORTS = {
    "fedsampling": "sizes already randomized in [1, M - 1]; a cap would bias N_tilde",
    "folb": "uniform draws; reported gradients reweight, they do not sample",
}


def test_every_method_that_samples_by_a_report_has_a_rogue_reply_test() -> None:
    names = {spec.name for spec in methods()}
    unaccounted = names - COVERED.keys() - NOT_SAMPLED_BY_REPORTS.keys()
    assert not unaccounted, (
        f"{sorted(unaccounted)}: add a rogue-reply case (and report_cap) here, or "
        "say in NOT_SAMPLED_BY_REPORTS why the method samples by no reported quantity"
    )
    assert not (COVERED.keys() | NOT_SAMPLED_BY_REPORTS.keys()) - names
    section = DEPLOYMENT_DOC.read_text().split("### A dishonest node's reach")[1]
    for spec in methods():
        assert f"`{spec.name}`" in section.split("\n## ")[0], spec.name
    for name in COVERED:
        assert _strategy_class(name)(**_minimal_arguments(name), report_cap=CAP)


def _strategy_class(name: str) -> Any:
    return next(spec.strategy for spec in methods() if spec.name == name)


def _minimal_arguments(name: str) -> dict[str, Any]:
    return (
        {"num_models": 2, "clients_per_round": 2}
        if name == "mmfl"
        else {"clients_per_round": 2}
    )


@pytest.mark.parametrize("name", sorted(COVERED))
def test_report_cap_is_off_by_default_and_checked(name: str) -> None:
    strategy_class = _strategy_class(name)
    arguments = _minimal_arguments(name)
    assert strategy_class(**arguments).report_cap is None
    assert strategy_class(**arguments, report_cap=CAP).report_cap == CAP
    wrong_type: tuple[Any, ...] = ("3", True, [3.0])
    for bad in wrong_type:
        with pytest.raises(TypeError, match="report_cap"):
            strategy_class(**arguments, report_cap=bad)
    for value in (1.0, 0.5, 0.0, -2.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="report_cap"):
            strategy_class(**arguments, report_cap=value)
    if any(spec.name == name and spec.legacy_api for spec in methods()):
        legacy: Any = legacy_class(name)(**arguments, report_cap=CAP)
        assert legacy.strategy.report_cap == CAP


def test_a_clipped_report_is_logged_by_node(caplog: pytest.LogCaptureFixture) -> None:
    flower = logging.getLogger("flwr")
    flower.propagate = True
    try:
        with caplog.at_level(logging.WARNING):
            strategy = MDSampling(clients_per_round=2, report_cap=CAP)
            next(rounds(strategy, Reports("size", LIE), 5, 1))
    finally:
        flower.propagate = False
    assert (
        f"node {ROGUE} reported num-examples = 1e+08, above report_cap = 3 times "
        "the round's median (100): counted as 300"
    ) in caplog.text
