"""Which layers the layer-wise path serves, and what it records of each call.

:func:`layer_plan` walks the model once: every trainable parameter must sit in
a layer served here (``nn.Linear``, ``nn.Conv1d/2d/3d``, ``nn.Embedding``,
``nn.LayerNorm``, ``nn.GroupNorm``, ``nn.InstanceNorm1d/2d/3d``, an eval-mode
``nn.BatchNorm*``, ``nn.LSTM``, ``nn.GRU``, ``nn.MultiheadAttention``),
else the caller falls back to torch.func. :func:`capturing` records the
pieces (:mod:`flwr_importance.per_sample.pieces`) of one forward pass: by a
forward hook for the layers whose parameters act on their input and output
alone, by running the recurrent and attention layers through their linear
pieces (:mod:`flwr_importance.per_sample.recurrent`) for the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch.nn.functional as F  # noqa: N812 (the conventional alias)
from torch import Tensor, nn
from torch.nn.modules.conv import _ConvNd
from torch.utils.hooks import RemovableHandle

from flwr_importance.per_sample import recurrent
from flwr_importance.per_sample.pieces import (
    AffinePiece,
    ConvPiece,
    DensePiece,
    EmbeddingPiece,
    Recorder,
    edge_of,
)
from flwr_importance.per_sample.validation import mixes_samples

CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
INSTANCE_NORM_TYPES = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
BATCH_NORM_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
#: Served by a forward hook whatever their options.
HOOKED_TYPES = (
    nn.Linear,
    nn.LayerNorm,
    nn.GroupNorm,
    *CONV_TYPES,
    *INSTANCE_NORM_TYPES,
)


@dataclass
class LayerPlan:
    """The model's layers by how they are served, and the layers none serves."""

    hooked: list[nn.Module] = field(default_factory=list)
    unrolled: list[nn.Module] = field(default_factory=list)
    #: Type names of the parameter-holding layers no path serves.
    unsupported: list[str] = field(default_factory=list)


def layer_plan(model: nn.Module) -> LayerPlan:
    """Sort the model's parameter-holding layers by how they are served.

    A layer is served when its exact type (a subclass may change ``forward``)
    and its options keep the identities exact; a layer ``nn.LSTM``, ``nn.GRU``
    or ``nn.MultiheadAttention`` serves the parameters of its submodules too.
    Frozen or shared parameters, and modules that own parameters without
    being served, make the model unsupported.

    Examples
    --------
    >>> from torch import nn
    >>> layer_plan(nn.Sequential(nn.Linear(2, 2), nn.PReLU())).unsupported
    ['PReLU']
    """
    plan = LayerPlan()
    served: set[int] = set()
    owned = 0
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        owned += len(own)
        if any(id(p) in served for p in own):
            continue
        if unrolled_supported(module):
            plan.unrolled.append(module)
            served.update(id(p) for p in module.parameters())
        elif own and hook_supported(module):
            plan.hooked.append(module)
            served.update(id(p) for p in own)
        elif own:
            plan.unsupported.append(type(module).__name__)
    parameters = list(model.parameters())
    if not all(p.requires_grad for p in parameters):
        plan.unsupported.append("frozen parameters")
    if owned != len(parameters):
        plan.unsupported.append("parameters shared between layers")
    return plan


def unrolled_supported(module: nn.Module) -> bool:
    """Whether ``module`` is a recurrent or attention layer run by its pieces."""
    if type(module) in (nn.LSTM, nn.GRU):
        return bool(module.proj_size == 0)
    if type(module) is nn.MultiheadAttention:
        return module.bias_k is None and not module.add_zero_attn
    return False


def hook_supported(module: nn.Module) -> bool:
    """Whether a forward hook on ``module`` sees all its parameters act."""
    kind = type(module)
    if kind is nn.Embedding:
        # max_norm renormalizes the table in place; scale_grad_by_freq mixes
        # the samples of a batch.
        return module.max_norm is None and not module.scale_grad_by_freq
    if kind in BATCH_NORM_TYPES:
        # Served only with its running statistics (eval mode).
        return not mixes_samples(module)
    return kind in HOOKED_TYPES


@contextmanager
def capturing(plan: LayerPlan, recorder: Recorder) -> Iterator[None]:
    """Record the pieces of the forward passes run inside, into ``recorder``."""
    handles: list[RemovableHandle] = []
    patched: list[nn.Module] = []
    try:
        for module in plan.hooked:
            handles.append(module.register_forward_hook(_hook(recorder)))
        for module in plan.unrolled:
            if "forward" in vars(module):
                recorder.problems.append(f"{type(module).__name__} has its own forward")
                continue
            module.forward = recurrent.unrolled_forward(module, recorder)
            patched.append(module)
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module in patched:
            del module.forward
    recorder.check_unchanged()


def _hook(recorder: Recorder) -> Callable[[nn.Module, tuple[Any, ...], Tensor], None]:
    def record(module: nn.Module, inputs: tuple[Any, ...], output: Tensor) -> None:
        layer_input = inputs[0]
        name = type(module).__name__
        if not (recorder.batched(layer_input, name) and recorder.batched(output, name)):
            return
        recorder.pieces.append(_piece(module, recorder.saved(layer_input), output))

    return record


def _piece(
    module: nn.Module, layer_input: Tensor, output: Tensor
) -> DensePiece | ConvPiece | AffinePiece | EmbeddingPiece:
    """The piece of one call of a hooked layer."""
    batch_size = layer_input.shape[0]
    edge, shape = edge_of(output)
    if isinstance(module, nn.Linear):
        return DensePiece(
            weight=module.weight,
            bias=module.bias,
            inputs=layer_input.reshape(batch_size, 1, -1, layer_input.shape[-1]),
            output=edge,
            output_shape=shape,
            layout=lambda grad: grad.reshape(batch_size, 1, -1, grad.shape[-1]),
        )
    if isinstance(module, _ConvNd):
        spatial = layer_input.dim() - 2
        if module.padding_mode == "zeros" and not isinstance(module.padding, str):
            return ConvPiece(module, layer_input, module.padding, edge, shape)
        # Other padding modes, and "same" (maybe one more on one side), pad
        # the input themselves.
        padded = (
            F.pad(
                layer_input,
                module._reversed_padding_repeated_twice,
                mode=module.padding_mode,
            )
            if module.padding_mode != "zeros"
            else F.pad(layer_input, _zero_padding(module, spatial))
        )
        return ConvPiece(module, padded, (0,) * spatial, edge, shape)
    if isinstance(module, nn.Embedding):
        return EmbeddingPiece(
            weight=module.weight,
            indices=layer_input.reshape(batch_size, -1),
            padding_idx=module.padding_idx,
            output=edge,
            output_shape=shape,
            layout=lambda grad: grad.reshape(batch_size, -1, grad.shape[-1]),
        )
    if isinstance(module, nn.LayerNorm):
        features = math.prod(module.normalized_shape)
        normalized = F.layer_norm(layer_input, module.normalized_shape, eps=module.eps)
        return AffinePiece(
            weight=module.weight,
            bias=module.bias,
            normalized=normalized.reshape(batch_size, -1, features),
            output=edge,
            output_shape=shape,
            layout=lambda grad: grad.reshape(batch_size, -1, features),
        )
    assert isinstance(module, nn.GroupNorm | nn.modules.batchnorm._NormBase)
    return AffinePiece(
        weight=module.weight,
        bias=module.bias,
        normalized=_channels_last(_channel_normalized(module, layer_input)),
        output=edge,
        output_shape=shape,
        layout=_channels_last,
    )


def _channels_last(tensor: Tensor) -> Tensor:
    """``(B, C, *spatial)`` as ``(B, positions, C)``."""
    return tensor.flatten(start_dim=2).transpose(1, 2)


def _channel_normalized(module: nn.Module, layer_input: Tensor) -> Tensor:
    """The input of a per-channel norm layer, normalized as its forward does."""
    if isinstance(module, nn.GroupNorm):
        return F.group_norm(layer_input, module.num_groups, eps=module.eps)
    assert isinstance(module, nn.modules.batchnorm._NormBase)
    if module.running_mean is None or (
        module.training and isinstance(module, nn.modules.instancenorm._InstanceNorm)
    ):
        return F.instance_norm(layer_input, eps=module.eps)
    shape = (1, -1) + (1,) * (layer_input.dim() - 2)
    mean = module.running_mean.reshape(shape)
    assert module.running_var is not None
    return (layer_input - mean) / (
        module.running_var.reshape(shape) + module.eps
    ).sqrt()


def _zero_padding(conv: _ConvNd, spatial: int) -> list[int]:
    """``F.pad``'s amounts (last dimension first) of a zero-padded convolution."""
    if conv.padding == "valid":
        return [0] * (2 * spatial)
    amounts: list[int] = []
    for dim in reversed(range(spatial)):
        if conv.padding == "same":
            total = conv.dilation[dim] * (conv.kernel_size[dim] - 1)
            amounts += [total // 2, total - total // 2]
        else:
            padding = int(conv.padding[dim])
            amounts += [padding, padding]
    return amounts
