"""Type aliases of the public API.

Keras ships no type information, and a tensor's type depends on the backend
(`tf.Tensor`, `jax.Array`, `torch.Tensor`, or a symbolic `keras.KerasTensor`),
so tensors are `Any` under their own names: the names say what is expected.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

#: A tensor of the current Keras backend, or a symbolic `keras.KerasTensor`.
Tensor: TypeAlias = Any
#: What `keras.ops.convert_to_tensor` takes: a tensor, a NumPy array, nested lists.
TensorLike: TypeAlias = Any
#: A shape, with `None` for an unknown dimension.
Shape: TypeAlias = Sequence[int | None]
#: A dtype name (`"float32"`), a NumPy or backend dtype, or None (the default).
DType: TypeAlias = Any
#: An activation as `keras.activations.get` takes it: a name, a callable, None (linear).
Activation: TypeAlias = str | Callable[..., Any] | None
#: An initializer, regularizer or constraint as Keras' `get` takes it: a name, a config
#: dict, an instance (callable), or None.
KerasObject: TypeAlias = str | dict[str, Any] | Callable[..., Any] | None
#: A float64 NumPy array.
FloatArray: TypeAlias = npt.NDArray[np.float64]

__all__ = [
    "Activation",
    "DType",
    "FloatArray",
    "KerasObject",
    "Shape",
    "Tensor",
    "TensorLike",
]
