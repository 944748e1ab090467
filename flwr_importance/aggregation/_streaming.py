"""Sums over a multiset of gradients, read in place, chunk by chunk (FOLB).

FOLB's weights (:mod:`.folb`) need, for every aggregated device, ``||g_k||^2``
and ``<g_k, gS>``, and ``||gS||^2``, where ``gS`` is the weighted mean of a
set of reference gradients. The gradients are never stacked into a K x d
matrix: per chunk, the float64 copy of every device's slice (one small block)
gives that chunk of ``gS`` and, while still in cache, each device's share of
the sums. Each gradient is read from memory once, in its own dtype, and every
sum is accumulated in float64.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
from numpy.typing import ArrayLike, NDArray

#: Entries per chunk of the streamed sums. The float64 block of one chunk
#: (every device's slice of it) is read three times: at K = 100 it stays in a
#: core's L2 cache (1.6 MB), and BLAS takes dot products of this length on one
#: thread (OpenBLAS splits those above 10,000 entries, which only slows down a
#: busy machine). Longer chunks cost less Python per entry.
CHUNK_SIZE = 2048


@dataclass(frozen=True)
class SplitVector:
    """A vector given as the consecutive arrays it is made of, read in place.

    A model's gradient arrives as one array per layer (views of the reply's
    bytes); concatenating them copies every device's gradient into a new
    d-sized vector, and holding K such copies costs more than the maths.

    Attributes
    ----------
    pieces : tuple[NDArray, ...]
        The vector's entries in order: each piece raveled in C order (as
        ``np.ravel`` does), then the pieces one after the other.
    """

    pieces: tuple[NDArray[np.floating], ...]


#: One gradient: a 1-D vector, or the arrays it is made of.
Vector = NDArray[np.floating] | SplitVector


@dataclass(frozen=True)
class Sums:
    """What the scores take from the gradients (eqs. 9-10, 13, 18)."""

    squares: NDArray[np.float64]  # ||g_k||^2
    inner_products: NDArray[np.float64]  # <g_k, gS>
    global_square: float  # ||gS||^2


def streamed_sums(
    gradients: list[list[NDArray[np.floating]]],
    references: list[list[NDArray[np.floating]]],
    reference_counts: NDArray[np.float64],
    size: int,
) -> Sums:
    """``||g_k||^2``, ``<g_k, gS>`` and ``||gS||^2``, one chunk at a time.

    ``gS``, the weighted mean of ``references`` (eqs. 10, 13), is never held
    whole: each chunk of it is complete once the references' slices are
    summed, and its share of the inner products is taken at once. Without
    reference weight (an empty ``S2``) only the squares are summed.
    """
    # The single-set rule estimates gS on the gradients themselves: one block.
    shared = references is gradients
    with_mean = len(references) > 0 and reference_counts.sum() > 0
    rows = gradients if shared or not with_mean else gradients + references
    chunks = Chunks(rows, size)
    squares = np.zeros(len(gradients))
    inner_products = np.zeros(len(gradients))
    global_square = 0.0
    mean_buffer = np.empty(chunks.chunk_size)
    for _, block in chunks:
        gradient_block = block[: len(gradients)]
        squares += _row_dots(gradient_block, gradient_block)
        if not with_mean:
            continue
        reference_block = gradient_block if shared else block[len(gradients) :]
        chunk_mean = mean_buffer[: block.shape[1]]
        np.einsum("k,kb->b", reference_counts, reference_block, out=chunk_mean)
        chunk_mean /= reference_counts.sum()
        global_square += float(chunk_mean @ chunk_mean)
        inner_products += _row_dots(gradient_block, chunk_mean)
    return Sums(squares, inner_products, global_square)


def _row_dots(
    block: NDArray[np.float64], other: NDArray[np.float64]
) -> NDArray[np.float64]:
    """``<block[k], other[k]>`` per row (``other`` 1-D: the same for every row).

    A stack of 1 x b by b x 1 products: NumPy takes each with BLAS's dot, about
    twice as fast as ``einsum`` on a cached block (``np.vecdot`` needs NumPy 2).
    """
    columns = other[:, :, None] if other.ndim == 2 else other[:, None]
    return np.matmul(block[:, None, :], columns).reshape(len(block))


class Chunks:
    """Equal-length vectors, each given as pieces, read as float64 blocks.

    Iterating gives ``(start, block)`` per chunk of entries: ``block[k]`` is
    vector ``k`` on ``start : start + block.shape[1]``, copied (and cast) into
    one reusable buffer of ``len(vectors) x chunk_size`` float64s. Chunks end at
    every piece boundary, so each row comes from one slice of one piece.
    """

    def __init__(
        self, vectors: Sequence[Sequence[NDArray[np.floating]]], size: int
    ) -> None:
        ends = {size}
        for layout in {tuple(piece.size for piece in pieces) for pieces in vectors}:
            ends.update(int(end) for end in np.cumsum(layout))
        # Stretches between piece boundaries (of any vector), cut into chunks.
        segments = [
            (start, stop)
            for start, stop in pairwise([0, *sorted(ends)])
            if stop > start
        ]
        spans = [
            (start, min(start + CHUNK_SIZE, stop))
            for first, stop in segments
            for start in range(first, stop, CHUNK_SIZE)
        ]
        self.chunk_size = max((stop - start for start, stop in spans), default=0)
        # Every vector's slice of every chunk, made once (K views per chunk).
        self._chunks = list(
            zip(
                spans,
                zip(*(_slices(pieces, segments) for pieces in vectors), strict=True),
                strict=True,
            )
        )
        self._buffer = np.empty(len(vectors) * self.chunk_size)

    def __iter__(self) -> Iterator[tuple[int, NDArray[np.float64]]]:
        for (start, stop), slices in self._chunks:
            flat = self._buffer[: len(slices) * (stop - start)]
            np.concatenate(slices, out=flat, casting="same_kind")
            yield start, flat.reshape(len(slices), stop - start)


def _slices(
    pieces: Sequence[NDArray[np.floating]], segments: Sequence[tuple[int, int]]
) -> list[NDArray[np.floating]]:
    """Views of the concatenation of ``pieces``, chunk by chunk of ``segments``.

    No segment straddles two pieces; each is cut into chunks of
    :data:`CHUNK_SIZE` entries (the last one shorter) by one reshape, not a
    slice per chunk (K slices per chunk cost as much as the copy into the block).
    """
    views: list[NDArray[np.floating]] = []
    remaining = iter(pieces)
    piece: NDArray[np.floating] = np.empty(0)
    offset = 0
    for start, stop in segments:
        while start >= offset + piece.size:
            offset += piece.size
            piece = next(remaining)
        segment = piece[start - offset : stop - offset]
        whole = segment.size - segment.size % CHUNK_SIZE
        views.extend(segment[:whole].reshape(-1, CHUNK_SIZE))
        if whole < segment.size:
            views.append(segment[whole:])
    return views


def vector_pieces(vector: Vector, name: str) -> list[NDArray[np.floating]]:
    """The 1-D arrays ``vector`` is made of: itself, or its raveled pieces."""
    if isinstance(vector, SplitVector):
        return [np.ravel(piece) for piece in vector.pieces]
    array = np.asarray(vector)
    if array.ndim != 1:
        raise ValueError(f"{name} must be equal-length 1-D vectors")
    return [array]


def common_size(vectors: Sequence[Sequence[NDArray[np.floating]]], name: str) -> int:
    """The vectors' common length; ``ValueError`` if they differ."""
    sizes = {sum(piece.size for piece in pieces) for pieces in vectors}
    if len(sizes) != 1:
        raise ValueError(f"{name} must be equal-length 1-D vectors")
    return sizes.pop()


def finite_rows(
    squares: NDArray[np.float64], vectors: Sequence[Sequence[NDArray[np.floating]]]
) -> NDArray[np.bool_]:
    """Which vectors hold no NaN or inf, given their squared norms.

    A NaN or inf entry makes the squared norm NaN or inf, and so do finite
    entries too large to square (beyond 1e154): for those the entries decide.
    """
    finite = np.isfinite(squares)
    for index in np.flatnonzero(~finite):
        finite[index] = all(np.isfinite(piece).all() for piece in vectors[int(index)])
    return finite


def device_weights(
    multiplicities: ArrayLike | None, sample_counts: ArrayLike | None, size: int
) -> NDArray[np.float64]:
    """Each device's weight in every sum: times drawn, times ``n_k`` if given."""
    return _per_device("multiplicities", multiplicities, size) * _per_device(
        "sample_counts", sample_counts, size
    )


def _per_device(name: str, values: ArrayLike | None, size: int) -> NDArray[np.float64]:
    """``values`` as finite, nonnegative floats, one per device (ones if None)."""
    if values is None:
        return np.ones(size)
    array = np.asarray(values, dtype=np.float64)
    if array.shape != (size,):
        raise ValueError(f"{size} devices but {name} of shape {array.shape}")
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError(f"{name} must be finite and >= 0")
    return array
