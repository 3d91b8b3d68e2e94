"""A layer's outputs and the gradients of one fixed weighted sum of them, on JAX and PyTorch.

What the kernel tests and the GPU check compare between the fused kernel and the
time loop. The weights of the sum (a cosine) make every output element count
differently, so a gradient routed to the wrong element shows.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def weighted_sum(outputs: Any) -> Any:
    """`sum(o * cos(0, 1, 2, ...))` over each output tensor (a list, a tuple or one tensor)."""
    from keras import ops

    total = 0.0
    for o in outputs if isinstance(outputs, list | tuple) else [outputs]:
        size = int(np.prod(o.shape))
        total = total + ops.sum(
            o * ops.reshape(ops.cos(ops.arange(size, dtype="float32")), o.shape)
        )
    return total


def outputs_and_grads(layer: Any, x: Any, call_args: dict) -> tuple[Any, Any]:
    """`layer`'s outputs on `x` and the gradients of `weighted_sum` w.r.t. its trainable weights.

    On PyTorch through autograd, on JAX through `stateless_call` and `jax.grad`.
    """
    import keras

    if keras.backend.backend() == "torch":
        import torch

        outputs = layer(x, **call_args)
        variables = [v.value for v in layer.trainable_variables]
        return outputs, torch.autograd.grad(weighted_sum(outputs), variables)
    import jax

    trainable = [v.value for v in layer.trainable_variables]
    fixed = [v.value for v in layer.non_trainable_variables]

    def loss(trainable):
        outputs, _ = layer.stateless_call(trainable, fixed, x, **call_args)
        return weighted_sum(outputs), outputs

    grads, outputs = jax.grad(loss, has_aux=True)(trainable)
    return outputs, grads
