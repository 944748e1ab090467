"""The error of a sum taken by Flower's SecAgg+ (Bell et al., CCS 2020).

SecAgg+ adds integers: each node clips every value of its reply to
``[-c, c]`` (``clipping_range``), maps it onto ``Q`` levels
(``quantization_range``) by stochastic rounding, masks and sends it; the
server unmasks the sum of the integers modulo ``modulus_range`` and maps it
back (``flwr.common.secure_aggregation.quantization``). With every node's
weight equal to ``max_weight`` (what FedSampling sends) the weights are exact,
so two errors remain:

- **clipping**, a bias, none while every value lies in ``[-c, c]``;
- **rounding**: a value ``x`` becomes ``floor`` or ``ceil`` of
  ``(x + c) Q / (2 c)``, whichever way keeps it unbiased, so each node's
  error in each coordinate is below one step ``Delta = 2 c / Q``, with mean
  zero and variance at most ``Delta^2 / 4``. Over ``n`` nodes the sum is off
  by less than ``n Delta`` (:func:`secure_sum_error_bound`) and by a
  standard deviation of at most ``sqrt(n) Delta / 2``
  (:func:`secure_sum_noise`).

The integers must not wrap around: ``n`` nodes' levels and weights add up to
``n Q``, below ``modulus_range`` (:func:`max_secure_participants`).
"""

from __future__ import annotations

import math


def quantization_step(clipping_range: float, quantization_range: int) -> float:
    """``Delta = 2 c / Q``: the value of one level of SecAgg+'s quantization.

    Parameters
    ----------
    clipping_range : float
        ``c > 0``: values are clipped to ``[-c, c]``.
    quantization_range : int
        ``Q >= 1``: the number of levels ``[-c, c]`` is cut into.

    Returns
    -------
    float
        ``Delta``.

    Raises
    ------
    ValueError
        ``c`` not positive and finite, or ``Q < 1``.

    Examples
    --------
    Flower's defaults, ``c = 8`` and ``Q = 2^22``:

    >>> quantization_step(8.0, 2**22)
    3.814697265625e-06
    """
    if not (math.isfinite(clipping_range) and clipping_range > 0):
        raise ValueError(
            f"clipping_range must be positive and finite, got {clipping_range}"
        )
    if quantization_range < 1:
        raise ValueError(f"quantization_range must be >= 1, got {quantization_range}")
    return 2 * clipping_range / quantization_range


def secure_sum_error_bound(
    num_participants: int, clipping_range: float, quantization_range: int
) -> float:
    """Worst-case error of each coordinate of a SecAgg+ sum: ``n Delta``.

    Holds for values inside ``[-c, c]`` (clipping adds its own bias) when
    every node's weight equals ``max_weight``: each of the ``n`` stochastic
    roundings moves a value by less than one step ``Delta = 2 c / Q``.

    Parameters
    ----------
    num_participants : int
        ``n``, the replies the sum adds.
    clipping_range : float
        ``c``.
    quantization_range : int
        ``Q``.

    Returns
    -------
    float
        ``n 2 c / Q``.

    Examples
    --------
    >>> secure_sum_error_bound(4, 8.0, 2**22)
    1.52587890625e-05
    """
    return num_participants * quantization_step(clipping_range, quantization_range)


def secure_sum_noise(
    num_participants: int, clipping_range: float, quantization_range: int
) -> float:
    """Bound on the standard deviation of each coordinate's rounding error.

    Stochastic rounding to a grid of step ``Delta`` is unbiased with
    variance ``p (1 - p) Delta^2 <= Delta^2 / 4``; the ``n`` roundings are
    independent, so the sum's error has mean zero and a standard deviation
    of at most ``sqrt(n) Delta / 2``. Compare it with the noise the method
    has anyway (FedSampling: a stochastic gradient over about ``K``
    samples, ``sigma / sqrt(K)`` for per-sample gradients of spread
    ``sigma``).

    Parameters
    ----------
    num_participants : int
        ``n``.
    clipping_range : float
        ``c``.
    quantization_range : int
        ``Q``.

    Returns
    -------
    float
        ``sqrt(n) c / Q``.

    Examples
    --------
    >>> secure_sum_noise(100, 8.0, 2**22)
    1.9073486328125e-05
    """
    step = quantization_step(clipping_range, quantization_range)
    return math.sqrt(num_participants) * step / 2


def max_secure_participants(quantization_range: int, modulus_range: int) -> int:
    """The most replies a SecAgg+ sum adds without wrapping around.

    Each reply adds at most ``Q`` to every coordinate and exactly ``Q`` to
    the weight total (weight ``max_weight``); the sum is taken modulo
    ``modulus_range``, so ``n Q`` must stay below it.

    Parameters
    ----------
    quantization_range : int
        ``Q >= 1``.
    modulus_range : int
        The modulus, above ``Q``.

    Returns
    -------
    int
        ``floor((modulus - 1) / Q)``.

    Examples
    --------
    Flower's defaults, ``Q = 2^22`` and a modulus of ``2^32``:

    >>> max_secure_participants(2**22, 2**32)
    1023
    """
    if quantization_range < 1:
        raise ValueError(f"quantization_range must be >= 1, got {quantization_range}")
    return (modulus_range - 1) // quantization_range


def check_no_wraparound(
    num_participants: int, quantization_range: int, modulus_range: int, *, what: str
) -> None:
    """Refuse a SecAgg+ sum of more replies than it adds without wrapping around.

    Above :func:`max_secure_participants` replies the masked sum is taken
    modulo ``modulus_range`` and unmasks to garbage, silently: check before
    the first message of the sum.

    Parameters
    ----------
    num_participants : int
        The replies the sum would add.
    quantization_range, modulus_range : int
        The workflow's ``Q`` and modulus.
    what : str
        What would take part, for the message (``"12 nodes would train in
        round 3"``).

    Raises
    ------
    ValueError
        Too many participants, with the limit and the fix.

    Examples
    --------
    >>> check_no_wraparound(1023, 2**22, 2**32, what="1023 nodes")
    >>> check_no_wraparound(1024, 2**22, 2**32, what="1024 nodes")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: 1024 nodes: SecAgg+'s sum wraps around above 1023 replies ...
    """
    largest = max_secure_participants(quantization_range, modulus_range)
    if num_participants > largest:
        raise ValueError(
            f"{what}: SecAgg+'s sum wraps around above {largest} replies "
            f"(quantization_range={quantization_range}, "
            f"modulus_range={modulus_range}); lower quantization_range to "
            "modulus_range // nodes or below"
        )
