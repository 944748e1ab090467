"""Strategies that wrap a method of the library: not methods themselves.

:class:`CentralDP` (central differential privacy, docs/privacy.md) wraps
any declared method's strategy that its spec does not refuse; its round
metrics carry :data:`DP_EPSILON_METRIC` and :data:`DP_DELTA_METRIC`.
"""

from flwr_importance.strategies.wrappers.central_dp import (
    DP_DELTA_METRIC,
    DP_EPSILON_METRIC,
    CentralDP,
)

__all__ = ["DP_DELTA_METRIC", "DP_EPSILON_METRIC", "CentralDP"]
