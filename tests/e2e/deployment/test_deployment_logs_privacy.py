"""No strategy logs client data.

"Client data" of a partition here means: its number of samples ``|D_c|`` (what
FedSampling protects), its feature vectors and its labels. A log record leaks
them if its message, once formatted, contains a partition's ``|D_c|`` as a
number, or if one of its arguments is an array or tensor large enough to hold
a feature vector or a partition's labels (at least as many elements as the
smaller of the two); small arrays such as per-model node counts are fine.
Each strategy runs through the real ServerApp and ClientApp in process
(``run_inprocess``), every record of every logger captured at DEBUG level;
the runs are the deployment test's.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from simulations.config import ExperimentConfig
from simulations.inprocess import resolve_run_config, run_inprocess
from simulations.task import federated_data
from tests.e2e.deployment.test_deployment import (
    NUM_SUPERNODES,
    RUNS,
    run_config,
)

NUMBER = re.compile(r"(?<![\w.])\d+(?![\w.])")


class Capture(logging.Handler):
    """Keeps every record it is given."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def captured_logs() -> Iterator[list[logging.LogRecord]]:
    """Records of the root logger and Flower's (which does not propagate)."""
    capture = Capture()
    loggers = [logging.getLogger(), logging.getLogger("flwr")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(capture)
        logger.setLevel(logging.DEBUG)
    yield capture.records
    for logger, level in zip(loggers, levels, strict=True):
        logger.removeHandler(capture)
        logger.setLevel(level)


@pytest.mark.parametrize("strategy", list(RUNS))
def test_strategy_logs_no_client_data(
    strategy: str, tmp_path: Path, captured_logs: list[logging.LogRecord]
) -> None:
    overrides = run_config(strategy, tmp_path)
    config = ExperimentConfig.from_run_config(resolve_run_config(overrides))
    partitions = federated_data(config, NUM_SUPERNODES).partitions
    sizes = {len(partition.x) for partition in partitions}
    feature_dim = int(np.prod(partitions[0].x.shape[1:]))
    smallest_data_vector = min(feature_dim, *sizes)
    run_inprocess(overrides, NUM_SUPERNODES)
    assert captured_logs, "nothing was logged: the capture is broken"
    for record in captured_logs:
        args = record.args if isinstance(record.args, tuple) else (record.args,)
        arrays = [arg for arg in args if isinstance(arg, np.ndarray | torch.Tensor)]
        assert all(
            int(np.prod(array.shape)) < smallest_data_vector for array in arrays
        ), record.getMessage()
        # The output folder is the test's own choice, not client data; its
        # pytest-made name holds counters such as "pytest-217" that can equal
        # a partition's size.
        message = record.getMessage().replace(str(tmp_path), "<tmp_path>")
        logged_numbers = {int(number) for number in NUMBER.findall(message)}
        assert not logged_numbers & sizes, (message, sorted(sizes))
