"""Replies checked before use: a bad reply is logged by node and dropped.

The maths of each method lives in :mod:`flwr_importance.sampling` and
:mod:`flwr_importance.aggregation` as pure NumPy functions; this module is
where their inputs are checked: a reply that fails a check is excluded with a
log line naming its node, so one misbehaving client never crashes a round or
corrupts the global model.

One kind of failure is not a misbehaving client but a missing client side:
every node that answered lacks the handler (or the reply keys) the method
needs, e.g. a plain FedAvg ClientApp under OCS. Dropping those replies would
leave the model unchanged round after round in a run that "succeeds", so a
:class:`ReplyLedger` (one per strategy) raises :class:`ClientSideMissingError`
instead, naming the lines to add; it also counts every dropped reply by
message type and reason for the summary logged when a run ends.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import TypedDict

import numpy as np
from flwr.app import ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode
from flwr.common.logger import log

from flwr_importance import protocol
from flwr_importance.strategies.arrays import all_finite, array_values

#: The reason of the error reply a ClientApp sends for a message type it has no
#: handler for (Flower 1.41). A Message-API ``ClientApp`` raises
#: ``ValueError("No query function registered with name 'norm'")``
#: (``flwr/clientapp/client_app.py``); a legacy ``ClientApp(client_fn=...)``
#: raises ``ValueError("Invalid message type: query.norm")``
#: (``flwr/client/message_handler/message_handler.py``). The SuperNode, the
#: simulation engine and the in-process grid send either back as an error reply
#: with code ``ErrorCode.CLIENT_APP_RAISED_EXCEPTION`` (2) and the exception's
#: text inside the reason, e.g. ``<class 'ValueError'>:<'No query function
#: registered with name 'norm''>`` (deployment) or ``<class
#: '...ClientAppException'>:<'...Message: No query function registered with
#: name 'norm''>`` (simulation). On the legacy API a ``NumPyClient`` without
#: ``get_properties`` answers a query with the status "Client does not
#: implement `get_properties`" (``flwr/compat/client/client.py``), which the
#: legacy transport turns into an error reply with the same code.
MISSING_HANDLER_REASON = re.compile(
    r"No (?:train|evaluate|query) function registered with name '\w+'"
    r"|Invalid message type: [\w.]+"
    r"|Client does not implement `\w+`"
)

#: The reason of an error reply the client helpers raise for the project's
#: wiring (:data:`flwr_importance.protocol.CLIENT_SIDE_MISCONFIGURED`), with
#: the helper's own text, up to the end of the exception's text in the reason.
MISCONFIGURED_REASON = re.compile(
    re.escape(protocol.CLIENT_SIDE_MISCONFIGURED) + r": (.*?)(?:'>)?$", re.S
)

#: The summary's reason for a node that did not reply in time.
NO_REPLY = "no reply (time-out or node gone)"
#: The summary's reason for an error reply saying no handler is registered.
NO_HANDLER = "no handler registered for the message type"


@dataclass(frozen=True)
class ClientSide:
    """What a user adds to a plain FedAvg ClientApp for a method, and where to read.

    Attributes
    ----------
    lines : str
        The client lines, as a sentence (e.g. "add `add_size_query(app,
        num_examples=...)`").
    docs : str
        The section of ``docs/methods.md`` that shows them, as
        ``docs/methods.md#<anchor>`` (GitHub's anchor of its ``## <n>.``
        heading).
    """

    lines: str
    docs: str


class ClientSideMissingError(RuntimeError):
    """Every node that answered lacks the client side of the strategy's method.

    Raised by a strategy (through its :class:`ReplyLedger`) when all the
    replies to a round's ``train`` or ``query.<action>`` message failed
    because no handler is registered for the message type, or because a key
    the method needs is absent from every reply, and no node has ever
    answered that message type well. The message names the method, the
    message type, what was missing, the client lines to add and the section
    of ``docs/methods.md`` that shows them. The parameters are kept as
    attributes of the same names.

    Parameters
    ----------
    method : str
        The strategy class.
    message_type : str
        The message type every node failed.
    missing : str
        What the replies lacked (a handler, a metric, an ArrayRecord).
    client_side : ClientSide
        The lines to add and the documentation section.
    """

    def __init__(
        self, method: str, message_type: str, missing: str, client_side: ClientSide
    ) -> None:
        self.method = method
        self.message_type = message_type
        self.missing = missing
        self.client_side = client_side
        super().__init__(
            f"{method}: every node that answered '{message_type}' lacks the "
            f"method's client side ({missing}); the ClientApp is a plain FedAvg "
            f"one or misses the method's lines. On the client, "
            f"{client_side.lines}; see {client_side.docs}"
        )


class ClientSideFailedError(ClientSideMissingError):
    """Every node that answered a message type failed it, and none ever succeeded.

    The client side is there but raises (a helper called with the wrong
    arguments, an app that does not unpack its batches): without this the run
    would drop every reply, keep the model round after round and end as if it
    had trained. The message quotes the first node's error. The parameters are
    kept as attributes of the same names.

    Parameters
    ----------
    method : str
        The strategy's name, first in the message.
    message_type : str
        The message type every answering node failed.
    first_error : str
        What the first failed reply said (its error reason or the check it
        failed).
    client_side : ClientSide
        The method's client lines and docs, which the message names as the fix.
    """

    def __init__(
        self,
        method: str,
        message_type: str,
        first_error: str,
        client_side: ClientSide,
    ) -> None:
        self.first_error = first_error
        RuntimeError.__init__(
            self,
            f"{method}: every node that answered '{message_type}' failed it, and no "
            f"node has ever answered it well: nothing can train. The first "
            f"node's error: {first_error}. Check the method's client lines: "
            f"{client_side.lines}; see {client_side.docs}",
        )
        self.method = method
        self.message_type = message_type
        self.missing = first_error
        self.client_side = client_side


@dataclass(frozen=True, kw_only=True)
class ReplyProblem:
    """Why a reply was dropped.

    Attributes
    ----------
    detail : str
        The log line's text (the values involved).
    reason : str
        The category the end-of-run summary counts it under.
    missing : str or None
        What a missing client side would explain: the absent handler, metric
        or ArrayRecord; None for a failure of another kind.
    """

    detail: str
    reason: str
    missing: str | None = None

    def __str__(self) -> str:
        """The detail, for log lines."""
        return self.detail


def _missing(what: str) -> ReplyProblem:
    """A reply without ``what`` (a metric or an ArrayRecord the method needs)."""
    return ReplyProblem(
        detail=f"{what} is missing",
        reason=f"{what} missing",
        missing=f"{what} missing from every reply",
    )


def _bad_value(detail: str) -> ReplyProblem:
    return ReplyProblem(detail=detail, reason="bad value")


def error_problem(reply: Message) -> ReplyProblem:
    """Why an error reply failed: no handler, a misconfigured helper, or a fault."""
    reason = reply.error.reason or ""
    detail = f"error reply ({reason})"
    if reply.error.code != ErrorCode.CLIENT_APP_RAISED_EXCEPTION:
        return ReplyProblem(detail=detail, reason="error reply")
    if MISSING_HANDLER_REASON.search(reason):
        return ReplyProblem(detail=detail, reason=NO_HANDLER, missing=NO_HANDLER)
    misconfigured = MISCONFIGURED_REASON.search(reason)
    if misconfigured:
        return ReplyProblem(
            detail=detail,
            reason=protocol.CLIENT_SIDE_MISCONFIGURED,
            missing=misconfigured[1],
        )
    return ReplyProblem(detail=detail, reason="error reply")


class ReplyLedger:
    """A strategy's dropped replies, by message type and reason, and its verdict.

    :func:`send_query <flwr_importance.strategies.messages.send_query>` and
    :func:`check_replies` record each dropped reply here
    (:meth:`record`) and, per batch of replies, :meth:`settle` whether the
    client side is missing: when every reply of the batch failed for that
    reason and no node has answered the message type well yet, it raises
    :class:`ClientSideMissingError`. When every reply of the batch failed
    for another reason (the client raised, or sent a bad value) and no node
    has answered the message type well yet, it raises
    :class:`ClientSideFailedError`, quoting the first failure: a run whose
    every node fails cannot train. A partial failure, a time-out, or a
    message type some node has handled before, leaves the
    strategy dropping and logging as usual. ``evaluate`` replies are counted
    but never settle: the method's lines do not add an evaluate handler.

    Parameters
    ----------
    method : str
        The strategy class, for the error and the summary.
    client_side : ClientSide
        The method's client lines, for the error.
    """

    def __init__(self, method: str, client_side: ClientSide) -> None:
        self.method = method
        self.client_side = client_side
        self.dropped: Counter[tuple[str, str]] = Counter()
        self._handled: set[str] = set()

    def record(self, message_type: str, reason: str, count: int = 1) -> None:
        """Count ``count`` replies of ``message_type`` dropped for ``reason``."""
        if count:
            self.dropped[message_type, reason] += count

    def settle(
        self, message_type: str, problems: Sequence[ReplyProblem | None]
    ) -> None:
        """Decide on one batch of answered replies (None: a usable reply).

        Raises
        ------
        ClientSideMissingError
            Every reply failed for want of the client side, and no reply of
            ``message_type`` has been usable before.
        ClientSideFailedError
            Every reply failed for another reason (the client raised, or sent
            a bad value), and no reply of ``message_type`` has been usable
            before: the run cannot train.
        """
        if any(problem is None for problem in problems):
            self._handled.add(message_type)
            return
        if (
            not problems
            or message_type in self._handled
            or message_type == MessageType.EVALUATE
        ):
            return
        missing = {problem.missing for problem in problems if problem is not None}
        # The run stops here: the dropped-replies summary goes out first, on
        # either API (the legacy one has no end-of-run hook of its own).
        self.log_summary()
        if None in missing:
            first = next(problem for problem in problems if problem is not None)
            raise ClientSideFailedError(
                self.method, message_type, first.detail, self.client_side
            )
        raise ClientSideMissingError(
            self.method,
            message_type,
            ", ".join(sorted(str(what) for what in missing)),
            self.client_side,
        )

    def log_summary(self) -> None:
        """Log the dropped replies by message type and reason (or that none were)."""
        if not self.dropped:
            log(INFO, "%s: no reply was dropped", self.method)
            return
        log(
            WARNING,
            "%s: %d replies dropped, by message type and reason:",
            self.method,
            sum(self.dropped.values()),
        )
        for (message_type, reason), count in sorted(self.dropped.items()):
            log(WARNING, "\t%s: %d x %s", message_type, count, reason)


@dataclass(frozen=True, kw_only=True)
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
        contents.append(RecordDict({protocol.METRIC_RECORD: MetricRecord(values)}))
    return contents


#: What a reply's arrays must look like: one ArrayRecord shaped like the given
#: one, or one ArrayRecord per key, each shaped like its template.
ExpectedArrays = ArrayRecord | Mapping[str, ArrayRecord] | None


class ReplyChecks(TypedDict, total=False):
    """The checks :func:`check_replies` runs, as its keyword arguments.

    Documented there; a caller that adds its own arguments (the strategies'
    :meth:`~flwr_importance.strategies.base.ImportanceStrategy.check_replies`,
    which adds the ledger) takes them as ``**checks: Unpack[ReplyChecks]``.
    """

    metric_keys: Sequence[str]
    nonnegative_keys: Sequence[str]
    optional_keys: Sequence[str]
    expected_arrays: ExpectedArrays
    expected_nodes: Collection[int] | None
    context: str


#: Largest magnitude a checked metric may have. Norms, sizes and losses enter
#: squares, products and sums of many nodes; past ~1e154 a square overflows
#: float64, and no real norm, size or loss comes near this bound.
MAX_METRIC_MAGNITUDE = 1e150


def _metric_problem(
    metrics: MetricRecord | None, key: str, nonnegative: bool
) -> ReplyProblem | None:
    if metrics is None or key not in metrics:
        return _missing(f"metric '{key}'")
    value = metrics[key]
    if isinstance(value, list) or not np.isfinite(value):
        return _bad_value(f"metric '{key}' is not a finite number ({value!r})")
    if nonnegative and value < 0:
        return _bad_value(f"metric '{key}' is negative ({value!r})")
    if abs(value) > MAX_METRIC_MAGNITUDE:
        return _bad_value(f"metric '{key}' is implausibly large ({value!r})")
    return None


def array_record_problem(
    name: str, arrays: ArrayRecord | None, expected: ArrayRecord
) -> ReplyProblem | None:
    """Why ``arrays`` cannot stand for ``expected`` (None if it can).

    It must exist, have ``expected``'s keys in order, hold those shapes in its
    bytes and only finite values; ``name`` labels it in the answer.
    """
    if arrays is None:
        return _missing(f"ArrayRecord '{name}'")
    if list(arrays.keys()) != list(expected.keys()):
        return _bad_value(f"ArrayRecord '{name}' does not match the model's keys")
    for key, array in arrays.items():
        try:
            values = array_values(array)
        except ValueError as error:
            return _bad_value(f"array '{name}/{key}' cannot be read ({error})")
        # The shape the bytes hold, not the one the metadata claims.
        if tuple(values.shape) != tuple(expected[key].shape):
            return _bad_value(
                f"array '{name}/{key}' has shape {values.shape}, "
                f"expected {expected[key].shape}"
            )
        if not all_finite(values):
            return _bad_value(f"array '{name}/{key}' holds NaN or infinite values")
    return None


def _arrays_problem(
    records: Mapping[str, ArrayRecord], expected: ExpectedArrays
) -> ReplyProblem | None:
    if expected is None:
        return None
    if isinstance(expected, ArrayRecord):
        if not records:
            return _missing("the model's ArrayRecord")
        if len(records) != 1:
            return _bad_value(f"it carries {len(records)} ArrayRecords, expected one")
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
    optional_keys: Sequence[str] = (),
    expected_arrays: ExpectedArrays = None,
    expected_nodes: Collection[int] | None = None,
    context: str = "aggregate_train",
    ledger: ReplyLedger | None = None,
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
    optional_keys : Sequence[str]
        Metrics a reply may leave out; checked as ``metric_keys`` when there.
    expected_arrays : ArrayRecord or Mapping[str, ArrayRecord], optional
        An ArrayRecord: the reply must carry exactly one ArrayRecord shaped like
        it. A mapping: the reply must carry an ArrayRecord under each key,
        shaped like the mapped one.
    expected_nodes : Collection[int], optional
        The nodes that were sent a message; a reply from any other node is
        dropped. None: every node's reply is considered.
    context : str
        Prefix of the log lines (the calling method).
    ledger : ReplyLedger, optional
        Counts the dropped replies and settles, per message type, whether the
        client side is missing (:meth:`ReplyLedger.settle`).

    Returns
    -------
    list[CheckedReply]
        The usable replies, in arrival order.

    Raises
    ------
    ClientSideMissingError
        Through ``ledger``: every reply of a message type lacks the method's
        client side.
    """
    checked: list[CheckedReply] = []
    seen: set[int] = set()
    required = list(dict.fromkeys([*metric_keys, *nonnegative_keys]))
    # Per message type, the outcome of each reply from a node that was asked
    # (None: usable); the ledger settles on them.
    answered: dict[str, list[ReplyProblem | None]] = {}
    for reply in replies:
        node_id = reply.metadata.src_node_id
        message_type = reply.metadata.message_type
        problem = _delivery_problem(reply, node_id, seen, expected_nodes)
        if problem is None:
            # Each read of these properties builds a new mapping: read once.
            metric_records = reply.content.metric_records
            arrays = dict(reply.content.array_records)
            problem = _content_problem(
                metric_records,
                arrays,
                [*required, *optional_keys],
                nonnegative_keys,
                expected_arrays,
                optional_keys,
            )
            answered.setdefault(message_type, []).append(problem)
        elif reply.has_error():
            answered.setdefault(message_type, []).append(problem)
        if problem is not None:
            log(
                WARNING,
                "%s: reply from node %d excluded: %s",
                context,
                node_id,
                problem,
            )
            if ledger is not None:
                ledger.record(message_type, problem.reason)
            continue
        seen.add(node_id)
        metrics = {
            key: float(value)
            for record in metric_records.values()
            for key, value in record.items()
            if isinstance(value, (int, float))
        }
        checked.append(CheckedReply(node_id=node_id, metrics=metrics, arrays=arrays))
    log(INFO, "%s: %d usable replies", context, len(checked))
    if ledger is not None:
        for message_type, problems in answered.items():
            ledger.settle(message_type, problems)
    return checked


def _delivery_problem(
    reply: Message,
    node_id: int,
    seen: Collection[int],
    expected_nodes: Collection[int] | None,
) -> ReplyProblem | None:
    if reply.has_error():
        return error_problem(reply)
    if expected_nodes is not None and node_id not in expected_nodes:
        return ReplyProblem(
            detail="it was not sent a message this round",
            reason="from a node not asked",
        )
    if node_id in seen:
        return ReplyProblem(
            detail="duplicate reply from the same node", reason="duplicate reply"
        )
    return None


def _content_problem(
    metric_records: Mapping[str, MetricRecord],
    arrays: Mapping[str, ArrayRecord],
    required: Sequence[str],
    nonnegative_keys: Sequence[str],
    expected_arrays: ExpectedArrays,
    optional_keys: Sequence[str] = (),
) -> ReplyProblem | None:
    if not metric_records and not arrays and (required or expected_arrays):
        # Nothing at all: a reply that came back empty (a failure of the
        # node), not one whose ClientApp answers without the method's keys.
        return ReplyProblem(detail="empty reply", reason="empty reply")
    if len(metric_records) > 1:
        return _bad_value(
            f"it carries {len(metric_records)} MetricRecords, expected one"
        )
    metric_record = next(iter(metric_records.values()), None)
    for key in required:
        if key in optional_keys and (metric_record is None or key not in metric_record):
            continue
        problem = _metric_problem(metric_record, key, key in nonnegative_keys)
        if problem is not None:
            return problem
    return _arrays_problem(arrays, expected_arrays)
