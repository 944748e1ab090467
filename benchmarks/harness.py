"""What every convergence benchmark shares: its command line and run set-up."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch


def benchmark_parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The shared command line: ``--full`` and ``--output-dir``.

    Parameters
    ----------
    name : str
        The benchmark's name; outputs go to ``outputs/benchmarks/<name>``.
    doc : str
        The module docstring; its first line describes the command.
    """
    parser = argparse.ArgumentParser(description=(doc or name).splitlines()[0])
    parser.add_argument("--full", action="store_true", help="paper-scale runs")
    parser.add_argument(
        "--output-dir", type=Path, default=Path("outputs/benchmarks") / name
    )
    return parser


def prepare_run() -> None:
    """One torch thread and quiet Flower logs for many small in-process runs.

    The models are tiny: extra intra-op threads only oversubscribe the cores.
    Flower logs every round of every run; warnings still show.
    """
    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.WARNING)
