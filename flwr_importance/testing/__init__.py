"""Test doubles for running strategies and ClientApps without a SuperLink."""

from flwr_importance.testing.grid import (
    InProcessGrid,
    WireRecord,
    partition_node_config,
)

__all__ = ["InProcessGrid", "WireRecord", "partition_node_config"]
