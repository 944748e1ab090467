"""The tree a strategy's ``summary()`` logs: :func:`log_settings`.

Every strategy, and :class:`~flwr_importance.strategies.wrappers.CentralDP`
around one, logs its settings as branches of one tree.
"""

from __future__ import annotations

from collections.abc import Mapping
from logging import INFO

from flwr.common.logger import log


def log_settings(
    title: str, settings: Mapping[str, object], last: bool = False
) -> None:
    """Log ``settings`` as one branch of a strategy summary's tree.

    ``last`` closes the tree (the final branch of :meth:`Strategy.summary`).
    """
    log(INFO, "\t%s──> %s:", "└" if last else "├", title)
    indent = "\t\t" if last else "\t│\t"
    for index, (label, value) in enumerate(settings.items()):
        branch = "└" if index == len(settings) - 1 else "├"
        log(INFO, "%s%s── %s: %s", indent, branch, label, value)
