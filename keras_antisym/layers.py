"""Fused AntisymmetricRNN layers: the fast path for whole sequences."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal

import keras
from keras import ops

from keras_antisym import _tf_loop, kernels
from keras_antisym._docstrings import arguments_from
from keras_antisym._fast_path import (
    Weights,
    fold_bias,
    group_steps,
    hoists_inputs,
    steps_per_iteration,
)
from keras_antisym._keras_private import rnn_loop
from keras_antisym._typing import Activation, KerasObject, Tensor
from keras_antisym._validation import check_auto_or_bool
from keras_antisym.cells import AntisymmetricCell, GatedAntisymmetricCell


def _cell_property(name: str) -> Any:
    return property(lambda self: getattr(self.cell, name), doc=f"The cell's `{name}` (read-only).")


@keras.saving.register_keras_serializable(package="keras_antisym")
@arguments_from(AntisymmetricCell)
class AntisymmetricRNN(keras.layers.RNN):
    """Fused AntisymmetricRNN layer (Chang et al., ICLR 2019, eq. 9).

        h_t = h_{t-1} + epsilon * tanh((W - Wᵀ - gamma*I) h_{t-1} + V x_t + b)

    Computes exactly what `keras.layers.RNN(AntisymmetricCell(...))` computes,
    with the same weights in the same order and shapes (so `set_weights`
    moves a model between the two), on the same time loop as Keras' own
    recurrent layers. `W - Wᵀ - γI` is formed once per call. The input
    projection `V x_t + b` of all time steps is either one matrix product
    before the loop (`hoist_inputs`), or each step projects its own input,
    with a constant-1 feature carrying the bias.

    Args:
        units: Positive integer, the dimension of the hidden state.
        activity_regularizer: Regularizer for the layer's output.
        return_sequences: Boolean, return the whole output sequence instead
            of the last output.
        return_state: Boolean, also return the last state.
        go_backwards: Boolean, process the input sequence backwards and
            return the reversed sequence.
        stateful: Boolean, the last state of sample `i` of a batch is the
            initial state of sample `i` of the next batch.
        unroll: Boolean, unroll the loop in Python (static length only).
        hoist_inputs: `"auto"`, `True` or `False`: whether the input
            projection of all steps is one product before the loop (the same
            numbers either way, only speed differs). `"auto"` hoists on a GPU
            or TPU for inputs of at least `HOIST_MIN_INPUT_DIM` features.
        fused_kernel: `"auto"` (default), `True` or `False`: whether a call
            runs the whole recurrence, forward and backward, in one fused
            kernel (`keras_antisym.kernels`: Pallas on JAX, Triton on
            PyTorch) instead of the time loop; the same numbers either way.
            The kernel needs JAX or PyTorch (with Triton), a CUDA GPU, tanh
            (and a sigmoid gate), a float32 or bfloat16 compute dtype
            (`mixed_bfloat16`: bfloat16 inputs, float32 state), at most
            `kernels.MAX_UNITS` units, no recurrent dropout in training, no
            mask, and a static length. `"auto"` uses it where these hold and
            takes the loop elsewhere. `True` means the kernel or an error,
            as `use_cudnn=True` of Keras' `GRU`: a `ValueError` naming the
            unmet condition, at construction for the backend, dtype policy,
            activations, `units` and any `recurrent_dropout`, at the call for
            a mask, the sequences' dtype, length and size, and the device
            (without a CUDA GPU the kernel runs interpreted only where
            `kernels.INTERPRET` allows: for tests). `False` never uses it.
            The kernel's product precision is `kernels.PRECISION`
            (`"tf32x3"`: float32's accuracy on tensor cores).

    The cell's arguments and `hoist_inputs` are also read-only properties
    of the layer, as in `keras.layers.GRU`.

    Call arguments:
        - `sequences`: A 3D tensor `(batch, timesteps, features)`.
        - `initial_state`: Optional list with one `(batch, units)` tensor.
        - `mask`: Optional boolean `(batch, timesteps)`; `True` marks the steps
            to process.
        - `training`: Python boolean, whether dropout is applied.

    Examples:
        >>> import numpy as np, keras
        >>> from keras_antisym import AntisymmetricRNN
        >>> model = keras.Sequential([
        ...     keras.Input((784, 1)),
        ...     AntisymmetricRNN(128, epsilon=0.01, gamma=0.01),
        ...     keras.layers.Dense(10),
        ... ])
        >>> model.count_params()
        9674
    """

    cell_class: type[AntisymmetricCell] = AntisymmetricCell
    cell_name: str = "antisymmetric_cell"
    #: Arguments of `cell_class` beyond those of `AntisymmetricCell`.
    cell_only_arguments: tuple[str, ...] = ()

    def __init__(
        self,
        units: int,
        epsilon: float = 0.01,
        gamma: float = 0.01,
        activation: Activation = "tanh",
        use_bias: bool = True,
        kernel_initializer: KerasObject = None,
        recurrent_initializer: KerasObject = None,
        bias_initializer: KerasObject = "zeros",
        kernel_regularizer: KerasObject = None,
        recurrent_regularizer: KerasObject = None,
        bias_regularizer: KerasObject = None,
        activity_regularizer: KerasObject = None,
        kernel_constraint: KerasObject = None,
        recurrent_constraint: KerasObject = None,
        bias_constraint: KerasObject = None,
        dropout: float = 0.0,
        recurrent_dropout: float = 0.0,
        seed: int | None = None,
        antisymmetric: bool = True,
        return_sequences: bool = False,
        return_state: bool = False,
        go_backwards: bool = False,
        stateful: bool = False,
        unroll: bool = False,
        hoist_inputs: bool | Literal["auto"] = "auto",
        fused_kernel: bool | Literal["auto"] = "auto",
        **kwargs: Any,
    ) -> None:
        self._init_rnn(
            self.cell_class(
                units,
                epsilon=epsilon,
                gamma=gamma,
                activation=activation,
                use_bias=use_bias,
                kernel_initializer=kernel_initializer,
                recurrent_initializer=recurrent_initializer,
                bias_initializer=bias_initializer,
                kernel_regularizer=kernel_regularizer,
                recurrent_regularizer=recurrent_regularizer,
                bias_regularizer=bias_regularizer,
                kernel_constraint=kernel_constraint,
                recurrent_constraint=recurrent_constraint,
                bias_constraint=bias_constraint,
                dropout=dropout,
                recurrent_dropout=recurrent_dropout,
                seed=seed,
                antisymmetric=antisymmetric,
                **self._cell_keywords(kwargs),
            ),
            hoist_inputs, fused_kernel,
            return_sequences=return_sequences, return_state=return_state,
            go_backwards=go_backwards, stateful=stateful, unroll=unroll,
            activity_regularizer=activity_regularizer, **kwargs,
        )  # fmt: skip

    def _init_rnn(
        self,
        cell: AntisymmetricCell,
        hoist_inputs: bool | Literal["auto"],
        fused_kernel: bool | Literal["auto"],
        **kwargs: Any,
    ) -> None:
        """`keras.layers.RNN.__init__`, the 3D input spec, `hoist_inputs`, `fused_kernel`.

        The layer casts for itself (`autocast=False`): under a mixed policy
        Keras' autocasting would read the `stateful` state variables, and
        any variable, in the compute dtype. The weights and the inputs are
        cast to the products' dtype where they are used (`sequence_constants`,
        `project_inputs`), the state is read and carried in float32.
        """
        kwargs["autocast"] = False
        super().__init__(cell, **kwargs)
        self._hoist_inputs = check_auto_or_bool("hoist_inputs", hoist_inputs)
        self._fused_kernel = check_auto_or_bool("fused_kernel", fused_kernel)
        if self._fused_kernel is True:
            kernels.check_layer(cell)
        self.input_spec = keras.layers.InputSpec(ndim=3)

    def build(self, sequences_shape: Any, initial_state_shape: Any = None) -> None:
        super().build(sequences_shape, initial_state_shape)
        if self.stateful and self.states is not getattr(self, "_float32_states", None):
            # Keras' state variables autocast: under a mixed policy a read inside
            # the call gives the compute dtype, rounding the carried state (and
            # on PyTorch an assignment there is lost). These are float32 and
            # never autocast; like Keras' own, they are not among the weights.
            with keras.name_scope(self.name, caller=self):
                states = [
                    keras.Variable(
                        ops.zeros(v.shape, self.variable_dtype),
                        trainable=False,
                        autocast=False,
                        name="rnn_state",
                    )
                    for v in self.states
                ]
            object.__setattr__(self, "states", states)
            object.__setattr__(self, "_float32_states", states)

    def _cell_keywords(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The cell's name, dtype and trainability, and its own arguments (popped)."""
        own = {name: kwargs.pop(name) for name in self.cell_only_arguments if name in kwargs}
        return {
            "dtype": kwargs.get("dtype"),
            "trainable": kwargs.get("trainable", True),
            "name": self.cell_name,
            **own,
        }

    def inner_loop(
        self,
        sequences: Tensor,
        initial_state: Tensor | list[Tensor],
        mask: Tensor | None,
        training: bool = False,
    ) -> tuple[Tensor, Tensor, list[Tensor]]:
        # Called by RNN.call (keras_antisym/_keras_private.py, assumption 3).
        result = self._fused_loop(sequences, initial_state, mask, training)
        # The float32 state for `call` (not tracked: a tensor of this call only).
        object.__setattr__(self, "_carried_states", result[2])
        return result

    def _fused_loop(
        self,
        sequences: Tensor,
        initial_state: Tensor | list[Tensor],
        mask: Tensor | None,
        training: bool,
    ) -> tuple[Tensor, Tensor, list[Tensor]]:
        cell = self.cell
        h0 = initial_state[0] if isinstance(initial_state, (list, tuple)) else initial_state
        # RNN.call has cast `h0` to the cell's compute dtype, the state dtype
        # (float32 under the mixed policies); the inputs run in the products' dtype.
        sequences = ops.cast(sequences, cell.product_dtype)
        if self.fused_kernel is True:  # the kernel or an error (no recurrent dropout)
            kernels.check_call(cell, sequences, mask)
            sequences, _ = self._apply_dropout(sequences, h0, training)
            return kernels.run_layer(cell, sequences, h0, self.go_backwards)
        sequences, recurrent_mask = self._apply_dropout(sequences, h0, training)
        if mask is None and recurrent_mask is None:
            if kernels.kernel_applies(cell, sequences, self.fused_kernel):
                return kernels.run_layer(cell, sequences, h0, self.go_backwards)
        operand, weights = cell.cached_sequence_constants()
        hoist = hoists_inputs(self.hoist_inputs, sequences.shape[-1])
        if hoist:
            sequences = cell.project_inputs(sequences)  # blocks side by side
        else:
            sequences, weights = fold_bias(sequences, weights)
        steps, width = sequences.shape[1], sequences.shape[-1]
        chunk = steps_per_iteration(sequences, mask, self.unroll)
        sequences, go_backwards = group_steps(sequences, chunk, self.go_backwards)
        step = self._step_function(operand, weights, recurrent_mask, hoist, chunk, width)
        if not training and not self.unroll and keras.backend.backend() == "tensorflow":
            # A loop LiteRT converts to builtin ops for any batch (Keras' own export).
            last_output, outputs, states = _tf_loop.rnn_loop(
                step,
                sequences,
                [h0],
                chunk * cell.units,
                go_backwards=go_backwards,
                mask=mask,
                zero_output_for_mask=self.zero_output_for_mask,
                return_all_outputs=self.return_sequences,
            )
        else:
            last_output, outputs, states = rnn_loop(
                step,
                sequences,
                [h0],
                go_backwards=go_backwards,
                mask=mask,
                unroll=self.unroll,
                input_length=sequences.shape[1],
                zero_output_for_mask=self.zero_output_for_mask,
                return_all_outputs=self.return_sequences,
            )
        if chunk > 1:
            last_output = states[0]
            if self.return_sequences:
                outputs = ops.reshape(outputs, (-1, steps, cell.units))
        return last_output, outputs, states

    def call(
        self,
        sequences: Tensor,
        initial_state: Tensor | list[Tensor] | None = None,
        mask: Tensor | None = None,
        training: bool = False,
    ) -> Tensor | list[Tensor]:
        """`keras.layers.RNN.call`; a `stateful` layer carries its state over in float32.

        RNN.call casts the states it returns to the layer's compute dtype and
        assigns those; a bfloat16 carry-over would round the state at every
        batch. The state variables are float32 (the variable dtype): they
        receive the loop's float32 state instead.
        """
        object.__setattr__(self, "_carried_states", None)
        result = super().call(sequences, initial_state=initial_state, mask=mask, training=training)
        carried = self._carried_states
        object.__setattr__(self, "_carried_states", None)
        if self.stateful and carried is not None:
            for variable, state in zip(self.states, carried, strict=True):
                variable.assign(ops.cast(state, self.variable_dtype))
        return result

    def _apply_dropout(
        self, sequences: Tensor, h0: Tensor, training: bool
    ) -> tuple[Tensor, Tensor | None]:
        """The inputs with their dropout mask applied, and the recurrent mask.

        Inside `RNN.call` these are the masks RNN drew for this call, one per
        sequence (keras_antisym/_keras_private.py, assumptions 2 and 3).
        """
        if not training:
            return sequences, None
        dropout_mask = self.cell.get_dropout_mask(sequences[:, 0])
        if dropout_mask is not None:
            sequences = sequences * ops.expand_dims(ops.cast(dropout_mask, sequences.dtype), 1)
        return sequences, self.cell.step_recurrent_dropout_mask(h0)

    def _step_function(
        self,
        operand: Tensor,
        weights: Weights,
        recurrent_mask: Tensor | None,
        hoist: bool,
        chunk: int,
        width: int,
    ) -> Callable[[Tensor, list[Tensor]], tuple[Tensor, list[Tensor]]]:
        """The loop's step: `chunk` Euler steps on inputs of `chunk·width` features."""
        cell, blocks = self.cell, len(weights)
        # RNN.call assigns the last state into the state variables in place:
        # under torch autograd the loop must not hold those tensors (as
        # Keras' own RNN.inner_loop).
        copy_states = keras.backend.backend() == "torch" and self.stateful

        def projected_blocks(inputs: Tensor) -> list[list[Tensor]]:
            """The projected input blocks of each of the `chunk` steps."""
            if hoist:
                pieces = [inputs] if chunk * blocks == 1 else ops.split(inputs, chunk * blocks, -1)
                return [pieces[j * blocks : (j + 1) * blocks] for j in range(chunk)]
            # Strided slices: cheaper than a split for narrow inputs.
            raw = [inputs[:, j * width : (j + 1) * width] for j in range(chunk)]
            return [cell.project_blocks(x, weights) for x in ([inputs] if chunk == 1 else raw)]

        def step(inputs: Tensor, states: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
            h = ops.copy(states[0]) if copy_states else states[0]
            outputs = []
            for projected in projected_blocks(inputs):
                h = cell.step(h, projected, operand, recurrent_mask)
                outputs.append(h)
            return (h if chunk == 1 else ops.concatenate(outputs, axis=-1)), [h]

        return step

    def transition_matrix(self) -> Tensor:
        """The paper's `W - Wᵀ - γI` (see `AntisymmetricCell`)."""
        return self.cell.transition_matrix()

    @property
    def hoist_inputs(self) -> bool | Literal["auto"]:
        """`"auto"`, `True` or `False`, as given (read-only)."""
        return self._hoist_inputs

    @property
    def fused_kernel(self) -> bool | Literal["auto"]:
        """`"auto"`, `True` or `False`, as given (read-only)."""
        return self._fused_kernel

    units: Final[int] = _cell_property("units")
    epsilon: Final[float] = _cell_property("epsilon")
    gamma: Final[float] = _cell_property("gamma")
    activation: Final[Callable[..., Any]] = _cell_property("activation")
    use_bias: Final[bool] = _cell_property("use_bias")
    kernel_initializer: Final[Any] = _cell_property("kernel_initializer")
    recurrent_initializer: Final[Any] = _cell_property("recurrent_initializer")
    bias_initializer: Final[Any] = _cell_property("bias_initializer")
    kernel_regularizer: Final[Any] = _cell_property("kernel_regularizer")
    recurrent_regularizer: Final[Any] = _cell_property("recurrent_regularizer")
    bias_regularizer: Final[Any] = _cell_property("bias_regularizer")
    kernel_constraint: Final[Any] = _cell_property("kernel_constraint")
    recurrent_constraint: Final[Any] = _cell_property("recurrent_constraint")
    bias_constraint: Final[Any] = _cell_property("bias_constraint")
    dropout: Final[float] = _cell_property("dropout")
    recurrent_dropout: Final[float] = _cell_property("recurrent_dropout")
    seed: Final[int | None] = _cell_property("seed")
    antisymmetric: Final[bool] = _cell_property("antisymmetric")

    def get_config(self) -> dict[str, Any]:
        base_config = super().get_config()
        del base_config["cell"]
        return {
            **base_config,
            **self.cell.argument_config(),
            "hoist_inputs": self.hoist_inputs,
            "fused_kernel": self.fused_kernel,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AntisymmetricRNN:
        return cls(**config)


@keras.saving.register_keras_serializable(package="keras_antisym")
@arguments_from(AntisymmetricRNN, GatedAntisymmetricCell)
class GatedAntisymmetricRNN(AntisymmetricRNN):
    """Fused AntisymmetricRNN with an input gate (Chang et al., eq. 10).

        z_t = sigmoid((W - Wᵀ - γI) h_{t-1} + V_z x_t + b_z)
        h_t = h_{t-1} + ε · z_t ⊙ tanh((W - Wᵀ - γI) h_{t-1} + V_h x_t + b_h)

    The same weights, in the same order and shapes, as
    `keras.layers.RNN(GatedAntisymmetricCell(...))`.

    Args:
        recurrent_activation: Activation of the gate `z` (sigmoid).

    Examples:
        >>> import numpy as np, keras
        >>> from keras_antisym import GatedAntisymmetricRNN
        >>> model = keras.Sequential([
        ...     keras.Input((1024, 3)),
        ...     GatedAntisymmetricRNN(256, epsilon=0.1, gamma=0.01),
        ...     keras.layers.Dense(10),
        ... ])
        >>> model.count_params()
        37258
    """

    cell_class: type[AntisymmetricCell] = GatedAntisymmetricCell
    cell_name: str = "gated_antisymmetric_cell"
    cell_only_arguments: tuple[str, ...] = ("recurrent_activation",)

    def __init__(
        self,
        units: int,
        epsilon: float = 0.01,
        gamma: float = 0.01,
        activation: Activation = "tanh",
        recurrent_activation: Activation = "sigmoid",
        use_bias: bool = True,
        kernel_initializer: KerasObject = None,
        recurrent_initializer: KerasObject = None,
        bias_initializer: KerasObject = "zeros",
        kernel_regularizer: KerasObject = None,
        recurrent_regularizer: KerasObject = None,
        bias_regularizer: KerasObject = None,
        activity_regularizer: KerasObject = None,
        kernel_constraint: KerasObject = None,
        recurrent_constraint: KerasObject = None,
        bias_constraint: KerasObject = None,
        dropout: float = 0.0,
        recurrent_dropout: float = 0.0,
        seed: int | None = None,
        antisymmetric: bool = True,
        return_sequences: bool = False,
        return_state: bool = False,
        go_backwards: bool = False,
        stateful: bool = False,
        unroll: bool = False,
        hoist_inputs: bool | Literal["auto"] = "auto",
        fused_kernel: bool | Literal["auto"] = "auto",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            units,
            epsilon=epsilon,
            gamma=gamma,
            activation=activation,
            recurrent_activation=recurrent_activation,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            recurrent_initializer=recurrent_initializer,
            bias_initializer=bias_initializer,
            kernel_regularizer=kernel_regularizer,
            recurrent_regularizer=recurrent_regularizer,
            bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer,
            kernel_constraint=kernel_constraint,
            recurrent_constraint=recurrent_constraint,
            bias_constraint=bias_constraint,
            dropout=dropout,
            recurrent_dropout=recurrent_dropout,
            seed=seed,
            antisymmetric=antisymmetric,
            return_sequences=return_sequences, return_state=return_state,
            go_backwards=go_backwards, stateful=stateful, unroll=unroll,
            hoist_inputs=hoist_inputs, fused_kernel=fused_kernel, **kwargs,
        )  # fmt: skip

    recurrent_activation: Final[Callable[..., Any]] = _cell_property("recurrent_activation")
