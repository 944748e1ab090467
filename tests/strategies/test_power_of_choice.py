"""PowerOfChoice on a grid of canned replies: selection, aggregation, bad replies.

Node ``i`` (by position) reports size ``SIZES[i]``, loss ``LOSSES[i]`` at the
model it is sent, and trains to the constant model ``i`` with training loss
``TRAIN_LOSSES[i]``; the grid can spoil or silence chosen nodes' replies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import ErrorCode

from flwr_importance.registry import method
from flwr_importance.strategies import PowerOfChoice
from flwr_importance.tooling.testing import CannedReplyGrid, Fleet, canned_responders
from flwr_importance.tooling.testing import canned_strategy as build_canned
from simulations.tooling import canned_variants

NUM_NODES = 12
SIZES = np.array([30, 5, 20, 0, 12, 40, 8, 25, 15, 10, 35, 18])
LOSSES = np.array([0.3, 2.5, 1.1, 9.0, 0.9, 0.2, 1.7, 0.6, 1.4, 2.1, 0.4, 1.0])
TRAIN_LOSSES = LOSSES / 2
MODEL = ArrayRecord.from_array_dict({"w": Array(np.zeros(3, np.float32))})


def constant_model(value: float) -> ArrayRecord:
    return ArrayRecord.from_array_dict({"w": Array(np.full(3, value, np.float32))})


def metrics(values: Mapping[str, float]) -> RecordDict:
    return RecordDict({"metrics": MetricRecord(dict(values))})


@dataclass
class SpoilingGrid(CannedReplyGrid):
    """A canned grid that records each message and spoils or drops some replies."""

    spoiled: dict[tuple[str, int], Callable[[Message], Message | None]] = field(
        default_factory=dict
    )
    sent: list[tuple[str, int]] = field(default_factory=list)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        replies = []
        for message in messages:
            kind = message.metadata.message_type
            index = self.node_index(message.metadata.dst_node_id)
            self.sent.append((kind, index))
            spoil = self.spoiled.get((kind, index))
            reply = self.reply_to(message) if spoil is None else spoil(message)
            if reply is not None:
                replies.append(reply)
        return replies

    def asked(self, kind: str) -> list[int]:
        return [index for sent_kind, index in self.sent if sent_kind == kind]


def make_grid() -> SpoilingGrid:
    def node(message: Message) -> int:
        return int(message.metadata.dst_node_id) - 2

    def train(message: Message) -> RecordDict:
        index = node(message)
        content = metrics(
            {"num-examples": int(SIZES[index]), "train-loss": TRAIN_LOSSES[index]}
        )
        content["arrays"] = constant_model(index)
        return content

    responders = {
        "query.sizes": lambda message: metrics(
            {"num-examples": int(SIZES[node(message)])}
        ),
        "query.loss": lambda message: metrics(
            {
                "loss-0": float(LOSSES[node(message)]),
                "num-examples-0": int(SIZES[node(message)]),
            }
        ),
        "train": train,
    }
    return SpoilingGrid(NUM_NODES, responders)


def run_round(
    strategy: PowerOfChoice, grid: SpoilingGrid, server_round: int = 1
) -> tuple[list[int], ArrayRecord | None, MetricRecord | None]:
    """One round: the trained node positions, the new model and the metrics."""
    grid.sent.clear()
    messages = list(strategy.configure_train(server_round, MODEL, ConfigRecord(), grid))
    trained = [grid.node_index(message.metadata.dst_node_id) for message in messages]
    replies = grid.send_and_receive(messages)
    arrays, round_metrics = strategy.aggregate_train(server_round, replies)
    return trained, arrays, round_metrics


def top(positions: Iterable[int], m: int, losses: np.ndarray = LOSSES) -> list[int]:
    return sorted(sorted(positions, key=lambda index: -losses[index])[:m])


def test_pow_d_trains_the_m_highest_loss_candidates_and_averages_plainly() -> None:
    strategy = PowerOfChoice(clients_per_round=3, candidates=6, seed=1)
    grid = make_grid()
    for server_round in (1, 2, 3):
        trained, arrays, round_metrics = run_round(strategy, grid, server_round)
        candidates = grid.asked("query.loss")
        assert len(set(candidates)) == 6
        assert 3 not in candidates  # a client without samples is never drawn
        assert sorted(trained) == top(candidates, 3)
        assert arrays is not None and round_metrics is not None
        # The plain mean of the selected models (node i sends the constant i).
        expected = np.mean(trained)
        np.testing.assert_allclose(arrays["w"].numpy(), np.full(3, expected))
        assert round_metrics["candidates"] == 6
        assert round_metrics["ranked-candidates"] == 6
        assert round_metrics["selected"] == 3
        assert round_metrics["distinct-clients"] == 3
        assert round_metrics["selected-loss"] == pytest.approx(np.mean(LOSSES[trained]))
    assert grid.asked("query.sizes") == []  # sizes are asked once, in round 1


def test_d_equal_to_the_fleet_always_trains_the_global_top_m() -> None:
    positive = [index for index in range(NUM_NODES) if SIZES[index] > 0]
    strategy = PowerOfChoice(clients_per_round=2, candidates=len(positive))
    grid = make_grid()
    for server_round in (1, 2):
        trained, _, _ = run_round(strategy, grid, server_round)
        assert sorted(trained) == top(positive, 2)


def test_same_seed_same_selection() -> None:
    def selections(seed: int) -> list[list[int]]:
        strategy = PowerOfChoice(clients_per_round=2, candidates=4, seed=seed)
        grid = make_grid()
        return [run_round(strategy, grid, r)[0] for r in (1, 2, 3)]

    assert selections(5) == selections(5)


def error_reply(message: Message) -> Message:
    return Message(
        Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "boom"), reply_to=message
    )


def nan_loss(message: Message) -> Message:
    return Message(
        metrics({"loss-0": float("nan"), "num-examples-0": 1}), reply_to=message
    )


def no_loss(message: Message) -> Message:
    return Message(metrics({"num-examples-0": 1}), reply_to=message)


def test_candidates_without_a_usable_loss_are_not_selected(
    caplog: pytest.LogCaptureFixture,
) -> None:
    positive = [index for index in range(NUM_NODES) if SIZES[index] > 0]
    strategy = PowerOfChoice(clients_per_round=3, candidates=len(positive))
    grid = make_grid()
    # The three highest-loss clients fail, send NaN, or never answer.
    worst = top(positive, 3)
    for spoil, index in zip((error_reply, nan_loss, no_loss), worst, strict=True):
        grid.spoiled[("query.loss", index)] = spoil
    silent = top(set(positive) - set(worst), 1)[0]
    grid.spoiled[("query.loss", silent)] = lambda message: None
    with caplog.at_level(logging.WARNING):
        trained, arrays, round_metrics = run_round(strategy, grid)
    usable = set(positive) - set(worst) - {silent}
    assert sorted(trained) == top(usable, 3)
    assert arrays is not None and round_metrics is not None
    assert round_metrics["ranked-candidates"] == len(usable)
    assert "4 of 11 candidates gave no usable loss" in caplog.text
    assert "query.loss: node" in caplog.text  # named by node


def test_fewer_answers_than_m_trains_those_and_none_skips_the_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = PowerOfChoice(clients_per_round=3, candidates=11)
    grid = make_grid()
    answering = 4
    for index in range(NUM_NODES):
        if index != answering:
            grid.spoiled[("query.loss", index)] = error_reply
    trained, arrays, round_metrics = run_round(strategy, grid)
    assert trained == [answering]
    assert arrays is not None and round_metrics is not None
    np.testing.assert_allclose(arrays["w"].numpy(), np.full(3, answering))
    grid.spoiled[("query.loss", answering)] = error_reply
    with caplog.at_level(logging.WARNING):
        trained, arrays, _ = run_round(strategy, grid, server_round=2)
    assert trained == [] and arrays is None
    assert "no usable reply, the model is unchanged" in caplog.text


def test_fewer_clients_than_d_warns_and_takes_them_all(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = PowerOfChoice(clients_per_round=2, candidates=20)
    grid = make_grid()
    with caplog.at_level(logging.WARNING):
        trained, _, round_metrics = run_round(strategy, grid)
    assert "fewer than candidates=20: all of them are candidates" in caplog.text
    assert sorted(grid.asked("query.loss")) == [i for i in range(12) if SIZES[i]]
    assert round_metrics is not None and round_metrics["candidates"] == 11
    assert len(trained) == 2


def test_bad_train_replies_are_dropped_from_the_mean() -> None:
    strategy = PowerOfChoice(clients_per_round=3, candidates=6, seed=3)
    grid = make_grid()
    messages = list(strategy.configure_train(1, MODEL, ConfigRecord(), grid))
    replies = list(grid.send_and_receive(messages))
    bad = Message(
        RecordDict(
            {
                "arrays": constant_model(float("nan")),
                "metrics": MetricRecord({"num-examples": 3}),
            }
        ),
        reply_to=messages[0],
    )
    arrays, _ = strategy.aggregate_train(1, [bad, *replies[1:]])
    good = [grid.node_index(m.metadata.dst_node_id) for m in messages[1:]]
    assert arrays is not None
    np.testing.assert_allclose(arrays["w"].numpy(), np.full(3, np.mean(good)))


def test_rpow_d_ranks_unseen_clients_first_then_by_their_last_train_loss() -> None:
    positive = [index for index in range(NUM_NODES) if SIZES[index] > 0]
    strategy = PowerOfChoice(
        clients_per_round=4, candidates=len(positive), variant="rpow-d", seed=0
    )
    grid = make_grid()
    seen: set[int] = set()
    for server_round in (1, 2):
        trained, _, round_metrics = run_round(strategy, grid, server_round)
        assert grid.asked("query.loss") == []  # no extra round trip
        assert not seen & set(trained)  # unseen clients rank first
        seen |= set(trained)
        assert round_metrics is not None and round_metrics["ranked-candidates"] == 11
    assert round_metrics is not None
    assert "selected-loss" not in round_metrics  # only unknown losses so far
    assert strategy.train_losses == {
        grid._node_ids[i]: pytest.approx(TRAIN_LOSSES[i]) for i in seen
    }
    # Round 3: the 3 still unseen first, then the highest reported train loss.
    unseen = set(positive) - seen
    trained, _, round_metrics = run_round(strategy, grid, 3)
    assert sorted(trained) == sorted([*unseen, *top(seen, 1, TRAIN_LOSSES)])
    # Round 4: everyone has reported; the top 4 by train loss.
    trained, _, round_metrics = run_round(strategy, grid, 4)
    assert sorted(trained) == top(positive, 4, TRAIN_LOSSES)
    assert round_metrics is not None
    assert round_metrics["selected-loss"] == pytest.approx(
        np.mean(TRAIN_LOSSES[trained])
    )


def test_rpow_d_keeps_the_previous_loss_when_a_reply_has_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = PowerOfChoice(clients_per_round=11, candidates=11, variant="rpow-d")
    grid = make_grid()
    run_round(strategy, grid)
    node = grid._node_ids[0]

    def without_train_loss(message: Message) -> Message:
        content = metrics({"num-examples": 30})
        content["arrays"] = constant_model(0)
        return Message(content, reply_to=message)

    grid.spoiled[("train", 0)] = without_train_loss
    with caplog.at_level(logging.WARNING):
        run_round(strategy, grid, 2)
    assert "1 of 11 replies carry no finite 'train-loss'" in caplog.text
    assert strategy.train_losses[node] == pytest.approx(TRAIN_LOSSES[0])


def test_defaults_and_summary(caplog: pytest.LogCaptureFixture) -> None:
    strategy = PowerOfChoice(clients_per_round=4)
    assert strategy.candidates == 8  # d = 2m
    assert PowerOfChoice(clients_per_round=4, candidates=0).candidates == 8
    assert strategy.variant == "pow-d"
    with caplog.at_level(logging.INFO):
        strategy.summary()
    assert "Candidates per round (d): 8" in caplog.text
    assert "Multiset" not in caplog.text


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"clients_per_round": 3, "candidates": 2}, ValueError, r"d = 2\) must be >="),
        ({"clients_per_round": 3, "candidates": -1}, ValueError, "candidates must be"),
        ({"clients_per_round": 3, "candidates": 4.0}, TypeError, "candidates must be"),
        ({"clients_per_round": 0}, ValueError, "clients_per_round must be >= 1"),
        ({"clients_per_round": 2, "variant": "cpow-d"}, ValueError, "variant must"),
        ({"clients_per_round": 2, "seed": -1}, ValueError, "seed must be >= 0"),
    ],
)
def test_bad_settings_fail_at_construction(
    arguments: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        PowerOfChoice(**arguments)  # type: ignore[arg-type]


def test_the_declared_canned_variant_runs_a_round() -> None:
    spec = method("power-of-choice")
    assert spec.strategy is PowerOfChoice
    fleet = Fleet.skewed(
        num_nodes=20, model=MODEL, reply_models=[constant_model(1.0)], seed=0
    )
    declared, variant = canned_variants()["power-of-choice"]
    assert declared is spec
    grid = CannedReplyGrid(
        20,
        canned_responders(
            variant.replies, fleet=fleet, node_index=lambda node: node - 2
        ),
    )
    strategy = build_canned(
        spec, variant, clients_per_round=3, fleet=fleet, projection_dim=8
    )
    assert isinstance(strategy, PowerOfChoice)
    messages = list(strategy.configure_train(1, MODEL, ConfigRecord(), grid))
    assert len(messages) == 3
    arrays, _ = strategy.aggregate_train(1, grid.send_and_receive(messages))
    assert arrays is not None
    np.testing.assert_allclose(arrays["w"].numpy(), 1.0)
