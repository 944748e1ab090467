"""Per-sample gradient norms and importance-weighted batch gradients of a model.

Two exact ways to get them, both vectorized over the batch (no Python loop over
samples):

* **Layer by layer** (:func:`layerwise_gradient_and_norms`), when every
  trainable parameter sits in a layer :mod:`flwr_importance.per_sample.capture`
  serves. One ordinary forward and backward pass gives each layer's inputs
  ``A_b`` and output gradient ``D_b`` per sample (samples do not interact, so
  row ``b`` of the batch's output gradient is sample ``b``'s own); each layer's
  per-sample gradient norm and the weighted gradient ``sum_b c_b grad_b`` then
  follow from ``A`` and ``D`` (:mod:`flwr_importance.per_sample.layers`),
  without building per-sample gradients where a cheaper form exists.
* **torch.func** (:func:`vmap_per_sample_grads`): ``vmap(grad(loss of one
  sample))`` over the batch, for any other model whose samples do not
  interact, in chunks of ``NORM_CHUNK_SIZE`` samples. It materializes a
  ``(chunk, *shape)`` gradient per parameter; a one-time warning names the
  layer types that forced it.

Both compute the gradient of the per-sample loss ``Q_b(w) = loss(f(x_b; w),
y_b) + l2 ||w||^2``, the regularizer included in every sample's gradient, as
in the ISFedAvg risk. Every function runs on the model's device: the data (and
weights) are moved to it. A model whose layers mix the samples of a batch
(BatchNorm in training mode) is refused with
:class:`~flwr_importance.per_sample.validation.SampleMixingLayerError`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from flwr_importance.per_sample import pieces as piece_math
from flwr_importance.per_sample.capture import capturing, layer_plan
from flwr_importance.per_sample.layers import row_squared_norms
from flwr_importance.per_sample.pieces import Piece, Recorder
from flwr_importance.per_sample.validation import check_samples_independent

SampleLoss = Callable[[Tensor, Tensor], Tensor]
"""Maps model outputs ``(B, ...)`` and targets ``(B, ...)`` to the ``(B,)`` data
losses (without regularizer)."""

# Rows per vmap call, so that the fallback never materializes the per-sample
# gradients of more than this many samples at once.
NORM_CHUNK_SIZE = 256

#: The sets of layer types the torch.func fallback was already announced for.
_ANNOUNCED_FALLBACKS: set[tuple[str, ...]] = set()


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

    Layer by layer when every layer is served, else by torch.func in chunks of
    ``NORM_CHUNK_SIZE``; both are exact. Arguments as in
    :func:`vmap_per_sample_grads`.

    Raises
    ------
    SampleMixingLayerError
        If a layer mixes the samples of the batch (BatchNorm in training mode).
    """
    check_samples_independent(model)
    layerwise = layerwise_gradient_and_norms(
        model, x, y, sample_loss, l2, sample_weights=None
    )
    if layerwise is not None:
        return layerwise[1]
    return vmap_gradient_and_norms(model, x, y, sample_loss, l2, None)[1]


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
    else from torch.func's per-sample gradients, chunk by chunk.

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
    SampleMixingLayerError
        If a layer mixes the samples of the batch (BatchNorm in training mode).
    """
    if sample_weights.shape != (x.shape[0],):
        raise ValueError(
            f"need one weight per sample ({x.shape[0]}), "
            f"got shape {tuple(sample_weights.shape)}"
        )
    check_samples_independent(model)
    first = next(model.parameters())
    weights = sample_weights.to(dtype=first.dtype, device=first.device)
    layerwise = layerwise_gradient_and_norms(
        model, x, y, sample_loss, l2, sample_weights=weights
    )
    if layerwise is not None and layerwise[0] is not None:
        return layerwise[0], layerwise[1]
    gradient, norms = vmap_gradient_and_norms(model, x, y, sample_loss, l2, weights)
    assert gradient is not None
    return gradient, norms


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


def vmap_gradient_and_norms(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    sample_loss: SampleLoss,
    l2: float,
    sample_weights: Tensor | None,
) -> tuple[list[Tensor] | None, Tensor]:
    """The weighted gradient (None without weights) and norms by torch.func.

    In chunks of ``NORM_CHUNK_SIZE`` samples; warns once per set of layer
    types that kept the model off the layer-wise path.
    """
    _announce_fallback(model)
    gradient: list[Tensor] | None = None
    norms = []
    for start in range(0, x.shape[0], NORM_CHUNK_SIZE):
        chunk = slice(start, start + NORM_CHUNK_SIZE)
        per_sample = vmap_per_sample_grads(model, x[chunk], y[chunk], sample_loss, l2)
        norms.append(norms_of(per_sample))
        if sample_weights is not None:
            weighted = [
                torch.tensordot(sample_weights[chunk], g, dims=1)
                for g in per_sample.values()
            ]
            gradient = (
                weighted
                if gradient is None
                else [
                    total + part for total, part in zip(gradient, weighted, strict=True)
                ]
            )
    return gradient, torch.cat(norms)


def _announce_fallback(model: nn.Module) -> None:
    """Warn, once per set of layer types, that torch.func serves this model."""
    layer_types = tuple(sorted(set(layer_plan(model).unsupported)))
    if layer_types in _ANNOUNCED_FALLBACKS:
        return
    _ANNOUNCED_FALLBACKS.add(layer_types)
    warnings.warn(
        "per-sample gradients by torch.func (slower, more memory) because of "
        f"{', '.join(layer_types) or 'how the layers were called'}; the layer-wise "
        "path serves Linear, Conv1d/2d/3d, Embedding, LayerNorm, GroupNorm, "
        "InstanceNorm, eval-mode BatchNorm, LSTM, GRU and MultiheadAttention",
        stacklevel=3,
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
        weights) and the ``(B,)`` per-sample gradient norms; None when a
        trainable parameter sits outside a served layer, a parameter is frozen
        or shared, or a layer saw a tensor that is not batch-first (the caller
        then uses torch.func).
    """
    plan = layer_plan(model)
    if plan.unsupported:
        return None
    device = model_device(model)
    x, y = x.to(device), y.to(device)
    recorder = Recorder(x.shape[0])
    with torch.enable_grad(), capturing(plan, recorder):
        data_losses = sample_loss(model(x), y)
    if recorder.problems:
        return None
    groups: dict[tuple[int, object], list[Piece]] = {}
    for piece in recorder.pieces:
        groups.setdefault(piece_math.piece_key(piece), []).append(piece)
    edges = {piece_math.edge_key(p.output): p.output for p in recorder.pieces}
    edge_grads = dict(
        zip(
            edges,
            torch.autograd.grad(
                data_losses.sum(), list(edges.values()), allow_unused=True
            ),
            strict=True,
        )
    )
    squared_parts: list[Tensor] = []
    # <data gradient of sample b, parameters>, needed to add the regularizer.
    inner_parts: list[Tensor] = []
    parameters = list(model.parameters())
    # Filled as the contributions come: a whole parameter's first gradient,
    # laid out as the parameter, is taken as is (on a small model, zeroing
    # and adding cost as much as the maths).
    gradients: dict[int, Tensor] = {}
    with torch.no_grad():
        for group in groups.values():
            output_grads = [
                _grad_or_zeros(
                    edge_grads[piece_math.edge_key(p.output)], p, data_losses
                )
                for p in group
            ]
            part = piece_math.contribution(group, output_grads, sample_weights, l2 > 0)
            squared_parts.append(part.squared_norms)
            if part.inner_with_parameters is not None:
                inner_parts.append(part.inner_with_parameters)
            for parameter, rows, gradient in part.gradients:
                if (
                    rows == slice(None)
                    and id(parameter) not in gradients
                    and gradient.stride() == parameter.stride()
                ):
                    gradients[id(parameter)] = gradient
                else:
                    if id(parameter) not in gradients:
                        gradients[id(parameter)] = torch.zeros_like(parameter)
                    gradients[id(parameter)][rows] += gradient
        squared_norms = _summed(squared_parts, data_losses)
        if l2 > 0:
            # ||g_b + 2 l2 w||^2 = ||g_b||^2 + 4 l2 <g_b, w> + 4 l2^2 ||w||^2
            parameter_norm = torch.linalg.vector_norm(
                torch.stack(torch._foreach_norm(tuple(parameters)))
            )
            squared_norms = squared_norms.add(
                _summed(inner_parts, data_losses), alpha=4 * l2
            ).add_(parameter_norm.square(), alpha=4 * l2**2)
        norms = squared_norms.clamp_min(0).sqrt()
        if sample_weights is None:
            return None, norms
        if l2 > 0:
            # Every sample's gradient carries the regularizer's 2 l2 w.
            scale = 2 * l2 * sample_weights.sum()
            for p in parameters:
                if id(p) in gradients:
                    gradients[id(p)].addcmul_(p, scale)
                else:
                    gradients[id(p)] = p * scale
    return [
        gradients[id(p)] if id(p) in gradients else torch.zeros_like(p)
        for p in parameters
    ], norms


def _summed(parts: list[Tensor], like: Tensor) -> Tensor:
    """The sum of ``(B,)`` tensors (one is returned as is; none: zeros)."""
    if len(parts) <= 1:
        return parts[0] if parts else torch.zeros_like(like.detach())
    return torch.stack(parts).sum(dim=0)


def _grad_or_zeros(output_grad: Tensor | None, piece: Piece, like: Tensor) -> Tensor:
    """The output gradient, or zeros for an output the loss does not use."""
    if output_grad is not None:
        return output_grad
    return like.new_zeros(piece.output_shape)
