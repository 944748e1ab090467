"""Model arrays read in place: ``.npy`` bytes as NumPy views, whole models as vectors.

A reply's arrays are read to be checked and again to be aggregated; reading
the serialized bytes where they lie (:func:`array_values`, the ``.npy`` format
parsed in :mod:`._npy`) instead of through ``Array.numpy()`` saves a copy each
time, and :func:`combine_arrays` sums replies array by array in the model's
own dtype, as Flower's ``FedAvg`` does. A round's model is released through
the :class:`Release` seam (:func:`linear_release` by default) and, with a
server optimizer, stepped by :func:`optimizer_step`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.common.constant import SType
from numpy.typing import NDArray

from flwr_importance.aggregation import weighted_sum
from flwr_importance.aggregation.server_optimizers import (
    OptimizerState,
    ServerOptimizer,
)
from flwr_importance.strategies._npy import npy_view


def array_values(array: Array) -> NDArray[Any]:
    """The values of ``array``: a read-only view of its serialized bytes.

    ``Array.numpy()`` copies the bytes into a new array; a reply's arrays are
    read to be checked and again to be aggregated, and at 1M parameters each
    copy costs half of what Flower's ``FedAvg`` spends on a reply. The ``.npy``
    header gives the dtype, shape and data offset (:func:`._npy.npy_view`);
    any other serialization falls back to ``Array.numpy()``.

    Raises
    ------
    ValueError
        The bytes are not a readable array (a corrupted reply).
    """
    values = npy_view(array.data) if array.stype == SType.NUMPY else None
    return array.numpy() if values is None else values


def all_finite(values: NDArray[Any]) -> bool:
    """Whether ``values`` holds no NaN and no infinity."""
    if not np.issubdtype(values.dtype, np.floating):
        return bool(np.all(np.isfinite(values)))
    flat = values.ravel()
    with np.errstate(over="ignore", invalid="ignore"):
        # A NaN or inf entry makes the sum of squares NaN or inf, and BLAS
        # computes it in a fraction of the time of np.isfinite(values).all().
        # Finite entries whose squares overflow make it inf too: then the
        # exact test decides.
        if np.isfinite(np.dot(flat, flat)):
            return True
    return bool(np.all(np.isfinite(values)))


def arrays_of(record: ArrayRecord) -> list[NDArray[Any]]:
    """The arrays of ``record``, flat, in order: read-only views, no copy."""
    return [array_values(array).ravel() for array in record.values()]


def flatten(record: ArrayRecord) -> NDArray[np.floating]:
    """All arrays of ``record`` as one vector in their common floating dtype.

    A float32 model stays float32: the sums over replies run in the model's
    own precision, as Flower's ``FedAvg`` does, at half the memory traffic of
    float64. A record of one floating array gives a read-only view (no copy).
    """
    arrays = arrays_of(record)
    dtype = np.result_type(*(array.dtype for array in arrays), np.float32)
    if len(arrays) == 1 and arrays[0].dtype == dtype:
        return arrays[0]
    return np.concatenate(arrays, dtype=dtype) if arrays else np.empty(0, dtype)


def unflatten(vector: NDArray[np.floating], like: ArrayRecord) -> ArrayRecord:
    """Split ``vector`` into an ArrayRecord shaped like ``like`` (keys, dtypes)."""
    sizes = [int(np.prod(template.shape)) for template in like.values()]
    if sum(sizes) != vector.size:
        raise ValueError(
            f"vector has {vector.size} entries, the record needs {sum(sizes)}"
        )
    arrays: dict[str, Array] = {}
    offset = 0
    for (key, template), size in zip(like.items(), sizes, strict=True):
        values = vector[offset : offset + size].reshape(template.shape)
        arrays[key] = Array(values.astype(np.dtype(template.dtype)))
        offset += size
    return ArrayRecord.from_array_dict(arrays)


def combine_arrays(
    records: Sequence[ArrayRecord],
    combine: Callable[[list[NDArray[np.floating]]], NDArray[np.floating]],
    like: ArrayRecord,
) -> ArrayRecord:
    """``combine`` applied array by array, shaped like ``like`` (keys, dtypes).

    For a linear combination of whole models (a mean, a weighted sum, a model
    plus a step) this equals ``unflatten(combine([flatten(r) for r in
    records]), like)`` without first copying each model into one vector: each
    array is read in place (:func:`array_values`), as Flower's ``FedAvg`` sums
    array by array. The records must have ``like``'s keys and shapes (checked
    replies do).
    """
    arrays: dict[str, Array] = {}
    for key, template in like.items():
        values = combine([array_values(record[key]).ravel() for record in records])
        arrays[key] = Array(
            values.reshape(template.shape).astype(template.dtype, copy=False)
        )
    return ArrayRecord.from_array_dict(arrays)


class Release(Protocol):
    """How a strategy forms the model it releases from the round's replies.

    Every strategy's round ends in one call ``release(base, terms, weights,
    mean_of=...)`` (``ImportanceStrategy.release``): client ``k`` contributes
    ``weights[k] * terms[k]`` (``mean_of`` None: ``terms`` are updates) or
    ``weights[k] / mean_of * (terms[k] - base)`` (``mean_of``: ``terms`` are
    models averaged with weights planned to total ``mean_of``). The default is
    :func:`linear_release`; ``CentralDP`` installs its clipped, noised one.
    """

    def __call__(
        self,
        base: ArrayRecord,
        terms: Sequence[ArrayRecord],
        weights: NDArray[np.float64],
        *,
        mean_of: float | None = None,
    ) -> ArrayRecord:
        """The released model, shaped like ``base`` (keys, dtypes)."""


def linear_release(
    base: ArrayRecord,
    terms: Sequence[ArrayRecord],
    weights: NDArray[np.float64],
    *,
    mean_of: float | None = None,
) -> ArrayRecord:
    """The methods' own release: ``base + sum_k w_k U_k`` or a weighted mean.

    ``mean_of`` None: ``base`` plus the weighted sum of the updates ``terms``.
    Otherwise the ``terms`` are models and the result is their mean weighted
    by ``weights`` over the replies that came (a missing reply's weight is
    shared out, as the methods' papers average the models received);
    ``mean_of``, the weight the plan expected, matters only to a private
    release, whose weights must not depend on who replied.
    """
    if mean_of is None:
        return combine_arrays(
            [base, *terms],
            lambda vectors: vectors[0] + weighted_sum(vectors[1:], weights),
            base,
        )
    shares = weights / weights.sum()
    return combine_arrays(terms, lambda models: weighted_sum(models, shares), base)


def optimizer_step(
    optimizer: ServerOptimizer,
    state: OptimizerState,
    current: ArrayRecord,
    aggregated: ArrayRecord,
    server_round: int,
) -> tuple[ArrayRecord, OptimizerState]:
    """``optimizer``'s step from ``current`` to the new model, on ArrayRecords.

    ``aggregated - current`` is the round's update estimate (the model a
    strategy's own step reaches, minus the model the round started from); the
    arrays keep their names, order and dtypes.
    """
    new_model, new_state = optimizer.step(
        {key: array_values(array) for key, array in current.items()},
        {key: array_values(array) for key, array in aggregated.items()},
        state,
        server_round,
    )
    record = ArrayRecord({key: Array(value) for key, value in new_model.items()})
    return record, new_state
