"""Test doubles for running strategies and ClientApps without a SuperLink."""

from flwr_importance.tooling.testing.canned import (
    FEDAVG_REPLIES,
    CannedReplyGrid,
    Fleet,
    Responder,
    canned_responders,
    canned_strategy,
)
from flwr_importance.tooling.testing.grid import (
    InProcessGrid,
    WireRecord,
    partition_node_config,
)

__all__ = [
    "FEDAVG_REPLIES",
    "CannedReplyGrid",
    "Fleet",
    "InProcessGrid",
    "Responder",
    "WireRecord",
    "canned_responders",
    "canned_strategy",
    "partition_node_config",
]
