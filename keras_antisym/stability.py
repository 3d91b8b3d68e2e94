"""Stability of AntisymmetricRNNs (Chang et al., ICLR 2019), computed from the weights.

The paper's case rests on two measurable properties:

- Proposition 2 (forward-Euler stability): with `J_f` the Jacobian of the
  ODE's right-hand side `f(h) = act(M h + V x + b)`, the Euler step is stable
  when `max_i |1 + ε·λ_i(J_f)| ≤ 1`. For the AntisymmetricRNN
  `J_f = diag(act'(a))·M` with `M = W - Wᵀ - γI`, whose eigenvalues have real
  part `≈ -γ`, so the margin stays close to (and, for small states, just
  above or below) 1.
- Figure 2: the eigenvalues of the end-to-end Jacobian `∂h_T/∂h_0` keep
  magnitudes near 1 (no exploding or vanishing gradients) for small `γ`.

Everything here is computed analytically with `keras.ops`, from the cell's
own step (`AntisymmetricCell.step` with `return_slope=True` gives `h_t` and
the diagonal `d` of `∂h_t/∂h_{t-1} = I + ε·diag(d)·M`), so it runs on the
TensorFlow, JAX and PyTorch backends and follows any cell variant.
Eigen- and singular value decompositions run in NumPy (float64) on the
resulting matrices: `keras.ops` has no general (non-symmetric) eigensolver on
every backend. Results are NumPy arrays or Python floats. The
`StabilityDiagnostics` callback (`keras_antisym.diagnostics`) logs them
during training.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt
from keras import ops

from keras_antisym._typing import DType, FloatArray, Tensor, TensorLike
from keras_antisym._validation import invalid
from keras_antisym.cells import AntisymmetricCell

__all__ = [
    "end_to_end_jacobian",
    "end_to_end_jacobian_stats",
    "eigenvalue_magnitude_stats",
    "get_antisymmetric_cell",
    "ode_jacobian",
    "stability_margin",
    "step_jacobian",
    "transition_eigenvalues",
    "transition_matrix",
]


def get_antisymmetric_cell(layer: Any) -> AntisymmetricCell:
    """The `AntisymmetricCell` of a cell, an RNN layer, or a fused layer.

    Args:
        layer: An `AntisymmetricCell`/`GatedAntisymmetricCell`, or any layer
            with such a cell as `layer.cell` (`keras.layers.RNN(cell)`,
            `AntisymmetricRNN`, `GatedAntisymmetricRNN`).

    Returns:
        The cell. Raises `ValueError` for anything else or an unbuilt cell.
    """
    cell = layer if isinstance(layer, AntisymmetricCell) else getattr(layer, "cell", None)
    if not isinstance(cell, AntisymmetricCell):
        raise invalid(
            "layer", "an AntisymmetricCell or a layer whose `cell` is one", type(layer).__name__
        )
    if not cell.built:
        raise invalid("layer", "a built layer (call it on data first)", cell.name)
    return cell


def reads_backwards(layer: Any) -> bool:
    """Whether `layer` reads its sequences backwards (`go_backwards`; never a cell)."""
    return bool(getattr(layer, "go_backwards", False)) and not isinstance(layer, AntisymmetricCell)


def transition_matrix(layer: Any) -> FloatArray:
    """The recurrent matrix `M = W - Wᵀ - γI` of a cell or layer, in NumPy.

    Paper orientation: `h_t = h_{t-1} + ε·tanh(M h_{t-1} + V x_t + b)`.
    For the ablation (`antisymmetric=False`) this is `U - γI`.

    Args:
        layer: A built cell or RNN layer (see `get_antisymmetric_cell`).

    Returns:
        A float64 NumPy array of shape `(units, units)`.

    Examples:
        >>> import numpy as np
        >>> from keras_antisym import AntisymmetricRNN, stability
        >>> layer = AntisymmetricRNN(8, gamma=0.1)
        >>> _ = layer(np.zeros((1, 5, 3), "float32"))
        >>> m = stability.transition_matrix(layer)
        >>> bool(np.allclose(m + m.T, -0.2 * np.eye(8), atol=1e-6))
        True
    """
    cell = get_antisymmetric_cell(layer)
    return ops.convert_to_numpy(cell.transition_matrix()).astype("float64")


def transition_eigenvalues(layer: Any) -> npt.NDArray[np.inexact[Any]]:
    """Eigenvalues of `M = W - Wᵀ - γI`: `-γ ± i·ω_k` when antisymmetric.

    Args:
        layer: A built cell or RNN layer (see `get_antisymmetric_cell`).

    Returns:
        A complex128 NumPy array of shape `(units,)`, sorted by imaginary part.

    Examples:
        >>> import numpy as np
        >>> from keras_antisym import AntisymmetricCell, stability
        >>> cell = AntisymmetricCell(4, gamma=0.5)
        >>> cell.build((None, 2))
        >>> eig = stability.transition_eigenvalues(cell)
        >>> bool(np.allclose(eig.real, -0.5, atol=1e-5))
        True
    """
    eig = np.linalg.eigvals(transition_matrix(layer))
    return eig[np.lexsort((eig.real, eig.imag))]


def _as_batch(name: str, value: TensorLike, width: int | None, dtype: DType) -> tuple[Tensor, bool]:
    value = ops.convert_to_tensor(value, dtype=dtype)
    squeeze = len(value.shape) == 1
    if squeeze:
        value = ops.expand_dims(value, 0)
    if len(value.shape) != 2 or (width is not None and value.shape[-1] != width):
        raise invalid(
            name,
            f"a tensor of shape (features,) or (batch, features) with {width} features",
            tuple(value.shape),
        )
    return value, squeeze


def _step_factors(
    layer: Any, state: TensorLike, inputs: TensorLike
) -> tuple[AntisymmetricCell, FloatArray, bool]:
    """The cell, the diagonal `d` of its step at `(state, inputs)`, and whether unbatched."""
    cell = get_antisymmetric_cell(layer)
    dtype = cell.kernel.dtype
    h, squeeze = _as_batch("state", state, cell.units, dtype)
    x, _ = _as_batch("inputs", inputs, cell.kernel.shape[0], dtype)
    operand, weights = cell.sequence_constants(cell.variable_dtype)
    _, d = cell.step(h, cell.project_blocks(x, weights), operand, return_slope=True)
    return cell, ops.convert_to_numpy(d).astype("float64"), squeeze


def ode_jacobian(layer: Any, state: TensorLike, inputs: TensorLike) -> FloatArray:
    """Jacobian `J_f = ∂f/∂h` of the ODE `h' = f(h, x)` that the cell discretizes.

        J_f = diag(act'(M h + V x + b)) · M                       (ungated)
        J_f = diag(c ⊙ σ'(a_z) + z ⊙ act'(a_c)) · M                  (gated)

    so that one Euler step has Jacobian `I + ε·J_f` (`step_jacobian`).

    Args:
        layer: A built cell or RNN layer (see `get_antisymmetric_cell`).
        state: `h_{t-1}`, shape `(units,)` or `(batch, units)`.
        inputs: `x_t`, shape `(input_dim,)` or `(batch, input_dim)`.

    Returns:
        A float64 NumPy array `(units, units)`, or `(batch, units, units)`
        when `state` is batched.

    Examples:
        >>> import numpy as np
        >>> from keras_antisym import AntisymmetricCell, stability
        >>> cell = AntisymmetricCell(3, gamma=0.0)
        >>> cell.build((None, 2))
        >>> j = stability.ode_jacobian(cell, np.zeros(3), np.zeros(2))
        >>> bool(np.allclose(j, -j.T, atol=1e-6))  # zero bias: J_f = M
        True
    """
    cell, d, squeeze = _step_factors(layer, state, inputs)
    jac = d[:, :, None] * transition_matrix(cell)[None]
    return jac[0] if squeeze else jac


def step_jacobian(layer: Any, state: TensorLike, inputs: TensorLike) -> FloatArray:
    """Jacobian `∂h_t/∂h_{t-1} = I + ε·J_f` of one step at a state and input.

    Args:
        layer: A built cell or RNN layer (see `get_antisymmetric_cell`).
        state: `h_{t-1}`, shape `(units,)` or `(batch, units)`.
        inputs: `x_t`, shape `(input_dim,)` or `(batch, input_dim)`.

    Returns:
        A float64 NumPy array `(units, units)` (or `(batch, units, units)`).

    Examples:
        >>> import numpy as np
        >>> from keras_antisym import AntisymmetricCell, stability
        >>> cell = AntisymmetricCell(3, epsilon=0.1, gamma=0.2)
        >>> cell.build((None, 2))
        >>> j = stability.step_jacobian(cell, np.zeros(3), np.zeros(2))
        >>> bool(np.allclose(np.diag(j), 1 - 0.1 * 0.2, atol=1e-6))
        True
    """
    cell = get_antisymmetric_cell(layer)
    jac = ode_jacobian(cell, state, inputs)
    return np.eye(cell.units) + cell.epsilon * jac


def stability_margin(layer: Any, state: TensorLike, inputs: TensorLike) -> float | FloatArray:
    """The forward-Euler margin `max_i |1 + ε·λ_i(J_f)|` (Proposition 2).

    At most 1: the Euler step is stable. Purely imaginary `λ_i` (`γ = 0`)
    give a margin above 1, the outward spiral of the paper's Figure 1(g);
    the diffusion `γ` brings it back to about `sqrt(1 - 2εγ·d + ε²·d²·ω²)`.
    It equals the spectral radius of `step_jacobian`.

    Args:
        layer: A built cell or RNN layer (see `get_antisymmetric_cell`).
        state: `h_{t-1}`, shape `(units,)` or `(batch, units)`.
        inputs: `x_t`, shape `(input_dim,)` or `(batch, input_dim)`.

    Returns:
        A Python float, or a NumPy array `(batch,)` for batched states.

    Examples:
        >>> import numpy as np
        >>> from keras_antisym import AntisymmetricCell, stability
        >>> cell = AntisymmetricCell(4, epsilon=0.1, gamma=0.0)
        >>> cell.build((None, 2))
        >>> bool(stability.stability_margin(cell, np.zeros(4), np.zeros(2)) >= 1.0)
        True
    """
    cell = get_antisymmetric_cell(layer)
    jac = ode_jacobian(cell, state, inputs)
    eig = np.linalg.eigvals(jac)
    margin = np.max(np.abs(1.0 + cell.epsilon * eig), axis=-1)
    return float(margin) if np.ndim(margin) == 0 else margin


@overload
def end_to_end_jacobian(
    layer: Any,
    sequences: TensorLike,
    initial_state: TensorLike | None = None,
    return_final_state: Literal[False] = False,
) -> FloatArray: ...


@overload
def end_to_end_jacobian(
    layer: Any,
    sequences: TensorLike,
    initial_state: TensorLike | None = None,
    *,
    return_final_state: Literal[True],
) -> tuple[FloatArray, FloatArray]: ...


@overload
def end_to_end_jacobian(
    layer: Any,
    sequences: TensorLike,
    initial_state: TensorLike | None,
    return_final_state: Literal[True],
) -> tuple[FloatArray, FloatArray]: ...


@overload
def end_to_end_jacobian(
    layer: Any,
    sequences: TensorLike,
    initial_state: TensorLike | None = None,
    return_final_state: bool = False,
) -> FloatArray | tuple[FloatArray, FloatArray]: ...


def end_to_end_jacobian(
    layer: Any,
    sequences: TensorLike,
    initial_state: TensorLike | None = None,
    return_final_state: bool = False,
) -> FloatArray | tuple[FloatArray, FloatArray]:
    """The end-to-end Jacobian `∂h_T/∂h_0 = Π_t (I + ε·diag(d_t)·M)` of a sequence.

    The product is accumulated with `keras.ops` as `P ← P + ε·d_t ⊙ (M P)`,
    one `(batch, units, units)` matrix product per step, in the dtype of the
    weights. A layer with `go_backwards=True` reads the sequence backwards,
    as it does when called. Masks and dropout are not applied.

    Args:
        layer: A built cell or RNN layer (see `get_antisymmetric_cell`).
        sequences: Inputs of shape `(timesteps, input_dim)` or
            `(batch, timesteps, input_dim)`, the inputs of the recurrent
            layer (not of the model).
        initial_state: Optional `h_0`, `(units,)` or `(batch, units)`;
            zeros by default.
        return_final_state: Boolean, also return `h_T`.

    Returns:
        A float64 NumPy array `(batch, units, units)` (no batch axis when
        `sequences` has none), and `h_T` when `return_final_state`.

    Examples:
        >>> import numpy as np
        >>> from keras_antisym import AntisymmetricRNN, stability
        >>> layer = AntisymmetricRNN(16, epsilon=0.1, gamma=0.01)
        >>> x = np.random.RandomState(0).randn(2, 50, 3).astype("float32")
        >>> _ = layer(x)
        >>> stability.end_to_end_jacobian(layer, x).shape
        (2, 16, 16)
    """
    cell = get_antisymmetric_cell(layer)
    x, h, squeeze = _sequences_and_state(cell, sequences, initial_state)
    if reads_backwards(layer):
        x = ops.flip(x, axis=1)
    operand, weights = cell.sequence_constants(cell.variable_dtype)
    m = ops.transpose(operand)
    projected = cell.project_blocks(x, weights)
    batch, units = x.shape[0], cell.units
    product = ops.broadcast_to(ops.eye(units, dtype=x.dtype), (batch, units, units))
    for t in range(x.shape[1]):
        h, d = cell.step(h, [block[:, t] for block in projected], operand, return_slope=True)
        product = product + cell.epsilon * d[:, :, None] * ops.matmul(m, product)
    jac = ops.convert_to_numpy(product).astype("float64")
    h = ops.convert_to_numpy(h).astype("float64")
    if squeeze:
        jac, h = jac[0], h[0]
    return (jac, h) if return_final_state else jac


def _sequences_and_state(
    cell: AntisymmetricCell, sequences: TensorLike, initial_state: TensorLike | None
) -> tuple[Tensor, Tensor, bool]:
    """`(batch, timesteps, input_dim)` inputs, `h_0` (zeros by default), whether unbatched."""
    dtype = cell.kernel.dtype
    x = ops.convert_to_tensor(sequences, dtype=dtype)
    squeeze = len(x.shape) == 2
    if squeeze:
        x = ops.expand_dims(x, 0)
    if len(x.shape) != 3 or x.shape[-1] != cell.kernel.shape[0]:
        raise invalid(
            "sequences",
            f"a tensor of shape (batch, timesteps, {cell.kernel.shape[0]})",
            tuple(x.shape),
        )
    batch = x.shape[0]
    if initial_state is None:
        return x, ops.zeros((batch, cell.units), dtype=dtype), squeeze
    h, _ = _as_batch("initial_state", initial_state, cell.units, dtype)
    return x, ops.broadcast_to(h, (batch, cell.units)), squeeze


def eigenvalue_magnitude_stats(matrices: TensorLike) -> dict[str, Any]:
    """Spectral statistics of square matrices (the quantities of Figure 2).

    Args:
        matrices: Array `(units, units)` or `(batch, units, units)`.

    Returns:
        A dict of Python floats and arrays: `eig_abs_mean`, `eig_abs_std`,
        `eig_abs_min`, `eig_abs_max` of the eigenvalue magnitudes pooled over
        the batch (as in Figure 2); `sv_max`, `sv_min` (pooled) and
        `singular_values`, a NumPy array `(batch, units)` in descending order.

    Examples:
        >>> import numpy as np
        >>> from keras_antisym import stability
        >>> stats = stability.eigenvalue_magnitude_stats(np.diag([2.0, 0.5]))
        >>> stats["eig_abs_mean"], stats["sv_max"]
        (1.25, 2.0)
    """
    mats = np.asarray(matrices, dtype="float64")
    if mats.ndim == 2:
        mats = mats[None]
    if mats.ndim != 3 or mats.shape[-1] != mats.shape[-2]:
        raise invalid("matrices", "square matrices (..., n, n)", mats.shape)
    mags = np.abs(np.linalg.eigvals(mats)).ravel()
    svs = np.linalg.svd(mats, compute_uv=False)
    return {
        "eig_abs_mean": float(mags.mean()),
        "eig_abs_std": float(mags.std()),
        "eig_abs_min": float(mags.min()),
        "eig_abs_max": float(mags.max()),
        "sv_max": float(svs.max()),
        "sv_min": float(svs.min()),
        "singular_values": svs,
    }


def end_to_end_jacobian_stats(
    layer: Any, sequences: TensorLike, initial_state: TensorLike | None = None
) -> dict[str, Any]:
    """`eigenvalue_magnitude_stats` of `end_to_end_jacobian(layer, sequences)`.

    Eigenvalue magnitudes with mean near 1 and small standard deviation mean
    gradients that neither explode nor vanish over the sequence.

    Args:
        layer: A built cell or RNN layer (see `get_antisymmetric_cell`).
        sequences: `(batch, timesteps, input_dim)` inputs of the layer.
        initial_state: Optional `h_0`.

    Returns:
        The dict of `eigenvalue_magnitude_stats`.

    Examples:
        >>> import numpy as np
        >>> from keras_antisym import AntisymmetricRNN, stability
        >>> layer = AntisymmetricRNN(16, epsilon=0.01, gamma=0.001)
        >>> x = np.random.RandomState(0).randn(2, 100, 3).astype("float32")
        >>> _ = layer(x)
        >>> stats = stability.end_to_end_jacobian_stats(layer, x)
        >>> 0.9 < stats["eig_abs_mean"] < 1.1
        True
    """
    return eigenvalue_magnitude_stats(end_to_end_jacobian(layer, sequences, initial_state))
