"""Reply checking and array plumbing shared by all strategies."""

from __future__ import annotations

import io
import logging

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

from flwr_importance.aggregation import mean, weighted_sum
from flwr_importance.strategies.arrays import (
    all_finite,
    array_values,
    combine_arrays,
    flatten,
    unflatten,
)
from flwr_importance.strategies.messages import node_messages
from flwr_importance.strategies.replies import check_replies
from flwr_importance.tooling.testing import InProcessGrid
from tests.tooling.testing.test_grid import app as echo_app

MODEL = ArrayRecord([np.zeros((2, 3), np.float32), np.zeros(3, np.float32)])


def reply(
    node_id: int,
    arrays: ArrayRecord | None = MODEL,
    metrics: dict[str, float] | None = None,
    error: str | None = None,
) -> Message:
    """A reply from ``node_id`` to a fresh instruction message."""
    instruction = Message(RecordDict(), node_id, "train")
    instruction.metadata.__dict__["_message_id"] = f"m{node_id}"
    if error is not None:
        return Message(Error(2, error), reply_to=instruction)
    content = RecordDict({"metrics": MetricRecord(metrics or {"norm": 1.0})})
    if arrays is not None:
        content["arrays"] = arrays
    return Message(content, reply_to=instruction)


@pytest.fixture(autouse=True)
def _task_identity() -> None:
    # Messages can only be built once Flower's TaskIdentity is set.
    InProcessGrid(echo_app, num_nodes=1)


def test_flatten_unflatten_round_trip_keeps_keys_shapes_dtypes() -> None:
    record = ArrayRecord(
        [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([7.0, 8.0])]
    )
    vector = flatten(record)
    np.testing.assert_array_equal(vector, [0, 1, 2, 3, 4, 5, 7, 8])
    back = unflatten(vector, record)
    assert list(back.keys()) == list(record.keys())
    for key in record:
        assert back[key].dtype == record[key].dtype
        np.testing.assert_array_equal(back[key].numpy(), record[key].numpy())
    with pytest.raises(ValueError, match="entries"):
        unflatten(np.zeros(3), record)


def test_check_replies_keeps_good_ones_and_names_the_bad_nodes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nan_model = ArrayRecord(
        [np.full((2, 3), np.nan, np.float32), np.zeros(3, np.float32)]
    )
    wrong_shape = ArrayRecord([np.zeros((3, 3), np.float32), np.zeros(3, np.float32)])
    replies = [
        reply(11),
        reply(11),  # duplicate
        reply(12, error="boom"),
        reply(13, metrics={"other": 1.0}),  # missing key
        reply(14, metrics={"norm": float("nan")}),
        reply(15, metrics={"norm": -1.0}),
        reply(16, arrays=nan_model),
        reply(17, arrays=wrong_shape),
        reply(18, arrays=None),
        reply(19, metrics={"norm": 2.5}),
    ]
    logging.getLogger("flwr").propagate = True
    with caplog.at_level(logging.WARNING, logger="flwr"):
        checked = check_replies(
            replies,
            metric_keys=["norm"],
            nonnegative_keys=["norm"],
            expected_arrays=MODEL,
        )
    assert [item.node_id for item in checked] == [11, 19]
    assert checked[1].metrics["norm"] == 2.5
    assert list(checked[1].array_record.keys()) == list(MODEL.keys())
    for node_id in range(12, 19):
        assert f"node {node_id} excluded" in caplog.text
    assert "node 11 excluded: duplicate" in caplog.text


def test_node_messages_carry_each_nodes_own_config() -> None:
    configs = {5: ConfigRecord({"p": 0.1}), 6: ConfigRecord({"p": 0.9})}
    messages = node_messages(configs, "train", MODEL, "arrays", "config")
    assert [m.metadata.dst_node_id for m in messages] == [5, 6]
    assert [m.content["config"]["p"] for m in messages] == [0.1, 0.9]
    assert all(m.content["arrays"] is MODEL for m in messages)


def test_weighted_sum_and_mean() -> None:
    vectors = [np.array([1.0, 2.0]), np.array([3.0, 4.0])]
    np.testing.assert_allclose(weighted_sum(vectors, [0.5, 2.0]), [6.5, 9.0])
    np.testing.assert_allclose(mean(vectors), [2.0, 3.0])
    with pytest.raises(ValueError, match="weights"):
        weighted_sum(vectors, [1.0])
    with pytest.raises(ValueError, match="NaN"):
        weighted_sum(vectors, [1.0, np.nan])


@pytest.mark.parametrize(
    "values",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
        np.array(2.5, dtype=np.float16),
        np.zeros((0, 5), np.float32),
        np.arange(4, dtype=np.int64),
        np.array([True, False]),
    ],
    ids=["float32", "fortran-float64", "0-d-float16", "empty", "int64", "bool"],
)
def test_array_values_reads_what_array_numpy_reads(values: np.ndarray) -> None:
    array = Array(values)
    read = array_values(array)
    expected = array.numpy()
    assert read.dtype == expected.dtype
    assert read.shape == expected.shape
    np.testing.assert_array_equal(read, expected)
    # A view of the reply's bytes: never written through.
    assert not read.flags.writeable


def test_array_values_reads_npy_format_2() -> None:
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    stream = io.BytesIO()
    np.lib.format.write_array(stream, values, version=(2, 0))
    array = Array(
        dtype=str(values.dtype),
        shape=values.shape,
        stype="numpy.ndarray",
        data=stream.getvalue(),
    )
    np.testing.assert_array_equal(array_values(array), values)


def test_a_truncated_array_is_an_excluded_reply(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = ArrayRecord([np.zeros((2, 3), np.float32), np.zeros(3, np.float32)])
    first = next(iter(model.values()))
    first.data = first.data[:-4]
    with pytest.raises(ValueError):
        array_values(first)
    logging.getLogger("flwr").propagate = True
    with caplog.at_level(logging.WARNING, logger="flwr"):
        checked = check_replies([reply(21, arrays=model)], expected_arrays=MODEL)
    assert checked == []
    assert "node 21 excluded" in caplog.text
    assert "cannot be read" in caplog.text


def test_all_finite_agrees_with_numpy_on_random_arrays() -> None:
    rng = np.random.default_rng(0)
    specials = [np.nan, np.inf, -np.inf, 3e38, -2e30, 1e-45, 0.0]
    for trial in range(300):
        dtype = [np.float32, np.float64, np.float16][trial % 3]
        values = rng.standard_normal(rng.integers(0, 50)).astype(dtype)
        for _ in range(rng.integers(0, 3)):
            if values.size:
                with np.errstate(over="ignore"):
                    values[rng.integers(values.size)] = rng.choice(specials)
        assert all_finite(values) == bool(np.isfinite(values).all()), values


def test_all_finite_when_squares_overflow() -> None:
    # Finite entries whose squares overflow float32 are still finite.
    assert all_finite(np.full(10, 1e30, np.float32))
    assert not all_finite(np.array([1e30, np.nan], np.float32))
    assert all_finite(np.arange(3))


def test_flatten_keeps_a_float32_model_in_float32_without_copying_one_array() -> None:
    single = ArrayRecord([np.arange(6, dtype=np.float32).reshape(2, 3)])
    vector = flatten(single)
    assert vector.dtype == np.float32
    assert not vector.flags.writeable  # the reply's own bytes
    assert flatten(MODEL).dtype == np.float32
    mixed = ArrayRecord([np.zeros(2, np.float32), np.arange(2, dtype=np.int64)])
    assert flatten(mixed).dtype == np.float64
    np.testing.assert_array_equal(flatten(mixed), [0, 0, 0, 1])


def test_weighted_sum_of_float32_vectors_is_float32_and_accurate() -> None:
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((200, 1000)).astype(np.float32)
    weights = rng.random(200)
    total = weighted_sum(iter(vectors), weights)
    assert total.dtype == np.float32
    exact = weights @ vectors.astype(np.float64)
    # 200 float32 roundings of terms of size ~|w v|: error ~ sqrt(200) * eps * scale.
    scale = np.sqrt(np.sum((weights[:, None] * vectors) ** 2, axis=0))
    tolerance = 10 * np.sqrt(200) * np.finfo(np.float32).eps * scale
    assert np.all(np.abs(total - exact) <= tolerance + 1e-30)


def test_combine_arrays_equals_combining_the_flattened_models() -> None:
    rng = np.random.default_rng(2)
    like = ArrayRecord(
        {
            "weight": Array(np.zeros((3, 4), np.float32)),
            "steps": Array(np.zeros(2, np.int64)),
        }
    )
    records = [
        ArrayRecord(
            {
                "weight": Array(rng.standard_normal((3, 4)).astype(np.float32)),
                "steps": Array(rng.integers(0, 9, 2)),
            }
        )
        for _ in range(5)
    ]
    weights = rng.random(5)
    combined = combine_arrays(records, lambda v: weighted_sum(v, weights), like)
    expected = unflatten(weighted_sum([flatten(r) for r in records], weights), like)
    assert list(combined.keys()) == ["weight", "steps"]
    for key in like:
        assert combined[key].dtype == like[key].dtype
        np.testing.assert_allclose(
            combined[key].numpy(), expected[key].numpy(), rtol=1e-6
        )


def test_check_replies_with_named_array_records() -> None:
    both = RecordDict(
        {"model": MODEL, "gradient": MODEL, "metrics": MetricRecord({"norm": 1.0})}
    )
    only_model = RecordDict({"model": MODEL, "metrics": MetricRecord({"norm": 1.0})})
    instruction = Message(RecordDict(), 21, "train")
    instruction.metadata.__dict__["_message_id"] = "m21"
    other = Message(RecordDict(), 22, "train")
    other.metadata.__dict__["_message_id"] = "m22"
    checked = check_replies(
        [Message(both, reply_to=instruction), Message(only_model, reply_to=other)],
        expected_arrays={"model": MODEL, "gradient": MODEL},
    )
    assert [item.node_id for item in checked] == [21]
    assert set(checked[0].arrays) == {"model", "gradient"}
    with pytest.raises(ValueError, match="2 ArrayRecords"):
        _ = checked[0].array_record


def test_register_handlers_routes_message_types() -> None:
    from flwr.app import Context
    from flwr.clientapp import ClientApp

    from flwr_importance.clientapps import register_handlers

    def answer(tag: str):
        def handler(message: Message, context: Context) -> Message:
            return Message(
                RecordDict({"m": MetricRecord({tag: 1.0})}), reply_to=message
            )

        return handler

    app = register_handlers(
        ClientApp(), {"train": answer("t"), "query.norm": answer("q")}
    )
    context = Context(
        run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={}
    )
    for message_type, tag in [("train", "t"), ("query.norm", "q")]:
        message = Message(RecordDict(), 5, message_type)
        message.metadata.__dict__["_message_id"] = message_type
        assert tag in app(message, context).content["m"]
    with pytest.raises(ValueError, match="category"):
        register_handlers(ClientApp(), {"bogus.x": answer("b")})
