"""Refuse models whose samples interact, and the fix for the usual one: BatchNorm.

A per-sample gradient is the gradient of one sample's loss alone. A
BatchNorm layer in training mode normalizes each sample by the statistics of
its whole batch, so a sample's loss depends on the other samples and there
is no such gradient: torch.func then fails with a message about its own
internals, mid-training. :func:`check_samples_independent` names each such
layer before the first step (the ISFedAvg sampler calls it when it is built)
and the fix: :func:`replace_batchnorm` swaps every BatchNorm for a GroupNorm,
as Opacus's ``ModuleValidator.fix`` does; or, to keep BatchNorm, put those
layers in eval mode, where they normalize by their running statistics (which
then stay as they are: they are no longer updated during training).
"""

from __future__ import annotations

import math

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

#: Most groups :func:`replace_batchnorm` gives a GroupNorm (as Opacus).
MAX_GROUPS = 32


class SampleMixingLayerError(ValueError):
    """The model has layers that mix the samples of a batch (named in the message)."""


def sample_mixing_layers(model: nn.Module) -> list[str]:
    """``"name (Type)"`` of every layer that normalizes by batch statistics.

    That is every BatchNorm (``BatchNorm1d/2d/3d``, ``SyncBatchNorm``, the lazy
    ones) in training mode, or without running statistics.

    Examples
    --------
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
    >>> sample_mixing_layers(model)
    ['1 (BatchNorm2d)']
    >>> sample_mixing_layers(model.eval())
    []
    """
    return [
        f"{name or '<model>'} ({type(module).__name__})"
        for name, module in model.named_modules()
        if mixes_samples(module)
    ]


def mixes_samples(module: nn.Module) -> bool:
    """Whether ``module`` is a BatchNorm normalizing by its batch's statistics."""
    return isinstance(module, _BatchNorm) and (
        module.training or module.running_mean is None
    )


def check_samples_independent(model: nn.Module) -> None:
    """Raise :class:`SampleMixingLayerError` if a layer mixes the batch's samples.

    Raises
    ------
    SampleMixingLayerError
        Naming each such layer and the fix.
    """
    if not any(mixes_samples(module) for module in model.modules()):
        return
    mixing = sample_mixing_layers(model)
    if mixing:
        raise SampleMixingLayerError(
            "per-sample gradients need layers that treat every sample on its "
            "own, and these normalize by the statistics of the whole batch: "
            f"{', '.join(mixing)}. Fix: model = replace_batchnorm(model) (from "
            "flwr_importance.clientapps.isfedavg: each BatchNorm becomes a "
            "GroupNorm), before loading weights and building the optimizer; or "
            "keep BatchNorm in eval mode (it then normalizes by its running "
            "statistics, which training no longer updates)."
        )


def replace_batchnorm(model: nn.Module) -> nn.Module:
    """Replace every BatchNorm of ``model`` by a GroupNorm, in place; return it.

    Each ``BatchNorm*d(C)`` becomes ``GroupNorm(gcd(32, C), C)`` with the same
    ``eps`` and affine parameters (scale 1, shift 0), as Opacus's
    ``ModuleValidator.fix``. The state dict keeps its parameter names (the
    running statistics go); build the optimizer after the swap.

    Examples
    --------
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Conv2d(3, 48, 3), nn.BatchNorm2d(48))
    >>> fixed = replace_batchnorm(model)
    >>> type(fixed[1]).__name__, fixed[1].num_groups, fixed[1].num_channels
    ('GroupNorm', 16, 48)
    """
    if isinstance(model, _BatchNorm):
        return _group_norm(model)
    for name, child in model.named_children():
        setattr(model, name, replace_batchnorm(child))
    return model


def _group_norm(batch_norm: _BatchNorm) -> nn.GroupNorm:
    channels = batch_norm.num_features
    group_norm = nn.GroupNorm(
        math.gcd(MAX_GROUPS, channels),
        channels,
        eps=batch_norm.eps,
        affine=batch_norm.affine,
    )
    if batch_norm.affine:
        group_norm.to(batch_norm.weight.device, batch_norm.weight.dtype)
    return group_norm
