"""The models federated-learning users bring, at CIFAR and Shakespeare shapes.

What the per-sample gradient paths (:mod:`flwr_importance.per_sample`) are
measured and tested on: Flower's quickstart-pytorch CNN, a ResNet-18 (the
CIFAR variant of FL papers, with torchvision's layer names and in-place
ReLUs), a character LSTM in LEAF's Shakespeare shape and a small transformer
encoder over the same characters. torchvision's ``resnet18`` is not used: it
is not installable next to the CPU torch here, and its stem is ImageNet's.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from flwr_importance.per_sample import replace_batchnorm

#: LEAF Shakespeare: 80 characters in, the next of 80 possible out.
SHAKESPEARE_VOCAB = 80
SHAKESPEARE_LENGTH = 80


class QuickstartCNN(nn.Module):
    """Flower's quickstart-pytorch ``Net`` (from 'PyTorch: A 60 Minute Blitz')."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Class scores of a batch of 3x32x32 images."""
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.relu(self.fc1(x.flatten(start_dim=1)))
        return self.fc3(torch.relu(self.fc2(x)))


class BasicBlock(nn.Module):
    """ResNet's two 3x3 convolutions with a shortcut (torchvision's names)."""

    def __init__(self, in_channels: int, channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride, bias=False),
                nn.BatchNorm2d(channels),
            )

    def forward(self, x: Tensor) -> Tensor:
        """``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``."""
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    """ResNet-18 for 32x32 images: 3x3 stem, four stages of two blocks, linear head."""

    def __init__(self, num_classes: int, in_channels: int, width: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        stages, channels = [], width
        for stage in range(4):
            out_channels = width * 2**stage
            stride = 1 if stage == 0 else 2
            stages.append(
                nn.Sequential(
                    BasicBlock(channels, out_channels, stride),
                    BasicBlock(out_channels, out_channels, 1),
                )
            )
            channels = out_channels
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Class scores of a batch of images."""
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(start_dim=1))


def resnet18(
    *,
    num_classes: int = 10,
    norm: Literal["group", "batch"] = "group",
    in_channels: int = 3,
    width: int = 64,
) -> nn.Module:
    """A ResNet-18 with GroupNorm (``"group"``, per-sample gradients) or BatchNorm.

    ``"group"`` is the BatchNorm network passed through
    :func:`~flwr_importance.per_sample.replace_batchnorm` (each
    ``BatchNorm2d(C)`` becomes ``GroupNorm(gcd(32, C), C)``); ``width`` is the
    first stage's channels (64 in the paper), smaller for quick tests.

    Examples
    --------
    >>> sum(p.numel() for p in resnet18().parameters())
    11173962
    """
    model = ResNet18(num_classes, in_channels, width)
    return replace_batchnorm(model) if norm == "group" else model


class CharLSTM(nn.Module):
    """LEAF's Shakespeare model: embed the characters, LSTM, predict the next one."""

    def __init__(
        self,
        *,
        vocab_size: int = SHAKESPEARE_VOCAB,
        embedding_dim: int = 8,
        hidden_size: int = 128,
        num_layers: int = 2,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden_size, num_layers, batch_first=True)
        self.fc = nn.Linear(hidden_size, vocab_size)

    def forward(self, characters: Tensor) -> Tensor:
        """Scores of the character after each ``(B, T)`` sequence."""
        output, _ = self.lstm(self.embedding(characters))
        return self.fc(output[:, -1])


class CharTransformer(nn.Module):
    """A transformer encoder over characters, mean-pooled, predicting the next one.

    Sinusoidal positions (no parameter), ``num_layers`` pre-norm encoder
    layers of ``d_model`` with ``4 d_model`` feed-forward units, no dropout.
    """

    def __init__(
        self,
        *,
        vocab_size: int = SHAKESPEARE_VOCAB,
        d_model: int = 64,
        num_heads: int = 4,
        num_layers: int = 4,
        max_length: int = SHAKESPEARE_LENGTH,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model,
            num_heads,
            4 * d_model,
            dropout=0.0,
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(
            layer, num_layers, enable_nested_tensor=False
        )
        self.fc = nn.Linear(d_model, vocab_size)
        position = torch.arange(max_length).unsqueeze(1)
        frequency = torch.exp(
            torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model)
        )
        positions = torch.zeros(max_length, d_model)
        positions[:, 0::2] = torch.sin(position * frequency)
        positions[:, 1::2] = torch.cos(position * frequency)
        self.positions: Tensor
        self.register_buffer("positions", positions)

    def forward(self, characters: Tensor) -> Tensor:
        """Scores of the character after each ``(B, T)`` sequence."""
        x = self.embedding(characters) + self.positions[: characters.shape[1]]
        return self.fc(self.encoder(x).mean(dim=1))
