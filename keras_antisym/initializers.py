"""The paper's weight initialization (Chang et al., 2019, Appendix C)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import keras

from keras_antisym._equations import fan_in_stddev
from keras_antisym._typing import DType, Tensor
from keras_antisym._validation import invalid


@keras.saving.register_keras_serializable(package="keras_antisym")
class FanInNormal(keras.initializers.RandomNormal):
    """Normal initializer `N(0, sigma**2 / fan_in)`, with `fan_in = shape[0]`.

    The AntisymmetricRNN paper initializes input-to-hidden matrices with
    `N(0, 1/m)` (`sigma=1`, `fan_in = m` for a kernel of shape `(m, units)`)
    and hidden-to-hidden matrices with `N(0, sigma_w**2 / n)`, where the paper
    searches `sigma_w` in `{0, 1, 2, 4, 8, 16}`. `sigma=0` gives zeros.

    Seeding follows Keras' own random initializers: an integer or `None`
    seed draws the same values on every call, a `keras.random.SeedGenerator`
    draws new values each call.

    Args:
        sigma: Non-negative float, the scale `sigma` (the paper's `sigma_w`).
        seed: Optional integer or `keras.random.SeedGenerator`.

    Examples:
        >>> init = FanInNormal(sigma=4.0, seed=0)
        >>> w = init((128, 128))  # entries drawn from N(0, 16 / 128)
    """

    def __init__(self, sigma: float = 1.0, seed: int | None = None) -> None:
        if (
            isinstance(sigma, bool)
            or not isinstance(sigma, numbers.Real)
            or not math.isfinite(sigma)
            or sigma < 0
        ):
            raise invalid("sigma", "a non-negative float", sigma)
        super().__init__(mean=0.0, stddev=1.0, seed=seed)
        self.sigma: float = float(sigma)

    def __call__(self, shape: Sequence[int], dtype: DType = None) -> Tensor:
        shape = tuple(shape)
        if not shape:
            raise invalid("shape", "at least one dimension", shape)
        if self.sigma == 0.0:
            return keras.ops.zeros(shape, dtype=dtype)
        stddev = fan_in_stddev(self.sigma, shape)
        return keras.random.normal(shape, stddev=stddev, dtype=dtype, seed=self.seed)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        return {"sigma": self.sigma, "seed": config["seed"]}
