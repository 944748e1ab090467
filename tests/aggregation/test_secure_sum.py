"""The documented error of a SecAgg+ sum, against Flower's own quantization.

Flower's ``quantize`` (each node) and ``dequantize`` with the workflow's
offset (the server) are applied to known values, with every weight equal to
``max_weight`` as FedSampling sends it; the masks cancel exactly, so they
are left out. Flower draws its rounding from NumPy's global state: the
checks leave margins of several standard deviations. Well under a second.
"""

from __future__ import annotations

import numpy as np
from flwr.common.secure_aggregation.quantization import dequantize, quantize

from flwr_importance.aggregation.secure_sum import (
    max_secure_participants,
    quantization_step,
    secure_sum_error_bound,
    secure_sum_noise,
)

CLIPPING_RANGE = 8.0
#: Coarse levels, so that the rounding error is far above float64's.
QUANTIZATION_RANGE = 2**12


def secure_sum(
    values: list[np.ndarray], clipping_range: float, levels: int
) -> np.ndarray:
    """What ``SecAggPlusWorkflow`` unmasks, times ``n``: the sum of ``values``.

    Each node quantizes its values; the server dequantizes the sum of the
    integers and removes the ``n - 1`` extra offsets (``unmask_stage``).
    """
    quantized = [quantize([value], clipping_range, levels)[0] for value in values]
    total = np.sum(quantized, axis=0)
    (unmasked,) = dequantize([total], clipping_range, levels)
    return unmasked - (len(values) - 1) * clipping_range


def test_the_error_of_a_sum_is_within_its_bound_and_its_noise() -> None:
    rng = np.random.default_rng(0)
    num_participants = 9
    values = [
        rng.uniform(-CLIPPING_RANGE, CLIPPING_RANGE, 200_000)
        for _ in range(num_participants)
    ]

    error = secure_sum(values, CLIPPING_RANGE, QUANTIZATION_RANGE) - np.sum(
        values, axis=0
    )

    bound = secure_sum_error_bound(num_participants, CLIPPING_RANGE, QUANTIZATION_RANGE)
    noise = secure_sum_noise(num_participants, CLIPPING_RANGE, QUANTIZATION_RANGE)
    assert np.abs(error).max() < bound
    assert abs(error.mean()) < 0.01 * noise  # unbiased
    assert 0.5 * noise < error.std() < noise


def test_values_beyond_the_clipping_range_are_clipped() -> None:
    values = [np.array([2 * CLIPPING_RANGE, -3 * CLIPPING_RANGE])] * 2
    total = secure_sum(values, CLIPPING_RANGE, QUANTIZATION_RANGE)
    np.testing.assert_allclose(total, [2 * CLIPPING_RANGE, -2 * CLIPPING_RANGE])


def test_the_most_participants_fill_the_modulus_without_wrapping() -> None:
    levels, modulus = 2**22, 2**32
    largest = max_secure_participants(levels, modulus)
    assert largest * levels < modulus <= (largest + 1) * levels
    assert quantization_step(CLIPPING_RANGE, levels) * levels == 2 * CLIPPING_RANGE
