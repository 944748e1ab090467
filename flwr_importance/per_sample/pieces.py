"""What a forward pass records of each layer call, and its per-sample contribution.

A *piece* is one call of a layer (or one linear map inside a recurrent or
attention layer): the operands the layer-wise identities of
:mod:`flwr_importance.per_sample.layers` need, plus the gradient edge of the
output whose gradient ``D`` the backward pass returns. A layer called several
times in one forward pass (a weight shared over time steps, a block applied
twice) leaves one piece per call; its pieces are joined along the positions
before any norm is taken, since a sample's gradient is the sum over calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional alias)
from torch import Tensor
from torch.autograd.graph import GradientEdge, get_gradient_edge
from torch.nn.modules.conv import _ConvNd

from flwr_importance.per_sample import layers

#: Maps the gradient of a piece's output to the layout its math expects.
Layout = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class DensePiece:
    """A weight applied at positions: ``Z_b = A_b W[rows]^T + bias[bias_rows]``.

    ``inputs`` is ``A``, ``(B, G, T, fan_in)``; ``layout`` maps the output's
    gradient to ``(B, G, T, fan_out)``. The rows pick one projection out of a
    stacked weight (attention's ``in_proj_weight``).

    ``beside`` holds further ``(weight, bias)`` pairs that add to the same
    output: ``W`` is then ``[W | W_2 | ...]``, applied to ``A``'s features in
    that order, and every bias is added (an LSTM layer's ``W_hh`` on
    ``h_{t-1}`` beside ``W_ih`` on ``x_t``). Their gradients share ``D``, so
    one Gram, one bias sum and one product serve them all.
    """

    weight: Tensor
    bias: Tensor | None
    inputs: Tensor
    output: GradientEdge
    output_shape: tuple[int, ...]
    layout: Layout
    rows: slice = field(default_factory=lambda: slice(None))
    bias_rows: slice = field(default_factory=lambda: slice(None))
    beside: tuple[tuple[Tensor, Tensor | None], ...] = ()

    @property
    def parameters(self) -> tuple[Tensor, ...]:
        """The parameters this piece's gradient reaches."""
        return _present(
            self.weight, self.bias, *(t for pair in self.beside for t in pair)
        )

    def applied(self) -> tuple[list[tuple[Tensor, slice, Tensor]], list[Tensor]]:
        """``(parameter, rows, part applied)`` of every weight, and the biases.

        The biases as parameters (each a ``(parameter, rows, part)`` would be
        redundant: only attention's, which has no ``beside``, takes rows).
        """
        weights = [(self.weight, self.rows, self.weight[self.rows])]
        weights += [(weight, slice(None), weight) for weight, _ in self.beside]
        biases = [bias for _, bias in self.beside if bias is not None]
        return weights, biases


@dataclass(frozen=True)
class ConvPiece:
    """A call of a convolution on ``inputs`` (padded as ``padding`` says)."""

    conv: _ConvNd
    inputs: Tensor
    padding: tuple[int, ...]
    output: GradientEdge
    output_shape: tuple[int, ...]

    @property
    def parameters(self) -> tuple[Tensor, ...]:
        """The parameters this piece's gradient reaches."""
        return _present(self.conv.weight, self.conv.bias)

    def patches(self) -> DensePiece:
        """The same call as a dense piece over its input patches."""
        groups = self.conv.groups
        batch_size = self.inputs.shape[0]
        return DensePiece(
            weight=self.conv.weight,
            bias=self.conv.bias,
            inputs=layers.conv_patches(
                self.inputs,
                kernel_size=self.conv.kernel_size,
                stride=self.conv.stride,
                padding=self.padding,
                dilation=self.conv.dilation,
                groups=groups,
            ),
            output=self.output,
            output_shape=self.output_shape,
            layout=lambda grad: grad.reshape(
                batch_size, groups, grad.shape[1] // groups, -1
            ).transpose(2, 3),
        )


@dataclass(frozen=True)
class AffinePiece:
    """A per-feature scale and shift of ``normalized`` (``(B, T, C)``)."""

    weight: Tensor | None
    bias: Tensor | None
    normalized: Tensor
    output: GradientEdge
    output_shape: tuple[int, ...]
    layout: Layout

    @property
    def parameters(self) -> tuple[Tensor, ...]:
        """The parameters this piece's gradient reaches."""
        return _present(self.weight, self.bias)


@dataclass(frozen=True)
class EmbeddingPiece:
    """Rows ``indices`` (``(B, T)``) of ``weight`` looked up."""

    weight: Tensor
    indices: Tensor
    padding_idx: int | None
    output: GradientEdge
    output_shape: tuple[int, ...]
    layout: Layout

    @property
    def parameters(self) -> tuple[Tensor, ...]:
        """The parameters this piece's gradient reaches."""
        return (self.weight,)


Piece = DensePiece | ConvPiece | AffinePiece | EmbeddingPiece


def _present(*tensors: Tensor | None) -> tuple[Tensor, ...]:
    return tuple(tensor for tensor in tensors if tensor is not None)


class Recorder:
    """Collects the pieces of one forward pass, and why it cannot be served.

    Saved tensors are detached views of the model's own; :meth:`check_unchanged`
    tells whether the forward pass modified one of them in place afterwards.
    """

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.pieces: list[Piece] = []
        self.problems: list[str] = []
        self._versions: list[tuple[Tensor, int]] = []

    def saved(self, tensor: Tensor) -> Tensor:
        """``tensor`` detached, remembered to check it is not changed in place."""
        self._versions.append((tensor, tensor._version))
        return tensor.detach()

    def batched(self, tensor: Tensor, what: str) -> bool:
        """Whether ``tensor``'s first dimension is the batch; else note a problem."""
        if tensor.dim() >= 2 and tensor.shape[0] == self.batch_size:
            return True
        self.problems.append(
            f"{what} got a tensor of shape {tuple(tensor.shape)}, not batch-first"
        )
        return False

    def check_unchanged(self) -> None:
        """Note a problem if a saved tensor was modified in place."""
        if any(tensor._version != version for tensor, version in self._versions):
            self.problems.append("a layer input was modified in place")


def edge_of(output: Tensor) -> tuple[GradientEdge, tuple[int, ...]]:
    """The gradient edge of ``output`` now (before any in-place op), and its shape."""
    return get_gradient_edge(output), tuple(output.shape)


@dataclass
class Contribution:
    """What the pieces of one parameter set add to the per-sample quantities."""

    squared_norms: Tensor
    #: ``<grad_b, parameters>``, needed for the L2 regularizer (None if unused).
    inner_with_parameters: Tensor | None
    #: Weighted gradient per parameter: ``(parameter, rows, gradient)``, each
    #: gradient a tensor of its own (the caller may add to it in place).
    gradients: list[tuple[Tensor, slice, Tensor]]


def joined(tensors: Sequence[Tensor], dim: int) -> Tensor:
    """The tensors of a layer's calls concatenated along positions (no copy for one)."""
    return tensors[0] if len(tensors) == 1 else torch.cat(list(tensors), dim=dim)


def joined_grads(
    pieces: Sequence[DensePiece | AffinePiece | EmbeddingPiece],
    output_grads: Sequence[Tensor],
    dim: int,
) -> Tensor:
    """The output gradients of a layer's calls, each in its layout, joined."""
    return joined(
        [piece.layout(grad) for piece, grad in zip(pieces, output_grads, strict=True)],
        dim=dim,
    )


def dense_contribution(
    pieces: Sequence[DensePiece],
    output_grads: Sequence[Tensor],
    sample_weights: Tensor | None,
    with_inner: bool,
) -> Contribution:
    """The calls of one dense weight (and those beside it), joined by position."""
    first = pieces[0]
    inputs = joined([piece.inputs for piece in pieces], dim=2)
    grads = joined_grads(pieces, output_grads, dim=2)
    weights, beside_biases = first.applied()
    bias = None if first.bias is None else first.bias[first.bias_rows]
    squared, weight_gradient = layers.dense_norms_and_gradient(
        inputs, grads, sample_weights
    )
    bias_grads = None
    biases = ([] if bias is None else [bias]) + beside_biases
    if biases:
        # Every bias of the piece gets the same per-sample gradient.
        bias_grads = layers.summed_bias_grads(grads)
        squared = squared + len(biases) * layers.row_squared_norms(bias_grads)
    inner = None
    if with_inner:
        # <D_b^T A_b, W> + <sum_t D_bt, bias> = <D_b, A_b W^T + bias>.
        weight = joined([part for _, _, part in weights], dim=1)
        group_weight = weight.reshape(inputs.shape[1], grads.shape[3], -1)
        outputs = inputs @ group_weight.transpose(1, 2).unsqueeze(0)
        for each in biases:
            outputs = outputs + each.reshape(1, inputs.shape[1], 1, -1)
        inner = (grads * outputs).flatten(start_dim=1).sum(dim=1)
    gradients = []
    if weight_gradient is not None:
        if len(weights) == 1:
            parameter, rows, part = weights[0]
            gradients.append((parameter, rows, weight_gradient.reshape(part.shape)))
        else:
            widths = [part.shape[1] for _, _, part in weights]
            blocks = weight_gradient.reshape(grads.shape[3], -1).split(widths, dim=1)
            gradients += [
                (parameter, rows, block)
                for (parameter, rows, _), block in zip(weights, blocks, strict=True)
            ]
    if sample_weights is not None and bias_grads is not None:
        bias_gradient = sample_weights @ bias_grads.flatten(start_dim=1)
        if first.bias is not None and bias is not None:
            gradients.append(
                (first.bias, first.bias_rows, bias_gradient.reshape(bias.shape))
            )
        # A tensor of its own for each bias: the caller adds to them in place.
        gradients += [
            (each, slice(None), bias_gradient.reshape(each.shape).clone())
            for each in beside_biases
        ]
    return Contribution(squared, inner, gradients)


def conv_contribution(
    pieces: Sequence[ConvPiece],
    output_grads: Sequence[Tensor],
    sample_weights: Tensor | None,
    with_inner: bool,
) -> Contribution:
    """The calls of one convolution: Gram form over patches, or materialized.

    Materialized per-sample kernels, and the weighted gradient, come from the
    convolution's own backward kernel
    (:func:`~flwr_importance.per_sample.layers.conv_weight_grads`), which beats
    building the input patches wherever the Gram form does not pay.
    """
    conv = pieces[0].conv
    positions = sum(math.prod(piece.output_shape[2:]) for piece in pieces)
    fan_in = conv.weight[0].numel()
    out_per_group = conv.out_channels // conv.groups

    def weight_grads(weights: Tensor | None) -> Tensor:
        """Per-sample kernels (no weights), or their weighted sum."""
        total = sum(
            layers.conv_weight_grads(
                piece.inputs,
                grad if weights is None else grad * weights.reshape(shape),
                tuple(conv.weight.shape),
                stride=conv.stride,
                padding=piece.padding,
                dilation=conv.dilation,
                groups=conv.groups,
                per_sample=weights is None,
            )
            for piece, grad in zip(pieces, output_grads, strict=True)
            for shape in [(-1,) + (1,) * (grad.dim() - 1)]
        )
        assert isinstance(total, Tensor)
        return total

    bias_grads = None
    if conv.bias is not None:
        bias_grads = torch.stack(
            [grad.flatten(start_dim=2).sum(dim=2) for grad in output_grads]
        ).sum(dim=0)
    if not layers.dense_uses_gram(positions, fan_in, out_per_group):
        sample_grads = [(conv.weight, weight_grads(None).flatten(start_dim=1))]
        if conv.bias is not None and bias_grads is not None:
            sample_grads.append((conv.bias, bias_grads))
        return materialized_contribution(sample_grads, sample_weights, with_inner)
    # Norms from the patches' Gram form; the weighted gradient from the
    # convolution's own kernel (contracting the patches over samples and
    # positions would copy them).
    part = dense_contribution(
        [piece.patches() for piece in pieces], output_grads, None, with_inner
    )
    if sample_weights is not None:
        part.gradients.append((conv.weight, slice(None), weight_grads(sample_weights)))
        if conv.bias is not None and bias_grads is not None:
            part.gradients.append((conv.bias, slice(None), sample_weights @ bias_grads))
    return part


def materialized_contribution(
    sample_grads: Sequence[tuple[Tensor, Tensor]],
    sample_weights: Tensor | None,
    with_inner: bool,
) -> Contribution:
    """What parameters with ``(B, numel)`` per-sample gradients at hand add."""
    first = sample_grads[0][1]
    squared = first.new_zeros(first.shape[0])
    inner = first.new_zeros(first.shape[0]) if with_inner else None
    gradients = []
    for parameter, per_sample in sample_grads:
        squared = squared + layers.row_squared_norms(per_sample)
        if inner is not None:
            inner = inner + per_sample @ parameter.reshape(-1)
        if sample_weights is not None:
            gradients.append(
                (
                    parameter,
                    slice(None),
                    (sample_weights @ per_sample).view_as(parameter),
                )
            )
    return Contribution(squared, inner, gradients)


def affine_contribution(
    pieces: Sequence[AffinePiece],
    output_grads: Sequence[Tensor],
    sample_weights: Tensor | None,
    with_inner: bool,
) -> Contribution:
    """The calls of one normalization layer's scale and shift."""
    first = pieces[0]
    normalized = joined([piece.normalized for piece in pieces], dim=1)
    grads = joined_grads(pieces, output_grads, dim=1)
    sample_grads = []
    if first.weight is not None:
        sample_grads.append(
            (first.weight, layers.affine_sample_grads(normalized, grads))
        )
    if first.bias is not None:
        sample_grads.append((first.bias, grads.sum(dim=1)))
    return materialized_contribution(sample_grads, sample_weights, with_inner)


def embedding_contribution(
    pieces: Sequence[EmbeddingPiece],
    output_grads: Sequence[Tensor],
    sample_weights: Tensor | None,
    with_inner: bool,
) -> Contribution:
    """The calls of one embedding table."""
    first = pieces[0]
    indices = joined([piece.indices for piece in pieces], dim=1)
    grads = joined_grads(pieces, output_grads, dim=1)
    if first.padding_idx is not None:
        # The padding row gets no gradient.
        grads = grads * (indices != first.padding_idx).unsqueeze(2).to(grads)
    num_embeddings = first.weight.shape[0]
    squared = layers.embedding_squared_norms(indices, grads, num_embeddings)
    inner = None
    if with_inner:
        inner = (grads * F.embedding(indices, first.weight)).sum(dim=(1, 2))
    gradients = []
    if sample_weights is not None:
        gradient = layers.embedding_weighted_gradient(
            indices, grads, sample_weights, num_embeddings
        )
        gradients.append((first.weight, slice(None), gradient))
    return Contribution(squared, inner, gradients)


def edge_key(edge: GradientEdge) -> tuple[int, int]:
    """Identifies the output a gradient edge points at."""
    return id(edge.node), edge.output_nr


def piece_key(piece: Piece) -> tuple[int, object]:
    """Pieces with one key belong to the same parameters and are joined."""
    rows = piece.rows if isinstance(piece, DensePiece) else slice(None)
    return id(piece.parameters[0]), (rows.start, rows.stop)


def contribution(
    pieces: Sequence[Piece],
    output_grads: Sequence[Tensor],
    sample_weights: Tensor | None,
    with_inner: bool,
) -> Contribution:
    """Dispatch the pieces of one key (all of one type) to their math."""
    math = _CONTRIBUTIONS[type(pieces[0])]
    return math(pieces, output_grads, sample_weights, with_inner)


#: The math of each piece type, by the type (a key's pieces share one).
_CONTRIBUTIONS: dict[type, Callable[..., Contribution]] = {
    DensePiece: dense_contribution,
    ConvPiece: conv_contribution,
    AffinePiece: affine_contribution,
    EmbeddingPiece: embedding_contribution,
}
