"""The per-sample gradient benchmark at small sizes: its table, with and without Opacus.

Timings are not asserted (the machine is shared): the table must have every
model's row with numbers, the Opacus column where Opacus runs, and say why
where it does not.
"""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import per_sample_grads

# --threads 0: the test process keeps its own torch thread count.
FAST = ["--small", "--repeats", "1", "--warmup", "0", "--threads", "0"]


def rows_of(summary: str) -> dict[str, list[str]]:
    """The table's rows by model name: their cells after the name."""
    return {
        cells[0]: cells[1:]
        for line in summary.splitlines()
        if line.startswith("| ") and not line.startswith("| model")
        for cells in [[cell.strip() for cell in line.strip("|").split("|")]]
    }


def test_every_model_gets_a_row_and_an_opacus_column(tmp_path: Path) -> None:
    pytest.importorskip("opacus")
    assert per_sample_grads.main([*FAST, "--output-dir", str(tmp_path)]) == 0
    summary = (tmp_path / "summary.md").read_text()
    rows = rows_of(summary)
    assert set(rows) == set(per_sample_grads.CASES)
    for name, (plain, library, ratio, opacus, opacus_ratio) in rows.items():
        assert float(plain) > 0 and float(library) > 0, name
        assert ratio.endswith("x"), name
        if name == "resnet18-groupnorm":
            # Opacus's hooks refuse ResNet's in-place `out += identity`.
            assert opacus.startswith("fails: RuntimeError"), opacus
        else:
            assert float(opacus) > 0 and opacus_ratio.endswith("x"), name
    assert "Target: library/plain <= 2.5x on every model" in summary
    assert "same command with `--device cuda` on a GPU" in summary
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["char-lstm"]) == {
        "plain",
        "library",
        "library-ratio",
        "opacus",
        "opacus-ratio",
        "opacus-status",
    }


def test_without_opacus_the_column_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_opacus(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".")[0] == "opacus":
            raise ImportError("No module named 'opacus'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_opacus)
    argv = [*FAST, "--models", "mlp", "char-lstm", "--output-dir", str(tmp_path)]
    assert per_sample_grads.main(argv) == 0
    rows = rows_of((tmp_path / "summary.md").read_text())
    assert set(rows) == {"mlp", "char-lstm"}
    assert all(
        cells[3] == "not installed" and cells[4] == "" for cells in rows.values()
    )
