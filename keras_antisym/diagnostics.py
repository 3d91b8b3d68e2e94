"""The `StabilityDiagnostics` callback: stability of AntisymmetricRNNs during training.

It logs, for every AntisymmetricRNN layer of a model, the quantities that
`keras_antisym.stability` computes from the weights (re-exported here), and
the gradient norm of each layer through the backend's own autodiff.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, cast

import keras
import numpy as np
from keras import ops

from keras_antisym._typing import TensorLike
from keras_antisym._validation import check_positive_int, invalid
from keras_antisym.cells import AntisymmetricCell
from keras_antisym.stability import (
    eigenvalue_magnitude_stats,
    end_to_end_jacobian,
    end_to_end_jacobian_stats,
    get_antisymmetric_cell,
    ode_jacobian,
    reads_backwards,
    stability_margin,
    step_jacobian,
    transition_eigenvalues,
    transition_matrix,
)

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


def _recurrent_layers(model: Any) -> list[Any]:
    """The layers of `model` (nested models included) with an AntisymmetricCell."""
    found = []
    for layer in getattr(model, "layers", []):
        if isinstance(getattr(layer, "cell", None), AntisymmetricCell):
            found.append(layer)
        elif hasattr(layer, "layers"):
            found.extend(_recurrent_layers(layer))
    return found


def _loss_function(model: Any) -> Callable[..., Any] | None:
    loss = getattr(model, "loss", None)
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    return loss if callable(loss) else None


def _gradients(
    model: Any, loss_fn: Callable[..., Any], x: TensorLike, y: TensorLike
) -> list[np.ndarray | None] | None:
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
    - with probe targets and a loss (`loss_fn`, else the model's compiled
      single loss): `"{prefix}/grad_norm/{layer.name}"`, the L2 norm of the
      loss gradient for each top-level layer with trainable weights, on the
      probe batch, in inference mode. Uses the backend's autodiff
      (TensorFlow, JAX or PyTorch).

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
        loss_fn: Optional loss for the gradient norms: a Keras loss, a
            callable `loss_fn(y_true, y_pred)` or a loss name. Default: the
            loss the model was compiled with (a custom training loop that
            does not compile passes its own).

    Examples:
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
        every_n_steps: int = 100,
        probe_data: TensorLike | tuple[TensorLike, TensorLike] | None = None,
        probe_steps: int | None = None,
        jacobian: bool = True,
        log_dir: str | os.PathLike[str] | None = None,
        prefix: str = "stability",
        loss_fn: str | dict[str, Any] | Callable[..., Any] | None = None,
    ) -> None:
        super().__init__()
        if isinstance(loss_fn, (str, dict)):  # a name, or a config from `get_config`
            loss_fn = keras.losses.get(loss_fn)
        if loss_fn is not None and not callable(loss_fn):
            raise invalid("loss_fn", "None, a loss name or a callable(y_true, y_pred)", loss_fn)
        self.loss_fn = loss_fn
        self.every_n_steps = check_positive_int("every_n_steps", every_n_steps)
        if probe_steps is not None and (
            isinstance(probe_steps, bool) or not isinstance(probe_steps, int) or probe_steps <= 0
        ):
            raise invalid("probe_steps", "None or a positive integer", probe_steps)
        if isinstance(probe_data, (tuple, list)):
            self.probe_x, self.probe_y = probe_data[0], probe_data[1]
        else:
            self.probe_x, self.probe_y = probe_data, None
        self.probe_steps = probe_steps
        self.jacobian = bool(jacobian)
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self.prefix = prefix
        #: Every computed set of values, with its `"step"`.
        self.records: list[dict[str, float]] = []
        #: The values last computed.
        self.latest: dict[str, float] = {}
        self._step = 0
        self._writer: Any = None
        self._layers: list[Any] | None = None
        self._extractor: Any = None

    def get_config(self) -> dict[str, Any]:
        # The probe batch is data, not configuration.
        return {
            "every_n_steps": self.every_n_steps,
            "probe_steps": self.probe_steps,
            "jacobian": self.jacobian,
            "log_dir": self.log_dir,
            "prefix": self.prefix,
            "loss_fn": None if self.loss_fn is None else keras.losses.serialize(self.loss_fn),
        }

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._find_layers()
        if self.log_dir is not None and self._writer is None:
            # TensorFlow is imported lazily, only to write TensorBoard events
            # when a log dir is given: the rest runs on any Keras backend.
            import tensorflow as tf

            self._writer = tf.summary.create_file_writer(os.path.join(self.log_dir, "stability"))

    def _find_layers(self) -> None:
        """The model's recurrent layers and, with a probe, a model giving their inputs."""
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

    def compute(self) -> dict[str, float]:
        """Computes the diagnostics now; returns a dict of Python floats.

        Called by `fit` every `every_n_steps` batches; outside `fit`, call
        `set_model(model)` first.
        """
        # Reading `self.model` syncs the JAX trainer's state into the
        # variables, which JAX leaves stale in the middle of an epoch.
        model = self.model
        if self._layers is None:  # called outside `fit`, after `set_model`
            self._find_layers()
        layers = cast("list[Any]", self._layers)  # set by `_find_layers`
        values: dict[str, float] = {}
        layer_inputs = None
        if self._extractor is not None:
            layer_inputs = self._extractor(self.probe_x, training=False)
            if len(layers) == 1:
                layer_inputs = [layer_inputs]
        for index, layer in enumerate(layers):
            probe = None if layer_inputs is None else ops.convert_to_numpy(layer_inputs[index])
            values.update(self._layer_values(layer, probe))
        values.update(self._gradient_norms(model))
        return values

    def _layer_values(self, layer: Any, probe: np.ndarray | None) -> dict[str, float]:
        """The diagnostics of one layer, on its own probe inputs (or at `h = 0, x = 0`)."""
        cell = get_antisymmetric_cell(layer)
        key = f"{self.prefix}/{layer.name}"
        eig = np.linalg.eigvals(transition_matrix(cell))
        values = {
            f"{key}/m_eig_real_max": float(eig.real.max()),
            f"{key}/m_eig_abs_max": float(np.abs(eig).max()),
        }
        if probe is None:
            margin = stability_margin(cell, np.zeros(cell.units), np.zeros(cell.kernel.shape[0]))
            values[f"{key}/euler_margin"] = float(margin)
            return values
        if self.probe_steps is not None:
            probe = probe[:, : self.probe_steps]
        # The last processed step maps h_{T-1} to h_T reading x_T: the margin
        # is that step's, at (h_{T-1}, x_T).
        if reads_backwards(layer):
            leading, last = probe[:, 1:], probe[:, 0]
        else:
            leading, last = probe[:, :-1], probe[:, -1]
        jac, h_prev = end_to_end_jacobian(layer, leading, return_final_state=True)
        if self.jacobian:
            jac = np.matmul(step_jacobian(cell, h_prev, last), jac)
            stats = eigenvalue_magnitude_stats(jac)
            for name in ("eig_abs_mean", "eig_abs_std", "sv_max", "sv_min"):
                values[f"{key}/e2e_{name}"] = stats[name]
        values[f"{key}/euler_margin"] = float(np.max(stability_margin(cell, h_prev, last)))
        return values

    def _gradient_norms(self, model: Any) -> dict[str, float]:
        loss_fn = self.loss_fn if self.loss_fn is not None else _loss_function(model)
        if self.probe_y is None or loss_fn is None:
            return {}
        grads = _gradients(model, loss_fn, self.probe_x, self.probe_y)
        if grads is None:
            return {}
        by_id: dict[int, Any] = {
            id(v): g for v, g in zip(model.trainable_variables, grads, strict=True)
        }
        norms: dict[str, float] = {}
        for layer in model.layers:
            squares = [
                float(np.sum(np.square(by_id[id(v)])))
                for v in layer.trainable_variables
                if by_id.get(id(v)) is not None
            ]
            if squares:
                norms[f"{self.prefix}/grad_norm/{layer.name}"] = math.sqrt(sum(squares))
        return norms

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
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

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        # History runs after user callbacks, so it records these values.
        if logs is not None:
            logs.update(self.latest)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
