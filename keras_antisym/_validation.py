"""Argument checks shared by the library, with Keras' error message."""

from __future__ import annotations

import math
import numbers
from typing import Any, Literal

import numpy as np


def invalid(name: str, expected: str, value: Any) -> ValueError:
    """The `ValueError` for argument `name`, in Keras' wording."""
    return ValueError(
        f"Received an invalid value for argument `{name}`, expected {expected}, got {value!r}."
    )


def invalid_described(name: str, expected: str, got: str, hint: str = "") -> ValueError:
    """`invalid` for a value described in words (`got`, not a repr), with an optional hint."""
    message = f"Received an invalid value for argument `{name}`, expected {expected}, got {got}."
    return ValueError(f"{message} {hint}" if hint else message)


def check_positive_int(name: str, value: Any) -> int:
    """`value` as an `int`, if it is a positive integer (not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise invalid(name, "a positive integer", value)
    return int(value)


def check_float(name: str, value: Any, expected: str, allow_zero: bool) -> float:
    """`value` as a `float`, if it is finite and positive (or zero, if allowed)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise invalid(name, expected, value)
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise invalid(name, expected, value)
    return value


def check_rate(name: str, value: Any) -> float:
    """`value` as a `float`, if it is a dropout rate in [0, 1)."""
    rate = check_float(name, value, "a float in [0, 1)", allow_zero=True)
    if rate >= 1:
        raise invalid(name, "a float in [0, 1)", value)
    return rate


def check_bool(name: str, value: Any) -> bool:
    """`value` as a `bool`, if it is a Python or NumPy boolean."""
    if not isinstance(value, (bool, np.bool_)):
        raise invalid(name, "a boolean", value)
    return bool(value)


def check_auto_or_bool(name: str, value: Any) -> bool | Literal["auto"]:
    """`"auto"`, or `value` as a `bool` (the form of GRU's `use_cudnn`)."""
    if isinstance(value, str) and value == "auto":
        return "auto"
    if not isinstance(value, (bool, np.bool_)):
        raise invalid(name, '"auto" or a boolean', value)
    return bool(value)
