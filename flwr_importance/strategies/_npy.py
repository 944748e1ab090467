"""Zero-copy reading of ``.npy`` bytes: the header parsed, the data a view.

Flower serializes each ``Array`` of a message in NumPy's ``.npy`` format.
:func:`npy_view` reads the header (dtype, shape, order, data offset) and
returns the data where it lies, so that reading a reply's arrays costs no
copy; :func:`~flwr_importance.strategies.arrays.array_values` reads an
``Array`` with it.
"""

from __future__ import annotations

import functools
import io
import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

#: The first bytes of every ``.npy`` serialization.
NPY_MAGIC = b"\x93NUMPY"


def npy_view(data: bytes) -> NDArray[Any] | None:
    """The array ``data`` serializes, as a read-only view of ``data``.

    None where ``data`` is not in a ``.npy`` format version this reads (1 or
    2) or holds Python objects: the caller then deserializes it with NumPy.

    Raises
    ------
    ValueError
        The header is not a readable ``.npy`` header (corrupted bytes).
    """
    if data[:6] != NPY_MAGIC:
        return None
    # Format versions 1 and 2 differ only in the width of the header length.
    length_bytes = {1: 2, 2: 4}.get(data[6])
    if length_bytes is None:
        return None
    offset = 8 + length_bytes + int.from_bytes(data[8 : 8 + length_bytes], "little")
    header = _npy_header(bytes(data[:offset]))
    if header is None:
        return None
    shape, fortran_order, dtype = header
    values = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=offset)
    return values.reshape(shape, order="F" if fortran_order else "C")


@functools.lru_cache(maxsize=1024)
def _npy_header(header: bytes) -> tuple[tuple[int, ...], bool, np.dtype[Any]] | None:
    """``(shape, fortran_order, dtype)`` of a ``.npy`` header; None for objects.

    Cached: every reply of a round carries the same few headers, and NumPy
    parses each with ``ast.literal_eval`` (a sixth of a reply's whole cost).
    """
    stream = io.BytesIO(header)
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
    else:
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
    return None if dtype.hasobject else (shape, fortran_order, dtype)
