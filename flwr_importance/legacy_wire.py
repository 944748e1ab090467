"""The legacy transport's wire format, read and written by both of its ends.

The legacy Strategy API knows four calls to a client: ``get_properties`` (a
config in, scalars out), ``get_parameters``, ``fit`` (a list of arrays and a
config in, a list of arrays, ``num_examples`` and scalar metrics out) and
``evaluate``. The Message-API strategies of this library speak in messages of
several types (``train``, ``evaluate``, ``query.<action>``) whose content may
hold several *named* ArrayRecords (FOLB replies with ``update`` and
``gradient``, OCS sends ``model-0``). The legacy transport maps one onto the
other without loss:

- the message type travels in the config under :data:`MESSAGE_TYPE_KEY`;
- the named ArrayRecords travel as one flat list of arrays, with their names and
  lengths in the config (server to client) or the metrics (client to server)
  under :data:`ARRAY_LAYOUT_KEY`, as a JSON list of ``[name, count]`` pairs;
- a message that carries arrays goes by ``fit``, one without by
  ``get_properties`` (whose reply properties become the reply's metrics).

Each end packs what it sends and unpacks what it receives, so this module
holds what both share: the keys, the packing of named ArrayRecords and the
conversions of configs and metrics to and from legacy scalars. The server's
end is :mod:`flwr_importance.compat.transport` (instructions out, replies in),
the client's :mod:`flwr_importance.clientapps.legacy_calls` (calls in, replies
out). Like :mod:`flwr_importance.protocol`, it sits below both and imports
neither, nor any ML framework.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from flwr.common import (
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from numpy.typing import NDArray

from flwr_importance import protocol

#: Config key carrying the Message-API message type (``train``, ``query.norm``).
MESSAGE_TYPE_KEY = protocol.COMPAT_MESSAGE_TYPE
#: Config/metric key carrying the names and lengths of the packed ArrayRecords.
ARRAY_LAYOUT_KEY = protocol.COMPAT_ARRAY_LAYOUT
#: Name of the ArrayRecord a plain legacy ``fit``/``evaluate`` model arrives as.
DEFAULT_RECORD = protocol.ARRAY_RECORD

#: What the legacy API accepts as a config value or a metric.
ScalarDict = dict[str, Scalar]


# -- arrays ------------------------------------------------------------------
def pack_arrays(
    records: Mapping[str, ArrayRecord],
) -> tuple[list[NDArray[np.generic]], str]:
    """Named ArrayRecords as one list of arrays and its JSON layout."""
    arrays: list[NDArray[np.generic]] = []
    layout: list[tuple[str, int]] = []
    for name, record in records.items():
        values = record.to_numpy_ndarrays()
        arrays.extend(values)
        layout.append((name, len(values)))
    return arrays, json.dumps(layout)


def unpack_arrays(
    arrays: Sequence[NDArray[np.generic]],
    layout: str | None,
    keys: Sequence[str] | None = None,
) -> RecordDict:
    """The named ArrayRecords :func:`pack_arrays` packed, in a RecordDict.

    Parameters
    ----------
    arrays : Sequence[NDArray]
        The flat list.
    layout : str or None
        The JSON layout; None means one record, :data:`DEFAULT_RECORD`, holding
        every array (what a plain legacy strategy sends).
    keys : Sequence[str], optional
        Array keys for each record of ``len(keys)`` arrays (a client passes its
        model's state-dict keys, so the record loads into the model); otherwise,
        and for records of another length, ``"0"``, ``"1"``, ...

    Raises
    ------
    ValueError
        If the layout is not a list of ``[name, count]`` pairs covering
        ``arrays`` exactly.
    """
    if layout is None:
        entries: object = [[DEFAULT_RECORD, len(arrays)]] if arrays else []
    else:
        entries = json.loads(layout)
    if not isinstance(entries, list) or not all(
        isinstance(entry, list)
        and len(entry) == 2
        and isinstance(entry[0], str)
        and isinstance(entry[1], int)
        and entry[1] >= 0
        for entry in entries
    ):
        raise ValueError(f"malformed {ARRAY_LAYOUT_KEY}: {layout!r}")
    if sum(count for _, count in entries) != len(arrays):
        raise ValueError(f"{ARRAY_LAYOUT_KEY} {layout!r} does not cover {len(arrays)}")
    records = RecordDict()
    offset = 0
    for name, count in entries:
        names = (
            list(keys)
            if keys is not None and len(keys) == count
            else [str(index) for index in range(count)]
        )
        values = arrays[offset : offset + count]
        records[name] = ArrayRecord.from_array_dict(
            {
                key: Array(np.asarray(value))
                for key, value in zip(names, values, strict=True)
            }
        )
        offset += count
    return records


def record_of(parameters: Parameters) -> ArrayRecord:
    """Legacy ``Parameters`` as an ArrayRecord keyed ``"0"``, ``"1"``, ..."""
    return ArrayRecord(parameters_to_ndarrays(parameters))


def parameters_of(record: ArrayRecord) -> Parameters:
    """An ArrayRecord's arrays, in order, as legacy ``Parameters``."""
    return ndarrays_to_parameters(record.to_numpy_ndarrays())


# -- configs and metrics -----------------------------------------------------
def legacy_scalars(values: Mapping[str, object], what: str) -> ScalarDict:
    """A config or metric record as legacy scalars (no lists).

    Raises
    ------
    ValueError
        For a value the legacy API cannot carry (a list).
    """
    scalars: ScalarDict = {}
    for key, value in values.items():
        if not isinstance(value, (bool, bytes, float, int, str)):
            raise ValueError(f"{what} '{key}' = {value!r} is not a legacy scalar")
        scalars[key] = value
    return scalars


def numeric_metrics(values: Mapping[str, Scalar]) -> MetricRecord | None:
    """The numeric entries of legacy metrics as a MetricRecord (None if none)."""
    numbers: dict[str, int | float | list[int] | list[float]] = {
        key: value
        for key, value in values.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }
    return MetricRecord(numbers) if numbers else None
