"""Argument checks of the strategies' constructors, with one wording.

A wrong type raises a TypeError, a value out of range a ValueError; each
message names the argument and the value given.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any, get_args


def check_count(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int, once checked to be a whole number ``>= minimum``.

    Raises
    ------
    TypeError
        ``value`` is not an integer (a bool is not one here).
    ValueError
        ``value`` is below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_positive(name: str, value: Any) -> float:
    """``value`` as a float, once checked to be a finite number ``> 0``.

    Raises
    ------
    TypeError
        ``value`` is not a real number.
    ValueError
        ``value`` is not finite or not positive.
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return number


def check_choice(name: str, value: Any, choices: Any) -> None:
    """Raise a ValueError naming the valid choices if ``value`` is not one.

    ``choices`` is the parameter's ``Literal`` type, whose arguments are the
    valid values, so that the annotation is their one list.

    Examples
    --------
    >>> from typing import Literal
    >>> Mode = Literal["single-set", "two-set"]
    >>> check_choice("mode", "two-set", Mode)
    >>> check_choice("mode", "other", Mode)
    Traceback (most recent call last):
    ...
    ValueError: mode must be one of ('single-set', 'two-set'), got 'other'
    """
    valid = get_args(choices)
    if value not in valid:
        raise ValueError(f"{name} must be one of {valid}, got {value!r}")


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
