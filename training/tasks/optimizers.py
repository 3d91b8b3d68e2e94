"""The optimizers a run can name: SGD with momentum, Adagrad (the paper's) and Adam."""

from __future__ import annotations

from typing import Any

from apputil.errors import invalid

OPTIMIZERS = ("sgd", "adagrad", "adam")


def make_optimizer(
    name: str,
    learning_rate: float,
    momentum: float = 0.9,
    clipnorm: float | None = None,
    dtype_policy: str = "float32",
) -> Any:
    """The Keras optimizer `name` (one of `OPTIMIZERS`); `momentum` is SGD's.

    Under `dtype_policy="mixed_float16"` it is wrapped in
    `keras.optimizers.LossScaleOptimizer` (dynamic loss scaling, as
    `Model.compile` does for a float16 model): float16 gradients underflow
    without it. Both trainers scale the loss through `optimizer.scale_loss`.
    """
    import keras

    clip = {"clipnorm": clipnorm} if clipnorm else {}
    if name == "sgd":
        optimizer = keras.optimizers.SGD(learning_rate, momentum=momentum, **clip)
    elif name == "adagrad":
        optimizer = keras.optimizers.Adagrad(learning_rate, **clip)
    elif name == "adam":
        optimizer = keras.optimizers.Adam(learning_rate, **clip)
    else:
        raise invalid("--optimizer", f"one of {', '.join(OPTIMIZERS)}", name)
    if dtype_policy == "mixed_float16":
        return keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
