"""``importance_secaggplus_mod``: Flower's ``secaggplus_mod`` for secure sums only.

A legacy query is a TRAIN message without the ``secaggplus_configs`` record:
Flower's mod alone refuses it, this one hands it to the ClientApp untouched.
A SecAgg+ stage is Flower's mod's: the setup stage, as Flower's
``SecAggPlusWorkflow`` sends it, comes back with the node's public keys.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.client.mod import secaggplus_mod
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.secure_aggregation.secaggplus_constants import (
    RECORD_KEY_CONFIGS,
    RECORD_KEY_STATE,
    Key,
    Stage,
)
from flwr.supercore.task_identity import TaskIdentity

from flwr_importance.clientapps.secure_aggregation import (
    importance_secaggplus_mod,
    is_secure_sum_message,
)

NODE_ID = 7


@pytest.fixture
def context() -> Context:
    """A node's context, with the server's identity set for new messages."""
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    TaskIdentity.task_id = 1
    return Context(
        run_id=1, node_id=NODE_ID, node_config={}, state=RecordDict(), run_config={}
    )


class RecordingApp:
    """The rest of the ClientApp: records what reaches it, replies a metric."""

    def __init__(self) -> None:
        self.received: list[Message] = []
        self.replies: list[Message] = []

    def __call__(self, message: Message, context: Context) -> Message:
        self.received.append(message)
        reply = Message(
            RecordDict({"metrics": MetricRecord({"update-norm-0": 1.5})}),
            reply_to=message,
        )
        self.replies.append(reply)
        return reply


def norm_query() -> Message:
    """OCS's norm query as the legacy transport sends it: a TRAIN message."""
    content = RecordDict(
        {
            "fitins.parameters": ArrayRecord([np.ones(3, dtype=np.float32)]),
            "fitins.config": ConfigRecord({"compat-message-type": "query.norm"}),
        }
    )
    return Message(content, dst_node_id=NODE_ID, message_type=MessageType.TRAIN)


def setup_stage() -> Message:
    """The setup stage of a secure sum, as ``SecAggPlusWorkflow`` builds it."""
    configs = ConfigRecord(
        {
            Key.STAGE: Stage.SETUP,
            Key.SAMPLE_NUMBER: 3,
            Key.SHARE_NUMBER: 3,
            Key.THRESHOLD: 2,
            Key.CLIPPING_RANGE: 8.0,
            Key.TARGET_RANGE: 2**22,
            Key.MOD_RANGE: 2**32,
            Key.MAX_WEIGHT: 1000.0,
        }
    )
    return Message(
        RecordDict({RECORD_KEY_CONFIGS: configs}),
        dst_node_id=NODE_ID,
        message_type=MessageType.TRAIN,
    )


def test_a_query_train_message_passes_through_untouched(context: Context) -> None:
    app = RecordingApp()
    query = norm_query()

    reply = importance_secaggplus_mod(query, context, app)

    assert not is_secure_sum_message(query)
    assert app.received == [query]
    assert reply is app.replies[0]
    assert RECORD_KEY_STATE not in context.state.config_records
    # Flower's mod alone refuses it: it expects every TRAIN to be a stage.
    with pytest.raises(KeyError, match=RECORD_KEY_CONFIGS):
        secaggplus_mod(norm_query(), context, RecordingApp())


def test_a_secure_sum_stage_is_handled_by_flowers_mod(context: Context) -> None:
    app = RecordingApp()
    stage = setup_stage()

    reply = importance_secaggplus_mod(stage, context, app)

    assert is_secure_sum_message(stage)
    assert app.received == []  # the setup stage never reaches the user's code
    keys = reply.content.config_records[RECORD_KEY_CONFIGS]
    assert isinstance(keys[Key.PUBLIC_KEY_1], bytes)
    assert isinstance(keys[Key.PUBLIC_KEY_2], bytes)
    state = context.state.config_records[RECORD_KEY_STATE]
    assert state["current_stage"] == Stage.SETUP
