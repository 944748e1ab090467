"""Argument checks of the strategies' constructors, with one wording.

``check_count``, ``check_positive`` and ``check_choice`` are the package's
shared validators (:mod:`flwr_importance.sampling._checks`), named here for the
strategies; ``check_keys`` is the strategies' own. A wrong type raises a
TypeError, a value out of range a ValueError; each message names the argument
and the value given.
"""

from __future__ import annotations

from typing import Any

from flwr_importance.sampling._checks import check_choice, check_count, check_positive

__all__ = ["check_choice", "check_count", "check_keys", "check_positive"]


def check_keys(
    weighted_by_key: Any, arrayrecord_key: Any, configrecord_key: Any
) -> None:
    """Raise unless every key is a non-empty string and the record keys differ.

    Raises
    ------
    TypeError
        A key is not a string.
    ValueError
        A key is empty, or the ArrayRecord and ConfigRecord keys are equal.
    """
    for key in (weighted_by_key, arrayrecord_key, configrecord_key):
        if not isinstance(key, str):
            raise TypeError(f"record and metric keys must be str, got {key!r}")
        if not key:
            raise ValueError("record and metric keys must not be empty")
    if arrayrecord_key == configrecord_key:
        raise ValueError(
            f"arrayrecord_key and configrecord_key are both {arrayrecord_key!r}: "
            "the model and the config need their own keys"
        )
