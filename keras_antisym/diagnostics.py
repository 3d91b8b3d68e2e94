"""Stability diagnostics for AntisymmetricRNNs (Chang et al., ICLR 2019).

The paper's case rests on two measurable properties:

- Proposition 2 (forward-Euler stability): with `J_f` the Jacobian of the
  ODE's right-hand side `f(h) = act(M h + V x + b)`, the Euler step is stable
  when `max_i |1 + ε·λ_i(J_f)| ≤ 1`. For the AntisymmetricRNN
  `J_f = diag(act'(a))·M` with `M = W - Wᵀ - γI`, whose eigenvalues have real
  part `≈ -γ`, so the margin stays close to (and, for small states, just
  above or below) 1.
- Figure 2: the eigenvalues of the end-to-end Jacobian `∂h_T/∂h_0` keep
  magnitudes near 1 (no exploding or vanishing gradients) for small `γ`.

Everything here is computed analytically from a cell's weights with
`keras.ops`, so it runs on the TensorFlow, JAX and PyTorch backends.
Eigen- and singular value decompositions run in NumPy (float64) on the
resulting matrices: `keras.ops` has no general (non-symmetric) eigensolver on
every backend. Results are NumPy arrays or Python floats.
"""

import math
import os

import keras
import numpy as np
from keras import ops

from keras_antisym.cells import AntisymmetricCell, GatedAntisymmetricCell

__all__ = [
    "StabilityDiagnostics",
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


def _invalid(name, expected, value):
    return ValueError(
        f"Received an invalid value for argument `{name}`, expected {expected}, got {value!r}."
    )


def get_antisymmetric_cell(layer):
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
        raise _invalid(
            "layer", "an AntisymmetricCell or a layer whose `cell` is one", type(layer).__name__
        )
    if not cell.built:
        raise _invalid("layer", "a built layer (call it on data first)", cell.name)
    return cell


def _go_backwards(layer):
    return bool(getattr(layer, "go_backwards", False)) and not isinstance(layer, AntisymmetricCell)


def transition_matrix(layer):
    """The recurrent matrix `M = W - Wᵀ - γI` of a cell or layer, in NumPy.

    Paper orientation: `h_t = h_{t-1} + ε·tanh(M h_{t-1} + V x_t + b)`.
    For the ablation (`antisymmetric=False`) this is `U - γI`.

    Args:
        layer: A built cell or RNN layer (see `get_antisymmetric_cell`).

    Returns:
        A float64 NumPy array of shape `(units, units)`.

    Example:

    >>> import numpy as np
    >>> from keras_antisym import AntisymmetricRNN, diagnostics
    >>> layer = AntisymmetricRNN(8, gamma=0.1)
    >>> _ = layer(np.zeros((1, 5, 3), "float32"))
    >>> m = diagnostics.transition_matrix(layer)
    >>> bool(np.allclose(m + m.T, -0.2 * np.eye(8), atol=1e-6))
    True
    """
    cell = get_antisymmetric_cell(layer)
    return ops.convert_to_numpy(cell.transition_matrix()).astype("float64")


def transition_eigenvalues(layer):
    """Eigenvalues of `M = W - Wᵀ - γI`: `-γ ± i·ω_k` when antisymmetric.

    Args:
        layer: A built cell or RNN layer (see `get_antisymmetric_cell`).

    Returns:
        A complex128 NumPy array of shape `(units,)`, sorted by imaginary part.

    Example:

    >>> import numpy as np
    >>> from keras_antisym import AntisymmetricCell, diagnostics
    >>> cell = AntisymmetricCell(4, gamma=0.5)
    >>> cell.build((None, 2))
    >>> eig = diagnostics.transition_eigenvalues(cell)
    >>> bool(np.allclose(eig.real, -0.5, atol=1e-5))
    True
    """
    eig = np.linalg.eigvals(transition_matrix(layer))
    return eig[np.lexsort((eig.real, eig.imag))]


def _derivative(activation, x):
    """`activation'(x)` in closed form for the usual activations."""
    name = keras.activations.serialize(activation)
    name = name if isinstance(name, str) else getattr(activation, "__name__", "")
    if name == "tanh":
        return 1.0 - ops.square(ops.tanh(x))
    if name == "sigmoid":
        s = ops.sigmoid(x)
        return s * (1.0 - s)
    if name == "linear":
        return ops.ones_like(x)
    if name == "relu":
        return ops.cast(x > 0, x.dtype)
    if name == "softsign":
        return 1.0 / ops.square(1.0 + ops.abs(x))
    # Any other activation: central differences, accurate to ~1e-3 relative in
    # float32 (backend autodiff would tie this module to one backend).
    step = 1e-2
    return (activation(x + step) - activation(x - step)) / (2 * step)


def _as_batch(name, value, width, dtype):
    value = ops.convert_to_tensor(value, dtype=dtype)
    squeeze = len(value.shape) == 1
    if squeeze:
        value = ops.expand_dims(value, 0)
    if len(value.shape) != 2 or (width is not None and value.shape[-1] != width):
        raise _invalid(
            name,
            f"a tensor of shape (features,) or (batch, features) with {width} features",
            tuple(value.shape),
        )
    return value, squeeze


def _diagonal_factor(cell, h, projected, operand):
    """`d` with `∂h_t/∂h_{t-1} = I + ε·diag(d)·M`, and `h_t`.

    Ungated: `d = act'(a)`. Gated (`h_t = h + ε z ⊙ c`, both `z` and `c`
    reading `M h`): `d = c ⊙ σ'(a_z) + z ⊙ act'(a_c)`, so the Jacobian keeps the
    paper's "diagonal times M" form.
    """
    shared = ops.matmul(h, operand)
    if isinstance(cell, GatedAntisymmetricCell):
        a_z = shared + projected[..., : cell.units]
        a_c = shared + projected[..., cell.units :]
        z = cell.recurrent_activation(a_z)
        c = cell.activation(a_c)
        d = c * _derivative(cell.recurrent_activation, a_z) + z * _derivative(cell.activation, a_c)
        return d, h + cell.epsilon * z * c
    a = shared + projected
    return _derivative(cell.activation, a), h + cell.epsilon * cell.activation(a)


def _step_factors(layer, state, inputs):
    cell = get_antisymmetric_cell(layer)
    dtype = cell.kernel.dtype
    h, squeeze = _as_batch("state", state, cell.units, dtype)
    x, _ = _as_batch("inputs", inputs, cell.kernel.shape[0], dtype)
    d, _ = _diagonal_factor(cell, h, cell.project_inputs(x), cell.recurrent_operand())
    return cell, ops.convert_to_numpy(d).astype("float64"), squeeze


def ode_jacobian(layer, state, inputs):
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

    Example:

    >>> import numpy as np
    >>> from keras_antisym import AntisymmetricCell, diagnostics
    >>> cell = AntisymmetricCell(3, gamma=0.0)
    >>> cell.build((None, 2))
    >>> j = diagnostics.ode_jacobian(cell, np.zeros(3), np.zeros(2))
    >>> bool(np.allclose(j, -j.T, atol=1e-6))  # zero bias: J_f = M
    True
    """
    cell, d, squeeze = _step_factors(layer, state, inputs)
    jac = d[:, :, None] * transition_matrix(cell)[None]
    return jac[0] if squeeze else jac


def step_jacobian(layer, state, inputs):
    """Jacobian `∂h_t/∂h_{t-1} = I + ε·J_f` of one step at a state and input.

    Args:
        layer: A built cell or RNN layer (see `get_antisymmetric_cell`).
        state: `h_{t-1}`, shape `(units,)` or `(batch, units)`.
        inputs: `x_t`, shape `(input_dim,)` or `(batch, input_dim)`.

    Returns:
        A float64 NumPy array `(units, units)` (or `(batch, units, units)`).

    Example:

    >>> import numpy as np
    >>> from keras_antisym import AntisymmetricCell, diagnostics
    >>> cell = AntisymmetricCell(3, epsilon=0.1, gamma=0.2)
    >>> cell.build((None, 2))
    >>> j = diagnostics.step_jacobian(cell, np.zeros(3), np.zeros(2))
    >>> bool(np.allclose(np.diag(j), 1 - 0.1 * 0.2, atol=1e-6))
    True
    """
    cell = get_antisymmetric_cell(layer)
    jac = ode_jacobian(cell, state, inputs)
    return np.eye(cell.units) + cell.epsilon * jac


def stability_margin(layer, state, inputs):
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

    Example:

    >>> import numpy as np
    >>> from keras_antisym import AntisymmetricCell, diagnostics
    >>> cell = AntisymmetricCell(4, epsilon=0.1, gamma=0.0)
    >>> cell.build((None, 2))
    >>> bool(diagnostics.stability_margin(cell, np.zeros(4), np.zeros(2)) >= 1.0)
    True
    """
    cell = get_antisymmetric_cell(layer)
    jac = ode_jacobian(cell, state, inputs)
    eig = np.linalg.eigvals(jac)
    margin = np.max(np.abs(1.0 + cell.epsilon * eig), axis=-1)
    return float(margin) if np.ndim(margin) == 0 else margin


def end_to_end_jacobian(layer, sequences, initial_state=None, return_final_state=False):
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

    Example:

    >>> import numpy as np
    >>> from keras_antisym import AntisymmetricRNN, diagnostics
    >>> layer = AntisymmetricRNN(16, epsilon=0.1, gamma=0.01)
    >>> x = np.random.RandomState(0).randn(2, 50, 3).astype("float32")
    >>> _ = layer(x)
    >>> diagnostics.end_to_end_jacobian(layer, x).shape
    (2, 16, 16)
    """
    cell = get_antisymmetric_cell(layer)
    dtype = cell.kernel.dtype
    x = ops.convert_to_tensor(sequences, dtype=dtype)
    squeeze = len(x.shape) == 2
    if squeeze:
        x = ops.expand_dims(x, 0)
    if len(x.shape) != 3 or x.shape[-1] != cell.kernel.shape[0]:
        raise _invalid(
            "sequences",
            f"a tensor of shape (batch, timesteps, {cell.kernel.shape[0]})",
            tuple(x.shape),
        )
    batch, steps = x.shape[0], x.shape[1]
    if initial_state is None:
        h = ops.zeros((batch, cell.units), dtype=dtype)
    else:
        h, _ = _as_batch("initial_state", initial_state, cell.units, dtype)
        h = ops.broadcast_to(h, (batch, cell.units))
    if _go_backwards(layer):
        x = ops.flip(x, axis=1)
    operand = cell.recurrent_operand()
    m = ops.transpose(operand)
    projected = cell.project_inputs(x)
    product = ops.broadcast_to(ops.eye(cell.units, dtype=dtype), (batch, cell.units, cell.units))
    for t in range(steps):
        d, h_next = _diagonal_factor(cell, h, projected[:, t], operand)
        product = product + cell.epsilon * d[:, :, None] * ops.matmul(m, product)
        h = h_next
    jac = ops.convert_to_numpy(product).astype("float64")
    h = ops.convert_to_numpy(h).astype("float64")
    if squeeze:
        jac, h = jac[0], h[0]
    return (jac, h) if return_final_state else jac


def eigenvalue_magnitude_stats(matrices):
    """Spectral statistics of square matrices (the quantities of Figure 2).

    Args:
        matrices: Array `(units, units)` or `(batch, units, units)`.

    Returns:
        A dict of Python floats and arrays: `eig_abs_mean`, `eig_abs_std`,
        `eig_abs_min`, `eig_abs_max` of the eigenvalue magnitudes pooled over
        the batch (as in Figure 2); `sv_max`, `sv_min` (pooled) and
        `singular_values`, a NumPy array `(batch, units)` in descending order.

    Example:

    >>> import numpy as np
    >>> from keras_antisym import diagnostics
    >>> stats = diagnostics.eigenvalue_magnitude_stats(np.diag([2.0, 0.5]))
    >>> stats["eig_abs_mean"], stats["sv_max"]
    (1.25, 2.0)
    """
    mats = np.asarray(matrices, dtype="float64")
    if mats.ndim == 2:
        mats = mats[None]
    if mats.ndim != 3 or mats.shape[-1] != mats.shape[-2]:
        raise _invalid("matrices", "square matrices (..., n, n)", mats.shape)
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


def end_to_end_jacobian_stats(layer, sequences, initial_state=None):
    """`eigenvalue_magnitude_stats` of `end_to_end_jacobian(layer, sequences)`.

    Eigenvalue magnitudes with mean near 1 and small standard deviation mean
    gradients that neither explode nor vanish over the sequence.

    Args:
        layer: A built cell or RNN layer (see `get_antisymmetric_cell`).
        sequences: `(batch, timesteps, input_dim)` inputs of the layer.
        initial_state: Optional `h_0`.

    Returns:
        The dict of `eigenvalue_magnitude_stats`.

    Example:

    >>> import numpy as np
    >>> from keras_antisym import AntisymmetricRNN, diagnostics
    >>> layer = AntisymmetricRNN(16, epsilon=0.01, gamma=0.001)
    >>> x = np.random.RandomState(0).randn(2, 100, 3).astype("float32")
    >>> _ = layer(x)
    >>> stats = diagnostics.end_to_end_jacobian_stats(layer, x)
    >>> 0.9 < stats["eig_abs_mean"] < 1.1
    True
    """
    return eigenvalue_magnitude_stats(end_to_end_jacobian(layer, sequences, initial_state))


def _recurrent_layers(model):
    """The layers of `model` (nested models included) with an AntisymmetricCell."""
    found = []
    for layer in getattr(model, "layers", []):
        if isinstance(getattr(layer, "cell", None), AntisymmetricCell):
            found.append(layer)
        elif hasattr(layer, "layers"):
            found.extend(_recurrent_layers(layer))
    return found


def _loss_function(model):
    loss = getattr(model, "loss", None)
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    return loss if callable(loss) else None


def _gradients(model, loss_fn, x, y):
    """Gradients of `loss_fn(y, model(x))` for `model.trainable_variables`.

    Keras 3 has no backend-agnostic gradient function, so this dispatches on
    the backend's own autodiff (TensorFlow, JAX, PyTorch); on any other
    backend it returns `None` and no gradient norms are logged.
    """
    backend = keras.backend.backend()
    variables = model.trainable_variables
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = ops.mean(loss_fn(y, model(x, training=False)))
        grads = tape.gradient(loss, variables)
    elif backend == "jax":
        import jax

        non_trainable = [v.value for v in model.non_trainable_variables]

        def compute(trainable):
            y_pred, _ = model.stateless_call(trainable, non_trainable, x, training=False)
            return ops.mean(loss_fn(y, y_pred))

        grads = jax.grad(compute)([v.value for v in variables])
    elif backend == "torch":
        import torch

        with torch.enable_grad():
            loss = ops.mean(loss_fn(y, model(x, training=False)))
            grads = torch.autograd.grad(loss, [v.value for v in variables], allow_unused=True)
    else:
        return None
    return [None if g is None else ops.convert_to_numpy(g) for g in grads]


@keras.saving.register_keras_serializable(package="keras_antisym")
class StabilityDiagnostics(keras.callbacks.Callback):
    """Logs the stability diagnostics of every AntisymmetricRNN layer.

    Every `every_n_steps` training batches, for each layer of the model whose
    `cell` is an `AntisymmetricCell` (fused, wrapped, nested models too), it
    records under `"{prefix}/{layer.name}/..."`:

    - `m_eig_real_max`, `m_eig_abs_max`: of the eigenvalues of
      `M = W - Wᵀ - γI` (real parts `-γ` while `M + Mᵀ = -2γI`).
    - `euler_margin`: `max_i |1 + ε·λ_i(J_f)|` (Proposition 2), the maximum
      over the probe batch at its last step, at `(h_{T-1}, x_T)` (at
      `h = 0, x = 0` without probe).
    - with a probe and `jacobian=True`: `e2e_eig_abs_mean`, `e2e_eig_abs_std`,
      `e2e_sv_max`, `e2e_sv_min` of `∂h_T/∂h_0` over the probe sequences
      (truncated to `probe_steps`), the quantities of the paper's Figure 2.
    - with probe targets and a compiled single loss: `"{prefix}/grad_norm/
      {layer.name}"`, the L2 norm of the loss gradient for each top-level
      layer with trainable weights, on the probe batch, in inference mode.
      Uses the backend's autodiff (TensorFlow, JAX or PyTorch).

    The latest values are added to the `logs` of the batch and of the epoch,
    so they appear in `model.fit(...).history` (one value per epoch, the last
    computed); every computed value is kept in `self.records`. With `log_dir`
    they are also written as TensorBoard scalars, at the global train step.

    Cost per evaluation: one `units³` eigendecomposition per layer, plus
    `probe_steps` `(batch, units, units)` products for the Jacobian. Keep the
    probe small (a few sequences) to leave it on during training.

    Args:
        every_n_steps: Positive integer, evaluate every this many batches.
        probe_data: Optional fixed probe batch: model inputs `x`, or `(x, y)`
            to also log gradient norms.
        probe_steps: Optional positive integer, the number of leading time
            steps of the probe used for the end-to-end Jacobian.
        jacobian: Boolean, whether to compute the end-to-end Jacobian stats.
        log_dir: Optional directory for TensorBoard event files.
        prefix: String, prefix of the logged names.

    Example:

    >>> import numpy as np, keras
    >>> from keras_antisym import AntisymmetricRNN, StabilityDiagnostics
    >>> x = np.random.RandomState(0).randn(32, 20, 3).astype("float32")
    >>> y = (x[:, 0, 0] > 0).astype("int32")
    >>> model = keras.Sequential([
    ...     keras.Input((20, 3)),
    ...     AntisymmetricRNN(8, epsilon=0.1, gamma=0.01, name="arnn"),
    ...     keras.layers.Dense(2),
    ... ])
    >>> model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    >>> diag = StabilityDiagnostics(every_n_steps=2, probe_data=(x[:4], y[:4]))
    >>> history = model.fit(x, y, batch_size=8, epochs=1, callbacks=[diag], verbose=0)
    >>> "stability/arnn/euler_margin" in history.history
    True
    """

    def __init__(
        self,
        every_n_steps=100,
        probe_data=None,
        probe_steps=None,
        jacobian=True,
        log_dir=None,
        prefix="stability",
    ):
        super().__init__()
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int):
            raise _invalid("every_n_steps", "a positive integer", every_n_steps)
        if every_n_steps <= 0:
            raise _invalid("every_n_steps", "a positive integer", every_n_steps)
        if probe_steps is not None and (not isinstance(probe_steps, int) or probe_steps <= 0):
            raise _invalid("probe_steps", "None or a positive integer", probe_steps)
        self.every_n_steps = every_n_steps
        if isinstance(probe_data, (tuple, list)):
            self.probe_x, self.probe_y = probe_data[0], probe_data[1]
        else:
            self.probe_x, self.probe_y = probe_data, None
        self.probe_steps = probe_steps
        self.jacobian = bool(jacobian)
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self.prefix = prefix
        self.records = []
        self.latest = {}
        self._step = 0
        self._writer = None
        self._layers = None
        self._extractor = None

    def get_config(self):
        # The probe batch is data, not configuration.
        return {
            "every_n_steps": self.every_n_steps,
            "probe_steps": self.probe_steps,
            "jacobian": self.jacobian,
            "log_dir": self.log_dir,
            "prefix": self.prefix,
        }

    def on_train_begin(self, logs=None):
        self._layers = _recurrent_layers(self.model)
        self._extractor = None
        if self.probe_x is not None and self._layers:
            try:
                # The recurrent layers' own inputs: a layer may sit after others.
                inputs = self.model.inputs
                self._extractor = keras.Model(
                    inputs[0] if len(inputs) == 1 else inputs,
                    [layer.input for layer in self._layers],
                )
            except (AttributeError, ValueError, TypeError):
                self._extractor = None  # subclassed model: no symbolic inputs
        if self.log_dir is not None and self._writer is None:
            # TensorFlow is imported lazily, only to write TensorBoard events
            # when a log dir is given: the rest runs on any Keras backend.
            import tensorflow as tf

            self._writer = tf.summary.create_file_writer(os.path.join(self.log_dir, "stability"))

    def compute(self):
        """Computes the diagnostics now; returns a dict of Python floats."""
        # Reading `self.model` syncs the JAX trainer's state into the
        # variables, which JAX leaves stale in the middle of an epoch.
        model = self.model
        values = {}
        layer_inputs = None
        if self._extractor is not None:
            layer_inputs = self._extractor(self.probe_x, training=False)
            if len(self._layers) == 1:
                layer_inputs = [layer_inputs]
        for index, layer in enumerate(self._layers):
            cell = get_antisymmetric_cell(layer)
            key = f"{self.prefix}/{layer.name}"
            eig = np.linalg.eigvals(transition_matrix(cell))
            values[f"{key}/m_eig_real_max"] = float(eig.real.max())
            values[f"{key}/m_eig_abs_max"] = float(np.abs(eig).max())
            if layer_inputs is None:
                margin = stability_margin(
                    cell, np.zeros(cell.units), np.zeros(cell.kernel.shape[0])
                )
                values[f"{key}/euler_margin"] = float(margin)
                continue
            seq = ops.convert_to_numpy(layer_inputs[index])
            if self.probe_steps is not None:
                seq = seq[:, : self.probe_steps]
            # The last processed step maps h_{T-1} to h_T reading x_T: the
            # margin is that step's, at (h_{T-1}, x_T).
            if _go_backwards(layer):
                leading, last = seq[:, 1:], seq[:, 0]
            else:
                leading, last = seq[:, :-1], seq[:, -1]
            jac, h_prev = end_to_end_jacobian(layer, leading, return_final_state=True)
            if self.jacobian:
                jac = np.matmul(step_jacobian(cell, h_prev, last), jac)
                stats = eigenvalue_magnitude_stats(jac)
                for name in ("eig_abs_mean", "eig_abs_std", "sv_max", "sv_min"):
                    values[f"{key}/e2e_{name}"] = stats[name]
            values[f"{key}/euler_margin"] = float(np.max(stability_margin(cell, h_prev, last)))
        values.update(self._gradient_norms(model))
        return values

    def _gradient_norms(self, model):
        loss_fn = _loss_function(model)
        if self.probe_y is None or loss_fn is None:
            return {}
        grads = _gradients(model, loss_fn, self.probe_x, self.probe_y)
        if grads is None:
            return {}
        by_id = {id(v): g for v, g in zip(model.trainable_variables, grads, strict=True)}
        norms = {}
        for layer in model.layers:
            squares = [
                float(np.sum(np.square(by_id[id(v)])))
                for v in layer.trainable_variables
                if by_id.get(id(v)) is not None
            ]
            if squares:
                norms[f"{self.prefix}/grad_norm/{layer.name}"] = math.sqrt(sum(squares))
        return norms

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1
        if self._step % self.every_n_steps:
            return
        values = self.compute()
        self.latest = values
        self.records.append({"step": self._step, **values})
        if logs is not None:
            logs.update(values)
        if self._writer is not None:
            import tensorflow as tf

            with self._writer.as_default():
                for name, value in values.items():
                    tf.summary.scalar(name, value, step=self._step)
            self._writer.flush()

    def on_epoch_end(self, epoch, logs=None):
        # History runs after user callbacks, so it records these values.
        if logs is not None:
            logs.update(self.latest)

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None
