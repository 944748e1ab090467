"""Per-sample gradient norms and weighted gradients of one layer, from its operands.

Every function here is pure: it takes what one ordinary backward pass gives
for a layer (its inputs ``A`` and the gradient ``D`` of the summed data loss
with respect to its output, row ``b`` being sample ``b``'s own gradient when
samples do not interact) and returns, per sample, the squared norm of that
sample's gradient with respect to the layer's parameters, and the weighted
sum ``sum_b c_b grad_b`` over the batch. No ``B x parameters`` tensor is built
unless that is the cheaper way.

Three shapes of layer cover the layers of :mod:`flwr_importance.per_sample`:

* **dense** (``nn.Linear`` on inputs of any rank, every ``nn.Conv*d`` through
  its input patches, the linear pieces of ``nn.LSTM``, ``nn.GRU`` and
  ``nn.MultiheadAttention``): the weight is applied at ``T`` positions, so
  sample ``b``'s gradient is ``D_b^T A_b``. Its squared norm is either
  ``<A_b A_b^T, D_b D_b^T>`` (the ``T x T`` "ghost" Gram form, Li et al. 2022)
  or the squared norm of the materialized ``D_b^T A_b``, whichever costs fewer
  multiplications (:func:`dense_uses_gram`).
* **affine** (the per-feature scale and shift of ``nn.LayerNorm``,
  ``nn.GroupNorm``, ``nn.InstanceNorm*d`` and an eval-mode BatchNorm): the
  gradient of the scale is ``sum_t D_bt * xhat_bt``, of the shift ``sum_t D_bt``.
* **embedding** (``nn.Embedding``): the gradient of row ``v`` is the sum of
  ``D_bt`` over the positions ``t`` whose index is ``v``.
"""

from __future__ import annotations

import math
from types import EllipsisType

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional alias)
from torch import Tensor


def row_squared_norms(batched: Tensor) -> Tensor:
    """``||t_b||^2`` of every slice ``t_b`` along the first dimension.

    Examples
    --------
    >>> import torch
    >>> row_squared_norms(torch.tensor([[3.0, 4.0], [1.0, 0.0]]))
    tensor([25.,  1.])
    """
    # A fused norm reduction: several times faster than pow(2).sum() on CPU.
    return torch.linalg.vector_norm(
        batched.reshape(batched.shape[0], -1), dim=1
    ).square()


def dense_uses_gram(positions: int, fan_in: int, fan_out: int) -> bool:
    """Whether the ``T x T`` Gram form is cheaper than materializing ``D_b^T A_b``.

    The Gram form costs ``T^2 (fan_in + fan_out)`` multiplications per sample,
    materializing ``T fan_in fan_out``; a single position (a dense layer on a
    flat input) needs neither (``||d a^T||^2 = ||d||^2 ||a||^2``).

    Examples
    --------
    A character model's embedding-to-hidden projection over 80 positions (8 in,
    512 out) is cheaper materialized; a 64-wide attention projection over 8
    tokens is cheaper in the Gram form:

    >>> dense_uses_gram(80, 8, 512), dense_uses_gram(8, 64, 64)
    (False, True)
    """
    return positions * (fan_in + fan_out) < fan_in * fan_out


def dense_norms_and_gradient(
    inputs: Tensor,
    output_grads: Tensor,
    sample_weights: Tensor | None,
) -> tuple[Tensor, Tensor | None]:
    """``||D_b^T A_b||^2`` for every sample ``b``, and ``sum_b c_b D_b^T A_b``.

    Parameters
    ----------
    inputs : torch.Tensor
        ``A``, shaped ``(B, G, T, fan_in)``: ``G`` independent weight blocks
        (a grouped convolution's groups; 1 otherwise), each applied at ``T``
        positions. Strided views are fine (no copy is made of them).
    output_grads : torch.Tensor
        ``D``, shaped ``(B, G, T, fan_out)``.
    sample_weights : torch.Tensor or None
        ``(B,)`` weights ``c_b``; None: no weighted gradient.

    Returns
    -------
    tuple of (torch.Tensor, torch.Tensor or None)
        The ``(B,)`` squared norms summed over the groups, and the weighted
        gradient ``(G, fan_out, fan_in)`` (None without weights). Where the
        per-sample gradients are materialized, the weighted gradient is their
        weighted sum.

    Examples
    --------
    >>> import torch
    >>> a, d = torch.randn(3, 1, 5, 4), torch.randn(3, 1, 5, 2)
    >>> per_sample = d.transpose(2, 3) @ a
    >>> squared, weighted = dense_norms_and_gradient(a, d, torch.ones(3))
    >>> torch.allclose(squared, per_sample.pow(2).sum((1, 2, 3)))
    True
    >>> torch.allclose(weighted, per_sample.sum(0))
    True
    """
    batch_size, groups, positions, fan_in = inputs.shape
    fan_out = output_grads.shape[3]
    if positions == 1 and groups == 1:
        # Rank one: ||d a^T||^2 = ||d||^2 ||a||^2, and plain matrix products.
        flat_inputs = inputs.reshape(batch_size, fan_in)
        flat_grads = output_grads.reshape(batch_size, fan_out)
        squared = row_squared_norms(flat_inputs) * row_squared_norms(flat_grads)
        if sample_weights is None:
            return squared, None
        weighted_grads = flat_grads * sample_weights.unsqueeze(1)
        return squared, (weighted_grads.T @ flat_inputs).unsqueeze(0)
    if positions == 1 or dense_uses_gram(positions, fan_in, fan_out):
        if positions == 1:
            squared = (
                inputs.square().sum(dim=3) * output_grads.square().sum(dim=3)
            ).sum(dim=(1, 2))
        else:
            squared = (position_gram(inputs) * position_gram(output_grads)).sum(
                dim=(1, 2, 3)
            )
        if sample_weights is None:
            return squared, None
        # The weights scale whichever operand is smaller.
        scale = sample_weights.reshape(-1, 1, 1, 1)
        if fan_in < fan_out:
            inputs = inputs * scale
        else:
            output_grads = output_grads * scale
        # One product per group over samples and positions (for one group,
        # the reshapes are views: no copy, unlike einsum's).
        grads_by_group = output_grads.transpose(0, 1).reshape(groups, -1, fan_out)
        inputs_by_group = inputs.transpose(0, 1).reshape(groups, -1, fan_in)
        if groups == 1:
            # A plain matrix product: faster than a batch of one.
            return squared, (grads_by_group[0].T @ inputs_by_group[0]).unsqueeze(0)
        return squared, grads_by_group.transpose(1, 2) @ inputs_by_group
    per_sample = output_grads.transpose(2, 3) @ inputs
    squared = row_squared_norms(per_sample)
    if sample_weights is None:
        return squared, None
    return squared, torch.tensordot(sample_weights, per_sample, dims=1)


def position_gram(positions: Tensor) -> Tensor:
    """``X_b X_b^T`` of ``(B, G, T, features)``: the ``(B, G, T, T)`` inner products.

    Examples
    --------
    >>> import torch
    >>> position_gram(torch.tensor([[[[1.0, 2.0], [0.0, 1.0]]]]))
    tensor([[[[5., 2.],
              [2., 1.]]]])
    """
    return positions @ positions.transpose(2, 3)


def conv_weight_grads(
    inputs: Tensor,
    output_grads: Tensor,
    weight_shape: tuple[int, ...],
    *,
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int,
    per_sample: bool,
) -> Tensor:
    """A convolution's weight gradient, by its own backward kernel.

    With ``per_sample``, every sample's, ``(B, *weight_shape)``: the batch
    becomes ``B`` groups of one convolution (samples side by side along the
    channels), whose weight gradient is the ``B`` per-sample gradients
    stacked. Without, their sum over the batch, ``weight_shape`` (scale
    ``output_grads`` by the sample weights for a weighted sum).

    Parameters
    ----------
    inputs : torch.Tensor
        The layer's ``(B, C, *spatial)`` input (padded, unless ``padding``
        does it).
    output_grads : torch.Tensor
        ``(B, O, *out_spatial)``.
    weight_shape : tuple of int
        ``(O, C / groups, *kernel)``.
    stride, padding, dilation, groups
        The layer's.
    per_sample : bool
        Whether to keep the samples' gradients apart.

    Examples
    --------
    >>> import torch
    >>> import torch.nn.functional as F
    >>> x, w = torch.randn(2, 3, 5), torch.randn(4, 3, 2, requires_grad=True)
    >>> d = torch.randn(2, 4, 4)
    >>> options = dict(stride=(1,), padding=(0,), dilation=(1,), groups=1)
    >>> grads = conv_weight_grads(x, d, (4, 3, 2), **options, per_sample=True)
    >>> first, = torch.autograd.grad(F.conv1d(x[:1], w), w, d[:1])
    >>> torch.allclose(grads[0], first, atol=1e-6)
    True
    >>> total = conv_weight_grads(x, d, (4, 3, 2), **options, per_sample=False)
    >>> torch.allclose(total, grads.sum(0), atol=1e-6)
    True
    """
    batch_size = inputs.shape[0]
    copies = batch_size if per_sample else 1
    stacked = (copies * weight_shape[0], *weight_shape[1:])
    grads = torch.ops.aten.convolution_backward(
        output_grads.reshape(-1, copies * weight_shape[0], *output_grads.shape[2:]),
        inputs.reshape(-1, copies * inputs.shape[1], *inputs.shape[2:]),
        # Only the weight's shape is read.
        output_grads.new_empty(1).expand(stacked),
        None,
        list(stride),
        list(padding),
        list(dilation),
        False,
        [0] * len(stride),
        copies * groups,
        (False, True, False),
    )[1]
    return grads.reshape(-1, *weight_shape) if per_sample else grads


def conv_patches(
    inputs: Tensor,
    *,
    kernel_size: tuple[int, ...],
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int,
) -> Tensor:
    """The input patches each kernel position sees: ``(B, G, L, C/G * prod(k))``.

    Windows of ``dilation (k - 1) + 1`` every ``stride`` along each spatial
    dimension of the zero-padded input, keeping every ``dilation``-th element
    (``F.unfold``'s im2col for 1-d and 2-d inputs, strided windows for 3-d);
    the patch features are ordered as the flattened weight ``(C/G, *k)``. The
    result is a transposed view of a contiguous ``(B, G, C/G * prod(k), L)``.

    Examples
    --------
    >>> import torch
    >>> patches = conv_patches(
    ...     torch.arange(4.0).reshape(1, 1, 4),
    ...     kernel_size=(2,), stride=(2,), padding=(0,), dilation=(1,), groups=1,
    ... )
    >>> patches
    tensor([[[[0., 1.],
              [2., 3.]]]])
    """
    spatial = inputs.dim() - 2
    batch_size = inputs.shape[0]
    if spatial <= 2:

        def as_2d(values: tuple[int, ...]) -> tuple[int, int]:
            # A 1-d input is a 2-d one of height 1.
            return (1, values[0]) if spatial == 1 else (values[0], values[1])

        columns = F.unfold(
            inputs if spatial == 2 else inputs.unsqueeze(2),
            kernel_size=as_2d(kernel_size),
            dilation=as_2d(dilation),
            padding=(0, padding[0]) if spatial == 1 else as_2d(padding),
            stride=as_2d(stride),
        )
        return columns.reshape(batch_size, groups, -1, columns.shape[2]).transpose(2, 3)
    windows = F.pad(inputs, [p for p in reversed(padding) for _ in range(2)])
    for dim in range(spatial):
        span = dilation[dim] * (kernel_size[dim] - 1) + 1
        windows = windows.unfold(2 + dim, span, stride[dim])
    # (B, C, L_1..L_n, span_1..span_n) -> every dilation-th element of a span.
    every_dilation: tuple[EllipsisType | slice, ...] = (
        Ellipsis,
        *(slice(None, None, d) for d in dilation),
    )
    windows = windows[every_dilation]
    positions = math.prod(windows.shape[2 : 2 + spatial])
    order = (0, 1, *range(2 + spatial, 2 + 2 * spatial), *range(2, 2 + spatial))
    columns = windows.permute(order).reshape(batch_size, groups, -1, positions)
    return columns.transpose(2, 3)


def summed_bias_grads(output_grads: Tensor) -> Tensor:
    """Each sample's bias gradient ``sum_t D_bt``, shaped ``(B, G, fan_out)``."""
    return output_grads.sum(dim=2)


def affine_sample_grads(normalized: Tensor, output_grads: Tensor) -> Tensor:
    """Each sample's scale gradient ``sum_t D_bt * xhat_bt``, shaped ``(B, C)``.

    Parameters
    ----------
    normalized : torch.Tensor
        ``xhat``, the normalized input before the affine map, ``(B, T, C)``.
    output_grads : torch.Tensor
        ``D``, ``(B, T, C)``.

    Examples
    --------
    >>> import torch
    >>> affine_sample_grads(torch.ones(1, 2, 3), torch.full((1, 2, 3), 0.5))
    tensor([[1., 1., 1.]])
    """
    return (normalized * output_grads).sum(dim=1)


def embedding_squared_norms(
    indices: Tensor, output_grads: Tensor, num_embeddings: int
) -> Tensor:
    """``||G_b||^2`` of every sample's embedding-table gradient.

    Row ``v`` of ``G_b`` is ``sum_{t: idx_bt = v} D_bt``, so ``||G_b||^2 =
    sum_{t, s: idx_bt = idx_bs} <D_bt, D_bs>``: the Gram form over positions,
    or the materialized ``(B, V, E)`` table, whichever is smaller.

    Parameters
    ----------
    indices : torch.Tensor
        ``(B, T)`` looked-up rows; positions to leave out (a padding index)
        carry a zero ``D``.
    output_grads : torch.Tensor
        ``(B, T, E)``.
    num_embeddings : int
        ``V``, the table's number of rows.

    Examples
    --------
    >>> import torch
    >>> indices = torch.tensor([[0, 2, 0]])
    >>> grads = torch.tensor([[[1.0], [2.0], [3.0]]])
    >>> embedding_squared_norms(indices, grads, 3)  # rows 0 and 2: 4 and 2
    tensor([20.])
    """
    batch_size, positions = indices.shape
    if positions * positions < num_embeddings * output_grads.shape[2]:
        same_row = (indices.unsqueeze(2) == indices.unsqueeze(1)).to(output_grads)
        grad_gram = output_grads @ output_grads.transpose(1, 2)
        return (same_row * grad_gram).sum(dim=(1, 2))
    table = output_grads.new_zeros(
        batch_size * num_embeddings, output_grads.shape[2]
    ).index_add_(0, embedding_rows(indices, num_embeddings), output_grads.flatten(0, 1))
    return row_squared_norms(table.reshape(batch_size, -1))


def embedding_rows(indices: Tensor, num_embeddings: int) -> Tensor:
    """Flat rows ``b V + idx_bt`` of a ``(B V)``-row table, one per position."""
    offsets = torch.arange(indices.shape[0], device=indices.device) * num_embeddings
    return (indices + offsets.unsqueeze(1)).flatten()


def embedding_weighted_gradient(
    indices: Tensor, output_grads: Tensor, sample_weights: Tensor, num_embeddings: int
) -> Tensor:
    """``sum_b c_b G_b``, the weighted embedding-table gradient ``(V, E)``.

    Examples
    --------
    >>> import torch
    >>> indices, grads = torch.tensor([[1], [1]]), torch.ones(2, 1, 2)
    >>> embedding_weighted_gradient(indices, grads, torch.tensor([1.0, 3.0]), 2)
    tensor([[0., 0.],
            [4., 4.]])
    """
    weighted = output_grads * sample_weights.reshape(-1, 1, 1)
    return output_grads.new_zeros(num_embeddings, output_grads.shape[2]).index_add_(
        0, indices.flatten(), weighted.flatten(0, 1)
    )
