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
from numpy.typing import ArrayLike, NDArray

from flwr_importance.sampling._checks import positive_integer


class CountSketch:
    """CountSketch (signed feature hashing) from ``input_dim`` to ``dim`` dimensions.

    Charikar, Chen, Farach-Colton, "Finding frequent items in data streams",
    ICALP 2002; Weinberger et al., "Feature hashing for large scale multitask
    learning", ICML 2009.  Coordinate ``i`` of a vector is added, with sign
    ``s(i) = +-1``, to bucket ``h(i)`` of the sketch: ``(S x)_b = sum_{h(i)=b}
    s(i) x_i``, a random projection whose matrix has one ``+-1`` per column.
    ``h`` and ``s`` are drawn once, uniformly and independently per
    coordinate, and kept as one integer code per coordinate (``O(input_dim)``
    memory): the same sketch applies to every vector, so sketches of
    different vectors (different clients, different rounds) are comparable.

    Guarantee (Weinberger et al., Lemma 2): for any ``x``, ``y``,
    ``E<S x, S y> = <x, y>`` and

    ``Var<S x, S y> = (||x||^2 ||y||^2 + <x, y>^2 - 2 sum_i x_i^2 y_i^2) / dim``,

    so ``||S x||^2 / ||x||^2`` is unbiased with relative standard deviation
    at most ``sqrt(2 / dim)`` (4.4% at ``dim = 1024``), squared L2 distances
    (norms of differences) likewise, and cosines move by about
    ``1 / sqrt(dim)``.  This is the variance of a dense Gaussian projection
    (``chi2(dim) / dim``) or below it, at ``O(input_dim)`` work per vector
    instead of ``O(input_dim dim)``.  The guarantee is on the variance
    (Chebyshev: ``P(| ||S x||^2 / ||x||^2 - 1 | > t) <= 2 / (dim t^2)``);
    exponential tails need ``||x||_inf`` small against ``||x||_2`` (Weinberger
    et al., Theorem 3), i.e. no few coordinates holding most of the norm.  L1
    distances are not preserved.

    Parameters
    ----------
    input_dim : int
        Dimension ``d`` of the vectors sketched, at least 1.
    dim : int
        Dimension of the sketch, at least 1.
    rng : numpy.random.Generator
        Source of ``h`` and ``s``; ``numpy.random.default_rng(seed)`` gives
        the same sketch for the same seed and dimensions.

    Raises
    ------
    ValueError
        If ``input_dim`` or ``dim`` is not a positive integer.
    """

    def __init__(self, input_dim: int, dim: int, rng: np.random.Generator) -> None:
        self.input_dim = positive_integer("input_dim", input_dim)
        self.dim = positive_integer("dim", dim)
        # One uniform code in [0, 2 dim) per coordinate: bucket `code % dim`,
        # sign + below `dim` and - above, independent and uniform.
        self._codes = rng.integers(0, 2 * self.dim, size=self.input_dim, dtype=np.intp)

    @property
    def nbytes(self) -> int:
        """Bytes held by the hash and sign codes."""
        return self._codes.nbytes

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
        values = np.asarray(vector, dtype=np.float32)
        if values.shape != (self.input_dim,):
            raise ValueError(
                f"vector must have shape ({self.input_dim},), got {values.shape}"
            )
        # Positive and negative terms go to separate halves, subtracted at the
        # end: the sign costs no pass over the d entries and no d-sized copy.
        halves = np.zeros(2 * self.dim, np.float32)
        np.add.at(halves, self._codes, values)
        return self._signed(halves, out)

    def _signed(
        self, halves: NDArray[np.float32], out: NDArray[np.float32] | None
    ) -> NDArray[np.float32]:
        """The positive half minus the negative half, checked to be finite."""
        sketch = np.subtract(halves[: self.dim], halves[self.dim :], out=out)
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
        each pair's difference goes through one buffer of the largest array's
        size and into the sketch in order, so the result equals :meth:`apply`
        of the concatenated difference, bit for bit, with no model-sized
        concatenation per update.

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
        halves = np.zeros(2 * self.dim, np.float32)
        buffer = np.empty(max(sizes, default=0), np.float32)
        offset = 0
        for part, base in zip(parts, start, strict=True):
            size = np.size(part)
            difference = buffer[:size]
            np.subtract(np.ravel(part), np.ravel(base), out=difference)
            np.add.at(halves, self._codes[offset : offset + size], difference)
            offset += size
        return self._signed(halves, out)


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
    instead: this function draws its ``d`` codes again on every call.

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
