"""The same seeds give the same benchmark numbers, in any process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_processes_with_other_hash_seeds_give_identical_numbers(
    tmp_path: Path,
) -> None:
    outputs = {seed: tmp_path / f"hash-seed-{seed}.json" for seed in ("1", "2")}
    # Both at once: the runs are single-threaded.
    processes = {
        seed: subprocess.Popen(
            [sys.executable, "-m", "tests.benchmarks.seeded_runs", str(output)],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed, output in outputs.items()
    }
    for seed, process in processes.items():
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, f"hash seed {seed}: {stderr[-3000:]}"
    first, second = (json.loads(path.read_text()) for path in outputs.values())
    assert first.keys() == second.keys()
    for key in first:
        assert first[key] == second[key], key
