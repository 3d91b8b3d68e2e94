"""The optimizers a run can name: SGD with momentum, Adagrad (the paper's) and Adam."""

from __future__ import annotations

from typing import Any

from apputil.errors import invalid

OPTIMIZERS = ("sgd", "adagrad", "adam")


def make_optimizer(
    name: str, learning_rate: float, momentum: float = 0.9, clipnorm: float | None = None
) -> Any:
    """The Keras optimizer `name` (one of `OPTIMIZERS`); `momentum` is SGD's."""
    import keras

    clip = {"clipnorm": clipnorm} if clipnorm else {}
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate, momentum=momentum, **clip)
    if name == "adagrad":
        return keras.optimizers.Adagrad(learning_rate, **clip)
    if name == "adam":
        return keras.optimizers.Adam(learning_rate, **clip)
    raise invalid("--optimizer", f"one of {', '.join(OPTIMIZERS)}", name)
