"""Layer-wise per-sample norms and weighted gradients against a per-sample loop.

Every layer type the layer-wise path serves, in the configurations that take
its different branches (Gram form or materialized, groups, dilation, padding
modes, sequence inputs, padding index, recurrent and attention options), and
the models users train, in float64 on the CPU: the norms and the weighted
gradient must equal a loop of one backward pass per sample, and the model
must have taken the layer-wise path with every trainable parameter in a
recorded piece.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from flwr_importance.per_sample import (
    engine,
    layerwise_gradient_and_norms,
    per_sample_grad_norms,
    weighted_gradient_and_norms,
)
from flwr_importance.per_sample.capture import capturing, layer_plan
from flwr_importance.per_sample.layers import dense_uses_gram
from flwr_importance.per_sample.pieces import Recorder
from flwr_importance.tasks.architectures import (
    CharLSTM,
    CharTransformer,
    QuickstartCNN,
    resnet18,
)

BATCH = 5
NUM_CLASSES = 3
# float64 sums in different orders.
RTOL, ATOL = 1e-9, 1e-11


class Head(nn.Module):
    """``body`` then a linear head on its flattened (or averaged) output."""

    def __init__(self, body: nn.Module, features: int, pool: str = "flatten") -> None:
        super().__init__()
        self.body = body
        self.pool = pool
        self.head = nn.Linear(features, NUM_CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.body(x)
        if isinstance(hidden, tuple):
            hidden = hidden[0]
        if self.pool == "mean1":
            hidden = hidden.mean(dim=1)
        return self.head(torch.tanh(hidden.flatten(start_dim=1)))


class Attention(nn.Module):
    """Multi-head attention with masks, returning its averaged weights too."""

    def __init__(self, cross: bool) -> None:
        super().__init__()
        self.cross = cross
        kwargs = {"kdim": 3, "vdim": 5} if cross else {}
        self.attention = nn.MultiheadAttention(6, 2, **kwargs)  # sequence-first

    def forward(self, x: Tensor) -> Tensor:
        query = x.transpose(0, 1)  # (T, B, 6)
        key = query[..., :3] if self.cross else query
        value = query[..., :5] if self.cross else query
        padding = torch.zeros(x.shape[0], x.shape[1], dtype=torch.bool)
        padding[:, -1] = True
        output, weights = self.attention(
            query, key, value, key_padding_mask=padding, need_weights=True
        )
        assert weights is not None
        return output.transpose(0, 1) + weights.sum(dim=2, keepdim=True)


class StatefulLSTM(nn.Module):
    """A 2-layer LSTM started from states computed from the input, whose final
    states reach the output too (gradients into ``h_0``, ``c_0`` and out of
    ``h_n``, ``c_n``)."""

    def __init__(self) -> None:
        super().__init__()
        self.start = nn.Linear(3, 2 * 2 * 4)
        self.lstm = nn.LSTM(3, 4, num_layers=2, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        # (h or c, layer, B, H)
        states = self.start(x.mean(dim=1)).reshape(-1, 2, 2, 4).permute(1, 2, 0, 3)
        output, (h_n, c_n) = self.lstm(x, (states[0], states[1]))
        return torch.cat((output.mean(dim=1), h_n[0], c_n.sum(dim=0)), dim=1)


def images(shape: tuple[int, ...]) -> Callable[[torch.Generator], Tensor]:
    return lambda generator: torch.randn((BATCH, *shape), generator=generator)


def tokens(vocab: int, length: int) -> Callable[[torch.Generator], Tensor]:
    def draw(generator: torch.Generator) -> Tensor:
        x = torch.randint(0, vocab, (BATCH, length), generator=generator)
        x[:, :2] = 0  # padding positions, and repeated rows
        return x

    return draw


#: Per case: the model and its input. Sizes are chosen so that each branch of
#: the layer maths runs (see ``test_the_cases_take_both_dense_branches``).
CASES: dict[
    str, tuple[Callable[[], nn.Module], Callable[[torch.Generator], Tensor]]
] = {
    "sequence-linear-gram": (
        lambda: Head(nn.Linear(40, 40), 40, "mean1"),
        images((4, 40)),
    ),
    "sequence-linear-materialized": (
        lambda: Head(nn.Linear(3, 5), 5 * 30),
        images((30, 3)),
    ),
    "linear-rank-4": (lambda: Head(nn.Linear(4, 2), 2 * 6), images((2, 3, 4))),
    "conv1d-groups-dilation-circular": (
        lambda: Head(
            nn.Conv1d(
                4,
                6,
                3,
                stride=2,
                dilation=2,
                padding=2,
                groups=2,
                padding_mode="circular",
            ),
            6 * 6,
        ),
        images((4, 12)),
    ),
    "conv1d-same-zeros-even-kernel": (
        lambda: Head(nn.Conv1d(2, 3, 4, padding="same", dilation=2), 3 * 7),
        images((2, 7)),
    ),
    "conv2d-same-reflect": (
        lambda: Head(
            nn.Conv2d(
                2, 3, (3, 2), padding="same", dilation=(1, 2), padding_mode="reflect"
            ),
            3 * 30,
        ),
        images((2, 5, 6)),
    ),
    "conv2d-gram-replicate": (
        lambda: Head(
            nn.Conv2d(16, 24, 3, stride=2, padding=1, padding_mode="replicate"),
            24 * 4,
        ),
        images((16, 4, 4)),
    ),
    "conv2d-depthwise-valid": (
        lambda: Head(nn.Conv2d(4, 8, 3, groups=4, padding="valid"), 8 * 9),
        images((4, 5, 5)),
    ),
    "conv3d-groups-stride": (
        lambda: Head(
            nn.Conv3d(2, 4, 2, stride=(1, 2, 1), padding=1, groups=2), 4 * 3 * 3 * 4
        ),
        images((2, 2, 4, 3)),
    ),
    "conv3d-gram": (
        lambda: Head(nn.Conv3d(8, 16, 2, dilation=(1, 1, 2)), 16 * 2),
        images((8, 3, 2, 3)),
    ),
    "embedding-gram-padding": (
        lambda: Head(nn.Embedding(50, 4, padding_idx=0), 4, "mean1"),
        tokens(50, 6),
    ),
    "embedding-table": (
        lambda: Head(nn.Embedding(4, 2), 2, "mean1"),
        tokens(4, 12),
    ),
    "layernorm-2d": (
        lambda: Head(nn.Sequential(nn.Linear(3, 6), nn.LayerNorm((6,))), 6, "mean1"),
        images((4, 3)),
    ),
    "layernorm-no-bias": (
        lambda: Head(nn.LayerNorm((2, 3), bias=False), 6),
        images((2, 3)),
    ),
    "groupnorm": (
        lambda: Head(nn.Sequential(nn.Conv2d(2, 4, 1), nn.GroupNorm(2, 4)), 4 * 9),
        images((2, 3, 3)),
    ),
    "instancenorm-affine": (
        lambda: Head(
            nn.Sequential(nn.Conv1d(2, 3, 1), nn.InstanceNorm1d(3, affine=True)), 3 * 4
        ),
        images((2, 4)),
    ),
    "batchnorm-eval": (
        lambda: Head(nn.Sequential(nn.Conv2d(2, 3, 1), batchnorm_in_eval_mode()), 27),
        images((2, 3, 3)),
    ),
    "lstm-2-layer-bidirectional": (
        lambda: Head(
            nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True),
            8,
            "mean1",
        ),
        images((6, 3)),
    ),
    "lstm-initial-and-final-states": (
        lambda: Head(StatefulLSTM(), 12),
        images((6, 3)),
    ),
    "lstm-sequence-first-no-bias": (
        lambda: Head(SequenceFirst(nn.LSTM(3, 4, bias=False)), 4, "mean1"),
        images((5, 3)),
    ),
    "gru-bidirectional-sequence-first": (
        lambda: Head(SequenceFirst(nn.GRU(3, 4, bidirectional=True)), 8, "mean1"),
        images((5, 3)),
    ),
    "gru-2-layer": (
        lambda: Head(nn.GRU(3, 4, num_layers=2, batch_first=True), 4, "mean1"),
        images((6, 3)),
    ),
    "attention-self": (
        lambda: Head(Attention(cross=False), 6, "mean1"),
        images((4, 6)),
    ),
    "attention-cross-kdim": (
        lambda: Head(Attention(cross=True), 6, "mean1"),
        images((4, 6)),
    ),
    "transformer-encoder": (
        lambda: Head(
            nn.TransformerEncoder(
                nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                2,
                enable_nested_tensor=False,
            ),
            8,
            "mean1",
        ),
        images((5, 8)),
    ),
    "quickstart-cnn": (lambda: QuickstartCNN(NUM_CLASSES), images((3, 32, 32))),
    "resnet18-groupnorm": (
        lambda: resnet18(num_classes=NUM_CLASSES, width=4),
        images((3, 16, 16)),
    ),
    "char-lstm": (
        lambda: CharLSTM(vocab_size=12, hidden_size=6, embedding_dim=3),
        tokens(12, 7),
    ),
    "char-transformer": (
        lambda: CharTransformer(vocab_size=12, d_model=8, num_heads=2, num_layers=2),
        tokens(12, 7),
    ),
}


class SequenceFirst(nn.Module):
    """Runs a sequence-first recurrent layer on batch-first input."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: Tensor) -> Tensor:
        output, _ = self.layer(x.transpose(0, 1))
        return output.transpose(0, 1)


def batchnorm_in_eval_mode() -> nn.BatchNorm2d:
    """A BatchNorm with non-trivial running statistics, in eval mode."""
    layer = nn.BatchNorm2d(3)
    assert layer.running_mean is not None and layer.running_var is not None
    layer.running_mean.uniform_(-1, 1)
    layer.running_var.uniform_(0.5, 2)
    return layer.eval()


def build(name: str) -> tuple[nn.Module, Tensor, Tensor]:
    make_model, make_input = CASES[name]
    torch.manual_seed(0)
    model = make_model().double()
    generator = torch.Generator().manual_seed(1)
    x = make_input(generator)
    if x.is_floating_point():
        x = x.double()
    output_classes = model(x[:1]).shape[1]
    y = torch.randint(0, output_classes, (BATCH,), generator=generator)
    return model, x, y


def sample_loss(outputs: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(outputs, targets, reduction="none")


def loop_reference(
    model: nn.Module, x: Tensor, y: Tensor, l2: float, weights: Tensor
) -> tuple[list[Tensor], Tensor]:
    """The weighted gradient and the norms, one backward pass per sample."""
    parameters = list(model.parameters())
    total = [torch.zeros_like(p) for p in parameters]
    norms = []
    for index in range(len(x)):
        loss = sample_loss(model(x[index : index + 1]), y[index : index + 1]).sum()
        loss = loss + l2 * sum(p.pow(2).sum() for p in parameters)
        grads = torch.autograd.grad(
            loss, parameters, allow_unused=True, materialize_grads=True
        )
        norms.append(torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt())
        for accumulated, sample_grad in zip(total, grads, strict=True):
            accumulated += weights[index] * sample_grad
    return total, torch.stack(norms)


@pytest.mark.parametrize("l2", [0.0, 0.01])
@pytest.mark.parametrize("name", sorted(CASES))
def test_norms_and_weighted_gradient_match_a_loop(name: str, l2: float) -> None:
    model, x, y = build(name)
    weights = torch.rand(BATCH, generator=torch.Generator().manual_seed(2)).double()
    expected_gradient, expected_norms = loop_reference(model, x, y, l2, weights)
    layerwise = layerwise_gradient_and_norms(model, x, y, sample_loss, l2, weights)
    assert layerwise is not None, f"{name} fell back to torch.func"
    gradient, norms = layerwise
    assert gradient is not None
    torch.testing.assert_close(norms, expected_norms, rtol=RTOL, atol=ATOL)
    for got, want in zip(gradient, expected_gradient, strict=True):
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    # The public entry points take the same path.
    torch.testing.assert_close(
        per_sample_grad_norms(model, x, y, sample_loss, l2),
        expected_norms,
        rtol=RTOL,
        atol=ATOL,
    )
    weighted, _ = weighted_gradient_and_norms(model, x, y, sample_loss, l2, weights)
    torch.testing.assert_close(weighted[0], expected_gradient[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_trainable_parameter_is_in_a_recorded_piece(name: str) -> None:
    model, x, _ = build(name)
    plan = layer_plan(model)
    assert plan.unsupported == []
    recorder = Recorder(BATCH)
    with capturing(plan, recorder):
        model(x)
    assert recorder.problems == []
    covered = {id(p) for piece in recorder.pieces for p in piece.parameters}
    missing = [n for n, p in model.named_parameters() if id(p) not in covered]
    assert missing == []


def test_the_cases_take_both_dense_branches() -> None:
    # sequence-linear-gram: T = 4 positions of a 40 x 40 weight.
    assert dense_uses_gram(4, 40, 40)
    # sequence-linear-materialized: T = 30 positions of a 3 -> 5 weight.
    assert not dense_uses_gram(30, 3, 5)
    # conv2d-gram-replicate: 2 x 2 outputs of a 16*9 -> 24 kernel; conv3d-gram:
    # 2 outputs of 8*8 -> 16; the other convolutions materialize.
    assert dense_uses_gram(4, 16 * 9, 24)
    assert dense_uses_gram(2, 8 * 8, 16)
    assert not dense_uses_gram(6, 2 * 3, 3)


def test_an_unserved_layer_falls_back_to_torch_func_with_one_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine, "_ANNOUNCED_FALLBACKS", set())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.PReLU(), nn.Linear(4, 2)).double()
    x = torch.randn(BATCH, 3, dtype=torch.float64)
    y = torch.randint(0, 2, (BATCH,))
    weights = torch.ones(BATCH, dtype=torch.float64)
    expected_gradient, expected_norms = loop_reference(model, x, y, 0.0, weights)
    with pytest.warns(UserWarning, match="torch.func .* because of PReLU"):
        gradient, norms = weighted_gradient_and_norms(
            model, x, y, sample_loss, 0.0, weights
        )
    torch.testing.assert_close(norms, expected_norms, rtol=RTOL, atol=ATOL)
    for got, want in zip(gradient, expected_gradient, strict=True):
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        per_sample_grad_norms(model, x, y, sample_loss, 0.0)
    assert [str(w.message) for w in seen] == []


def test_the_fallback_materializes_one_chunk_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.PReLU(), nn.Linear(4, 2)).double()
    x = torch.randn(BATCH, 3, dtype=torch.float64)
    y = torch.randint(0, 2, (BATCH,))
    weights = torch.rand(BATCH, dtype=torch.float64)
    expected_gradient, expected_norms = loop_reference(model, x, y, 0.01, weights)
    chunk_rows: list[int] = []
    materialize = engine.vmap_per_sample_grads

    def spy(model: nn.Module, x: Tensor, *args: Any) -> dict[str, Tensor]:
        chunk_rows.append(len(x))
        return materialize(model, x, *args)

    monkeypatch.setattr(engine, "NORM_CHUNK_SIZE", 2)
    monkeypatch.setattr(engine, "vmap_per_sample_grads", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gradient, norms = weighted_gradient_and_norms(
            model, x, y, sample_loss, 0.01, weights
        )
    assert chunk_rows == [2, 2, 1]
    torch.testing.assert_close(norms, expected_norms, rtol=RTOL, atol=ATOL)
    for got, want in zip(gradient, expected_gradient, strict=True):
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
