"""The one wording of a bad argument in `serving/` (Keras' own: "Received an invalid value ...")."""


def invalid(argument, expected, got, error=ValueError):
    """`error` naming `argument`; `got` is shown as given (pass `repr(value)` to quote it)."""
    return error(
        f"Received an invalid value for argument `{argument}`, expected {expected}, got {got}"
    )
