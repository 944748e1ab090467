"""FOLB's gradient-aligned aggregation weights (Nguyen et al., "Fast-convergent
federated learning").

Pure NumPy. Every function works on the *distinct* devices that answered, each
with a multiplicity: FOLB samples multisets uniformly with replacement, and a
device drawn ``m`` times counts ``m`` times in every sum (its reply is the same
whichever draw it answers, so it trains once; see the strategy's docstring).

The paper's text lost its formulas; the forms below are those recovered in
``FOLB-EQUATIONS.md`` (parameter names as there):

- eq. 13 (single set ``S``): ``gS = mean_{j in S} g_j``, ``c_k = <g_k, gS>``,
  ``a_k = c_k / sum_{i in S} |c_i|``; a device with ``c_k < 0`` has its update
  subtracted ("rather than discarding" it).
- eqs. 9-10 (two sets): the same with ``gS2 = mean_{j in S2} g_j`` estimated on a
  second, independent set; eq. 9 may drop the devices with ``c_k < 0`` instead
  (``negative="drop"``).
- eq. 18 (heterogeneity-aware): ``d_k = c_k - psi * gamma_k * ||g_k|| * ||gS||``
  (or ``psi * gamma_k * ||gS||^2``), ``a_k = d_k / sum_i |d_i|``; ``psi = 0`` gives
  eq. 13 back.

The new model is ``w^{t+1} = w^t + sum_k a_k dw_k``
(:func:`flwr_importance.aggregation.weighted_sum` of the updates). Degenerate
rounds (all scores zero, a single device, non-finite gradients) fall back to the
plain mean of the valid updates, with the reason returned for the caller to log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

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


@dataclass(frozen=True)
class FolbWeights:
    """Aggregation weights of one round and why they may be a fallback.

    Attributes
    ----------
    weights : NDArray[np.float64]
        ``a_k`` per distinct device (multiplicity included), for
        ``w^{t+1} = w^t + sum_k a_k dw_k``.
    scores : NDArray[np.float64]
        ``c_k`` (eqs. 9, 13) or ``d_k`` (eq. 18) per device; NaN where the
        gradient was not finite.
    fallback_reason : str or None
        ``None`` when the weights follow the rule; else why they are the plain
        mean of the valid updates.
    """

    weights: NDArray[np.float64]
    scores: NDArray[np.float64]
    fallback_reason: str | None = None


def estimated_global_gradient(
    gradients: Sequence[NDArray[np.floating]], multiplicities: ArrayLike | None = None
) -> NDArray[np.float64]:
    """``gS = (1 / |S|) sum_{j in S} g_j`` over a multiset (eqs. 10, 13).

    Parameters
    ----------
    gradients : Sequence[NDArray]
        One full local gradient ``g_j = grad F_j(w^t)`` per distinct device.
    multiplicities : ArrayLike, optional
        How many times each device was drawn (default one each).

    Returns
    -------
    NDArray[np.float64]
        The multiset mean of the gradients.
    """
    counts = _multiplicities(multiplicities, len(gradients))
    if not gradients:
        raise ValueError("need at least one gradient to estimate the global one")
    total = np.zeros(np.shape(gradients[0]), dtype=np.float64)
    for count, gradient in zip(counts, gradients, strict=True):
        total += count * np.asarray(gradient, dtype=np.float64)
    return total / counts.sum()


def folb_weights(
    gradients: Sequence[NDArray[np.floating]],
    multiplicities: ArrayLike | None = None,
    *,
    reference_gradients: Sequence[NDArray[np.floating]] | None = None,
    reference_multiplicities: ArrayLike | None = None,
    inexactness: ArrayLike | None = None,
    psi: float = 0.0,
    penalty: Penalty = "norm-product",
    negative: NegativeRule = "flip",
    denominator: Denominator = "abs",
) -> FolbWeights:
    """FOLB aggregation weights: eq. 13, eqs. 9-10 or eq. 18 by the arguments.

    Parameters
    ----------
    gradients : Sequence[NDArray]
        ``g_k = grad F_k(w^t)`` of each distinct device whose update is
        aggregated (``S``, or ``S1`` in the two-set rule), equal-length vectors.
    multiplicities : ArrayLike, optional
        Times each of those devices was drawn (default one each).
    reference_gradients : Sequence[NDArray], optional
        Gradients of the second set ``S2`` (eq. 10); ``None`` estimates the
        global gradient on ``gradients`` themselves (eq. 13). Non-finite ones
        are left out of the estimate; an empty sequence (the second set did
        not answer) falls back to the mean.
    reference_multiplicities : ArrayLike, optional
        Times each ``S2`` device was drawn (default one each).
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
        For inconsistent lengths or shapes, negative multiplicities or ``psi``,
        ``gamma_k`` outside ``[0, 1]``, or an unknown option.
    """
    check_options(penalty, negative, denominator, psi)
    counts = _multiplicities(multiplicities, len(gradients))
    if not gradients:
        raise ValueError("need at least one device")
    matrix = _stack(gradients, "gradients")
    gammas = _inexactness(inexactness, len(gradients), psi)
    finite = np.all(np.isfinite(matrix), axis=1)
    # The matrix itself when every gradient is finite (the usual case): boolean
    # indexing copies the K x d matrix (800 MB at K = 100, d = 1M) at each use.
    finite_rows = matrix if finite.all() else matrix[finite]
    if reference_gradients is None:
        reference, reference_counts = finite_rows, counts[finite]
    elif len(reference_gradients) == 0:
        # The whole second set failed to answer: nothing to estimate gS2 with.
        reference, reference_counts = matrix[:0], counts[:0]
    else:
        reference = _stack(reference_gradients, "reference_gradients")
        if reference.shape[1] != matrix.shape[1]:
            raise ValueError(
                f"reference gradients have length {reference.shape[1]}, "
                f"the gradients {matrix.shape[1]}"
            )
        reference_counts = _multiplicities(reference_multiplicities, len(reference))
        reference_finite = np.all(np.isfinite(reference), axis=1)
        reference = reference[reference_finite]
        reference_counts = reference_counts[reference_finite]

    scores = np.full(len(counts), np.nan)
    if not finite.any():
        return _mean_fallback(
            finite, counts, scores, "no device sent a finite gradient"
        )
    if reference_counts.sum() == 0:
        return _mean_fallback(
            finite, counts, scores, "no finite gradient to estimate the global one"
        )
    global_gradient = estimated_global_gradient(list(reference), reference_counts)
    global_norm = float(np.linalg.norm(global_gradient))
    # einsum: np.linalg.norm(axis=1) squares into a K x d temporary first.
    gradient_norms = np.sqrt(np.einsum("ij,ij->i", finite_rows, finite_rows))
    inner_products = finite_rows @ global_gradient
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
    gradients: Sequence[NDArray[np.floating]],
    multiplicities: ArrayLike | None = None,
    *,
    negative: NegativeRule = "flip",
    denominator: Denominator = "abs",
) -> FolbWeights:
    """Eq. 13: ``a_k = c_k / sum_{i in S} |c_i|``, ``c_k = <g_k, gS>``, one set."""
    return folb_weights(
        gradients, multiplicities, negative=negative, denominator=denominator
    )


def two_set_weights(
    gradients: Sequence[NDArray[np.floating]],
    reference_gradients: Sequence[NDArray[np.floating]],
    multiplicities: ArrayLike | None = None,
    reference_multiplicities: ArrayLike | None = None,
    *,
    negative: NegativeRule = "flip",
    denominator: Denominator = "abs",
) -> FolbWeights:
    """Eqs. 9-10: ``c_k = <g_k, gS2>`` for ``k in S1``, ``gS2`` from ``S2``."""
    return folb_weights(
        gradients,
        multiplicities,
        reference_gradients=reference_gradients,
        reference_multiplicities=reference_multiplicities,
        negative=negative,
        denominator=denominator,
    )


def heterogeneity_aware_weights(
    gradients: Sequence[NDArray[np.floating]],
    inexactness: ArrayLike,
    psi: float,
    multiplicities: ArrayLike | None = None,
    *,
    penalty: Penalty = "norm-product",
    negative: NegativeRule = "flip",
    denominator: Denominator = "abs",
) -> FolbWeights:
    """Eq. 18: ``d_k = c_k - psi gamma_k ||g_k|| ||gS||``, ``a_k = d_k / sum |d_i|``."""
    return folb_weights(
        gradients,
        multiplicities,
        inexactness=inexactness,
        psi=psi,
        penalty=penalty,
        negative=negative,
        denominator=denominator,
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
    """Plain (multiset) mean over the devices with a finite gradient."""
    valid_counts = np.where(finite, counts, 0.0)
    if valid_counts.sum() == 0:
        # Nothing trustworthy: weights of zero keep the model where it is.
        return FolbWeights(np.zeros(len(counts)), scores, reason)
    return FolbWeights(valid_counts / valid_counts.sum(), scores, reason)


def _stack(vectors: Sequence[NDArray[np.floating]], name: str) -> NDArray[np.float64]:
    if not vectors:
        raise ValueError(f"{name} is empty")
    matrix = np.asarray([np.asarray(v, dtype=np.float64) for v in vectors])
    if matrix.ndim != 2:
        raise ValueError(f"{name} must be equal-length 1-D vectors")
    return matrix


def _multiplicities(values: ArrayLike | None, size: int) -> NDArray[np.float64]:
    if values is None:
        return np.ones(size)
    counts = np.asarray(values, dtype=np.float64)
    if counts.shape != (size,):
        raise ValueError(f"{size} devices but multiplicities of shape {counts.shape}")
    if not np.all(np.isfinite(counts)) or np.any(counts < 0):
        raise ValueError("multiplicities must be finite and >= 0")
    return counts


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
