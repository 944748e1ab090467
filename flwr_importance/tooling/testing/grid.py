"""An in-process Flower ``Grid``: runs a ``ClientApp`` for every message, no SuperLink.

Strategy tests and benchmarks need many seeded runs of the real strategy and the
real ClientApp code; starting a SuperLink and Ray for each would cost ~20 s. This
grid delivers each message to the ``ClientApp`` of its destination node in this
process, keeps one ``Context`` per node (so ``context.state`` persists across
rounds, as on a SuperNode) and, by default, round-trips every message through
Flower's protobuf serialization, so both sides see exactly what would cross the
wire. ``wire_log`` keeps those serialized messages for tests that inspect them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Context, Error, Message, RecordDict, UserConfig
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.proto.message_pb2 import Message as ProtoMessage
from flwr.server import LegacyContext, ServerConfig
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.server.workflow import DefaultWorkflow
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from flwr_importance.local_grid import LocalGrid
from flwr_importance.tooling.testing.fault_injection import LostReplyError

NodeConfigFactory = Callable[[int, int], UserConfig]


def partition_node_config(partition_id: int, num_partitions: int) -> UserConfig:
    """The node config Flower's simulation gives virtual SuperNodes."""
    return {"partition-id": partition_id, "num-partitions": num_partitions}


@dataclass(kw_only=True)
class WireRecord:
    """One message as it crossed the (simulated) wire."""

    direction: str  # "to-node" or "to-server"
    node_id: int
    message_type: str
    payload: bytes

    def message(self) -> Message:
        """Deserialize the recorded bytes back into a ``Message``."""
        proto = ProtoMessage()
        proto.ParseFromString(self.payload)
        return message_from_proto(proto)


@dataclass
class _Node:
    context: Context
    partition_id: int
    responsive: bool = True


@dataclass
class InProcessGrid(LocalGrid):
    """Deliver messages to ``client_app`` in this process, one ``Context`` per node.

    Parameters
    ----------
    client_app : ClientApp
        The ClientApp every node runs.
    num_nodes : int
        Number of nodes created at start (partition ids ``0..num_nodes-1``).
    run_config : Mapping
        The run config every node's ``Context`` holds.
    seed : int
        Seeds the random 64-bit node ids (Flower draws them at random too).
    serialize : bool
        Round-trip messages through protobuf and keep them in ``wire_log``.
    node_config : callable
        ``(partition_id, num_partitions) -> node_config``.
    """

    client_app: ClientApp
    num_nodes: int
    run_config: Mapping[str, bool | int | float | str] = field(default_factory=dict)
    seed: int = 0
    serialize: bool = True
    node_config: NodeConfigFactory = partition_node_config
    wire_log: list[WireRecord] = field(default_factory=list, init=False)
    _nodes: dict[int, _Node] = field(default_factory=dict, init=False)
    _replies: dict[str, Message] = field(default_factory=dict, init=False)
    _run: Run = field(init=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self._message_ids = itertools.count(1)
        run_id = int(self._rng.integers(1, 2**63))
        self._run = Run.create_empty(run_id)
        # Flower reads these class attributes when a Message is constructed;
        # outside a Flower runtime nobody else sets them.
        TaskIdentity.run_id = run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID
        TaskIdentity.task_id = 1
        for partition_id in range(self.num_nodes):
            self.add_node(partition_id, self.num_nodes)

    # -- membership (tests use these to simulate nodes joining and leaving) ----
    def add_node(self, partition_id: int, num_partitions: int) -> int:
        """Connect a new node holding ``partition_id``; return its node id."""
        node_id = int(self._rng.integers(2, 2**63))
        context = Context(
            run_id=self._run.run_id,
            node_id=node_id,
            node_config=self.node_config(partition_id, num_partitions),
            state=RecordDict(),
            run_config=dict(self.run_config),
        )
        self._nodes[node_id] = _Node(context=context, partition_id=partition_id)
        return node_id

    def remove_node(self, node_id: int) -> None:
        """Disconnect a node: it disappears from ``get_node_ids`` with its state."""
        del self._nodes[node_id]

    def set_responsive(self, node_id: int, responsive: bool) -> None:
        """An unresponsive node stays listed but never replies (a time-out)."""
        self._nodes[node_id].responsive = responsive

    def partition_of(self, node_id: int) -> int:
        """The partition id a node was created with."""
        return self._nodes[node_id].partition_id

    def node_state(self, node_id: int) -> RecordDict:
        """The node's persistent ``context.state`` (for assertions in tests)."""
        return self._nodes[node_id].context.state

    def server_context(self) -> Context:
        """The ``Context`` a ServerApp of this grid's run gets (its run config)."""
        return Context(
            run_id=self._run.run_id,
            node_id=SUPERLINK_NODE_ID,
            node_config={},
            state=RecordDict(),
            run_config=dict(self.run_config),
        )

    def run_legacy(
        self,
        strategy: LegacyStrategy,
        *,
        num_rounds: int,
        fit_workflow: Callable[[Grid, Context], None] | None = None,
    ) -> LegacyContext:
        """Flower's legacy ``DefaultWorkflow`` on this grid, as a ServerApp runs it.

        ``fit_workflow`` is the workflow's fit (Flower's ``SecAggPlusWorkflow``,
        the library's ``SecureAOCSWorkflow``; None: Flower's plain one). Returns
        the ``LegacyContext``, whose ``history`` and ``state`` hold the run.
        """
        context = LegacyContext(
            context=self.server_context(),
            config=ServerConfig(num_rounds=num_rounds),
            strategy=strategy,
        )
        DefaultWorkflow(fit_workflow=fit_workflow)(self, context)
        return context

    # -- Grid API --------------------------------------------------------------
    def get_node_ids(self) -> Iterable[int]:
        """Ids of the connected nodes."""
        return list(self._nodes)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver each message to its node's ClientApp now; keep the reply."""
        message_ids = []
        for message in messages:
            message_id = f"{next(self._message_ids):032x}"
            message.metadata.__dict__["_message_id"] = message_id
            node = self._nodes.get(message.metadata.dst_node_id)
            reply = self._deliver(message, node)
            if reply is not None:
                reply.metadata.__dict__["_message_id"] = f"r{message_id}"
                self._replies[message_id] = reply
            message_ids.append(message_id)
        return message_ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Return (and forget) the replies available for ``message_ids``."""
        return [
            self._replies.pop(message_id)
            for message_id in message_ids
            if message_id in self._replies
        ]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Push ``messages`` and return the replies (missing ones time out at once)."""
        return self.pull_messages(self.push_messages(messages))

    # -- delivery ----------------------------------------------------------------
    def _wire(self, message: Message, direction: str, node_id: int) -> Message:
        if not self.serialize:
            return message
        payload = message_to_proto(message).SerializeToString()
        record = WireRecord(
            direction=direction,
            node_id=node_id,
            message_type=message.metadata.message_type,
            payload=payload,
        )
        self.wire_log.append(record)
        return record.message()

    def _deliver(self, message: Message, node: _Node | None) -> Message | None:
        if node is None:
            return Message(
                Error(ErrorCode.NODE_UNAVAILABLE, "node is not connected"),
                reply_to=message,
            )
        if not node.responsive:
            return None
        node_id = node.context.node_id
        received = self._wire(message, "to-node", node_id)
        try:
            reply = self.client_app(received, node.context)
        except LostReplyError:
            return None
        except Exception as exc:
            # A SuperNode turns a raising ClientApp into an error reply too.
            reply = Message(
                Error(
                    ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                    f"{type(exc).__name__}: {exc}",
                ),
                reply_to=received,
            )
        return self._wire(reply, "to-server", node_id)
