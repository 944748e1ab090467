"""FOLB's gradient-aligned aggregation weights.

Nguyen et al., "Fast-convergent federated learning", IEEE JSAC 2021. Pure NumPy.

The paper optimizes the sample-weighted objective ``f = sum_k (n_k / n) F_k``
(Sec. II-A: it replaces the factor ``1/N`` by ``n_k / n``, "the approach we take
throughout this paper"), as FedProx, its code base, does. Every sum below
therefore weighs device ``k`` by the sample count ``n_k`` it reports; without
``sample_counts`` every device weighs the same (the ``1/N`` objective). The
paper's formulas were lost in the available text; the forms below follow its
prose and equation numbers:

- eq. 13 (single set ``S``): ``gS = sum_{j in S} n_j g_j / sum_{j in S} n_j``,
  ``c_k = <g_k, gS>``, ``a_k = n_k c_k / sum_{i in S} n_i |c_i|``; a device with
  ``c_k < 0`` has its update subtracted ("rather than discarding" it). With
  identical gradients every ``c_k`` is the same and ``a_k = n_k / sum_i n_i``:
  FedProx's sample-weighted mean.
- eqs. 9-10 (two sets): the same with ``gS2`` (eq. 10) estimated on a second,
  independent set; eq. 9 may drop the devices with ``c_k < 0`` instead
  (``negative="drop"``).
- eq. 18 (heterogeneity-aware): ``d_k = c_k - psi * gamma_k * ||g_k|| * ||gS||``
  (or ``psi * gamma_k * ||gS||^2``), ``a_k = n_k d_k / sum_i n_i |d_i|``;
  ``psi = 0`` gives eq. 13 back.

``gS`` is a ratio estimator; the paper calls it an unbiased estimate of the
global gradient. Under uniform draws the unbiased estimate is
``(N / (K n)) sum_{j in S} n_j g_j``, which points the same way; every score is
linear in ``gS`` and the weights divide scores by scores, so the weights are
the same with either (the scale cancels).

Every function works on the *distinct* devices that answered, each with a
multiplicity: a device drawn ``m`` times (draws with replacement, as in the
paper's analysis) counts ``m`` times in every sum; its reply is the same
whichever draw it answers, so it trains once (see the strategy's docstring).

The new model is ``w^{t+1} = w^t + eta sum_k a_k dw_k``
(:func:`flwr_importance.aggregation.weighted_sum` of the updates; ``eta`` the
strategy's ``server_lr``). Degenerate rounds (all scores zero, a single device,
non-finite gradients) fall back to the sample-weighted mean of the valid
updates, with the reason returned for the caller to log.

The gradients are read in place, chunk by chunk, never stacked into a K x d
matrix: per chunk, the float64 copy of every device's slice (one small block)
gives that chunk of ``gS`` and, while still in cache, each device's share of
``<g_k, gS>``, ``||g_k||^2`` and ``||gS||^2``. Each gradient is read from
memory once, in its own dtype, and every sum is accumulated in float64.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Literal, TypedDict

import numpy as np
from numpy.typing import ArrayLike, NDArray

if TYPE_CHECKING:
    from typing_extensions import Unpack

NegativeRule = Literal["flip", "drop"]
Denominator = Literal["abs", "signed"]
Penalty = Literal["norm-product", "global-norm"]

NEGATIVE_RULES: tuple[NegativeRule, ...] = ("flip", "drop")
DENOMINATORS: tuple[Denominator, ...] = ("abs", "signed")
PENALTIES: tuple[Penalty, ...] = ("norm-product", "global-norm")

# A denominator below this fraction of its scale (sum of m_k |g_k| |gS|, the
# largest it can be) is numerically zero: all gradients are orthogonal to the
# estimate, or the estimate itself vanishes.
RELATIVE_ZERO = 1e-12

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
class FolbWeights:
    """Aggregation weights of one round and why they may be a fallback.

    Attributes
    ----------
    weights : NDArray[np.float64]
        ``a_k`` per distinct device (multiplicity and ``n_k`` included), for
        ``w^{t+1} = w^t + eta sum_k a_k dw_k``.
    scores : NDArray[np.float64]
        ``c_k`` (eqs. 9, 13) or ``d_k`` (eq. 18) per device; NaN where the
        gradient was not finite.
    fallback_reason : str or None
        ``None`` when the weights follow the rule; else why they are the
        (sample-weighted) mean of the valid updates.
    """

    weights: NDArray[np.float64]
    scores: NDArray[np.float64]
    fallback_reason: str | None = None


class FolbOptions(TypedDict, total=False):
    """The options every rule shares, taken as ``**options`` and passed on.

    :func:`single_set_weights`, :func:`two_set_weights` and
    :func:`heterogeneity_aware_weights` are :func:`folb_weights` with the
    arguments of one equation; these keywords, documented and defaulted there,
    go through unchanged.
    """

    sample_counts: ArrayLike | None
    negative: NegativeRule
    denominator: Denominator


def estimated_global_gradient(
    gradients: Sequence[Vector],
    multiplicities: ArrayLike | None = None,
    *,
    sample_counts: ArrayLike | None = None,
) -> NDArray[np.float64]:
    """``gS = sum_{j in S} n_j g_j / sum_{j in S} n_j`` over a multiset (eqs. 10, 13).

    Parameters
    ----------
    gradients : Sequence[NDArray or SplitVector]
        One full local gradient ``g_j = grad F_j(w^t)`` per distinct device.
    multiplicities : ArrayLike, optional
        How many times each device was drawn (default one each).
    sample_counts : ArrayLike, optional
        ``n_j`` per device (>= 0); ``None`` weighs every device the same.

    Returns
    -------
    NDArray[np.float64]
        The sample-weighted multiset mean of the gradients.

    Examples
    --------
    >>> gradients = [np.array([1.0, 0.0]), np.array([0.0, 1.0])]
    >>> estimated_global_gradient(gradients, sample_counts=[3, 1]).tolist()
    [0.75, 0.25]
    >>> estimated_global_gradient(gradients, [1, 3]).tolist()
    [0.25, 0.75]
    """
    counts = _device_weights(multiplicities, sample_counts, len(gradients))
    if not gradients:
        raise ValueError("need at least one gradient to estimate the global one")
    pieces = [_pieces(gradient, "gradients") for gradient in gradients]
    size = _common_size(pieces, "gradients")
    mean = np.empty(size)
    for start, block in _Chunks(pieces, size):
        chunk_mean = mean[start : start + block.shape[1]]
        np.einsum("k,kb->b", counts, block, out=chunk_mean)
        chunk_mean /= counts.sum()
    return mean


def folb_weights(
    gradients: Sequence[Vector],
    multiplicities: ArrayLike | None = None,
    *,
    sample_counts: ArrayLike | None = None,
    reference_gradients: Sequence[Vector] | None = None,
    reference_multiplicities: ArrayLike | None = None,
    reference_sample_counts: ArrayLike | None = None,
    inexactness: ArrayLike | None = None,
    psi: float = 0.0,
    penalty: Penalty = "norm-product",
    negative: NegativeRule = "flip",
    denominator: Denominator = "abs",
) -> FolbWeights:
    """FOLB aggregation weights: eq. 13, eqs. 9-10 or eq. 18 by the arguments.

    Parameters
    ----------
    gradients : Sequence[NDArray or SplitVector]
        ``g_k = grad F_k(w^t)`` of each distinct device whose update is
        aggregated (``S``, or ``S1`` in the two-set rule), equal-length vectors
        in any real dtype (every sum is taken in float64).
    multiplicities : ArrayLike, optional
        Times each of those devices was drawn (default one each).
    sample_counts : ArrayLike, optional
        ``n_k`` per device (>= 0), the weight of device ``k`` in ``gS`` and in
        the weights (the paper's ``n_k / n`` objective); ``None`` weighs every
        device the same (the ``1/N`` objective).
    reference_gradients : Sequence[NDArray or SplitVector], optional
        Gradients of the second set ``S2`` (eq. 10); ``None`` estimates the
        global gradient on ``gradients`` themselves (eq. 13). Non-finite ones
        are left out of the estimate; an empty sequence (the second set did
        not answer) falls back to the mean.
    reference_multiplicities : ArrayLike, optional
        Times each ``S2`` device was drawn (default one each).
    reference_sample_counts : ArrayLike, optional
        ``n_j`` per ``S2`` device; give it exactly when ``sample_counts`` is given.
    inexactness : ArrayLike, optional
        ``gamma_k`` in ``[0, 1]`` per device (eq. 18); required when ``psi > 0``.
    psi : float
        Weight of the inexactness penalty (eq. 18, ``>= 0``); 0 is eq. 13/9.
    penalty : {"norm-product", "global-norm"}
        ``psi gamma_k ||g_k|| ||gS||`` or ``psi gamma_k ||gS||^2``.
    negative : {"flip", "drop"}
        A device with a negative score has its update subtracted (eq. 13, the
        paper's "rather than discarding"), or gets weight 0 (eq. 9 as written).
    denominator : {"abs", "signed"}
        ``sum_i |c_i|`` (as recovered) or ``sum_i c_i``. With ``"drop"`` the
        dropped devices are left out of either sum.

    Returns
    -------
    FolbWeights
        The weights, the scores, and the fallback reason if any.

    Raises
    ------
    ValueError
        For inconsistent lengths or shapes, negative multiplicities, sample
        counts or ``psi``, sample counts for one set only, ``gamma_k`` outside
        ``[0, 1]``, or an unknown option.

    Examples
    --------
    Identical gradients: FedProx's sample-weighted mean.

    >>> same = [np.array([1.0, 2.0])] * 3
    >>> folb_weights(same, sample_counts=[1, 2, 5]).weights.tolist()
    [0.125, 0.25, 0.625]
    """
    check_options(penalty, negative, denominator, psi)
    if reference_gradients is not None and (sample_counts is None) != (
        reference_sample_counts is None
    ):
        raise ValueError(
            "give sample counts for both sets (samples weighting) or for neither"
        )
    counts = _device_weights(multiplicities, sample_counts, len(gradients))
    if not gradients:
        raise ValueError("need at least one device")
    gradient_pieces = [_pieces(gradient, "gradients") for gradient in gradients]
    size = _common_size(gradient_pieces, "gradients")
    gammas = _inexactness(inexactness, len(gradients), psi)
    if reference_gradients is None:
        # All the gradients, until one of them turns out not finite.
        reference_pieces, reference_counts = gradient_pieces, counts
    elif len(reference_gradients) == 0:
        # The whole second set failed to answer: nothing to estimate gS2 with.
        reference_pieces, reference_counts = [], counts[:0]
    else:
        reference_pieces = [
            _pieces(gradient, "reference_gradients") for gradient in reference_gradients
        ]
        reference_size = _common_size(reference_pieces, "reference_gradients")
        if reference_size != size:
            raise ValueError(
                f"reference gradients have length {reference_size}, "
                f"the gradients {size}"
            )
        reference_counts = _device_weights(
            reference_multiplicities, reference_sample_counts, len(reference_pieces)
        )

    sums = _streamed_sums(gradient_pieces, reference_pieces, reference_counts, size)
    finite = _finite(sums.squares, gradient_pieces)
    if reference_gradients is None:
        reference_finite = finite
    elif np.isfinite(sums.global_square):
        # A NaN or inf entry of a reference gradient, even of one drawn 0
        # times, makes its chunk of gS, and so ||gS||^2, NaN or inf.
        reference_finite = np.ones(len(reference_pieces), dtype=bool)
    else:
        reference_finite = _finite(
            np.full(len(reference_pieces), np.inf), reference_pieces
        )

    scores = np.full(len(counts), np.nan)
    if not finite.any():
        return _mean_fallback(
            finite, counts, scores, "no device sent a finite gradient"
        )
    if reference_counts[reference_finite].sum() == 0:
        return _mean_fallback(
            finite,
            counts,
            scores,
            "no finite gradient of positive weight to estimate the global one",
        )
    if not reference_finite.all():
        # The sums above took the non-finite references into gS: again without.
        sums = _streamed_sums(
            gradient_pieces,
            [
                pieces
                for pieces, is_finite in zip(
                    reference_pieces, reference_finite, strict=True
                )
                if is_finite
            ],
            reference_counts[reference_finite],
            size,
        )
    global_norm = float(np.sqrt(sums.global_square))
    gradient_norms = np.sqrt(sums.squares[finite])
    inner_products = sums.inner_products[finite]
    if penalty == "norm-product":
        penalties = psi * gammas[finite] * gradient_norms * global_norm
    else:
        penalties = psi * gammas[finite] * global_norm**2
    scores[finite] = inner_products - penalties

    if not finite.all():
        return _mean_fallback(
            finite, counts, scores, "a device sent a NaN/inf gradient"
        )
    if len(counts) == 1:
        return _mean_fallback(finite, counts, scores, "a single device")
    kept = scores if negative == "flip" else np.where(scores > 0, scores, 0.0)
    total = float(counts @ (np.abs(kept) if denominator == "abs" else kept))
    scale = float(counts @ (gradient_norms * global_norm + penalties))
    if not total > RELATIVE_ZERO * scale:
        return _mean_fallback(
            finite,
            counts,
            scores,
            _zero_denominator_reason(scores, scale, total, negative),
        )
    return FolbWeights(weights=counts * kept / total, scores=scores)


def single_set_weights(
    gradients: Sequence[Vector],
    multiplicities: ArrayLike | None = None,
    **options: Unpack[FolbOptions],
) -> FolbWeights:
    """Eq. 13: ``a_k = n_k c_k / sum_{i in S} n_i |c_i|``, ``c_k = <g_k, gS>``.

    ``options`` (:class:`FolbOptions`): ``sample_counts``, ``negative``,
    ``denominator``, as in :func:`folb_weights`.

    Examples
    --------
    The device against the estimate has its update subtracted, or dropped:

    >>> grads = [np.array([1.0, 0.0]), np.array([1.0, 0.0]), np.array([-1.0, 0.0])]
    >>> np.round(single_set_weights(grads).weights, 3).tolist()
    [0.333, 0.333, -0.333]
    >>> single_set_weights(grads, negative="drop").weights.tolist()
    [0.5, 0.5, 0.0]
    """
    return folb_weights(gradients, multiplicities, **options)


def two_set_weights(
    gradients: Sequence[Vector],
    reference_gradients: Sequence[Vector],
    multiplicities: ArrayLike | None = None,
    reference_multiplicities: ArrayLike | None = None,
    *,
    reference_sample_counts: ArrayLike | None = None,
    **options: Unpack[FolbOptions],
) -> FolbWeights:
    """Eqs. 9-10: ``c_k = <g_k, gS2>`` for ``k in S1``, ``gS2`` from ``S2``.

    The ``reference_*`` arguments describe ``S2`` and ``options``
    (:class:`FolbOptions`) the rule, as in :func:`folb_weights`.

    Examples
    --------
    >>> grads = [np.array([1.0, 0.0]), np.array([0.0, 1.0])]
    >>> two_set_weights(grads, [np.array([1.0, 0.0])]).weights.tolist()
    [1.0, 0.0]
    """
    return folb_weights(
        gradients,
        multiplicities,
        reference_gradients=reference_gradients,
        reference_multiplicities=reference_multiplicities,
        reference_sample_counts=reference_sample_counts,
        **options,
    )


def heterogeneity_aware_weights(
    gradients: Sequence[Vector],
    inexactness: ArrayLike,
    psi: float,
    multiplicities: ArrayLike | None = None,
    *,
    penalty: Penalty = "norm-product",
    **options: Unpack[FolbOptions],
) -> FolbWeights:
    """Eq. 18: ``d_k = c_k - psi gamma_k ||g_k|| ||gS||``, weights ``n_k d_k``.

    ``inexactness`` is ``gamma_k`` per device; it, ``psi``, ``penalty`` and
    ``options`` (:class:`FolbOptions`) are as in :func:`folb_weights`.

    Examples
    --------
    The same gradient, the second device inexact (``gamma = 1``):

    >>> grads = [np.array([1.0, 0.0]), np.array([1.0, 0.0])]
    >>> weights = heterogeneity_aware_weights(grads, [0.0, 1.0], psi=0.5).weights
    >>> np.round(weights, 3).tolist()
    [0.667, 0.333]
    """
    return folb_weights(
        gradients,
        multiplicities,
        inexactness=inexactness,
        psi=psi,
        penalty=penalty,
        **options,
    )


def _zero_denominator_reason(
    scores: NDArray[np.float64], scale: float, total: float, negative: NegativeRule
) -> str:
    """Why the weights' denominator is (numerically) zero or negative."""
    if np.all(np.abs(scores) <= RELATIVE_ZERO * scale):
        return "all scores (inner products) are zero"
    if negative == "drop" and not np.any(scores > 0):
        return "no device has a positive score and negative='drop'"
    return f"the signed denominator is not positive ({total:.3g})"


def _mean_fallback(
    finite: NDArray[np.bool_],
    counts: NDArray[np.float64],
    scores: NDArray[np.float64],
    reason: str,
) -> FolbWeights:
    """Mean over the devices with a finite gradient, weighted by ``counts``.

    ``counts`` are the devices' weights in the rule (multiplicity times
    ``n_k``): FedProx's sample-weighted mean, or the plain multiset mean.
    """
    valid_counts = np.where(finite, counts, 0.0)
    if valid_counts.sum() == 0:
        # Nothing trustworthy: weights of zero keep the model where it is.
        return FolbWeights(np.zeros(len(counts)), scores, reason)
    return FolbWeights(valid_counts / valid_counts.sum(), scores, reason)


@dataclass(frozen=True)
class _Sums:
    """What the scores take from the gradients (eqs. 9-10, 13, 18)."""

    squares: NDArray[np.float64]  # ||g_k||^2
    inner_products: NDArray[np.float64]  # <g_k, gS>
    global_square: float  # ||gS||^2


def _streamed_sums(
    gradients: list[list[NDArray[np.floating]]],
    references: list[list[NDArray[np.floating]]],
    reference_counts: NDArray[np.float64],
    size: int,
) -> _Sums:
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
    chunks = _Chunks(rows, size)
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
    return _Sums(squares, inner_products, global_square)


def _row_dots(
    block: NDArray[np.float64], other: NDArray[np.float64]
) -> NDArray[np.float64]:
    """``<block[k], other[k]>`` per row (``other`` 1-D: the same for every row).

    A stack of 1 x b by b x 1 products: NumPy takes each with BLAS's dot, about
    twice as fast as ``einsum`` on a cached block (``np.vecdot`` needs NumPy 2).
    """
    columns = other[:, :, None] if other.ndim == 2 else other[:, None]
    return np.matmul(block[:, None, :], columns).reshape(len(block))


class _Chunks:
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


def _pieces(vector: Vector, name: str) -> list[NDArray[np.floating]]:
    """The 1-D arrays ``vector`` is made of: itself, or its raveled pieces."""
    if isinstance(vector, SplitVector):
        return [np.ravel(piece) for piece in vector.pieces]
    array = np.asarray(vector)
    if array.ndim != 1:
        raise ValueError(f"{name} must be equal-length 1-D vectors")
    return [array]


def _common_size(vectors: Sequence[Sequence[NDArray[np.floating]]], name: str) -> int:
    """The vectors' common length; ``ValueError`` if they differ."""
    sizes = {sum(piece.size for piece in pieces) for pieces in vectors}
    if len(sizes) != 1:
        raise ValueError(f"{name} must be equal-length 1-D vectors")
    return sizes.pop()


def _finite(
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


def _device_weights(
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


def _inexactness(
    values: ArrayLike | None, size: int, psi: float
) -> NDArray[np.float64]:
    if values is None:
        if psi > 0:
            raise ValueError("psi > 0 needs the devices' inexactness gamma_k")
        return np.zeros(size)
    gammas = np.asarray(values, dtype=np.float64)
    if gammas.shape != (size,):
        raise ValueError(f"{size} devices but inexactness of shape {gammas.shape}")
    if not np.all((gammas >= 0) & (gammas <= 1)):
        raise ValueError("inexactness gamma_k must lie in [0, 1]")
    return gammas


def check_options(penalty: str, negative: str, denominator: str, psi: float) -> None:
    """Raise ``ValueError`` for an unknown option or a negative/non-finite ``psi``."""
    if penalty not in PENALTIES:
        raise ValueError(f"penalty must be one of {PENALTIES}, got {penalty!r}")
    if negative not in NEGATIVE_RULES:
        raise ValueError(f"negative must be one of {NEGATIVE_RULES}, got {negative!r}")
    if denominator not in DENOMINATORS:
        raise ValueError(
            f"denominator must be one of {DENOMINATORS}, got {denominator!r}"
        )
    if not (np.isfinite(psi) and psi >= 0):
        raise ValueError(f"psi must be finite and >= 0, got {psi}")
