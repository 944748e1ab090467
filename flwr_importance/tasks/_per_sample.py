"""Per-sample gradients, their norms, and importance-weighted batch gradients.

Two exact ways to get them, both vectorized over the batch (no Python loop over
samples):

* **torch.func** (:func:`vmap_per_sample_grads`): ``vmap(grad(loss of one
  sample))`` over the batch. Works for any model whose samples do not interact,
  and materializes a ``(B, *shape)`` gradient per parameter.
* **Layer-wise ("ghost") norms** (:func:`layerwise_gradient_and_norms`), for
  models whose parameters all sit in ``nn.Linear`` and ``nn.Conv2d`` layers (all
  of :mod:`flwr_importance.tasks.models`). One ordinary backward pass gives every
  layer's output gradient ``delta_b`` per sample; with the layer input ``a_b``,
  a linear layer's per-sample weight gradient is ``delta_b a_b^T``, whose squared
  norm is ``||delta_b||^2 ||a_b||^2`` (Goodfellow 2015, "Efficient per-example
  gradient computations"), and the importance-weighted batch gradient is
  ``(w * delta)^T a``. Nothing of size ``B x parameters`` is built for linear
  layers; convolutions build their (small) per-sample kernel gradients from
  ``unfold``. On a CPU, materializing the MLP's per-sample gradients costs 5 to
  9 plain SGD steps at batch 64, this path 1 to 1.6 steps (see
  ``benchmarks/per_sample_grads.py``), which is why the ISFedAvg step and the
  norms use it when they can.

Both paths compute the gradient of the per-sample loss
``Q_b(w) = loss(f(x_b; w), y_b) + l2 ||w||^2``, the regularizer included in every
sample's gradient, as in the ISFedAvg risk. :func:`per_sample_grad_norms` and
:func:`weighted_gradient_and_norms` take the layer-wise path when the model
allows it and torch.func otherwise. Every function runs on the model's device:
the data (and weights) are moved to it, so a model on CUDA is served on CUDA.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeGuard

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional alias)
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap
from torch.utils.hooks import RemovableHandle

SampleLoss = Callable[[Tensor, Tensor], Tensor]
"""Maps model outputs ``(B, ...)`` and targets ``(B, ...)`` to the ``(B,)`` data
losses (without regularizer)."""

# Rows per vmap call when only norms are wanted, so that a norm over a whole
# client data set never materializes all of its per-sample gradients at once.
NORM_CHUNK_SIZE = 256


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's parameters (the CPU for a model without any).

    Examples
    --------
    >>> model_device(nn.Linear(2, 1))
    device(type='cpu')
    """
    first = next(model.parameters(), None)
    return torch.device("cpu") if first is None else first.device


def per_sample_grad_norms(
    model: nn.Module, x: Tensor, y: Tensor, sample_loss: SampleLoss, l2: float
) -> Tensor:
    """``||grad Q_n(w)||`` over all parameters, for every sample; shape ``(B,)``.

    Layer by layer without building per-sample gradients when all parameters
    sit in plain ``nn.Linear``/``nn.Conv2d`` layers, else by torch.func in
    chunks of ``NORM_CHUNK_SIZE``; both are exact. Arguments as in
    :func:`vmap_per_sample_grads`.
    """
    layerwise = layerwise_gradient_and_norms(
        model, x, y, sample_loss, l2, sample_weights=None
    )
    if layerwise is not None:
        return layerwise[1]
    return vmap_norms(model, x, y, sample_loss, l2)


def weighted_gradient_and_norms(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    sample_loss: SampleLoss,
    l2: float,
    sample_weights: Tensor,
) -> tuple[list[Tensor], Tensor]:
    """``sum_b c_b grad Q_b(w)`` and the ``(B,)`` per-sample norms, in one pass.

    Layer by layer when the model allows it (see :func:`per_sample_grad_norms`),
    else from torch.func's per-sample gradients.

    Parameters
    ----------
    model, x, y, sample_loss, l2
        As in :func:`vmap_per_sample_grads`.
    sample_weights : torch.Tensor
        ``(B,)`` weights ``c_b``, cast to the parameters' dtype and device.

    Returns
    -------
    tuple of (list of torch.Tensor, torch.Tensor)
        The weighted gradient in ``model.parameters()`` order, and the norms.

    Raises
    ------
    ValueError
        If there is not one weight per sample.
    """
    if sample_weights.shape != (x.shape[0],):
        raise ValueError(
            f"need one weight per sample ({x.shape[0]}), "
            f"got shape {tuple(sample_weights.shape)}"
        )
    first = next(model.parameters())
    weights = sample_weights.to(dtype=first.dtype, device=first.device)
    layerwise = layerwise_gradient_and_norms(
        model, x, y, sample_loss, l2, sample_weights=weights
    )
    if layerwise is not None and layerwise[0] is not None:
        return layerwise[0], layerwise[1]
    per_sample = vmap_per_sample_grads(model, x, y, sample_loss, l2)
    gradient = [torch.tensordot(weights, g, dims=1) for g in per_sample.values()]
    return gradient, norms_of(per_sample)


def vmap_per_sample_grads(
    model: nn.Module, x: Tensor, y: Tensor, sample_loss: SampleLoss, l2: float
) -> dict[str, Tensor]:
    """Per-sample gradients with ``torch.func.vmap(grad(...))``.

    Parameters
    ----------
    model : torch.nn.Module
        A model that treats samples independently (no batch statistics).
    x, y : torch.Tensor
        Batch of inputs and targets (first dimension ``B``).
    sample_loss : SampleLoss
        Per-sample data loss.
    l2 : float
        Weight of ``||w||^2`` in every sample's loss.

    Returns
    -------
    dict of str to torch.Tensor
        For every parameter name of ``model.named_parameters()``, the ``(B,
        *param.shape)`` tensor of per-sample gradients, on the model's device.
    """
    device = model_device(model)
    x, y = x.to(device), y.to(device)
    parameters = {name: p.detach() for name, p in model.named_parameters()}
    buffers = {name: b.detach() for name, b in model.named_buffers()}

    def loss_of_one_sample(
        params: dict[str, Tensor], sample_x: Tensor, sample_y: Tensor
    ) -> Tensor:
        output = functional_call(model, (params, buffers), (sample_x.unsqueeze(0),))
        loss = sample_loss(output, sample_y.unsqueeze(0)).squeeze(0)
        if l2 > 0:
            loss = loss + l2 * sum(p.pow(2).sum() for p in params.values())
        return loss

    per_sample: dict[str, Tensor] = vmap(
        grad(loss_of_one_sample), in_dims=(None, 0, 0)
    )(parameters, x, y)
    return per_sample


def norms_of(per_sample_grads: dict[str, Tensor]) -> Tensor:
    """The ``(B,)`` Euclidean norms, over all parameters, of per-sample gradients."""
    squared = sum(row_squared_norms(g) for g in per_sample_grads.values())
    return torch.as_tensor(squared).sqrt()


def row_squared_norms(batched: Tensor) -> Tensor:
    """``||t_b||^2`` of every slice ``t_b`` along the first dimension."""
    # A fused norm reduction: several times faster than pow(2).sum() on CPU.
    return torch.linalg.vector_norm(
        batched.reshape(batched.shape[0], -1), dim=1
    ).square()


def vmap_norms(
    model: nn.Module, x: Tensor, y: Tensor, sample_loss: SampleLoss, l2: float
) -> Tensor:
    """Per-sample gradient norms by torch.func, in chunks of ``NORM_CHUNK_SIZE``."""
    return torch.cat(
        [
            norms_of(vmap_per_sample_grads(model, x_chunk, y_chunk, sample_loss, l2))
            for x_chunk, y_chunk in zip(
                x.split(NORM_CHUNK_SIZE), y.split(NORM_CHUNK_SIZE), strict=True
            )
        ]
    )


def layerwise_gradient_and_norms(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    sample_loss: SampleLoss,
    l2: float,
    sample_weights: Tensor | None,
) -> tuple[list[Tensor] | None, Tensor] | None:
    """Per-sample gradient norms and a weighted batch gradient, layer by layer.

    Parameters
    ----------
    model, x, y, sample_loss, l2
        As in :func:`vmap_per_sample_grads`.
    sample_weights : torch.Tensor or None
        ``(B,)`` weights ``c_b``; when given, also return ``sum_b c_b grad Q_b``.

    Returns
    -------
    tuple of (list of torch.Tensor or None, torch.Tensor), or None
        The weighted gradient in ``model.parameters()`` order (None without
        weights) and the ``(B,)`` per-sample gradient norms; None when the model
        has a parameter outside a plain ``nn.Linear``/``nn.Conv2d`` layer, a
        frozen or shared parameter, or a layer called other than once per
        forward pass (the caller then uses torch.func).
    """
    layers = _supported_layers(model)
    if layers is None:
        return None
    device = model_device(model)
    x, y = x.to(device), y.to(device)
    if sample_weights is not None:
        sample_weights = sample_weights.to(device)
    captured: dict[nn.Module, list[tuple[Tensor, Tensor]]] = {
        layer: [] for layer in layers
    }

    def capture(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        captured[module].append((inputs[0].detach(), output))

    handles: list[RemovableHandle] = [
        layer.register_forward_hook(capture) for layer in layers
    ]
    try:
        with torch.enable_grad():
            data_losses = sample_loss(model(x), y)
    finally:
        for handle in handles:
            handle.remove()
    calls = [captured[layer] for layer in layers]
    if any(len(layer_calls) != 1 for layer_calls in calls):
        return None
    inputs = [layer_calls[0][0] for layer_calls in calls]
    outputs = [layer_calls[0][1] for layer_calls in calls]
    if any(
        isinstance(layer, nn.Linear) and layer_input.dim() != 2
        for layer, layer_input in zip(layers, inputs, strict=True)
    ):
        return None
    # Samples do not interact, so row b of d(sum_b Q_b)/d(output) is sample b's own
    # output gradient; autograd computes no parameter gradient here.
    output_grads = torch.autograd.grad(
        data_losses.sum(), outputs, allow_unused=True, materialize_grads=True
    )
    batch_size = x.shape[0]
    squared_norms = torch.zeros(
        batch_size, dtype=data_losses.dtype, device=data_losses.device
    )
    # <data gradient of sample b, parameters>, needed to add the regularizer.
    inner_with_parameters = torch.zeros_like(squared_norms)
    gradients: dict[Tensor, Tensor] = {}
    with torch.no_grad():
        for layer, layer_input, output, output_grad in zip(
            layers, inputs, outputs, output_grads, strict=True
        ):
            unfolded_input, flat_grad = _layer_operands(layer, layer_input, output_grad)
            bias_grads = flat_grad.sum(dim=2)
            squared_norms += _squared_weight_grad_norms(unfolded_input, flat_grad)
            if layer.bias is not None:
                squared_norms += row_squared_norms(bias_grads)
            if l2 > 0:
                # The layer is linear in (weight, bias), so
                # <(d output / d params)^T delta, params> = <delta, output>.
                inner_with_parameters += (
                    (output_grad * output).reshape(batch_size, -1).sum(1)
                )
            if sample_weights is not None:
                weighted_grad = flat_grad * sample_weights[:, None, None]
                gradients[layer.weight] = torch.einsum(
                    "bol,bil->oi", weighted_grad, unfolded_input
                ).reshape(layer.weight.shape)
                if layer.bias is not None:
                    gradients[layer.bias] = sample_weights @ bias_grads
        parameters = list(model.parameters())
        if l2 > 0:
            # ||g_b + 2 l2 w||^2 = ||g_b||^2 + 4 l2 <g_b, w> + 4 l2^2 ||w||^2
            parameter_norm2 = sum(p.pow(2).sum() for p in parameters)
            squared_norms += (
                4 * l2 * inner_with_parameters + 4 * l2**2 * parameter_norm2
            )
        norms = squared_norms.clamp_min(0).sqrt()
        if sample_weights is None:
            return None, norms
        if l2 > 0:
            # Every sample's gradient carries the regularizer's 2 l2 w.
            weight_total = sample_weights.sum()
            for p in parameters:
                gradients[p] += 2 * l2 * weight_total * p
    return [gradients[p] for p in parameters], norms


Layer = nn.Linear | nn.Conv2d


def _supported_layers(model: nn.Module) -> list[Layer] | None:
    """The model's parameter-holding layers, or None if one is not supported."""
    modules = [
        module
        for module in model.modules()
        if next(module.parameters(recurse=False), None) is not None
    ]
    owned = [p for module in modules for p in module.parameters(recurse=False)]
    unique = list(model.parameters())
    if len(owned) != len(unique) or not all(p.requires_grad for p in unique):
        return None
    layers = [module for module in modules if _is_supported(module)]
    return layers if len(layers) == len(modules) else None


def _is_supported(module: nn.Module) -> TypeGuard[Layer]:
    """Whether the layer-wise identities hold for ``module``."""
    # Exact types: a subclass may change forward() and break the identities.
    if type(module) is nn.Conv2d:
        return (
            module.groups == 1
            and module.padding_mode == "zeros"
            and not isinstance(module.padding, str)
        )
    return type(module) is nn.Linear


def _layer_operands(
    layer: Layer, layer_input: Tensor, output_grad: Tensor
) -> tuple[Tensor, Tensor]:
    """``(A, D)`` with sample b's weight gradient ``D_b A_b^T``.

    ``A`` is ``(B, fan_in, L)`` and ``D`` is ``(B, out, L)``, ``L`` being the number
    of positions the weight is applied at: 1 for a dense layer, the output pixels
    for a convolution (whose input is unfolded into patches).
    """
    if isinstance(layer, nn.Conv2d):
        patches = F.unfold(
            layer_input,
            kernel_size=layer.kernel_size,
            dilation=layer.dilation,
            padding=layer.padding,  # type: ignore[arg-type]  # ints, checked above
            stride=layer.stride,
        )
        return patches, output_grad.flatten(start_dim=2)
    return layer_input.unsqueeze(2), output_grad.unsqueeze(2)


def _squared_weight_grad_norms(unfolded_input: Tensor, flat_grad: Tensor) -> Tensor:
    """``||D_b A_b^T||^2`` for every sample b."""
    if unfolded_input.shape[2] == 1:
        # Rank one: ||d a^T||^2 = ||d||^2 ||a||^2, no (out x fan_in) matrix built.
        return row_squared_norms(flat_grad) * row_squared_norms(unfolded_input)
    # Convolution kernels are small (out x fan_in), so build them per sample.
    per_sample = torch.bmm(flat_grad, unfolded_input.transpose(1, 2))
    return row_squared_norms(per_sample)
