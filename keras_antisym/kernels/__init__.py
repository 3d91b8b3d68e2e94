"""Fused GPU kernels of the AntisymmetricRNN recurrence (JAX: Pallas; PyTorch: Triton).

`recurrence(u, mt, h0, epsilon, gated)` is the one entry point: all states
`H (B, T, n)` of `h_t = h_{t-1} + ε·rate(h_{t-1}·Mt + u_t)` from the
projected inputs `u (B, T, k·n)` of all steps, the operand `mt (n, n)` and
`h0 (B, n)`, differentiable in all three (see `pallas_recurrence`). The
fused layers call it through `kernel_applies` and `run_layer` when
`fused_kernel` allows; the backend modules are imported on first use only
(Triton and TensorFlow must not share a process).
"""

import importlib.util
import os

import keras
from keras import ops

from keras_antisym._keras_private import torch_device

#: Backends with a kernel; TensorFlow keeps the loop.
KERNEL_BACKENDS = ("jax", "torch")
#: The widest state of the kernels (wider layers take the loop).
MAX_UNITS = 128
#: The one dtype of the kernels.
KERNEL_DTYPE = "float32"
#: The product precision of the kernels' steps, read at each call: `"float32"`
#: (full float32 products, the default), `"tf32x3"` (three TF32 tensor-core
#: products, about float32's accuracy) or `"tf32"` (one; ~1e-3 relative per
#: product). The environment's `KERAS_ANTISYM_KERNEL_PRECISION` sets it.
PRECISION = os.environ.get("KERAS_ANTISYM_KERNEL_PRECISION", "float32")


def cuda_available():
    """Whether the current backend computes on a CUDA GPU by default (PyTorch: with Triton)."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        if jax.default_backend() != "gpu":
            return False
        version = getattr(jax.devices()[0].client, "platform_version", "")
        return "rocm" not in str(version).lower()
    if backend == "torch":
        found = importlib.util.find_spec("triton") is not None
        return found and torch_device().startswith("cuda")
    return False


def _activation_name(activation):
    name = keras.activations.serialize(activation)
    return name if isinstance(name, str) else getattr(activation, "__name__", "")


def fits(batch, steps, units, blocks):
    """Whether the kernels take this size: `W` on chip, offsets in 32 bits.

    The state width is padded to a power of two of at most `MAX_UNITS`
    (`(n, n)` float32 in shared memory, 64 KiB at 128 units), and the
    projected inputs `(batch, T, blocks·n)` must have fewer than 2³¹ entries.
    """
    width = max(16, 1 << (int(units) - 1).bit_length())
    if width > MAX_UNITS:
        return False
    return batch is None or (batch + 15) * steps * blocks * width < 2**31


def kernel_applies(cell, sequences, fused_kernel):
    """Whether a fused layer's call runs the kernel rather than the loop.

    The caller checks that the call has no mask and no recurrent dropout.
    `fused_kernel=False` never; `"auto"` on a CUDA device; `True` on any
    device (elsewhere than on a GPU: Pallas interpret mode or Triton's
    interpreter, for tests). In every case: a kernel backend, tanh (and a
    sigmoid gate), float32, a static positive length and input width, and
    a size the kernels take (`fits`).
    """
    if fused_kernel is False or keras.backend.backend() not in KERNEL_BACKENDS:
        return False
    batch, steps, width = sequences.shape
    if not steps or not width or cell.compute_dtype != KERNEL_DTYPE:
        return False
    if not fits(batch, steps, cell.units, cell.num_blocks):
        return False
    if keras.backend.standardize_dtype(sequences.dtype) != KERNEL_DTYPE:
        return False
    if _activation_name(cell.activation) != "tanh":
        return False
    gate = getattr(cell, "recurrent_activation", None)
    if gate is not None and _activation_name(gate) != "sigmoid":
        return False
    return fused_kernel is True or cuda_available()


def recurrence(u, mt, h0, epsilon, gated=False, precision=None):
    """All states `(B, T, n)` of the recurrence on the current Keras backend.

    `precision` None: the module's `PRECISION`.
    """
    precision = PRECISION if precision is None else precision
    backend = keras.backend.backend()
    if backend == "jax":
        from keras_antisym.kernels import pallas_recurrence

        return pallas_recurrence.recurrence(u, mt, h0, epsilon, gated, precision)
    if backend == "torch":
        from keras_antisym.kernels import triton_recurrence

        return triton_recurrence.recurrence(u, mt, h0, epsilon, gated, precision)
    raise NotImplementedError(f"No fused kernel on the {backend} backend.")


def run_layer(cell, sequences, h0, go_backwards):
    """`(last_output, outputs, [last_state])` of a fused layer's call, by the kernel.

    `sequences` already carry their input dropout; the inputs of all steps
    are projected by one product (as `hoist_inputs`), the operand is the
    one `recurrent_operand()` of this call, and `go_backwards` reverses the
    steps (the outputs are in processing order, as the loop's).
    """
    operand, _ = cell.cached_sequence_constants()
    projected = cell.project_inputs(sequences)
    if go_backwards:
        projected = ops.flip(projected, axis=1)
    states = recurrence(projected, operand, h0, cell.epsilon, gated=cell.num_blocks == 2)
    last = states[:, -1]
    return last, states, [last]


__all__ = ["cuda_available", "fits", "kernel_applies", "recurrence", "run_layer"]
