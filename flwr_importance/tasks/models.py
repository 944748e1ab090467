"""The torch models of the papers' experiments, built deterministically from a seed.

Every model maps a batch shaped ``(B, *input_shape)`` to ``(B, num_outputs)`` and
treats samples independently (no batch normalization), which per-sample gradients
rely on.
"""

from __future__ import annotations

import math

import torch
from torch import nn

MODEL_NAMES = ("linear", "logreg", "mlp", "cnn")


def build_model(
    name: str,
    input_shape: tuple[int, ...],
    num_outputs: int,
    seed: int,
    *,
    hidden: tuple[int, int] = (200, 200),
) -> nn.Module:
    """Build a model with weights initialized from ``seed`` alone.

    Parameters
    ----------
    name : str
        ``"linear"``: linear regression ``f(x) = W x`` without bias, because the
        ISFedAvg regression model ``d = u w + v`` has none and its closed-form
        optimum (eq. 33) is for ``w`` alone. ``"logreg"``: multinomial logistic
        regression (flatten, then affine with bias). ``"mlp"``: flatten, then
        Linear-ReLU-Linear-ReLU-Linear with ``hidden`` sizes. ``"cnn"``: two
        3x3 convolutions (16 and 32 channels), each followed by ReLU and 2x2 max
        pooling, then a 64-unit hidden layer and the output layer; needs a
        ``(C, H, W)`` input with ``H, W >= 4`` (8x8 digits, 28x28 MNIST, 32x32
        CIFAR-10).
    input_shape : tuple of int
        Shape of one sample, without the batch dimension.
    num_outputs : int
        Number of classes (classification) or of regression targets.
    seed : int
        Initialization seed. The global torch RNG is forked, so building a model
        neither depends on nor changes the caller's random state.
    hidden : tuple of (int, int)
        Hidden layer sizes of ``"mlp"`` (ignored by the other models).

    Returns
    -------
    torch.nn.Module
        The model, in training mode.

    Raises
    ------
    ValueError
        For an unknown name, a non-positive size, or an input shape the model
        cannot take.
    """
    if name not in MODEL_NAMES:
        raise ValueError(
            f"unknown model {name!r}; valid names: {', '.join(MODEL_NAMES)}"
        )
    if num_outputs < 1 or not input_shape or any(size < 1 for size in input_shape):
        raise ValueError(
            f"need positive sizes, got input_shape={input_shape}, "
            f"num_outputs={num_outputs}"
        )
    with torch.random.fork_rng(devices=[]):
        # The CPU generator alone: the model is built on the CPU, and
        # torch.manual_seed would also queue a lazy seeding of every accelerator
        # backend, formatting the call stack each time (a large share of a
        # small ClientApp call's time, built once per message).
        torch.random.default_generator.manual_seed(seed)
        return _MODEL_BUILDERS[name](input_shape, num_outputs, hidden)


def _linear(
    input_shape: tuple[int, ...], num_outputs: int, hidden: tuple[int, int]
) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(math.prod(input_shape), num_outputs, bias=False)
    )


def _logreg(
    input_shape: tuple[int, ...], num_outputs: int, hidden: tuple[int, int]
) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_outputs))


def _mlp(
    input_shape: tuple[int, ...], num_outputs: int, hidden: tuple[int, int]
) -> nn.Module:
    first, second = hidden
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(input_shape), first),
        nn.ReLU(),
        nn.Linear(first, second),
        nn.ReLU(),
        nn.Linear(second, num_outputs),
    )


def _cnn(
    input_shape: tuple[int, ...], num_outputs: int, hidden: tuple[int, int]
) -> nn.Module:
    if len(input_shape) != 3 or min(input_shape[1:]) < 4:
        raise ValueError(
            f"'cnn' needs a (C, H, W) input with H, W >= 4, got {input_shape}"
        )
    channels, height, width = input_shape
    # Two 2x2 poolings (floor division each) leave this many positions.
    pooled_positions = (height // 2 // 2) * (width // 2 // 2)
    return nn.Sequential(
        nn.Conv2d(channels, 16, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * pooled_positions, 64),
        nn.ReLU(),
        nn.Linear(64, num_outputs),
    )


_MODEL_BUILDERS = {"linear": _linear, "logreg": _logreg, "mlp": _mlp, "cnn": _cnn}
