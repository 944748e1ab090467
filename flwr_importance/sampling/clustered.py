"""Clustered sampling of clients (Fraboni et al., ICML 2021).

Clustered sampling replaces the ``m`` i.i.d. draws of MD sampling by one draw
from each of ``m`` distributions ``W_1..W_m`` over the clients.  A distribution
matrix ``r`` of shape ``(m, N)`` is valid (the paper's Proposition 1) when

- every row sums to one: ``sum_i r[k, i] = 1``, and
- every client keeps its MD share: ``sum_k r[k, i] = m n_i / M_tot``;

then averaging the ``m`` drawn models is unbiased, and the variance of every
client's aggregation weight is at most MD sampling's.

Both algorithms work in integer *units* (paper, Appendix C): client ``i`` owns
``m n_i`` units, each distribution holds exactly ``M_tot = sum_i n_i`` units,
and ``r = units / M_tot``.  The integer arithmetic makes both properties hold
exactly before the final division.

- :func:`clustered_distributions_by_size` is Algorithm 1 (by sample size).
- :func:`clustered_distributions_by_similarity` is Algorithm 2 (by similarity
  of the clients' representative gradients, Ward hierarchical clustering).
- :func:`sample_from_distributions` draws one client from each distribution.
- :class:`CountSketch` (and :func:`project_gradients`, its one-shot form)
  compresses representative gradients for Algorithm 2, keeping their inner
  products and L2 distances in expectation.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_importance.sampling._checks import (
    distinct_indices,
    nonnegative_matrix,
    nonnegative_vector,
    probability_array,
    sample_count,
)

# scipy is imported inside the functions that cluster or take L1 distances, not
# here: it costs 0.25 s, half again the import of Flower's own strategies, and
# every strategy module imports this one (most never cluster).

Distance = Literal["arccos", "l2", "l1"]
DISTANCES: tuple[Distance, ...] = get_args(Distance)

# Units are compared with float linkage heights and divided into floats: below
# 2**53 every unit count is an exact float64.
_MAX_EXACT_UNITS = 2**53

# A row of a distribution matrix may miss 1 by float rounding, not by more.
_ROW_SUM_TOLERANCE = 1e-9

# Relative gap allowed between ``distances[i, j]`` and ``distances[j, i]``.
_SYMMETRY_RTOL = 1e-9

# Side of the square tiles the symmetry check compares: a 256 x 256 float64
# tile and its mirror (1 MB in all) stay in cache while both are read.
_SYMMETRY_TILE = 256

# Bytes of float64 copy `cross_distances` makes at a time for L1 distances.
_L1_BLOCK_BYTES = 64 * 2**20


def clustered_distributions_by_size(sizes: ArrayLike, m: int) -> NDArray[np.float64]:
    """Algorithm 1: ``m`` sampling distributions built from the clients' sizes.

    Clients are taken by decreasing sample size and their ``m n_i`` units are
    poured into the distributions one after the other, each distribution
    holding ``M_tot`` units, so that clients of similar size share a
    distribution and a client spans at most two of them (beyond those it fills
    alone).

    Parameters
    ----------
    sizes : ArrayLike
        Sample count ``n_i >= 0`` of each of the ``N`` clients (integers, not
        all zero).
    m : int
        Number of clients drawn per round, ``1 <= m <= N``.

    Returns
    -------
    NDArray[np.float64]
        Distribution matrix ``r`` of shape ``(m, N)``: rows sum to one, column
        ``i`` sums to ``m n_i / M_tot``.  A client with ``m n_i >= M_tot`` owns
        ``floor(m n_i / M_tot)`` rows outright (drawn with probability one).

    Raises
    ------
    ValueError
        If ``sizes`` is not a vector of non-negative integers with a positive
        sum, or ``m`` is not an integer in ``[1, N]``.

    Examples
    --------
    Client 2 holds half the data, so it owns one distribution; clients 0 and 1
    share the other. Column ``i`` sums to ``m n_i / M_tot``:

    >>> r = clustered_distributions_by_size([10, 10, 20], 2)
    >>> r.tolist()
    [[0.0, 0.0, 1.0], [0.5, 0.5, 0.0]]
    >>> r.sum(axis=0).tolist()
    [0.5, 0.5, 1.0]
    """
    units, total, m = _checked_units(sizes, m)
    table, open_rows, residual = _dedicate_heavy_clients(units, total, m)
    order = _by_decreasing_units(np.flatnonzero(residual), residual)
    seed_levels = np.zeros(open_rows.size, np.int64)
    _fill_greedily(table, open_rows, seed_levels, order, residual[order], total)
    return table / total


def clustered_distributions_by_similarity(
    sizes: ArrayLike,
    representative_grads: ArrayLike,
    m: int,
    distance: Distance = "arccos",
) -> NDArray[np.float64]:
    """Algorithm 2: ``m`` sampling distributions grouping similar clients.

    Similar clients share a distribution, so one draw per distribution spreads
    the round over dissimilar clients (in the paper's MNIST example with one
    digit per client, every round sees every digit once the tree has found the
    digits).  Steps:

    1. clients with ``m n_i >= M_tot`` first get ``floor(m n_i / M_tot)``
       distributions of their own, as the paper prescribes (end of Section 5);
       the rest of their units, below ``M_tot``, go through the steps below;
    2. Ward hierarchical clustering of the pairwise distances between the
       representative gradients of the clients with units left;
    3. the tree is cut into its largest subtrees holding at most ``M_tot``
       units each, ``K`` groups (``K >= m`` since the units total
       ``m M_tot``);
    4. the heaviest groups seed the open distributions, one each; the clients
       of the other groups, group by group in decreasing weight, fill the room
       left, exactly as in Algorithm 1.

    Parameters
    ----------
    sizes : ArrayLike
        As in :func:`clustered_distributions_by_size`.
    representative_grads : ArrayLike
        Array of shape ``(N, d)``: row ``i`` is client ``i``'s last update
        (returned model minus the global model it started from), zeros for a
        client never sampled.  float32 input is kept float32 for the Gram
        matrix (half the memory of float64, cosines to about 1e-7).
    m : int
        As in :func:`clustered_distributions_by_size`.
    distance : {"arccos", "l2", "l1"}
        Dissimilarity between two gradients: angle between them (default, as
        in the paper's experiments), Euclidean or Manhattan distance.  Zero
        gradients are at angle 0 from each other and at angle pi/2 (orthogonal)
        from every non-zero gradient, so clients never sampled are grouped
        together, as the paper intends, and no NaN arises.

    Returns
    -------
    NDArray[np.float64]
        Distribution matrix ``r`` of shape ``(m, N)`` with the same exact
        properties as :func:`clustered_distributions_by_size`.

    Raises
    ------
    ValueError
        On invalid ``sizes`` or ``m`` (as for Algorithm 1), gradients that are
        not a finite ``(N, d)`` array (for ``arccos`` and ``l2``, also finite
        ones whose squared norms overflow), or an unknown ``distance``.

    Examples
    --------
    Clients 0 and 2 point one way, 1 and 3 the other: each pair shares a
    distribution, so a round draws one client of each direction.

    >>> grads = [[1.0, 0.0], [0.0, 1.0], [1.0, 0.1], [0.1, 1.0]]
    >>> clustered_distributions_by_similarity([1, 1, 1, 1], grads, 2).tolist()
    [[0.5, 0.0, 0.5, 0.0], [0.0, 0.5, 0.0, 0.5]]
    """
    units, total, m = _checked_units(sizes, m)
    grads = _checked_gradients(representative_grads, units.size)
    distances = _distance_matrix(grads, _checked_distance_name(distance))
    return _allocate_by_similarity(units, total, m, distances)


def clustered_distributions_from_distances(
    sizes: ArrayLike, distances: ArrayLike, m: int
) -> NDArray[np.float64]:
    """Algorithm 2 from a precomputed client distance matrix.

    The same as :func:`clustered_distributions_by_similarity` after the
    distances: a strategy can keep the ``(N, N)`` matrix between rounds and
    update only the rows of the clients that returned a new gradient (the
    paper's ``O(N m d)`` per round) instead of recomputing all of it.

    Parameters
    ----------
    sizes, m
        As in :func:`clustered_distributions_by_size`.
    distances : ArrayLike
        Symmetric ``(N, N)`` matrix of non-negative dissimilarities, e.g. from
        :func:`pairwise_distances`; the diagonal is ignored.

    Returns
    -------
    NDArray[np.float64]
        The matrix :func:`clustered_distributions_by_similarity` gives for
        gradients at these distances.

    Raises
    ------
    ValueError
        On invalid ``sizes`` or ``m`` (as for Algorithm 1), or if
        ``distances`` is not a finite, non-negative, symmetric ``(N, N)``
        matrix.

    Examples
    --------
    >>> grads = [[1.0, 0.0], [0.0, 1.0], [1.0, 0.1], [0.1, 1.0]]
    >>> distances = pairwise_distances(grads)
    >>> clustered_distributions_from_distances([1, 1, 1, 1], distances, 2).tolist()
    [[0.5, 0.0, 0.5, 0.0], [0.0, 0.5, 0.0, 0.5]]
    """
    units, total, m = _checked_units(sizes, m)
    matrix = nonnegative_matrix("distances", distances)
    if matrix.shape != (units.size, units.size):
        raise ValueError(
            f"distances must have shape ({units.size}, {units.size}), "
            f"got {matrix.shape}"
        )
    if not _is_symmetric(matrix):
        raise ValueError("distances must be symmetric")
    return _allocate_by_similarity(units, total, m, matrix)


def pairwise_distances(
    representative_grads: ArrayLike, distance: Distance = "arccos"
) -> NDArray[np.float64]:
    """Distances between all pairs of representative gradients, loop-free.

    Parameters
    ----------
    representative_grads : ArrayLike
        Array of shape ``(N, d)``, one gradient per row (see
        :func:`clustered_distributions_by_similarity`).
    distance : {"arccos", "l2", "l1"}
        Dissimilarity, as in :func:`clustered_distributions_by_similarity`
        (zero gradients included).

    Returns
    -------
    NDArray[np.float64]
        Symmetric ``(N, N)`` matrix of distances.

    Raises
    ------
    ValueError
        If the gradients are not a finite 2-D array (for ``arccos`` and
        ``l2``, also finite ones whose squared norms overflow) or ``distance``
        is unknown.

    Examples
    --------
    A zero gradient is orthogonal (angle pi/2) to every other gradient:

    >>> np.round(pairwise_distances([[1, 0], [0, 1], [0, 0]]), 4).tolist()
    [[0.0, 1.5708, 1.5708], [1.5708, 0.0, 1.5708], [1.5708, 1.5708, 0.0]]
    >>> pairwise_distances([[1, 0], [0, 2]], "l1").tolist()
    [[0.0, 3.0], [3.0, 0.0]]
    """
    grads = _checked_gradients(representative_grads)
    return _distance_matrix(grads, _checked_distance_name(distance))


def cross_distances(
    left_grads: ArrayLike,
    right_grads: ArrayLike,
    distance: Distance = "arccos",
    *,
    rows: ArrayLike | None = None,
) -> NDArray[np.float64]:
    """Distances between every row of ``left_grads`` and every row of ``right_grads``.

    What a strategy needs to keep a distance matrix up to date: only the rows
    (and columns) of the clients that returned a new gradient are recomputed,
    ``O(k N d)`` for ``k`` new gradients instead of ``O(N^2 d)``.  Same
    conventions as :func:`pairwise_distances` (zero gradients included);
    float32 input stays float32 for the inner products.

    Parameters
    ----------
    left_grads : ArrayLike
        Array of shape ``(k, d)``.
    right_grads : ArrayLike
        Array of shape ``(N, d)``, the same ``d``.
    distance : {"arccos", "l2", "l1"}
        Dissimilarity, as in :func:`clustered_distributions_by_similarity`.
    rows : ArrayLike or None
        Distinct indices of the rows of ``left_grads`` whose distances are
        returned, in that order (default: all).  They are the same rows, to
        the last bit, as in the full result: for ``arccos`` and ``l2`` the
        inner products are still taken for all of ``left_grads`` in one
        product, since BLAS picks its kernels, and so its rounding, by the
        shape of the product.  What a strategy needs when some of the rows
        it refreshes are zero gradients, whose distances it already knows.

    Returns
    -------
    NDArray[np.float64]
        Matrix of shape ``(k, N)``, or ``(len(rows), N)``.

    Raises
    ------
    ValueError
        If the gradients are not finite 2-D arrays with the same number of
        columns (for ``arccos`` and ``l2``, also finite ones whose squared
        norms overflow), ``distance`` is unknown, or ``rows`` are not
        distinct indices of rows of ``left_grads``.

    Examples
    --------
    >>> np.round(cross_distances([[1, 0]], [[1, 0], [0, 2]], "l2"), 4).tolist()
    [[0.0, 2.2361]]
    """
    left = _checked_gradients(left_grads)
    right = _checked_gradients(right_grads)
    if left.shape[1] != right.shape[1]:
        raise ValueError(
            f"gradients must have the same dimension, got {left.shape[1]} "
            f"and {right.shape[1]}"
        )
    name = _checked_distance_name(distance)
    selected = (
        slice(None) if rows is None else distinct_indices("rows", rows, left.shape[0])
    )
    if name == "l1":
        from scipy.spatial.distance import cdist  # scipy on first use, see top

        left, right = _finite_gradients(left)[selected], _finite_gradients(right)
        # cdist works in float64: blocks of rows bound that copy of ``right``.
        rows_per_block = max(1, _L1_BLOCK_BYTES // (8 * right.shape[1]))
        blocks = [
            cdist(left, right[start : start + rows_per_block], metric="cityblock")
            for start in range(0, right.shape[0], rows_per_block)
        ]
        return np.hstack([np.zeros((left.shape[0], 0)), *blocks])
    left_squared_norms = _squared_row_norms(left)[selected]
    right_squared_norms = _squared_row_norms(right)
    gram = (left @ right.T)[selected].astype(np.float64)
    return _distances_from_gram(gram, left_squared_norms, right_squared_norms, name)


def sample_from_distributions(
    distributions: ArrayLike, rng: np.random.Generator
) -> NDArray[np.int64]:
    """Draw one client from each distribution (one uniform per row).

    Parameters
    ----------
    distributions : ArrayLike
        Matrix of shape ``(m, N)`` with rows that are probability vectors.
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    NDArray[np.int64]
        The ``m`` drawn client indices, row ``k``'s draw at position ``k``; a
        client may appear more than once.  A zero-probability client is never
        drawn.

    Raises
    ------
    ValueError
        If ``distributions`` is not 2-D with entries in [0, 1] and rows
        summing to one.

    Examples
    --------
    >>> rows = [[0.0, 0.0, 1.0], [0.5, 0.5, 0.0]]
    >>> sample_from_distributions(rows, np.random.default_rng(0)).tolist()
    [2, 0]
    """
    probabilities = _checked_distributions(distributions)
    cumulative = np.cumsum(probabilities, axis=1)
    # Scaling the uniform by the row's own total keeps the target inside the
    # row when float rounding leaves the total a hair below one.
    targets = rng.random(probabilities.shape[0]) * cumulative[:, -1]
    drawn = np.count_nonzero(cumulative <= targets[:, None], axis=1)
    # `targets` can round up to the row total itself; the last client with
    # positive probability is then the one the uniform belongs to.
    last_positive = (
        probabilities.shape[1] - 1 - np.argmax(probabilities[:, ::-1] > 0, axis=1)
    )
    return np.minimum(drawn, last_positive).astype(np.int64)


def aggregation_weight_variance(distributions: ArrayLike) -> NDArray[np.float64]:
    """Variance of each client's aggregation weight under clustered sampling.

    The weight of client ``i`` is ``omega_i = (times i is drawn) / m``; with
    one independent draw per distribution its variance is
    ``(1/m^2) sum_k r[k, i] (1 - r[k, i])`` (paper, eq. 16).

    Parameters
    ----------
    distributions : ArrayLike
        Distribution matrix of shape ``(m, N)``.

    Returns
    -------
    NDArray[np.float64]
        Vector of ``N`` variances.

    Raises
    ------
    ValueError
        If ``distributions`` is not a valid distribution matrix.

    Examples
    --------
    A client that owns a distribution has a certain weight:

    >>> r = clustered_distributions_by_size([10, 10, 20], 2)
    >>> aggregation_weight_variance(r).tolist()
    [0.0625, 0.0625, 0.0]
    """
    probabilities = _checked_distributions(distributions)
    draws = probabilities.shape[0]
    return np.sum(probabilities * (1 - probabilities), axis=0) / draws**2


def md_aggregation_weight_variance(p: ArrayLike, m: int) -> NDArray[np.float64]:
    """Variance of each client's aggregation weight under MD sampling.

    ``m`` i.i.d. draws with probabilities ``p`` give
    ``Var[omega_i] = p_i (1 - p_i) / m`` (paper, eq. 14); clustered sampling
    with the same ``p`` is never above it (eq. 17).

    Parameters
    ----------
    p : ArrayLike
        Probability of each client per draw (``n_i / M_tot``).
    m : int
        Number of draws, at least 1.

    Returns
    -------
    NDArray[np.float64]
        Vector of variances, one per client.

    Raises
    ------
    ValueError
        If ``p`` has entries outside [0, 1] or ``m`` is not a positive integer.

    Examples
    --------
    MD sampling with the same ``p`` as the clustered example of
    :func:`aggregation_weight_variance`: every variance is larger (eq. 17).

    >>> md_aggregation_weight_variance([0.25, 0.25, 0.5], 2).tolist()
    [0.09375, 0.09375, 0.125]
    """
    probabilities = probability_array("p", p)
    return probabilities * (1 - probabilities) / _positive_integer("m", m)


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
        self.input_dim = _positive_integer("input_dim", input_dim)
        self.dim = _positive_integer("dim", dim)
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
        sketch = np.subtract(halves[: self.dim], halves[self.dim :], out=out)
        # A NaN or infinite entry, or a float32 overflow, leaves a non-finite
        # bucket: checking the dim buckets checks the d entries.
        if not np.all(np.isfinite(sketch)):
            raise ValueError(
                "vector contains NaN or infinite values, or values too large "
                "to sum in float32"
            )
        return sketch


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


def _positive_integer(name: str, value: int) -> int:
    """Check that ``value`` is an integer of at least 1."""
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _checked_units(sizes: ArrayLike, m: int) -> tuple[NDArray[np.int64], int, int]:
    """Validate the inputs; return client units ``m n_i``, ``M_tot`` and ``m``."""
    counts = nonnegative_vector("sizes", sizes)
    if np.any(counts != np.floor(counts)):
        raise ValueError("sizes must be integer sample counts")
    total = int(counts.sum())
    if total == 0:
        raise ValueError("sizes must not all be zero")
    draws = sample_count("m", _positive_integer("m", m), counts.size)
    if draws * total >= _MAX_EXACT_UNITS:
        raise ValueError(
            f"m * sum(sizes) = {draws * total} is too large for exact arithmetic "
            f"(limit 2**53)"
        )
    return draws * counts.astype(np.int64), total, draws


def _checked_gradients(
    representative_grads: ArrayLike, clients: int | None = None
) -> NDArray:
    """Validate the shape of an ``(N, d)`` gradient array; float32 stays float32.

    **Decision:** finiteness is checked where the distances are computed,
    from the squared norms for ``arccos`` and ``l2``
    (:func:`_checked_squared_norms`), so that no extra pass over the
    ``(N, d)`` array is made.
    """
    grads = np.asarray(representative_grads)
    if grads.dtype != np.float32:
        grads = grads.astype(np.float64, copy=False)
    wrong_rows = clients is not None and grads.shape[:1] != (clients,)
    if grads.ndim != 2 or grads.shape[1] == 0 or wrong_rows:
        rows = "N" if clients is None else clients
        raise ValueError(
            f"representative_grads must have shape ({rows}, d) with d >= 1, "
            f"got {grads.shape}"
        )
    return grads


def _finite_gradients(grads: NDArray) -> NDArray:
    """Reject gradients with NaN or infinite entries (the ``l1`` distance)."""
    if not np.all(np.isfinite(grads)):
        raise ValueError("representative_grads contains NaN or infinite values")
    return grads


def _squared_row_norms(grads: NDArray) -> NDArray[np.float64]:
    """``||g_i||^2`` of every row, accumulated in the rows' own precision.

    Raises ``ValueError`` for gradients that are not finite (see
    :func:`_checked_squared_norms`).
    """
    return _checked_squared_norms(np.einsum("ij,ij->i", grads, grads))


def _checked_squared_norms(squared_norms: NDArray) -> NDArray[np.float64]:
    """Reject gradients whose squared norms are not finite; return them in float64.

    A NaN or infinite entry makes the squared norm of its row NaN or
    infinite, so this checks the gradients without the ``isfinite`` pass over
    the whole ``(N, d)`` array, which reads it once more and allocates
    ``N d`` booleans (a tenth of the Gram matrix's time at 500 x 50,000).  It
    also rejects finite entries too large to square in the gradients' dtype,
    whose inner products and distances would be NaN.
    """
    if not np.all(np.isfinite(squared_norms)):
        raise ValueError(
            "representative_grads contains NaN or infinite values, or values "
            "too large to square"
        )
    return squared_norms.astype(np.float64)


def _checked_distance_name(distance: str) -> Distance:
    """Reject an unknown distance name."""
    if distance not in DISTANCES:
        raise ValueError(f"distance must be one of {DISTANCES}, got {distance!r}")
    return distance


def _checked_distributions(distributions: ArrayLike) -> NDArray[np.float64]:
    """Validate an ``(m, N)`` matrix whose rows are probability vectors."""
    probabilities = probability_array("distributions", distributions, ndim=2)
    if probabilities.size == 0:
        raise ValueError(
            f"distributions must be non-empty, got shape {probabilities.shape}"
        )
    row_sums = probabilities.sum(axis=1)
    if np.any(np.abs(row_sums - 1) > _ROW_SUM_TOLERANCE):
        raise ValueError(
            "every row of distributions must sum to 1, got sums in "
            f"[{row_sums.min():.12g}, {row_sums.max():.12g}]"
        )
    return probabilities


def _is_symmetric(matrix: NDArray[np.float64]) -> bool:
    """Whether a non-negative square matrix equals its transpose, to ``_SYMMETRY_RTOL``.

    **Decision:** the test of ``np.allclose(matrix, matrix.T, rtol, atol=0)``,
    ``|a - b| <= rtol |b|`` both ways round, i.e. ``|a - b| <= rtol min(a, b)``
    for non-negative entries, run tile by tile on the upper triangle against
    its mirror: ``allclose`` builds several ``N x N`` temporaries and reads
    the transpose across the whole matrix (12 s at 10,000 clients, against
    0.2 s here).  A tile equal to its mirror, as a matrix built symmetric is,
    skips the tolerance arithmetic.
    """
    size, tile_side = matrix.shape[0], _SYMMETRY_TILE
    for top in range(0, size, tile_side):
        for left in range(top, size, tile_side):
            tile = matrix[top : top + tile_side, left : left + tile_side]
            mirror = matrix[left : left + tile_side, top : top + tile_side].T
            if np.array_equal(tile, mirror):
                continue
            gap = np.abs(tile - mirror)
            if not np.all(gap <= _SYMMETRY_RTOL * np.minimum(tile, mirror)):
                return False
    return True


def _allocate_by_similarity(
    units: NDArray[np.int64],
    total: int,
    m: int,
    distances: NDArray[np.float64],
) -> NDArray[np.float64]:
    """Steps 1-4 of Algorithm 2 (see :func:`clustered_distributions_by_similarity`)."""
    table, open_rows, residual = _dedicate_heavy_clients(units, total, m)
    if open_rows.size == 0:
        return table / total

    # Clients without units left (no data, or all of it in dedicated rows)
    # take no part in the clustering.  With rows open, at least two clients
    # have units left, since each has fewer than M_tot of them.
    active = np.flatnonzero(residual)
    from scipy.cluster.hierarchy import linkage  # scipy on first use, see top

    tree = linkage(_condensed_distances(distances, active), method="ward")
    group = _cut_by_capacity(tree, residual[active], total)

    group_units = np.zeros(group.max() + 1, np.int64)
    np.add.at(group_units, group, residual[active])
    # Stable sort: groups of equal weight keep label order (deterministic).
    groups_by_weight = np.argsort(-group_units, kind="stable")
    rank = np.empty_like(groups_by_weight)
    rank[groups_by_weight] = np.arange(groups_by_weight.size)
    client_rank = rank[group]

    seeds = client_rank < open_rows.size
    seeded_clients = active[seeds]
    table[open_rows[client_rank[seeds]], seeded_clients] = residual[seeded_clients]

    remaining = active[~seeds]
    order = remaining[
        np.lexsort((remaining, -residual[remaining], client_rank[~seeds]))
    ]
    seed_levels = group_units[groups_by_weight[: open_rows.size]]
    _fill_greedily(table, open_rows, seed_levels, order, residual[order], total)
    return table / total


def _condensed_distances(
    distances: NDArray[np.float64], clients: NDArray[np.intp]
) -> NDArray[np.float64]:
    """Upper triangle of the distances between ``clients``, as ``linkage`` takes it.

    When every client takes part (the usual case), the triangle is read from
    ``distances`` itself: gathering an ``N x N`` copy first would take longer
    than reading the triangle (0.6 s against 0.2 s at 10,000 clients).
    """
    from scipy.spatial.distance import squareform  # scipy on first use, see top

    if clients.size < distances.shape[0]:
        distances = distances[np.ix_(clients, clients)]
    return squareform(distances, checks=False)


def _dedicate_heavy_clients(
    units: NDArray[np.int64], total: int, m: int
) -> tuple[NDArray[np.int64], NDArray[np.intp], NDArray[np.int64]]:
    """Give each client ``floor(units_i / M_tot)`` distributions of its own.

    **Decision:** done first, for both algorithms.  The paper prescribes it for
    Algorithm 2 (end of Section 5); for Algorithm 1 the greedy pass alone does
    not guarantee it (with ``m n = (1.3, 1.2, ...) M_tot`` the second client
    straddles two distributions and is never drawn with certainty), while
    taking the full distributions out first leaves the other properties intact
    and lowers the heavy clients' weight variance.

    Returns
    -------
    tuple
        The ``(m, N)`` unit table with the dedicated rows filled, the indices
        of the rows still open, and each client's units left (``< M_tot``).
        The units left fill the open rows exactly: they total
        ``M_tot * len(open rows)``.
    """
    full_rows = units // total
    owners = np.repeat(np.arange(units.size), full_rows)
    table = np.zeros((m, units.size), np.int64)
    table[np.arange(owners.size), owners] = total
    return table, np.arange(owners.size, m), units - full_rows * total


def _by_decreasing_units(
    clients: NDArray[np.intp], units: NDArray[np.int64]
) -> NDArray[np.intp]:
    """``clients`` sorted by decreasing units, ties by index (deterministic)."""
    return clients[np.argsort(-units[clients], kind="stable")]


def _fill_greedily(
    table: NDArray[np.int64],
    rows: NDArray[np.intp],
    seed_levels: NDArray[np.int64],
    clients: NDArray[np.intp],
    units: NDArray[np.int64],
    total: int,
) -> None:
    """Pour the clients' units, in order, into distributions ``rows`` of ``table``.

    The greedy pass shared by Algorithms 1 and 2: client after client, its
    units go into the current distribution until it holds ``total``, the
    excess into the next one.  Laid end to end on one line, the free room of
    the distributions and the clients' units share the same length; the
    boundaries of both cut it into pieces that each lie in one distribution
    and come from one client, found by two sorted searches, without a loop and
    in ``O((m + N) log(m + N))`` time and memory.

    Parameters
    ----------
    table : NDArray[np.int64]
        The ``(m, N)`` unit table, filled in place.
    rows : NDArray[np.intp]
        The distributions to fill, in filling order.
    seed_levels : NDArray[np.int64]
        Units already in each of ``rows`` (all ``<= total``).
    clients : NDArray[np.intp]
        The clients to place, in placement order; none has units in ``rows``.
    units : NDArray[np.int64]
        Units of each of ``clients``; they add up to the free room,
        ``sum(total - seed_levels)``.
    total : int
        Capacity of a distribution (``M_tot``).
    """
    room_end = np.cumsum(total - seed_levels)
    units_end = np.cumsum(units)
    piece_end = np.union1d(room_end, units_end)
    piece_units = np.diff(piece_end, prepend=0)
    # Empty rooms or empty clients only produce zero-length pieces.
    piece_end, piece_units = piece_end[piece_units > 0], piece_units[piece_units > 0]
    # A piece (start, end] lies in the first room, and comes from the first
    # client, whose segment ends at or after `end`.
    distribution = np.searchsorted(room_end, piece_end)
    client = np.searchsorted(units_end, piece_end)
    table[rows[distribution], clients[client]] = piece_units


def _distance_matrix(grads: NDArray, distance: Distance) -> NDArray[np.float64]:
    """Square matrix of pairwise distances between the rows of ``grads``.

    **Decision:** loop-free: one Gram matrix ``G G^T`` (BLAS) for ``arccos``
    and ``l2``, ``scipy.spatial.distance.pdist`` for ``l1``; the authors'
    reference loops over client pairs in Python, ``O(N^2 d)`` interpreted work.
    """
    if distance == "l1":
        from scipy.spatial.distance import pdist, squareform  # on first use, see top

        return squareform(pdist(_finite_gradients(grads), metric="cityblock"))
    # Non-finite gradients make the diagonal non-finite: the check below
    # reports them, so the Gram matrix's own overflow warnings are noise.
    with np.errstate(over="ignore", invalid="ignore"):
        gram = grads @ grads.T
    squared_norms = _checked_squared_norms(np.diag(gram))
    gram = gram.astype(np.float64, copy=False)
    return _distances_from_gram(gram, squared_norms, squared_norms, distance)


def _distances_from_gram(
    gram: NDArray[np.float64],
    left_squared_norms: NDArray[np.float64],
    right_squared_norms: NDArray[np.float64],
    distance: Literal["arccos", "l2"],
) -> NDArray[np.float64]:
    """``arccos`` or ``l2`` distances from inner products and squared norms.

    **Decision:** computed in place in ``gram`` (the caller's own float64
    array, returned): each ``k x N`` temporary avoided is 800 MB allocated
    and written at 10,000 x 10,000; one is left, for the norms' products or
    sums.
    """
    if distance == "l2":
        # |a - b|^2 = |a|^2 + |b|^2 - 2 <a, b>; rounding can dip below zero.
        norm_sums = np.add.outer(left_squared_norms, right_squared_norms)
        squared = np.subtract(norm_sums, np.multiply(gram, 2.0, out=gram), out=gram)
        return np.sqrt(np.maximum(squared, 0.0, out=squared), out=squared)
    left_norms = np.sqrt(left_squared_norms)
    right_norms = np.sqrt(right_squared_norms)
    left_zero, right_zero = left_norms == 0, right_norms == 0
    # Zero rows of the Gram matrix give cosine 0 (orthogonal) against any
    # vector; two zero vectors are then set to cosine 1 (same direction).
    norm_products = np.outer(
        np.where(left_zero, 1.0, left_norms), np.where(right_zero, 1.0, right_norms)
    )
    cosine = np.divide(gram, norm_products, out=gram)
    cosine[np.ix_(left_zero, right_zero)] = 1.0
    return np.arccos(np.clip(cosine, -1.0, 1.0, out=cosine), out=cosine)


def _cut_by_capacity(
    tree: NDArray[np.float64], units: NDArray[np.int64], total: int
) -> NDArray[np.intp]:
    """Cut a linkage tree into the largest subtrees of at most ``total`` units.

    **Decision:** the paper leaves the cut open ("cut P to determine K >= m
    groups" with ``q_k <= M``).  As the authors' reference code does, every
    merge height is replaced by the units of the merged subtree and the tree
    is cut at height ``total``: a group is a subtree that fits in one
    distribution whose parent does not.  This gives the fewest groups that
    fit, each a whole branch of the tree, in ``O(N)``, and unlike cutting at
    merge heights (``fcluster`` with ``maxclust``) it cannot get stuck on tied
    heights, e.g. the zero distances between never-sampled clients.  Every
    leaf fits (``units < total``), so every client gets a group.

    Returns
    -------
    NDArray[np.intp]
        Group label ``0..K-1`` of each leaf.
    """
    from scipy.cluster.hierarchy import fcluster  # scipy on first use, see top

    leaves = units.size
    subtree_units = np.concatenate([units, np.zeros(leaves - 1, np.int64)])
    for merge, (left, right) in enumerate(tree[:, :2].astype(np.intp)):
        subtree_units[leaves + merge] = subtree_units[left] + subtree_units[right]
    by_units = tree.copy()
    by_units[:, 2] = subtree_units[leaves:]
    return fcluster(by_units, t=total, criterion="distance").astype(np.intp) - 1
