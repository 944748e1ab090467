"""CountSketch: compressed representative gradients for clustered sampling.

Algorithm 2 of clustered sampling (Fraboni et al., ICML 2021) only needs the
distances between the clients' representative gradients; a sketch of each
(:class:`CountSketch`, or :func:`project_gradients`, its one-shot form) keeps
their inner products and L2 distances in expectation in ``dim`` floats per
client instead of the model's ``d``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import ArrayLike, NDArray

from flwr_importance.validation import check_count

__all__ = [
    "CountSketch",
    "project_gradients",
]


class CountSketch:
    """CountSketch (signed feature hashing) from ``input_dim`` to ``dim`` dimensions.

    Charikar, Chen, Farach-Colton, "Finding frequent items in data streams",
    ICALP 2002; Weinberger et al., "Feature hashing for large scale multitask
    learning", ICML 2009.  Coordinate ``i`` of a vector is added, with sign
    ``s(i) = +-1``, to bucket ``h(i)`` of the sketch: ``(S x)_b = sum_{h(i)=b}
    s(i) x_i``, a random projection whose matrix has one ``+-1`` per column.
    The same sketch applies to every vector, so sketches of different vectors
    (different clients, different rounds) are comparable.

    **Decision:** the hash is blocked.  The coordinates are cut into blocks of
    ``dim`` consecutive ones, and block ``j`` is rotated by its own shift:
    ``h(i) = (i + r_j) mod dim`` for ``i`` in block ``j``, with the shifts
    ``r_j`` uniform on ``0..dim-1`` and the signs ``s(i)``, one per
    coordinate, uniform, all independent.  Two coordinates of one block never
    share a bucket; two of different blocks share one with probability
    ``1 / dim``, as under a fully random hash.  The sketch is then a sum of
    rotated blocks, taken with whole-block copies and one sum of products
    over about ``input_dim`` entries, where scattering single entries
    (``np.add.at``) took most of Algorithm 2's server time at 10,000 nodes
    (``benchmarks.server_overhead``).

    Guarantee (Weinberger et al., Lemma 2, whose proof only uses the signs'
    independence and the probability that two coordinates collide): for any
    ``x``, ``y``, ``E<S x, S y> = <x, y>`` and

    ``Var<S x, S y> = sum_{i < k, different blocks} (x_i y_k + x_k y_i)^2 / dim``,

    the fully random hash's variance,
    ``(||x||^2 ||y||^2 + <x, y>^2 - 2 sum_i x_i^2 y_i^2) / dim``, less the
    pairs within a block.  So ``||S x||^2 / ||x||^2`` is unbiased with
    relative standard deviation at most ``sqrt(2 / dim)`` (4.4% at
    ``dim = 1024``), squared L2 distances (norms of differences) likewise,
    and cosines move by about ``1 / sqrt(dim)``: the variance of a dense
    Gaussian projection (``chi2(dim) / dim``) or below it, at
    ``O(input_dim)`` work per vector.  The guarantee is on the variance
    (Chebyshev: ``P(| ||S x||^2 / ||x||^2 - 1 | > t) <= 2 / (dim t^2)``);
    the blocks' rotations make the collisions of a block's coordinates
    depend on each other, so no exponential tail is claimed.  L1 distances
    are not preserved.

    Memory: the signs, and two scratch arrays the vectors go through, of
    about ``input_dim`` float32 each (12 bytes per coordinate): one sketch
    is not for use from several threads at once.

    Parameters
    ----------
    input_dim : int
        Dimension ``d`` of the vectors sketched, at least 1.
    dim : int
        Dimension of the sketch, at least 1.
    rng : numpy.random.Generator
        Source of the shifts and signs; ``numpy.random.default_rng(seed)``
        gives the same sketch for the same seed and dimensions.

    Raises
    ------
    ValueError
        If ``input_dim`` or ``dim`` is not a positive integer.
    """

    def __init__(self, input_dim: int, dim: int, rng: np.random.Generator) -> None:
        self.input_dim = check_count("input_dim", input_dim)
        self.dim = check_count("dim", dim)
        blocks = -(-self.input_dim // self.dim)
        shifts = rng.integers(0, self.dim, size=blocks)
        signs = 2 * rng.integers(0, 2, size=(blocks, self.dim)).astype(np.float32) - 1
        # The vector's blocks, padded with zeros to whole blocks.
        self._blocks = np.zeros((blocks, self.dim), np.float32)
        # Block j is copied to `dim * rank_j + r_j` of a layout read as rows of
        # `dim`: its entries land in the columns (i + r_j) mod dim, and in
        # increasing order of shift the blocks never overlap.  Summing the
        # layout's rows, signed, gives the sketch; the gaps between blocks
        # stay zero.
        rank = np.empty(blocks, np.intp)
        rank[np.argsort(shifts, kind="stable")] = np.arange(blocks)
        self._starts = self.dim * rank + shifts
        self._layout = np.zeros((blocks + 1, self.dim), np.float32)
        self._layout_windows = self._windows(self._layout)
        self._signs = np.zeros_like(self._layout)
        self._windows(self._signs)[self._starts] = signs

    def _windows(self, layout: NDArray[np.float32]) -> NDArray[np.float32]:
        """Every ``dim``-long window of ``layout``, by starting entry (a view)."""
        return sliding_window_view(layout.reshape(-1), self.dim, writeable=True)

    @property
    def nbytes(self) -> int:
        """Bytes held by the shifts, the signs and the scratch arrays."""
        return (
            self._starts.nbytes
            + self._signs.nbytes
            + self._layout.nbytes
            + self._blocks.nbytes
        )

    def apply(
        self, vector: ArrayLike, out: NDArray[np.float32] | None = None
    ) -> NDArray[np.float32]:
        """Sketch one vector: ``S x``.

        Parameters
        ----------
        vector : ArrayLike
            Vector of shape ``(input_dim,)``; summed in float32.
        out : NDArray[np.float32] or None
            Array of shape ``(dim,)`` to write the sketch into.

        Returns
        -------
        NDArray[np.float32]
            The sketch, shape ``(dim,)`` (``out`` when given).

        Raises
        ------
        ValueError
            If ``vector`` has the wrong shape, or its entries are NaN,
            infinite, or too large to sum in float32.
        """
        values = np.asarray(vector)
        if values.shape != (self.input_dim,):
            raise ValueError(
                f"vector must have shape ({self.input_dim},), got {values.shape}"
            )
        self._blocks.reshape(-1)[: self.input_dim] = values
        return self._sketch_blocks(out)

    def _sketch_blocks(self, out: NDArray[np.float32] | None) -> NDArray[np.float32]:
        """The sketch of the vector in the blocks, checked to be finite."""
        self._layout_windows[self._starts] = self._blocks
        sketch = np.einsum("rc,rc->c", self._layout, self._signs, out=out)
        # A NaN or infinite entry, or a float32 overflow, leaves a non-finite
        # bucket: checking the dim buckets checks the d entries.
        if not np.all(np.isfinite(sketch)):
            raise ValueError(
                "vector contains NaN or infinite values, or values too large "
                "to sum in float32"
            )
        return sketch

    def apply_difference(
        self,
        parts: Sequence[NDArray[np.floating]],
        start: Sequence[NDArray[np.floating]],
        out: NDArray[np.float32] | None = None,
    ) -> NDArray[np.float32]:
        """Sketch ``x - y`` given as arrays, without building either vector.

        ``parts`` and ``start`` are two models' arrays, pair by pair of the
        same size (a returned model and the global model it started from);
        each pair's difference is written straight into the sketch's blocks,
        so the result equals :meth:`apply` of the concatenated difference,
        bit for bit, with no model-sized concatenation per update.

        Parameters
        ----------
        parts, start : Sequence[NDArray]
            Arrays whose flattened concatenations have ``input_dim`` entries.
        out : NDArray[np.float32] or None
            Array of shape ``(dim,)`` to write the sketch into.

        Returns
        -------
        NDArray[np.float32]
            The sketch of the difference, shape ``(dim,)``.

        Raises
        ------
        ValueError
            As :meth:`apply`, or if the arrays' sizes do not pair up to
            ``input_dim`` entries.

        Examples
        --------
        >>> sketch = CountSketch(4, 2, np.random.default_rng(0))
        >>> x, y = np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.5, 0.0, 1.0, 1.0])
        >>> whole = sketch.apply(x - y)
        >>> parts = sketch.apply_difference([x[:1], x[1:]], [y[:1], y[1:]])
        >>> bool(np.array_equal(whole, parts))
        True
        """
        sizes = [np.size(part) for part in parts]
        if sizes != [np.size(part) for part in start] or sum(sizes) != self.input_dim:
            raise ValueError(
                f"the arrays must pair up to input_dim = {self.input_dim} entries, "
                f"got sizes {sizes} and {[np.size(part) for part in start]}"
            )
        entries = self._blocks.reshape(-1)
        offset = 0
        for part, base in zip(parts, start, strict=True):
            size = np.size(part)
            np.subtract(
                np.ravel(part), np.ravel(base), out=entries[offset : offset + size]
            )
            offset += size
        return self._sketch_blocks(out)


def project_gradients(grads: ArrayLike, dim: int, seed: int) -> NDArray[np.float32]:
    """CountSketch of gradients to ``dim`` dimensions (see :class:`CountSketch`).

    Algorithm 2 only needs distances between representative gradients; keeping
    a ``dim``-dimensional sketch per client instead of the full update bounds
    the server's memory at ``N * dim`` floats.  The sketch is drawn from
    ``numpy.random.default_rng(seed)`` for the gradients' dimension ``d``, so
    the same seed always gives the same projection (gradients sketched in
    different rounds stay comparable).  Squared norms and squared L2 distances
    are unbiased with relative standard deviation at most ``sqrt(2 / dim)``
    (4.4% at ``dim = 1024``), cosines move by about ``1 / sqrt(dim)``.  A
    caller sketching many batches should keep one :class:`CountSketch`
    instead: this function draws its ``d`` signs again on every call.

    Parameters
    ----------
    grads : ArrayLike
        One gradient of shape ``(d,)`` or a batch of shape ``(N, d)``.
    dim : int
        Target dimension, at least 1.
    seed : int
        Seed of the projection; use the same one for every round of a run.

    Returns
    -------
    NDArray[np.float32]
        Projected gradients, shape ``(dim,)`` or ``(N, dim)``.

    Raises
    ------
    ValueError
        If ``grads`` is not a finite 1-D or 2-D array or ``dim`` < 1.

    Examples
    --------
    >>> sketch = project_gradients(np.ones((3, 1000)), 16, seed=0)
    >>> sketch.shape, sketch.dtype
    ((3, 16), dtype('float32'))
    >>> bool(np.array_equal(sketch[0], project_gradients(np.ones(1000), 16, seed=0)))
    True
    """
    vectors = np.asarray(grads, dtype=np.float32)
    if vectors.ndim not in (1, 2):
        raise ValueError(f"grads must be 1-D or 2-D, got shape {vectors.shape}")
    batch = np.atleast_2d(vectors)
    sketch = CountSketch(batch.shape[1], dim, np.random.default_rng(seed))
    projected = np.zeros((batch.shape[0], sketch.dim), np.float32)
    for vector, row in zip(batch, projected, strict=True):
        sketch.apply(vector, out=row)
    return projected if vectors.ndim == 2 else projected[0]
