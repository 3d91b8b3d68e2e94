"""The one wording of a bad argument, and the exception class of the user's mistakes.

The wording is Keras' own ("Received an invalid value for argument `x`, expected
..., got ..."), as `keras_antisym` uses it. Values are shown with a bounded
`repr`: a value read from a user's file may be huge or self-referencing (YAML
aliases expand exponentially), and an error message must stay one short line.
"""

from __future__ import annotations

import reprlib

_REPR = reprlib.Repr()
_REPR.maxlevel = 2
_REPR.maxstring = 80
_REPR.maxother = 80
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 4
_LONGEST = 120


class UsageError(ValueError):
    """A bad option or input of the user's making: reported as one line, exit status 2."""


def shown(value: object) -> str:
    """`repr(value)`, cut to a bounded length and depth (`...` marks what was left out)."""
    text = _REPR.repr(value)
    return text if len(text) <= _LONGEST else text[: _LONGEST - 3] + "..."


def invalid(
    argument: str,
    expected: str,
    value: object,
    error: type[Exception] = UsageError,
) -> Exception:
    """An `error` for `value` of `argument` (a `--flag`, a Python name or a JSON key).

    `value` is shown with `shown` (a bounded `repr`); pass a `Literal` to show
    text as it is.
    """
    got = value.text if isinstance(value, Literal) else shown(value)
    return error(
        f"Received an invalid value for argument `{argument}`, expected {expected}, got {got}."
    )


class Literal:
    """Text that `invalid` shows as it is, not quoted (e.g. "5 (`folder` exists)")."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def check(condition: object, argument: str, expected: str, value: object) -> None:
    """Raises `UsageError` naming `argument` unless `condition`."""
    if not condition:
        raise invalid(argument, expected, value)
