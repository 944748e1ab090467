"""MMFL's helpers for Flower's app: evaluating and saving every packed model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord

from flwr_importance.strategies import (
    evaluate_every_model,
    pack_models,
    per_model_files,
)

MODELS = [ArrayRecord({"w": Array(np.array([value]))}) for value in (1.0, 2.0, 6.0)]
PACKED = pack_models(MODELS)


def weight(arrays: ArrayRecord) -> float:
    return float(arrays["w"].numpy()[0])


def test_one_evaluate_function_per_model_in_model_order() -> None:
    functions = [
        lambda _, arrays, offset=offset: MetricRecord(
            {"score": weight(arrays) + offset, "n": 1}
        )
        for offset in (0.0, 10.0, 20.0)
    ]
    metrics = evaluate_every_model(functions)(3, PACKED)
    assert metrics is not None
    assert metrics["score-per-model"] == [1.0, 12.0, 26.0]
    assert metrics["score"] == pytest.approx(13.0)
    assert metrics["n"] == 1.0


def test_wrong_count_different_names_and_lists_are_refused() -> None:
    def same(_: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord({"score": weight(arrays)})

    with pytest.raises(ValueError, match="2 evaluate functions for 3 models"):
        evaluate_every_model([same, same])(1, PACKED)

    def named_by_weight(_: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord({f"w{weight(arrays):g}": 1.0})

    with pytest.raises(ValueError, match="the same metrics"):
        evaluate_every_model(named_by_weight)(1, PACKED)

    def listed(_: int, arrays: ArrayRecord) -> MetricRecord:
        return MetricRecord({"scores": [weight(arrays)]})

    with pytest.raises(TypeError, match="'scores' is not a number"):
        evaluate_every_model(listed)(1, PACKED)


def test_no_metrics_when_no_model_is_evaluated() -> None:
    assert evaluate_every_model(lambda _, __: None)(1, PACKED) is None


def test_each_model_gets_its_own_file_beside_the_apps(tmp_path: Path) -> None:
    files = per_model_files(PACKED, tmp_path / "final_model.pt")
    assert [path for _, path in files] == [
        tmp_path / f"final_model-{index}.pt" for index in range(3)
    ]
    assert [weight(arrays) for arrays, _ in files] == [1.0, 2.0, 6.0]
    assert [list(arrays) for arrays, _ in files] == [["w"]] * 3
