"""Fused GPU kernels of the AntisymmetricRNN recurrence (JAX: Pallas; PyTorch: Triton).

`recurrence(u, mt, h0, epsilon, gated)` is the one entry point: all states
`H (B, T, n)` of `h_t = h_{t-1} + ε·rate(h_{t-1}·Mt + u_t)` from the
projected inputs `u (B, T, k·n)` of all steps, the operand `mt (n, n)` and
`h0 (B, n)`, differentiable in all three (see `pallas_recurrence`). The
fused layers call it through `kernel_applies` and `run_layer` when
`fused_kernel` allows (with `fused_kernel=True`, `check_layer` and
`check_call` raise where it cannot run); the backend modules are imported on first use only
(Triton and TensorFlow must not share a process).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import keras
from keras import ops

from keras_antisym._keras_private import torch_device
from keras_antisym._validation import invalid, invalid_described

#: Backends with a kernel; TensorFlow keeps the loop.
KERNEL_BACKENDS = ("jax", "torch")
#: The widest state of the kernels (wider layers take the loop).
MAX_UNITS = 128
#: The dtype of the kernels' state, accumulation and outputs.
KERNEL_DTYPE = "float32"
#: The compute dtypes whose inputs the kernels take: a layer under
#: `mixed_bfloat16` gives them bfloat16 projected inputs and operand, which
#: they widen to float32 on chip (float16 takes the loop).
KERNEL_INPUT_DTYPES = ("float32", "bfloat16")
#: The product precision of the kernels' steps, read at each call: `"tf32x3"`
#: (the default: three TF32 tensor-core products, float32's accuracy; on an
#: H100 within 1e-4 relative of the float32 loop after 200 steps, as full
#: float32 products), `"float32"` (full float32 products on the CUDA cores,
#: 3-9 times slower) or `"tf32"` (one TF32 product: about twice as fast as
#: tf32x3, ~1e-3 relative per product, 2e-2 to 1e-1 after 200 steps). The
#: environment's `KERAS_ANTISYM_KERNEL_PRECISION` sets it. Interpreted (on a
#: CPU) the products are full float32 whatever the setting.
PRECISION = os.environ.get("KERAS_ANTISYM_KERNEL_PRECISION", "tf32x3")
#: Whether `fused_kernel=True` runs the kernels without a CUDA GPU, interpreted
#: (Pallas' interpret mode; Triton's interpreter, which also needs
#: `TRITON_INTERPRET=1` before `triton` is imported): slow, for tests on tiny
#: shapes. Read at each call; the environment's `KERAS_ANTISYM_KERNEL_INTERPRET=1`
#: sets it. Off, `fused_kernel=True` without a CUDA GPU raises.
INTERPRET = os.environ.get("KERAS_ANTISYM_KERNEL_INTERPRET", "0") not in ("", "0")


def cuda_available() -> bool:
    """Whether the current backend computes on a CUDA GPU by default (PyTorch: with Triton)."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        if jax.default_backend() != "gpu":
            return False
        version = getattr(jax.devices()[0].client, "platform_version", "")
        return "rocm" not in str(version).lower()
    if backend == "torch":
        return _triton_found() and torch_device().startswith("cuda")
    return False


def _activation_name(activation: Any) -> str:
    name = keras.activations.serialize(activation)
    return name if isinstance(name, str) else getattr(activation, "__name__", "")


def fits(batch: int | None, steps: int, units: int, blocks: int) -> bool:
    """Whether the kernels take this size: `W` on chip, offsets in 32 bits.

    The state width is padded to a power of two of at most `MAX_UNITS`
    (`(n, n)` float32 in shared memory, 64 KiB at 128 units), and the
    projected inputs `(batch, T, blocks·n)` must have fewer than 2³¹ entries.
    """
    width = max(16, 1 << (int(units) - 1).bit_length())
    if width > MAX_UNITS:
        return False
    return batch is None or (batch + 15) * steps * blocks * width < 2**31


def kernel_applies(cell: Any, sequences: Any, fused_kernel: bool | str) -> bool:
    """Whether a fused layer's call runs the kernel rather than the loop.

    The caller checks that the call has no mask and no recurrent dropout.
    `fused_kernel=False` never; `"auto"` on a CUDA device; `True` on a CUDA
    device, or elsewhere where `INTERPRET` allows (Pallas interpret mode or
    Triton's interpreter, for tests). In every case: a kernel backend, tanh
    (and a sigmoid gate), a float32 or bfloat16 compute dtype, a static positive length and input
    width, and a size the kernels take (`fits`). A layer with
    `fused_kernel=True` raises instead of taking the loop (`check_layer`,
    `check_call`).
    """
    if fused_kernel is False or _static_problem(cell) is not None:
        return False
    if _sequences_problem(cell, sequences) is not None:
        return False
    if cuda_available():
        return True
    return fused_kernel is True and _device_problem() is None


def _unmet(name: str, expected: str, got: str) -> ValueError:
    """The error of `fused_kernel=True` where the kernel cannot run, naming the condition."""
    return invalid_described(
        name,
        f"{expected} with `fused_kernel=True`",
        got,
        'The fused kernel cannot run otherwise; pass `fused_kernel="auto"` to fall back '
        "to the time loop.",
    )


def _static_problem(cell: Any) -> ValueError | None:
    """What a layer's construction rules out for the kernel (None: nothing)."""
    backend = keras.backend.backend()
    if backend not in KERNEL_BACKENDS:
        return invalid(
            "fused_kernel",
            f'"auto" or False on the {backend} backend (the fused kernel runs on JAX and PyTorch)',
            True,
        )
    policy = cell.dtype_policy
    if policy.compute_dtype not in KERNEL_INPUT_DTYPES:
        return _unmet(
            "dtype", "a dtype policy that computes in float32 or bfloat16", repr(policy.name)
        )
    activation = _activation_name(cell.activation)
    if activation != "tanh":
        return _unmet("activation", "'tanh'", repr(activation or cell.activation))
    gate = getattr(cell, "recurrent_activation", None)
    if gate is not None and _activation_name(gate) != "sigmoid":
        return _unmet("recurrent_activation", "'sigmoid'", repr(_activation_name(gate) or gate))
    if not fits(None, 1, cell.units, cell.num_blocks):
        return _unmet("units", f"at most {MAX_UNITS}", repr(cell.units))
    return None


def _sequences_problem(cell: Any, sequences: Any) -> ValueError | None:
    """What a call's sequences rule out for the kernel (None: nothing)."""
    batch, steps, width = sequences.shape
    shape = f"sequences of shape {tuple(sequences.shape)}"
    if steps is None:
        return _unmet("sequences", "a static number of timesteps", shape)
    if not steps or not width:
        return _unmet("sequences", "at least one timestep and one feature", shape)
    dtype = keras.backend.standardize_dtype(sequences.dtype)
    if dtype not in KERNEL_INPUT_DTYPES:
        return _unmet("sequences", "float32 or bfloat16 sequences", f"{dtype} sequences")
    if not fits(batch, steps, cell.units, cell.num_blocks):
        return _unmet(
            "sequences",
            "fewer than 2**31 projected inputs, padded (`(batch + 15) * timesteps * "
            "blocks * padded units`)",
            shape,
        )
    return None


def _device_problem() -> ValueError | None:
    """Why the kernels cannot run on this device (None: a CUDA GPU, or `INTERPRET`)."""
    backend = keras.backend.backend()
    if backend == "torch" and not _triton_found():
        return invalid("fused_kernel", '"auto" or False without Triton (pip install triton)', True)
    if cuda_available():
        return None
    how = "set KERAS_ANTISYM_KERNEL_INTERPRET=1 to interpret the kernel, for tests"
    if backend == "torch":
        if INTERPRET and _triton_interpreted():
            return None
        how += ", with TRITON_INTERPRET=1 before triton is imported"
    elif INTERPRET:
        return None
    return invalid("fused_kernel", f'"auto" or False without a CUDA GPU ({how})', True)


def _triton_found() -> bool:
    return importlib.util.find_spec("triton") is not None


def _triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_layer(cell: Any) -> None:
    """Raise the `ValueError` of a layer built with `fused_kernel=True` that never runs it.

    Conditions fixed at construction: a kernel backend, a float32 or
    bfloat16 compute dtype, tanh (and a sigmoid gate), at most `MAX_UNITS` units, and no
    recurrent dropout (the kernel has none).
    """
    problem = _static_problem(cell)
    if problem is None and cell.recurrent_dropout:
        problem = _unmet("recurrent_dropout", "0", repr(cell.recurrent_dropout))
    if problem is not None:
        raise problem


def check_call(cell: Any, sequences: Any, mask: Any) -> None:
    """Raise the `ValueError` of a `fused_kernel=True` call that the kernel cannot run.

    Conditions known at the call: no mask, float32 or bfloat16 sequences of a static
    positive length and width that the kernels take (`fits`), and a CUDA
    GPU (or `INTERPRET`); and again those of `check_layer`.
    """
    problem = _static_problem(cell)
    if problem is None and mask is not None:
        shape = getattr(mask, "shape", None)
        got = "a mask" if shape is None else f"a mask of shape {tuple(shape)}"
        problem = _unmet("mask", "None", got)
    if problem is None:
        problem = _sequences_problem(cell, sequences)
    if problem is None:
        problem = _device_problem()
    if problem is not None:
        raise problem


def recurrence(
    u: Any, mt: Any, h0: Any, epsilon: float, gated: bool = False, precision: str | None = None
) -> Any:
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


def run_layer(cell: Any, sequences: Any, h0: Any, go_backwards: bool) -> tuple[Any, Any, list[Any]]:
    """`(last_output, outputs, [last_state])` of a fused layer's call, by the kernel.

    `sequences` already carry their input dropout; the inputs of all steps
    are projected by one product (as `hoist_inputs`), the operand is the
    one `recurrent_operand()` of this call, and `go_backwards` reverses the
    steps (the outputs are in processing order, as the loop's). Under
    `mixed_bfloat16` the projection and the operand are bfloat16 and `h0`
    float32 (the cell's state dtype); the states come back in float32.
    """
    operand, _ = cell.cached_sequence_constants()
    projected = cell.project_inputs(sequences)
    if go_backwards:
        projected = ops.flip(projected, axis=1)
    states = recurrence(projected, operand, h0, cell.epsilon, gated=cell.num_blocks == 2)
    last = states[:, -1]
    return last, states, [last]


__all__ = [
    "check_call",
    "check_layer",
    "cuda_available",
    "fits",
    "kernel_applies",
    "recurrence",
    "run_layer",
]
