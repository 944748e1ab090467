"""Message plumbing every strategy shares: checked replies in, arrays out.

The maths of each method lives in :mod:`flwr_importance.sampling` and
:mod:`flwr_importance.aggregation` as pure NumPy functions; this module turns
Flower messages into those functions' inputs and back, and is where bad input is
caught: a reply that fails a check is excluded with a log line naming its node,
so one misbehaving client never crashes a round or corrupts the global model.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import SType
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import sample_nodes
from numpy.typing import NDArray

from flwr_importance.protocol import query_message_type

#: The first bytes of every ``.npy`` serialization.
NPY_MAGIC = b"\x93NUMPY"


def array_values(array: Array) -> NDArray[Any]:
    """The values of ``array``: a read-only view of its serialized bytes.

    ``Array.numpy()`` copies the bytes into a new array; a reply's arrays are
    read to be checked and again to be aggregated, and at 1M parameters each
    copy costs half of what Flower's ``FedAvg`` spends on a reply. The ``.npy``
    header gives the dtype, shape and data offset; any other serialization
    falls back to ``Array.numpy()``.

    Raises
    ------
    ValueError
        The bytes are not a readable array (a corrupted reply).
    """
    data = array.data
    if array.stype != SType.NUMPY or data[:6] != NPY_MAGIC:
        return array.numpy()
    # Format versions 1 and 2 differ only in the width of the header length.
    length_bytes = {1: 2, 2: 4}.get(data[6])
    if length_bytes is None:
        return array.numpy()
    offset = 8 + length_bytes + int.from_bytes(data[8 : 8 + length_bytes], "little")
    header = _npy_header(bytes(data[:offset]))
    if header is None:
        return array.numpy()
    shape, fortran_order, dtype = header
    values = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=offset)
    return values.reshape(shape, order="F" if fortran_order else "C")


@functools.lru_cache(maxsize=1024)
def _npy_header(header: bytes) -> tuple[tuple[int, ...], bool, np.dtype[Any]] | None:
    """``(shape, fortran_order, dtype)`` of a ``.npy`` header; None for objects.

    Cached: every reply of a round carries the same few headers, and NumPy
    parses each with ``ast.literal_eval`` (a sixth of a reply's whole cost).
    """
    stream = io.BytesIO(header)
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
    else:
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
    return None if dtype.hasobject else (shape, fortran_order, dtype)


def all_finite(values: NDArray[Any]) -> bool:
    """Whether ``values`` holds no NaN and no infinity."""
    if not np.issubdtype(values.dtype, np.floating):
        return bool(np.all(np.isfinite(values)))
    flat = values.ravel()
    with np.errstate(over="ignore", invalid="ignore"):
        # A NaN or inf entry makes the sum of squares NaN or inf, and BLAS
        # computes it in a fraction of the time of np.isfinite(values).all().
        # Finite entries whose squares overflow make it inf too: then the
        # exact test decides.
        if np.isfinite(np.dot(flat, flat)):
            return True
    return bool(np.all(np.isfinite(values)))


def flatten(record: ArrayRecord) -> NDArray[np.floating]:
    """All arrays of ``record`` as one vector in their common floating dtype.

    A float32 model stays float32: the sums over replies run in the model's
    own precision, as Flower's ``FedAvg`` does, at half the memory traffic of
    float64. A record of one floating array gives a read-only view (no copy).
    """
    arrays = [array_values(array).ravel() for array in record.values()]
    dtype = np.result_type(*(array.dtype for array in arrays), np.float32)
    if len(arrays) == 1 and arrays[0].dtype == dtype:
        return arrays[0]
    return np.concatenate(arrays, dtype=dtype) if arrays else np.empty(0, dtype)


def unflatten(vector: NDArray[np.floating], like: ArrayRecord) -> ArrayRecord:
    """Split ``vector`` into an ArrayRecord shaped like ``like`` (keys, dtypes)."""
    sizes = [int(np.prod(template.shape)) for template in like.values()]
    if sum(sizes) != vector.size:
        raise ValueError(
            f"vector has {vector.size} entries, the record needs {sum(sizes)}"
        )
    arrays: dict[str, Array] = {}
    offset = 0
    for (key, template), size in zip(like.items(), sizes, strict=True):
        values = vector[offset : offset + size].reshape(template.shape)
        arrays[key] = Array(values.astype(np.dtype(template.dtype)))
        offset += size
    return ArrayRecord.from_array_dict(arrays)


def combine_arrays(
    records: Sequence[ArrayRecord],
    combine: Callable[[list[NDArray[np.floating]]], NDArray[np.floating]],
    like: ArrayRecord,
) -> ArrayRecord:
    """``combine`` applied array by array, shaped like ``like`` (keys, dtypes).

    For a linear combination of whole models (a mean, a weighted sum, a model
    plus a step) this equals ``unflatten(combine([flatten(r) for r in
    records]), like)`` without first copying each model into one vector: each
    array is read in place (:func:`array_values`), as Flower's ``FedAvg`` sums
    array by array. The records must have ``like``'s keys and shapes (checked
    replies do).
    """
    arrays: dict[str, Array] = {}
    for key, template in like.items():
        values = combine([array_values(record[key]).ravel() for record in records])
        arrays[key] = Array(
            values.reshape(template.shape).astype(template.dtype, copy=False)
        )
    return ArrayRecord.from_array_dict(arrays)


#: What a message shares with every node: one ArrayRecord (stored under
#: ``arrayrecord_key``) or several, by name (e.g. one per model).
SharedArrays = ArrayRecord | Mapping[str, ArrayRecord] | None


def connected_nodes(grid: Grid, min_available_nodes: int) -> list[int]:
    """The connected node ids, sorted, once at least ``min_available_nodes`` are
    (and at least one).

    Waits as Flower's ``FedAvg`` does; sorted so that a seeded draw over them
    does not depend on the order the grid lists them in.
    """
    _, connected = sample_nodes(grid, max(min_available_nodes, 1), 0)
    return sorted(connected)


def warn_if_fewer_nodes(num_nodes: int, clients_per_round: int, effect: str) -> None:
    """Warn, every round it happens, that fewer nodes are connected than sampled.

    A method configured for more clients than the federation has does not
    sample at all (every node takes part, or draws repeat): the run looks like
    the method's but is not. ``effect`` says what the method does instead.
    """
    if num_nodes < clients_per_round:
        log(
            WARNING,
            "configure_train: %d nodes connected, fewer than clients_per_round=%d: "
            "%s; start more nodes or lower clients_per_round",
            num_nodes,
            clients_per_round,
            effect,
        )


def node_messages(
    node_configs: Mapping[int, ConfigRecord],
    message_type: str,
    arrays: SharedArrays = None,
    arrayrecord_key: str = "arrays",
    configrecord_key: str = "config",
) -> list[Message]:
    """One message per node, each with its own config (and the shared arrays)."""
    named_arrays: Mapping[str, ArrayRecord] = (
        {arrayrecord_key: arrays} if isinstance(arrays, ArrayRecord) else arrays or {}
    )
    # Nodes given the same ConfigRecord object share one RecordDict, as all
    # nodes do in Flower's FedAvg: a RecordDict per node costs more than the
    # rest of a 1,000-node query round.
    contents: dict[int, RecordDict] = {}
    messages = []
    for node_id, config in node_configs.items():
        content = contents.get(id(config))
        if content is None:
            content = RecordDict({configrecord_key: config, **named_arrays})
            contents[id(config)] = content
        messages.append(Message(content, node_id, message_type))
    return messages


def send_query(
    grid: Grid,
    node_configs: Mapping[int, ConfigRecord],
    action: str,
    arrays: SharedArrays = None,
    timeout: float = 600.0,
) -> dict[int, Message]:
    """Send ``query.<action>`` to the nodes; return the good replies by node id.

    ``arrays`` goes to every node: one ArrayRecord under ``"arrays"``, or a
    mapping of named ArrayRecords. Nodes that fail or do not answer within
    ``timeout`` are logged and left out: the caller works with whoever answered.
    """
    messages = node_messages(node_configs, query_message_type(action), arrays)
    replies = grid.send_and_receive(messages, timeout=timeout)
    answered: dict[int, Message] = {}
    for reply in replies:
        node_id = reply.metadata.src_node_id
        if reply.has_error():
            log(
                WARNING,
                "query.%s: node %d failed: %s",
                action,
                node_id,
                reply.error.reason,
            )
        elif node_id in answered:
            log(
                WARNING,
                "query.%s: duplicate reply from node %d ignored",
                action,
                node_id,
            )
        else:
            answered[node_id] = reply
    missing = set(node_configs) - set(answered)
    if missing:
        log(
            INFO,
            "query.%s: %d of %d nodes did not answer",
            action,
            len(missing),
            len(node_configs),
        )
    return answered


@dataclass(frozen=True)
class CheckedReply:
    """A reply that passed :func:`check_replies`, unpacked.

    ``arrays`` holds every ArrayRecord of the reply by its key; ``array_record``
    is the only one, for the usual one-model reply.
    """

    node_id: int
    metrics: dict[str, float]
    arrays: dict[str, ArrayRecord]

    @property
    def array_record(self) -> ArrayRecord:
        """The reply's single ArrayRecord."""
        if len(self.arrays) != 1:
            raise ValueError(f"reply carries {len(self.arrays)} ArrayRecords")
        return next(iter(self.arrays.values()))


#: What a reply's arrays must look like: one ArrayRecord shaped like the given
#: one, or one ArrayRecord per key, each shaped like its template.
ExpectedArrays = ArrayRecord | Mapping[str, ArrayRecord] | None


#: Largest magnitude a checked metric may have. Norms, sizes and losses enter
#: squares, products and sums of many nodes; past ~1e154 a square overflows
#: float64, and no real norm, size or loss comes near this bound.
MAX_METRIC_MAGNITUDE = 1e150


def _metric_problem(
    metrics: MetricRecord | None, key: str, nonnegative: bool
) -> str | None:
    if metrics is None or key not in metrics:
        return f"metric '{key}' is missing"
    value = metrics[key]
    if isinstance(value, list) or not np.isfinite(value):
        return f"metric '{key}' is not a finite number ({value!r})"
    if nonnegative and value < 0:
        return f"metric '{key}' is negative ({value!r})"
    if abs(value) > MAX_METRIC_MAGNITUDE:
        return f"metric '{key}' is implausibly large ({value!r})"
    return None


def array_record_problem(
    name: str, arrays: ArrayRecord | None, expected: ArrayRecord
) -> str | None:
    """Why ``arrays`` cannot stand for ``expected`` (None if it can).

    It must exist, have ``expected``'s keys in order, hold those shapes in its
    bytes and only finite values; ``name`` labels it in the answer.
    """
    if arrays is None:
        return f"ArrayRecord '{name}' is missing"
    if list(arrays.keys()) != list(expected.keys()):
        return f"ArrayRecord '{name}' does not match the model's keys"
    for key, array in arrays.items():
        try:
            values = array_values(array)
        except ValueError as error:
            return f"array '{name}/{key}' cannot be read ({error})"
        # The shape the bytes hold, not the one the metadata claims.
        if tuple(values.shape) != tuple(expected[key].shape):
            return (
                f"array '{name}/{key}' has shape {values.shape}, "
                f"expected {expected[key].shape}"
            )
        if not all_finite(values):
            return f"array '{name}/{key}' holds NaN or infinite values"
    return None


def _arrays_problem(
    records: Mapping[str, ArrayRecord], expected: ExpectedArrays
) -> str | None:
    if expected is None:
        return None
    if isinstance(expected, ArrayRecord):
        if len(records) != 1:
            return f"it carries {len(records)} ArrayRecords, expected one"
        ((name, record),) = records.items()
        return array_record_problem(name, record, expected)
    for name, template in expected.items():
        problem = array_record_problem(name, records.get(name), template)
        if problem is not None:
            return problem
    return None


def check_replies(
    replies: Iterable[Message],
    *,
    metric_keys: Sequence[str] = (),
    nonnegative_keys: Sequence[str] = (),
    expected_arrays: ExpectedArrays = None,
    context: str = "aggregate_train",
) -> list[CheckedReply]:
    """The replies a strategy can use, each checked; the rest logged and dropped.

    A reply is dropped when it is an error reply, when its node already replied
    this round (only the first counts), when it carries more than one
    MetricRecord, when a required metric is missing, not a finite number,
    larger in magnitude than :data:`MAX_METRIC_MAGNITUDE` or negative where it
    must not be, or when its arrays are missing, have other
    keys or shapes than ``expected_arrays``, or hold NaN/inf.

    Parameters
    ----------
    replies : Iterable[Message]
        The round's replies.
    metric_keys : Sequence[str]
        Metrics every reply must carry, as finite numbers.
    nonnegative_keys : Sequence[str]
        Those of ``metric_keys`` (or others) that must also be ``>= 0``.
    expected_arrays : ArrayRecord or Mapping[str, ArrayRecord], optional
        An ArrayRecord: the reply must carry exactly one ArrayRecord shaped like
        it. A mapping: the reply must carry an ArrayRecord under each key,
        shaped like the mapped one.
    context : str
        Prefix of the log lines (the calling method).

    Returns
    -------
    list[CheckedReply]
        The usable replies, in arrival order.
    """
    checked: list[CheckedReply] = []
    seen: set[int] = set()
    required = list(dict.fromkeys([*metric_keys, *nonnegative_keys]))
    for reply in replies:
        node_id = reply.metadata.src_node_id
        problem = _delivery_problem(reply, node_id in seen)
        if problem is None:
            # Each read of these properties builds a new mapping: read once.
            metric_records = reply.content.metric_records
            arrays = dict(reply.content.array_records)
            problem = _content_problem(
                metric_records, arrays, required, nonnegative_keys, expected_arrays
            )
        if problem is not None:
            log(
                WARNING,
                "%s: reply from node %d excluded: %s",
                context,
                node_id,
                problem,
            )
            continue
        seen.add(node_id)
        metrics = {
            key: float(value)
            for record in metric_records.values()
            for key, value in record.items()
            if isinstance(value, (int, float))
        }
        checked.append(CheckedReply(node_id, metrics, arrays))
    log(INFO, "%s: %d usable replies", context, len(checked))
    return checked


def _delivery_problem(reply: Message, duplicate: bool) -> str | None:
    if reply.has_error():
        return f"error reply ({reply.error.reason})"
    if duplicate:
        return "duplicate reply from the same node"
    return None


def _content_problem(
    metric_records: Mapping[str, MetricRecord],
    arrays: Mapping[str, ArrayRecord],
    required: Sequence[str],
    nonnegative_keys: Sequence[str],
    expected_arrays: ExpectedArrays,
) -> str | None:
    if len(metric_records) > 1:
        return f"it carries {len(metric_records)} MetricRecords, expected one"
    metric_record = next(iter(metric_records.values()), None)
    for key in required:
        problem = _metric_problem(metric_record, key, key in nonnegative_keys)
        if problem is not None:
            return problem
    return _arrays_problem(arrays, expected_arrays)


class CheckedFedAvg(FedAvg):
    """Flower's ``FedAvg`` whose federated evaluation survives bad replies.

    ``FedAvg.aggregate_evaluate`` raises ``InconsistentMessageReplies`` (ending
    the run) when one reply lacks the weighting metric or carries other keys,
    and divides by zero when the weights sum to zero. Here
    :func:`check_replies` drops, and logs by node, error replies, duplicates
    and replies whose ``weighted_by_key`` is missing, not finite, negative or
    implausibly large; the others are averaged by ``evaluate_metrics_aggr_fn``
    as in ``FedAvg``. Every strategy of the library subclasses it.
    """

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Weighted mean of the checked replies' metrics (None if none is usable).

        With federated evaluation off on purpose (``fraction_evaluate = 0``)
        nothing was asked and nothing is logged; a warning means evaluation
        was asked for and no reply could be used.
        """
        replies = list(replies)
        if not replies and self.fraction_evaluate == 0.0:
            return None
        checked = check_replies(
            replies,
            nonnegative_keys=[self.weighted_by_key],
            context="aggregate_evaluate",
        )
        if sum(reply.metrics[self.weighted_by_key] for reply in checked) <= 0:
            log(WARNING, "aggregate_evaluate: no usable reply with a positive weight")
            return None
        records = [
            RecordDict({"metrics": MetricRecord(dict(reply.metrics))})
            for reply in checked
        ]
        return self.evaluate_metrics_aggr_fn(records, self.weighted_by_key)
