"""Fixtures for the tests of the user's quickstart-shaped ClientApp code."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def float32_convolutions(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuDNN convolutions in full float32, not TF32, so CUDA matches the CPU."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
