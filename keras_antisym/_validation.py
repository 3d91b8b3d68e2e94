"""Argument checks shared by the library, with Keras' error message."""

import math
import numbers

import numpy as np


def invalid(name, expected, value):
    """The `ValueError` for argument `name`, in Keras' wording."""
    return ValueError(
        f"Received an invalid value for argument `{name}`, expected {expected}, got {value!r}."
    )


def invalid_described(name, expected, got, hint=""):
    """`invalid` for a value described in words (`got`, not a repr), with an optional hint."""
    message = f"Received an invalid value for argument `{name}`, expected {expected}, got {got}."
    return ValueError(f"{message} {hint}" if hint else message)


def check_positive_int(name, value):
    """`value` as an `int`, if it is a positive integer (not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise invalid(name, "a positive integer", value)
    return int(value)


def check_float(name, value, expected, allow_zero):
    """`value` as a `float`, if it is finite and positive (or zero, if allowed)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise invalid(name, expected, value)
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise invalid(name, expected, value)
    return value


def check_rate(name, value):
    """`value` as a `float`, if it is a dropout rate in [0, 1)."""
    rate = check_float(name, value, "a float in [0, 1)", allow_zero=True)
    if rate >= 1:
        raise invalid(name, "a float in [0, 1)", value)
    return rate


def check_bool(name, value):
    """`value` as a `bool`, if it is a Python or NumPy boolean."""
    if not isinstance(value, (bool, np.bool_)):
        raise invalid(name, "a boolean", value)
    return bool(value)


def check_auto_or_bool(name, value):
    """`"auto"`, or `value` as a `bool` (the form of GRU's `use_cudnn`)."""
    if isinstance(value, str) and value == "auto":
        return value
    if not isinstance(value, (bool, np.bool_)):
        raise invalid(name, '"auto" or a boolean', value)
    return bool(value)
