"""Replies checked before use: a bad reply is logged by node and dropped.

The maths of each method lives in :mod:`flwr_importance.sampling` and
:mod:`flwr_importance.aggregation` as pure NumPy functions; this module is
where their inputs are checked: a reply that fails a check is excluded with a
log line naming its node, so one misbehaving client never crashes a round or
corrupts the global model.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log

from flwr_importance.strategies.arrays import all_finite, array_values


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


def metric_contents(replies: Iterable[CheckedReply]) -> list[RecordDict]:
    """The replies' metrics, each as the content Flower's metric aggregators read.

    Flower's ``aggregate_metricrecords`` (and any ``train_metrics_aggr_fn`` or
    ``evaluate_metrics_aggr_fn``) takes the contents of reply messages; a
    checked reply keeps only its numeric metrics, in one MetricRecord.
    """
    contents = []
    for reply in replies:
        values: dict[str, int | float | list[int] | list[float]] = dict(reply.metrics)
        contents.append(RecordDict({"metrics": MetricRecord(values)}))
    return contents


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
    expected_nodes: Collection[int] | None = None,
    context: str = "aggregate_train",
) -> list[CheckedReply]:
    """The replies a strategy can use, each checked; the rest logged and dropped.

    A reply is dropped when it is an error reply, when its node was not sent a
    message (not in ``expected_nodes``), when its node already replied this
    round (only the first counts), when it carries more than one
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
    expected_nodes : Collection[int], optional
        The nodes that were sent a message; a reply from any other node is
        dropped. None: every node's reply is considered.
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
        problem = _delivery_problem(reply, node_id, seen, expected_nodes)
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


def _delivery_problem(
    reply: Message,
    node_id: int,
    seen: Collection[int],
    expected_nodes: Collection[int] | None,
) -> str | None:
    if reply.has_error():
        return f"error reply ({reply.error.reason})"
    if expected_nodes is not None and node_id not in expected_nodes:
        return "it was not sent a message this round"
    if node_id in seen:
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
