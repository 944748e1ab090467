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
matrix (:mod:`._streaming`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypedDict, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_importance.aggregation._streaming import (
    Chunks,
    Sums,
    Vector,
    common_size,
    device_weights,
    finite_rows,
    streamed_sums,
    vector_pieces,
)
from flwr_importance.aggregation._streaming import (
    SplitVector as SplitVector,  # the type of the gradients, re-exported
)
from flwr_importance.validation import check_choice

if TYPE_CHECKING:
    from typing_extensions import Unpack

#: Where ``gS`` is estimated: on the aggregated devices themselves (eq. 13) or
#: on a second, independent set (eqs. 9-10).
Mode = Literal["single-set", "two-set"]
NegativeRule = Literal["flip", "drop"]
Denominator = Literal["abs", "signed"]
Penalty = Literal["norm-product", "global-norm"]

NEGATIVE_RULES: tuple[NegativeRule, ...] = get_args(NegativeRule)
DENOMINATORS: tuple[Denominator, ...] = get_args(Denominator)
PENALTIES: tuple[Penalty, ...] = get_args(Penalty)

# A denominator below this fraction of its scale (sum of m_k |g_k| |gS|, the
# largest it can be) is numerically zero: all gradients are orthogonal to the
# estimate, or the estimate itself vanishes.
RELATIVE_ZERO = 1e-12


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
    mode and arguments of one equation; these keywords, documented and
    defaulted there, go through unchanged.
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
    counts = device_weights(multiplicities, sample_counts, len(gradients))
    if not gradients:
        raise ValueError("need at least one gradient to estimate the global one")
    pieces = [vector_pieces(gradient, "gradients") for gradient in gradients]
    size = common_size(pieces, "gradients")
    mean = np.empty(size)
    for start, block in Chunks(pieces, size):
        chunk_mean = mean[start : start + block.shape[1]]
        np.einsum("k,kb->b", counts, block, out=chunk_mean)
        chunk_mean /= counts.sum()
    return mean


def folb_weights(
    gradients: Sequence[Vector],
    multiplicities: ArrayLike | None = None,
    *,
    mode: Mode,
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
    """FOLB aggregation weights: eq. 13 or eqs. 9-10 by ``mode``, eq. 18 if ``psi > 0``.

    Parameters
    ----------
    gradients : Sequence[NDArray or SplitVector]
        ``g_k = grad F_k(w^t)`` of each distinct device whose update is
        aggregated (``S``, or ``S1`` in the two-set rule), equal-length vectors
        in any real dtype (every sum is taken in float64).
    multiplicities : ArrayLike, optional
        Times each of those devices was drawn (default one each).
    mode : {"single-set", "two-set"}
        Where the global gradient is estimated: ``"single-set"`` (eq. 13) on
        ``gradients`` themselves, no ``reference_*`` argument given;
        ``"two-set"`` (eqs. 9-10) on the second set ``S2`` of
        ``reference_gradients``, which must be given.
    sample_counts : ArrayLike, optional
        ``n_k`` per device (>= 0), the weight of device ``k`` in ``gS`` and in
        the weights (the paper's ``n_k / n`` objective); ``None`` weighs every
        device the same (the ``1/N`` objective).
    reference_gradients : Sequence[NDArray or SplitVector], optional
        Gradients of the second set ``S2`` (eq. 10; ``mode="two-set"`` only).
        Non-finite ones are left out of the estimate; an empty sequence (the
        second set did not answer) falls back to the mean.
    reference_multiplicities : ArrayLike, optional
        Times each ``S2`` device was drawn (default one each).
    reference_sample_counts : ArrayLike, optional
        ``n_j`` per ``S2`` device; give it exactly when ``sample_counts`` is given.
    inexactness : ArrayLike, optional
        ``gamma_k`` in ``[0, 1]`` per device (eq. 18); required when ``psi > 0``.
    psi : float
        Weight of the inexactness penalty (eq. 18, ``>= 0``), in either mode;
        0 is eq. 13 or eq. 9.
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
        For an unknown mode or option, ``reference_*`` arguments that do not
        fit ``mode``, inconsistent lengths or shapes, negative multiplicities,
        sample counts or ``psi``, sample counts for one set only, or
        ``gamma_k`` outside ``[0, 1]``.

    Examples
    --------
    Identical gradients: FedProx's sample-weighted mean.

    >>> same = [np.array([1.0, 2.0])] * 3
    >>> folb_weights(same, mode="single-set", sample_counts=[1, 2, 5]).weights.tolist()
    [0.125, 0.25, 0.625]
    """
    check_options(penalty, negative, denominator, psi)
    _check_mode_arguments(
        mode,
        sample_counts,
        reference_gradients,
        reference_multiplicities,
        reference_sample_counts,
    )
    counts = device_weights(multiplicities, sample_counts, len(gradients))
    if not gradients:
        raise ValueError("need at least one device")
    gradient_pieces = [vector_pieces(gradient, "gradients") for gradient in gradients]
    size = common_size(gradient_pieces, "gradients")
    gammas = _inexactness(inexactness, len(gradients), psi)
    if mode == "single-set":
        estimate = _single_set_estimate(gradient_pieces, counts, size)
    else:
        assert reference_gradients is not None  # by _check_mode_arguments
        estimate = _two_set_estimate(
            gradient_pieces,
            size,
            reference_gradients,
            reference_multiplicities,
            reference_sample_counts,
        )
    finite = estimate.finite
    scores = np.full(len(counts), np.nan)
    if estimate.fallback_reason is not None:
        return _mean_fallback(finite, counts, scores, estimate.fallback_reason)
    finite_scores, bounds = _penalized_scores(
        estimate.sums, finite, gammas, psi, penalty
    )
    scores[finite] = finite_scores
    if not finite.all():
        return _mean_fallback(
            finite, counts, scores, "a device sent a NaN/inf gradient"
        )
    if len(counts) == 1:
        return _mean_fallback(finite, counts, scores, "a single device")
    return _normalized_weights(counts, scores, bounds, finite, negative, denominator)


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
    return folb_weights(gradients, multiplicities, mode="single-set", **options)


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
        mode="two-set",
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
        mode="single-set",
        inexactness=inexactness,
        psi=psi,
        penalty=penalty,
        **options,
    )


def _check_mode_arguments(
    mode: Mode,
    sample_counts: ArrayLike | None,
    reference_gradients: Sequence[Vector] | None,
    reference_multiplicities: ArrayLike | None,
    reference_sample_counts: ArrayLike | None,
) -> None:
    """Raise ``ValueError`` unless the ``reference_*`` arguments fit ``mode``."""
    check_choice("mode", mode, Mode)
    references = {
        "reference_gradients": reference_gradients,
        "reference_multiplicities": reference_multiplicities,
        "reference_sample_counts": reference_sample_counts,
    }
    given = [name for name, value in references.items() if value is not None]
    if mode == "single-set" and given:
        raise ValueError(
            "mode='single-set' estimates gS on the gradients themselves: "
            f"{', '.join(given)} belong to mode='two-set'"
        )
    if mode == "single-set":
        return
    if reference_gradients is None:
        raise ValueError(
            "mode='two-set' needs reference_gradients, the second set's "
            "gradients (an empty sequence when none of it answered)"
        )
    if (sample_counts is None) != (reference_sample_counts is None):
        raise ValueError(
            "give sample counts for both sets (samples weighting) or for neither"
        )


@dataclass(frozen=True)
class _Estimate:
    """A rule's sums, ``gS`` over the finite references, or why none serve."""

    sums: Sums
    finite: NDArray[np.bool_]  # which aggregated devices sent a finite gradient
    fallback_reason: str | None = None  # then the weights are the mean


def _single_set_estimate(
    gradients: list[list[NDArray[np.floating]]],
    counts: NDArray[np.float64],
    size: int,
) -> _Estimate:
    """Eq. 13: ``gS`` estimated on the aggregated devices' own gradients."""
    # All the gradients, until one of them turns out not finite.
    sums = streamed_sums(gradients, gradients, counts, size)
    finite = finite_rows(sums.squares, gradients)
    return _without_non_finite_references(
        gradients, size, sums, finite, gradients, counts, finite
    )


def _two_set_estimate(
    gradients: list[list[NDArray[np.floating]]],
    size: int,
    reference_gradients: Sequence[Vector],
    reference_multiplicities: ArrayLike | None,
    reference_sample_counts: ArrayLike | None,
) -> _Estimate:
    """Eqs. 9-10: ``gS2`` estimated on the second set ``S2``'s gradients."""
    if len(reference_gradients) == 0:
        # The whole second set failed to answer: nothing to estimate gS2 with.
        references: list[list[NDArray[np.floating]]] = []
        reference_counts = np.ones(0)
    else:
        references = [
            vector_pieces(gradient, "reference_gradients")
            for gradient in reference_gradients
        ]
        reference_size = common_size(references, "reference_gradients")
        if reference_size != size:
            raise ValueError(
                f"reference gradients have length {reference_size}, "
                f"the gradients {size}"
            )
        reference_counts = device_weights(
            reference_multiplicities, reference_sample_counts, len(references)
        )
    sums = streamed_sums(gradients, references, reference_counts, size)
    if np.isfinite(sums.global_square):
        reference_finite = np.ones(len(references), dtype=bool)
    else:
        # A NaN or inf entry of a reference gradient, even of one drawn 0
        # times, makes its chunk of gS, and so ||gS||^2, NaN or inf.
        reference_finite = finite_rows(np.full(len(references), np.inf), references)
    finite = finite_rows(sums.squares, gradients)
    return _without_non_finite_references(
        gradients, size, sums, finite, references, reference_counts, reference_finite
    )


def _without_non_finite_references(
    gradients: list[list[NDArray[np.floating]]],
    size: int,
    sums: Sums,
    finite: NDArray[np.bool_],
    references: list[list[NDArray[np.floating]]],
    reference_counts: NDArray[np.float64],
    reference_finite: NDArray[np.bool_],
) -> _Estimate:
    """The estimate over the finite references: ``sums`` again without the others."""
    if not finite.any():
        return _Estimate(sums, finite, "no device sent a finite gradient")
    if reference_counts[reference_finite].sum() == 0:
        return _Estimate(
            sums,
            finite,
            "no finite gradient of positive weight to estimate the global one",
        )
    if not reference_finite.all():
        # The sums above took the non-finite references into gS: again without.
        sums = streamed_sums(
            gradients,
            [
                pieces
                for pieces, is_finite in zip(references, reference_finite, strict=True)
                if is_finite
            ],
            reference_counts[reference_finite],
            size,
        )
    return _Estimate(sums, finite)


def _penalized_scores(
    sums: Sums,
    finite: NDArray[np.bool_],
    gammas: NDArray[np.float64],
    psi: float,
    penalty: Penalty,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Eq. 18's ``d_k`` of the finite devices (``c_k`` at ``psi = 0``), and bounds.

    A score's bound, ``||g_k|| ||gS|| + penalty_k``, is the most its magnitude
    can be: the scale against which a denominator is numerically zero.
    """
    global_norm = float(np.sqrt(sums.global_square))
    gradient_norms = np.sqrt(sums.squares[finite])
    inner_products = sums.inner_products[finite]
    if penalty == "norm-product":
        penalties = psi * gammas[finite] * gradient_norms * global_norm
    else:
        penalties = psi * gammas[finite] * global_norm**2
    return inner_products - penalties, gradient_norms * global_norm + penalties


def _normalized_weights(
    counts: NDArray[np.float64],
    scores: NDArray[np.float64],
    bounds: NDArray[np.float64],
    finite: NDArray[np.bool_],
    negative: NegativeRule,
    denominator: Denominator,
) -> FolbWeights:
    """Eqs. 9 and 13: ``a_k = n_k c_k / sum_i n_i |c_i|`` (or as the options say)."""
    kept = scores if negative == "flip" else np.where(scores > 0, scores, 0.0)
    total = float(counts @ (np.abs(kept) if denominator == "abs" else kept))
    scale = float(counts @ bounds)
    if not total > RELATIVE_ZERO * scale:
        return _mean_fallback(
            finite,
            counts,
            scores,
            _zero_denominator_reason(scores, scale, total, negative),
        )
    return FolbWeights(weights=counts * kept / total, scores=scores)


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
    check_choice("penalty", penalty, Penalty)
    check_choice("negative", negative, NegativeRule)
    check_choice("denominator", denominator, Denominator)
    if not (np.isfinite(psi) and psi >= 0):
        raise ValueError(f"psi must be finite and >= 0, got {psi}")
