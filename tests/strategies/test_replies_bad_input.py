"""Property-based: a corrupt reply is excluded, logged by node, and harmless.

For every strategy, hypothesis picks one message type the strategy consumes
(``train`` or its query: sizes, norms), one node's reply to it, and a way to
spoil that reply: an error reply, NaN or infinite arrays, a wrong shape,
missing arrays, a missing, NaN, negative or huge (``1e300``) metric, or a
second reply from the same node (a duplicated node id). The replies are real
``flwr.app.Message``s answering the strategy's own messages, built by the
canned-reply grid of :mod:`flwr_importance.tooling.testing.canned` (each strategy's
client contract) on a small model.

Checked: no exception, a finite global model, a WARNING naming the node, and
the same aggregate as when that node's reply never arrived (for a duplicate:
as when it came once), so the good replies aggregate to what they would alone.
``aggregate_evaluate`` gets the same treatment: good evaluate replies plus one
spoiled (error, missing/NaN/negative/huge weight, two MetricRecords, a second
reply from the node) aggregate to the good replies' metrics alone.

The number of cases tried is recorded per test (``record_property``) and
printed in the terminal summary (``tests/strategies/conftest.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

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
from flwr.serverapp.strategy import Strategy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from flwr_importance.strategies.arrays import flatten
from flwr_importance.strategies.mmfl import pack_models
from flwr_importance.tooling.testing import (
    CannedReplyGrid,
    Fleet,
    canned_responders,
    canned_strategy,
)
from simulations.tooling import canned_variants

NUM_NODES = 30
CLIENTS_PER_ROUND = 3
#: Larger than the model: clustered similarity keeps whole representative gradients.
PROJECTION_DIM = 1024
#: Every canned variant of every registry method, by name.
VARIANTS = canned_variants()
METHODS = tuple(VARIANTS)
CORRUPTIONS = (
    "error",
    "nan-array",
    "inf-array",
    "wrong-shape",
    "missing-arrays",
    "missing-metric",
    "nan-metric",
    "negative-metric",
    "huge-metric",
    "duplicate",
)
ARRAY_CORRUPTIONS = {"nan-array", "inf-array", "wrong-shape", "missing-arrays"}
HUGE = 1e300
#: Metrics that may be negative: OCS/MMFL only report the mean train loss, and
#: a loss may be negative (e.g. a Gaussian negative log-likelihood).
SIGNED_METRICS = {"train-loss"}
#: Metrics a reply may leave out (checked only when there): OCS/MMFL's train
#: loss, a round metric a project's train function may not report.
OPTIONAL_METRICS = {"train-loss"}
MAX_EXAMPLES = 8


def small_fleet() -> Fleet:
    """A 10x5 + 5 float32 model and skewed sizes and norms for 30 nodes."""
    rng = np.random.default_rng(0)
    model = ArrayRecord(
        {
            "weight": Array(rng.standard_normal((10, 5)).astype(np.float32)),
            "bias": Array(np.zeros(5, np.float32)),
        }
    )
    return Fleet.skewed(num_nodes=NUM_NODES, model=model, reply_models=[model])


FLEET = small_fleet()


@dataclass(frozen=True)
class Spoil:
    """How one reply is spoiled: its message type, node, kind and metric."""

    message_type: str
    victim: int  # index into that round's messages of the type (modulo)
    kind: str
    metric: int  # index into the reply's metric keys (modulo)

    def changes(self, content: RecordDict) -> bool:
        """Whether the spoil alters what the strategy reads of ``content``."""
        if self.kind in ARRAY_CORRUPTIONS:
            return bool(content.array_records)
        if self.kind in ("error", "duplicate"):
            return True
        return any(
            self._spoilable(dict(record)) for record in content.metric_records.values()
        )

    def _spoilable(self, values: dict[str, Any]) -> list[str]:
        """The metric keys this spoil may alter."""
        if self.kind == "negative-metric":
            return [key for key in values if key not in SIGNED_METRICS]
        if self.kind == "missing-metric":
            return [key for key in values if key not in OPTIONAL_METRICS]
        return list(values)

    def apply(self, message: Message, content: RecordDict) -> list[Message]:
        """The replies the node sends instead of its good one."""
        if self.kind == "error":
            error = Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "ValueError: boom")
            return [Message(error, reply_to=message)]
        if self.kind == "duplicate":
            second = Spoil(self.message_type, 0, "nan-array", self.metric)
            return [
                Message(content, reply_to=message),
                *second.apply(message, content),
            ]
        spoiled = RecordDict()
        for name, record in content.items():
            if isinstance(record, ArrayRecord):
                if self.kind == "missing-arrays":
                    continue
                spoiled[name] = self._arrays(record)
            elif name in content.metric_records:
                spoiled[name] = self._metrics(dict(record))
            else:
                spoiled[name] = record
        return [Message(spoiled, reply_to=message)]

    def _arrays(self, record: ArrayRecord) -> ArrayRecord:
        arrays = {key: array.numpy().copy() for key, array in record.items()}
        first = next(iter(arrays))
        if self.kind == "nan-array":
            arrays[first].flat[0] = np.nan
        elif self.kind == "inf-array":
            arrays[first].flat[-1] = -np.inf
        elif self.kind == "wrong-shape":
            arrays[first] = np.zeros(arrays[first].size + 1, arrays[first].dtype)
        return ArrayRecord({key: Array(value) for key, value in arrays.items()})

    def _metrics(self, values: dict[str, Any]) -> MetricRecord:
        keys = sorted(self._spoilable(values))
        key = keys[self.metric % len(keys)]
        if self.kind == "missing-metric":
            del values[key]
        elif self.kind == "nan-metric":
            values[key] = float("nan")
        elif self.kind == "negative-metric":
            values[key] = -abs(float(values[key])) - 1.0
        elif self.kind == "huge-metric":
            values[key] = HUGE
        return MetricRecord(values)


@dataclass
class SpoilingGrid(CannedReplyGrid):
    """Canned replies, one of them spoiled (or dropped, for the reference run)."""

    spoil: Spoil | None = None
    drop_victim: bool = False
    victims: list[int] = field(default_factory=list)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Each message's canned reply; the victim's spoiled or dropped."""
        messages = list(messages)
        spoil = self.spoil
        targeted = [
            m
            for m in messages
            if spoil and m.metadata.message_type == spoil.message_type
        ]
        victim = targeted[spoil.victim % len(targeted)] if spoil and targeted else None
        replies: list[Message] = []
        for message in messages:
            reply = self.reply_to(message)
            if (
                spoil is None
                or message is not victim
                or not spoil.changes(reply.content)
            ):
                replies.append(reply)
                continue
            # Only a reply really spoiled (or dropped) names a victim.
            self.victims.append(message.metadata.dst_node_id)
            if not self.drop_victim:
                replies.extend(spoil.apply(message, reply.content))
        return replies


def new_strategy(method: str) -> Strategy:
    """A fresh ``method`` strategy training 3 of the fleet's nodes a round."""
    return canned_strategy(
        *VARIANTS[method],
        clients_per_round=CLIENTS_PER_ROUND,
        fleet=FLEET,
        projection_dim=PROJECTION_DIM,
    )


def one_round(method: str, grid: SpoilingGrid) -> NDArray[np.float64] | None:
    """Round 1 of a fresh strategy; the flattened new model (None: unchanged)."""
    strategy = new_strategy(method)
    packed = VARIANTS[method][1].packed_models
    arrays = pack_models([FLEET.model]) if packed else FLEET.model
    messages = strategy.configure_train(1, arrays, ConfigRecord(), grid)
    new_arrays, _ = strategy.aggregate_train(1, grid.send_and_receive(messages))
    return None if new_arrays is None else flatten(new_arrays)


def make_grid(method: str, spoil: Spoil | None, drop_victim: bool) -> SpoilingGrid:
    grid = SpoilingGrid(NUM_NODES, {}, spoil=spoil, drop_victim=drop_victim)
    replies = VARIANTS[method][1].replies
    grid.responders = canned_responders(
        replies, fleet=FLEET, node_index=grid.node_index
    )
    return grid


@pytest.fixture
def flower_warnings(
    caplog: pytest.LogCaptureFixture,
) -> Iterator[pytest.LogCaptureFixture]:
    """Capture Flower's logger (it does not propagate to the root by default)."""
    flower = logging.getLogger("flwr")
    flower.propagate = True
    with caplog.at_level(logging.WARNING, logger="flwr"):
        yield caplog
    flower.propagate = False


def spoils(method: str, kind: str) -> st.SearchStrategy[Spoil]:
    """Spoils of kind ``kind`` of the message types ``method`` sends."""
    types = sorted(VARIANTS[method][1].replies)
    return st.builds(
        Spoil,
        message_type=st.sampled_from(types),
        victim=st.integers(0, 1000),
        kind=st.just(kind),
        metric=st.integers(0, 10),
    )


@pytest.mark.parametrize("kind", CORRUPTIONS)
@pytest.mark.parametrize("method", METHODS)
def test_a_spoiled_reply_is_excluded_logged_and_changes_nothing_else(
    method: str,
    kind: str,
    flower_warnings: pytest.LogCaptureFixture,
    record_property: Callable[[str, object], None],
) -> None:
    tried, spoiled_replies = [], []

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(spoil=spoils(method, kind))
    def check(spoil: Spoil) -> None:
        tried.append(spoil)
        flower_warnings.clear()
        spoiled_grid = make_grid(method, spoil, drop_victim=False)
        spoiled = one_round(method, spoiled_grid)
        if not spoiled_grid.victims:
            return  # no message of that type, or nothing there to spoil
        (victim,) = spoiled_grid.victims
        spoiled_replies.append(spoil)
        reference = one_round(
            method, make_grid(method, spoil, drop_victim=spoil.kind != "duplicate")
        )
        assert spoiled is None or np.all(np.isfinite(spoiled))
        if reference is None:
            assert spoiled is None
        else:
            assert spoiled is not None
            np.testing.assert_allclose(spoiled, reference, rtol=1e-12, atol=0)
        assert any(
            str(victim) in record.getMessage() and record.levelno >= logging.WARNING
            for record in flower_warnings.records
        ), f"no warning names node {victim} for {spoil}"

    check()
    record_property("hypothesis_cases", len(tried))
    record_property("spoiled_replies", len(spoiled_replies))
    assert spoiled_replies, f"no {kind} reply of {method} was spoiled"


# -- aggregate_evaluate ---------------------------------------------------------
EVALUATE_SPOILS = (
    "error",
    "missing-weight",
    "nan-weight",
    "negative-weight",
    "huge-weight",
    "two-metric-records",
    "duplicate",
)


def evaluate_reply(node_id: int, content: RecordDict | Error) -> Message:
    """A reply from ``node_id`` to an ``evaluate`` instruction."""
    instruction = Message(RecordDict(), node_id, "evaluate")
    instruction.metadata.__dict__["_message_id"] = f"evaluate-{node_id}"
    return Message(content, reply_to=instruction)


def evaluate_metrics(size: int, accuracy: float) -> RecordDict:
    """A good evaluate reply's content."""
    return RecordDict(
        {"metrics": MetricRecord({"num-examples": size, "accuracy": accuracy})}
    )


def spoiled_evaluate(node_id: int, kind: str) -> list[Message]:
    """The replies a node sends instead of a good evaluate reply."""
    if kind == "error":
        error = Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "ValueError: boom")
        return [evaluate_reply(node_id, error)]
    if kind == "duplicate":
        good = evaluate_reply(node_id, evaluate_metrics(10, 0.5))
        return [good, evaluate_reply(node_id, evaluate_metrics(10**6, 0.0))]
    metrics: dict[str, Any] = {"num-examples": 10, "accuracy": 0.9}
    if kind == "missing-weight":
        del metrics["num-examples"]
    else:
        metrics["num-examples"] = {
            "nan-weight": float("nan"),
            "negative-weight": -5,
            "huge-weight": HUGE,
            "two-metric-records": 10,
        }[kind]
    content = RecordDict({"metrics": MetricRecord(metrics)})
    if kind == "two-metric-records":
        content["more"] = MetricRecord({"accuracy": 1.0})
    return [evaluate_reply(node_id, content)]


@pytest.mark.parametrize("kind", EVALUATE_SPOILS)
@pytest.mark.parametrize("method", METHODS)
def test_aggregate_evaluate_excludes_a_spoiled_reply_and_names_its_node(
    method: str,
    kind: str,
    flower_warnings: pytest.LogCaptureFixture,
    record_property: Callable[[str, object], None],
) -> None:
    make_grid(method, None, drop_victim=False)  # sets Flower's TaskIdentity
    tried = []

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(
        sizes=st.lists(st.integers(1, 500), min_size=1, max_size=6),
        accuracy=st.floats(0, 1),
    )
    def check(sizes: list[int], accuracy: float) -> None:
        tried.append(sizes)
        flower_warnings.clear()
        strategy = new_strategy(method)
        good = [
            evaluate_reply(node_id, evaluate_metrics(size, accuracy * node_id % 1))
            for node_id, size in enumerate(sizes, start=2)
        ]
        victim = len(sizes) + 2
        spoiled = strategy.aggregate_evaluate(
            1, [*good, *spoiled_evaluate(victim, kind)]
        )
        alone = strategy.aggregate_evaluate(
            1,
            good + spoiled_evaluate(victim, kind)[:1] if kind == "duplicate" else good,
        )
        assert spoiled is not None and alone is not None
        assert dict(spoiled) == pytest.approx(dict(alone), rel=1e-12)
        assert any(
            f"node {victim}" in record.getMessage()
            for record in flower_warnings.records
        ), f"no warning names node {victim} ({kind})"

    check()
    record_property("hypothesis_cases", len(tried))
    record_property("spoiled_replies", len(tried))
