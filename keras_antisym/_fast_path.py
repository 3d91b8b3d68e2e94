"""How a fused layer prepares a sequence for its time loop (`keras_antisym.layers`).

Whether the input projection is hoisted out of the loop, how many Euler steps
one iteration takes, and the bias folded into the input kernels: choices that
change no result, only the work per step.
"""

from __future__ import annotations

from typing import Literal

from keras import ops

from keras_antisym._keras_private import accelerator_available
from keras_antisym._typing import Tensor

#: With `hoist_inputs="auto"`, the least input width that is hoisted on a GPU or TPU.
HOIST_MIN_INPUT_DIM = 8
# Euler steps per iteration of the time loop, for sequences of a static length
# that it divides (without mask or unroll): the steps share the loop's own
# per-iteration work, while more steps per iteration make a longer step body.
# Not an argument: it changes no result, and no machine needs another value.
_STEPS_PER_ITERATION = 2


def hoists_inputs(hoist_inputs: bool | Literal["auto"], input_dim: int | None) -> bool:
    """Whether a fused layer projects all steps' inputs before its loop.

    Args:
        hoist_inputs: The layer's argument, `"auto"`, `True` or `False`.
        input_dim: The number of input features (None or 0: never).

    Returns:
        `hoist_inputs` when it is a boolean. `"auto"` hoists on a GPU or TPU,
        where one large product beats `T` small ones, for inputs of at least
        `HOIST_MIN_INPUT_DIM` features; not on a CPU, whose loop is bound by
        per-op dispatch, and there the stored `(batch, T, units)` projection
        and its gradient cost more than the per-step products they replace.
    """
    if not input_dim:
        return False
    if hoist_inputs == "auto":
        return input_dim >= HOIST_MIN_INPUT_DIM and accelerator_available()
    return hoist_inputs


#: The input blocks `[(V_k, b_k)]` of `AntisymmetricCell.input_weights` (`b_k` None without bias).
Weights = list[tuple[Tensor, Tensor | None]]


def steps_per_iteration(sequences: Tensor, mask: Tensor | None, unroll: bool) -> int:
    steps, width = sequences.shape[1], sequences.shape[-1]
    chunk = _STEPS_PER_ITERATION
    if mask is not None or unroll or steps is None or steps % chunk or not width:
        return 1
    return chunk


def group_steps(sequences: Tensor, chunk: int, go_backwards: bool) -> tuple[Tensor, bool]:
    """`(batch, T, w)` as `(batch, T / chunk, chunk·w)`, reversed first if `go_backwards`.

    Returns the grouped sequences and the `go_backwards` left to the loop.
    """
    if chunk == 1:
        return sequences, go_backwards
    if go_backwards:
        sequences = ops.flip(sequences, axis=1)
    steps, width = sequences.shape[1], sequences.shape[-1]
    return ops.reshape(sequences, (-1, steps // chunk, chunk * width)), False


def fold_bias(sequences: Tensor, weights: Weights) -> tuple[Tensor, Weights]:
    """A constant-1 input feature that makes each block's bias a row of its kernel.

    One product per block and step instead of a product and a bias add,
    whose gradient would be a reduction at every step.
    """
    if not sequences.shape[-1] or weights[0][1] is None:
        return sequences, weights
    ones = ops.ones_like(sequences[..., :1])
    folded = [
        (ops.concatenate([kernel, ops.expand_dims(bias, 0)], 0), None) for kernel, bias in weights
    ]
    return ops.concatenate([sequences, ones], -1), folded
