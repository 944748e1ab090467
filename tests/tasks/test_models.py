"""Model construction: shapes, determinism by seed, untouched global RNG."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flwr_importance.tasks import MODEL_NAMES, build_model

SHAPES: dict[str, list[tuple[int, ...]]] = {
    "linear": [(10,), (1, 8, 8)],
    "logreg": [(2,), (60,), (1, 8, 8)],
    "mlp": [(60,), (1, 8, 8), (1, 28, 28)],
    "cnn": [(1, 8, 8), (1, 28, 28), (3, 32, 32)],
}


@pytest.mark.parametrize(
    ("name", "input_shape"),
    [(name, shape) for name in MODEL_NAMES for shape in SHAPES[name]],
)
def test_output_shape(name: str, input_shape: tuple[int, ...]) -> None:
    model = build_model(name, input_shape, num_outputs=7, seed=0)
    assert model(torch.zeros(5, *input_shape)).shape == (5, 7)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_same_seed_same_weights_and_global_rng_untouched(name: str) -> None:
    input_shape = SHAPES[name][-1]
    rng_state = torch.get_rng_state()
    first = build_model(name, input_shape, 3, seed=5)
    assert torch.equal(torch.get_rng_state(), rng_state)
    second = build_model(name, input_shape, 3, seed=5)
    other = build_model(name, input_shape, 3, seed=6)
    for a, b, c in zip(
        first.parameters(), second.parameters(), other.parameters(), strict=True
    ):
        assert torch.equal(a, b)
        assert not torch.equal(a, c)


def test_linear_has_no_bias_and_logreg_has_one() -> None:
    linear = build_model("linear", (10,), 1, seed=0)
    assert [tuple(p.shape) for p in linear.parameters()] == [(1, 10)]
    logreg = build_model("logreg", (1, 8, 8), 10, seed=0)
    assert [tuple(p.shape) for p in logreg.parameters()] == [(10, 64), (10,)]


def test_mlp_hidden_sizes() -> None:
    model = build_model("mlp", (60,), 10, seed=0, hidden=(32, 16))
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in layers] == [
        (60, 32),
        (32, 16),
        (16, 10),
    ]


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="linear, logreg, mlp, cnn"):
        build_model("resnet", (1, 8, 8), 10, seed=0)


@pytest.mark.parametrize("input_shape", [(60,), (1, 3, 3)])
def test_cnn_rejects_unsuitable_input(input_shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="cnn"):
        build_model("cnn", input_shape, 10, seed=0)
