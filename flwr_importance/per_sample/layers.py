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

import torch
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


def dense_squared_norms(inputs: Tensor, output_grads: Tensor) -> Tensor:
    """``||D_b^T A_b||^2`` for every sample ``b``, summed over groups.

    Parameters
    ----------
    inputs : torch.Tensor
        ``A``, shaped ``(B, G, T, fan_in)``: ``G`` independent weight blocks
        (a grouped convolution's groups; 1 otherwise), each applied at ``T``
        positions.
    output_grads : torch.Tensor
        ``D``, shaped ``(B, G, T, fan_out)``.

    Returns
    -------
    torch.Tensor
        Shape ``(B,)``.

    Examples
    --------
    >>> import torch
    >>> a, d = torch.randn(3, 1, 5, 4), torch.randn(3, 1, 5, 2)
    >>> direct = (d.transpose(2, 3) @ a).pow(2).sum((1, 2, 3))
    >>> torch.allclose(dense_squared_norms(a, d), direct)
    True
    """
    positions, fan_in, fan_out = inputs.shape[2], inputs.shape[3], output_grads.shape[3]
    if positions == 1:
        return (
            (inputs.square().sum(dim=3) * output_grads.square().sum(dim=3))
            .flatten(start_dim=1)
            .sum(dim=1)
        )
    if dense_uses_gram(positions, fan_in, fan_out):
        input_gram = inputs @ inputs.transpose(2, 3)
        grad_gram = output_grads @ output_grads.transpose(2, 3)
        return (input_gram * grad_gram).flatten(start_dim=1).sum(dim=1)
    return row_squared_norms(output_grads.transpose(2, 3) @ inputs)


def dense_weighted_gradient(
    inputs: Tensor, output_grads: Tensor, sample_weights: Tensor
) -> Tensor:
    """``sum_b c_b D_b^T A_b``, shaped ``(G, fan_out, fan_in)``.

    Examples
    --------
    >>> import torch
    >>> a, d = torch.ones(2, 1, 3, 1), torch.ones(2, 1, 3, 1)
    >>> dense_weighted_gradient(a, d, torch.tensor([1.0, 0.5]))
    tensor([[[4.5000]]])
    """
    weighted = output_grads * sample_weights.reshape(-1, 1, 1, 1)
    return torch.einsum("bgto,bgti->goi", weighted, inputs)


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
