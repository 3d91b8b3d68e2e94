"""AntisymmetricRNN cells (Chang, Chen, Haber & Chi, ICLR 2019)."""

from __future__ import annotations

from typing import Any, Literal, overload

import keras
from keras import ops

from keras_antisym import _equations as equations
from keras_antisym._docstrings import arguments_from
from keras_antisym._equations import upper_triangle_indices
from keras_antisym._keras_private import SequenceConstantsCell, accelerator_available
from keras_antisym._typing import Activation, DType, KerasObject, Shape, Tensor
from keras_antisym._validation import check_bool, check_float, check_positive_int, check_rate
from keras_antisym.initializers import FanInNormal


def activation_derivative(activation: Any, x: Tensor) -> Tensor:
    """`activation'(x)`, in closed form for the usual activations.

    Any other activation gets central differences, accurate to ~1e-3 relative
    in float32: backend autodiff would tie the caller to one backend.
    """
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
    step = 1e-2
    return (activation(x + step) - activation(x - step)) / (2 * step)


def _dtype(x: Tensor) -> str:
    return str(keras.backend.standardize_dtype(x.dtype))


def _cast_to(x: Tensor, dtype: str) -> Tensor:
    """`x` in `dtype` (no op when it is already)."""
    return x if _dtype(x) == dtype else ops.cast(x, dtype)


@keras.saving.register_keras_serializable(package="keras_antisym")
class AntisymmetricCell(keras.layers.Layer, SequenceConstantsCell):
    """Cell of the AntisymmetricRNN (Chang et al., ICLR 2019, eq. 9).

    A forward-Euler discretization of the ODE `h' = tanh((W - Wᵀ)h + Vx + b)`,
    whose antisymmetric Jacobian has purely imaginary eigenvalues, so signals
    neither explode nor vanish over long sequences. The diffusion `gamma`
    makes the Euler step stable:

        h_t = h_{t-1} + epsilon * tanh((W - Wᵀ - gamma*I) h_{t-1} + V x_t + b)

    `W` is stored as its strictly upper triangle, a vector of
    `units * (units - 1) / 2` trainable entries (`recurrent_kernel`) in the
    row-major order of `numpy.triu_indices(units, 1)`. `kernel` has Keras'
    layout `(input_dim, units)`, i.e. it is `Vᵀ`. This cell processes one step;
    wrap it in `keras.layers.RNN`, or use the fused `AntisymmetricRNN` layer.

    Mixed precision (`dtype="mixed_bfloat16"` or `"mixed_float16"`): the
    products `M h`, `V x`, the sum `M h + V x + b` and the activations run in
    the policy's compute dtype (`product_dtype`); the state `h` and the Euler
    update `h + ε·f` stay in the variable dtype (float32). The increments
    `|ε·f| ≤ ε` are far below bfloat16's spacing near 1 (2⁻⁷): a bfloat16
    state would round them away and the dynamics would drift (by ~6% after
    1000 steps at `ε = 0.01`). So the cell's `compute_dtype`, the dtype of
    its state and output that `keras.layers.RNN` carries through its loop,
    is the variable dtype; the RNN layer casts what it returns to its own
    compute dtype.

    Args:
        units: Positive integer, the dimension `n` of the hidden state.
        epsilon: Positive float, the step size `ε` (paper grid: 0.01, 0.1, 1).
        gamma: Non-negative float, the diffusion `γ` (paper grid: 0.001,
            0.01, 0.1, 1). `0` gives the undiffused, Euler-unstable model.
        activation: Activation of the update (`tanh` in the paper).
        use_bias: Boolean, whether the update has a bias `b`.
        kernel_initializer: Initializer for `kernel` (`V`). Defaults to the
            paper's `N(0, 1/m)`, `FanInNormal(1.0)`.
        recurrent_initializer: Initializer for `W`. It is called with the
            full `(units, units)` shape and the strictly upper triangle of
            its result is kept. Defaults to the paper's `N(0, σ_w²/n)` with
            `σ_w = 1`; use `FanInNormal(sigma_w)` for the paper's other σ_w.
        bias_initializer: Initializer for the bias (zeros in the paper).
        kernel_regularizer: Regularizer for `kernel`.
        recurrent_regularizer: Regularizer for the stored vector of `W`
            (note `‖W - Wᵀ‖² = 2‖w‖²`).
        bias_regularizer: Regularizer for the bias.
        kernel_constraint: Constraint for `kernel`.
        recurrent_constraint: Constraint for the stored vector of `W`.
        bias_constraint: Constraint for the bias.
        dropout: Float in [0, 1), fraction of the inputs to drop. One mask
            per sequence, shared by all time steps.
        recurrent_dropout: Float in [0, 1), fraction of `h_{t-1}` to drop in
            the recurrent product `(W - Wᵀ - γI) h_{t-1}`; the skip path
            `h_{t-1} + ...` is never dropped, so no memory is lost.
        seed: Integer, random seed for dropout.
        antisymmetric: Boolean. `False` gives the paper's ablation model: a
            free `(units, units)` matrix `U` in place of `W - Wᵀ`, with the
            diffusion still applied (`U - γI`).

    Call arguments:
        - `sequence`: A 2D tensor of shape `(batch, input_dim)`, one time step.
        - `states`: A list with one tensor of shape `(batch, units)`, `h_{t-1}`.
        - `training`: Python boolean, whether dropout is applied.

    Returns:
        `(h_t, [h_t])`.

    Examples:
        >>> import numpy as np, keras
        >>> from keras_antisym import AntisymmetricCell
        >>> layer = keras.layers.RNN(AntisymmetricCell(32, epsilon=0.1, gamma=0.01))
        >>> tuple(layer(np.zeros((4, 100, 3), "float32")).shape)
        (4, 32)
    """

    #: Number of `units`-wide blocks in the input projection.
    num_blocks: int = 1

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
        kernel_constraint: KerasObject = None,
        recurrent_constraint: KerasObject = None,
        bias_constraint: KerasObject = None,
        dropout: float = 0.0,
        recurrent_dropout: float = 0.0,
        seed: int | None = None,
        antisymmetric: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.units = check_positive_int("units", units)
        self.epsilon = check_float("epsilon", epsilon, "a positive float", allow_zero=False)
        self.gamma = check_float("gamma", gamma, "a non-negative float", allow_zero=True)
        self.activation = keras.activations.get(activation)
        self.use_bias = check_bool("use_bias", use_bias)
        self.kernel_initializer = keras.initializers.get(
            kernel_initializer if kernel_initializer is not None else FanInNormal(1.0)
        )
        self.recurrent_initializer = keras.initializers.get(
            recurrent_initializer if recurrent_initializer is not None else FanInNormal(1.0)
        )
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.recurrent_regularizer = keras.regularizers.get(recurrent_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.recurrent_constraint = keras.constraints.get(recurrent_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.dropout = check_rate("dropout", dropout)
        self.recurrent_dropout = check_rate("recurrent_dropout", recurrent_dropout)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed=seed)
        self.antisymmetric = check_bool("antisymmetric", antisymmetric)
        self.state_size = self.units
        self.output_size = self.units
        # On a CPU, XLA makes TensorFlow's recurrent while-loop slower (see
        # benchmarks/), so jit_compile="auto"/True keeps the plain graph there;
        # on a GPU/TPU XLA is what makes the loop fast (as on JAX).
        self.supports_jit = keras.backend.backend() != "tensorflow" or accelerator_available()
        self._upper_indices = upper_triangle_indices(self.units) if self.antisymmetric else None

    @property
    def compute_dtype(self) -> str:
        """The dtype of the state and the output: the variable dtype (float32).

        `keras.layers.RNN` casts the initial state to this dtype and carries
        the state through its loop in it, and `Layer.__call__` converts the
        cell's inputs to it; the products run in `product_dtype`.
        """
        return str(self.variable_dtype)

    @property
    def product_dtype(self) -> str:
        """The dtype of the products and activations: the policy's compute dtype.

        `bfloat16` under `mixed_bfloat16`, `float16` under `mixed_float16`,
        else the variable dtype.
        """
        return str(self.dtype_policy.compute_dtype)

    def build(self, input_shape: Shape) -> None:
        input_shape = tuple(input_shape)
        equations.add_weights(self, input_shape, "keras.layers.RNN")

    def _upper_triangle_initializer(self, shape: Shape, dtype: DType = None) -> Tensor:
        full = self.recurrent_initializer((self.units, self.units), dtype=dtype)
        return equations.upper_triangle(ops, full, self.units)

    def recurrent_operand(self) -> Tensor:
        """`(W - Wᵀ - γI)ᵀ`, the matrix that multiplies `h` from the right.

        Forming it costs a few `units²` operations: the fused layers form it
        once per sequence, not once per step.
        """
        stored = ops.convert_to_tensor(self.recurrent_kernel)
        return equations.recurrent_operand(
            ops, stored, self.units, self.gamma, self.antisymmetric, self._upper_indices
        )

    def input_weights(self) -> list[tuple[Tensor, Tensor | None]]:
        """`[(V_k, b_k)]`: the kernel and bias as `units`-wide blocks.

        One block ungated; `[gate z, candidate h]` gated (`b_k` is None
        without bias). Each block gets its own product in the loop: slicing
        one `(batch, 2·units)` product would add a strided-slice gradient at
        every step.
        """
        kernel = ops.convert_to_tensor(self.kernel)
        bias = None if self.bias is None else ops.convert_to_tensor(self.bias)
        return equations.input_blocks(kernel, bias, self.units, self.num_blocks)

    def sequence_constants(
        self, dtype: DType = None
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor | None]]]:
        """`(recurrent_operand(), input_weights())` cast to `dtype` (default `product_dtype`).

        Formed once per sequence inside `keras.layers.RNN` (see
        `keras_antisym._keras_private`) and by the fused layers: `M` is
        formed from the stored weights and rounded once. The stability
        analysis asks for the variable dtype (float32).

        Args:
            dtype: The dtype of the products (None: `product_dtype`).

        Returns:
            `(operand, [(V_k, b_k)])` in `dtype`.
        """
        dtype = self.product_dtype if dtype is None else dtype
        operand = ops.cast(self.recurrent_operand(), dtype)
        weights = [
            (ops.cast(kernel, dtype), None if bias is None else ops.cast(bias, dtype))
            for kernel, bias in self.input_weights()
        ]
        return operand, weights

    def transition_matrix(self) -> Tensor:
        """The paper's `W - Wᵀ - γI` (or `U - γI` when not antisymmetric).

        `h_t = h_{t-1} + ε·tanh(M h_{t-1} + V x_t + b)` with `M` this matrix.
        """
        return ops.transpose(self.recurrent_operand())

    def project_inputs(self, inputs: Tensor) -> Tensor:
        """`x·Vᵀ + b` for inputs of shape `(..., input_dim)`, all blocks, in `product_dtype`."""
        dtype = self.product_dtype
        projected = ops.matmul(ops.cast(inputs, dtype), ops.cast(self.kernel, dtype))
        if self.bias is not None:
            projected = projected + ops.cast(self.bias, dtype)
        return projected

    @staticmethod
    def project_blocks(inputs: Tensor, weights: list[tuple[Tensor, Tensor | None]]) -> list[Tensor]:
        """`[x·V_kᵀ + b_k]` per block, for `weights` from `input_weights()`."""
        return equations.project_blocks(ops, inputs, weights)

    @overload
    def vector_field(
        self, shared: Tensor, blocks: list[Tensor], return_slope: Literal[False] = False
    ) -> Tensor: ...

    @overload
    def vector_field(
        self, shared: Tensor, blocks: list[Tensor], return_slope: Literal[True]
    ) -> tuple[Tensor, Tensor]: ...

    def vector_field(
        self, shared: Tensor, blocks: list[Tensor], return_slope: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """The right-hand side `f` of the ODE `h' = f(h, x)` that the cell discretizes.

        Every block reads the same recurrent term, so `∂f/∂h = diag(d)·M`:
        the Jacobian of a step is `I + ε·diag(d)·M` (see `keras_antisym.stability`).

        Args:
            shared: `h·(W - Wᵀ - γI)ᵀ`, the recurrent term `M h`, `(batch, units)`.
            blocks: The projected input blocks `[x·V_kᵀ + b_k]` (`project_blocks`).
            return_slope: Boolean, also return `d = ∂f/∂shared` (elementwise).

        Returns:
            `f = act(M h + V x + b)`, `(batch, units)`, or `(f, d)`.
        """
        derivative = activation_derivative if return_slope else None
        return equations.vector_field(shared, blocks, self.activation, derivative=derivative)

    @overload
    def step(
        self,
        h: Tensor,
        blocks: list[Tensor],
        operand: Tensor,
        recurrent_mask: Tensor | None = None,
        return_slope: Literal[False] = False,
    ) -> Tensor: ...

    @overload
    def step(
        self,
        h: Tensor,
        blocks: list[Tensor],
        operand: Tensor,
        recurrent_mask: Tensor | None = None,
        *,
        return_slope: Literal[True],
    ) -> tuple[Tensor, Tensor]: ...

    def step(
        self,
        h: Tensor,
        blocks: list[Tensor],
        operand: Tensor,
        recurrent_mask: Tensor | None = None,
        return_slope: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """One Euler step `h_t = h_{t-1} + ε·f` from `h_{t-1}`.

        The one definition of the step: the cell's `call`, the fused layers'
        loop and the stability diagnostics all take it. The products and
        activations run in the dtype of `operand` (`h_{t-1}` is cast to it
        for `M h`); the Euler update `h + ε·f` runs in the dtype of `h`, so
        a float32 state keeps increments below the spacing of bfloat16.

        Args:
            h: `h_{t-1}`, `(batch, units)`.
            blocks: The projected input blocks `[x_t·V_kᵀ + b_k]` (`project_blocks`).
            operand: `(W - Wᵀ - γI)ᵀ` (`recurrent_operand`).
            recurrent_mask: Optional recurrent dropout mask for `h_{t-1}`
                in the recurrent term only (the skip path is never dropped).
            return_slope: Boolean, also return `d` of `vector_field`.

        Returns:
            `h_t` (dtype of `h`), or `(h_t, d)` (`d` in the dtype of `operand`).
        """
        product = _dtype(operand)
        h_product = _cast_to(h, product)
        if recurrent_mask is not None:
            recurrent_mask = _cast_to(recurrent_mask, product)
        shared = equations.recurrent_term(ops, h_product, operand, recurrent_mask)
        blocks = [_cast_to(block, product) for block in blocks]
        if not return_slope:
            rate = self.vector_field(shared, blocks)
            return equations.euler_step(h, self.epsilon, _cast_to(rate, _dtype(h)))
        rate, slope = self.vector_field(shared, blocks, return_slope=True)
        return equations.euler_step(h, self.epsilon, _cast_to(rate, _dtype(h))), slope

    def call(
        self, sequence: Tensor, states: Tensor | list[Tensor], training: bool = False
    ) -> tuple[Tensor, Tensor | list[Tensor]]:
        h = states[0] if isinstance(states, (list, tuple)) else states
        recurrent_mask = None
        if training:
            dropout_mask = self.get_dropout_mask(sequence)
            if dropout_mask is not None:
                sequence = sequence * ops.cast(dropout_mask, sequence.dtype)
            recurrent_mask = self.step_recurrent_dropout_mask(h)
        operand, weights = self.cached_sequence_constants()
        sequence = _cast_to(sequence, _dtype(operand))
        h_new = self.step(h, self.project_blocks(sequence, weights), operand, recurrent_mask)
        new_states = [h_new] if isinstance(states, (list, tuple)) else h_new
        return h_new, new_states

    def get_initial_state(self, batch_size: int | None = None) -> list[Tensor]:
        return [ops.zeros((batch_size, self.units), dtype=self.compute_dtype)]

    def argument_config(self) -> dict[str, Any]:
        """The constructor arguments of this cell, serialized."""
        return {
            "units": self.units,
            "epsilon": self.epsilon,
            "gamma": self.gamma,
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "recurrent_initializer": keras.initializers.serialize(self.recurrent_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
            "recurrent_regularizer": keras.regularizers.serialize(self.recurrent_regularizer),
            "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
            "kernel_constraint": keras.constraints.serialize(self.kernel_constraint),
            "recurrent_constraint": keras.constraints.serialize(self.recurrent_constraint),
            "bias_constraint": keras.constraints.serialize(self.bias_constraint),
            "dropout": self.dropout,
            "recurrent_dropout": self.recurrent_dropout,
            "seed": self.seed,
            "antisymmetric": self.antisymmetric,
        }

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), **self.argument_config()}


@keras.saving.register_keras_serializable(package="keras_antisym")
@arguments_from(AntisymmetricCell)
class GatedAntisymmetricCell(AntisymmetricCell):
    """Cell of the AntisymmetricRNN with an input gate (Chang et al., eq. 10).

    The gate shares the antisymmetric term, so the model has only `m·n + n`
    more parameters than the ungated cell and its Jacobian keeps the form
    "diagonal times antisymmetric":

        z_t = sigmoid((W - Wᵀ - γI) h_{t-1} + V_z x_t + b_z)
        h_t = h_{t-1} + ε · z_t ⊙ tanh((W - Wᵀ - γI) h_{t-1} + V_h x_t + b_h)

    `kernel` has shape `(input_dim, 2·units)` and `bias` `(2·units,)`, laid
    out as `[gate z | candidate h]`.

    Args:
        recurrent_activation: Activation of the gate `z` (sigmoid in the
            paper).

    Call arguments:
        - `sequence`: A 2D tensor of shape `(batch, input_dim)`, one time step.
        - `states`: A list with one tensor of shape `(batch, units)`, `h_{t-1}`.
        - `training`: Python boolean, whether dropout is applied.

    Examples:
        >>> import numpy as np, keras
        >>> from keras_antisym import GatedAntisymmetricCell
        >>> layer = keras.layers.RNN(GatedAntisymmetricCell(32), return_sequences=True)
        >>> tuple(layer(np.zeros((4, 100, 3), "float32")).shape)
        (4, 100, 32)
    """

    num_blocks: int = 2

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
        kernel_constraint: KerasObject = None,
        recurrent_constraint: KerasObject = None,
        bias_constraint: KerasObject = None,
        dropout: float = 0.0,
        recurrent_dropout: float = 0.0,
        seed: int | None = None,
        antisymmetric: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
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
            **kwargs,
        )
        self.recurrent_activation = keras.activations.get(recurrent_activation)

    @overload
    def vector_field(
        self, shared: Tensor, blocks: list[Tensor], return_slope: Literal[False] = False
    ) -> Tensor: ...

    @overload
    def vector_field(
        self, shared: Tensor, blocks: list[Tensor], return_slope: Literal[True]
    ) -> tuple[Tensor, Tensor]: ...

    def vector_field(
        self, shared: Tensor, blocks: list[Tensor], return_slope: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """`f = z ⊙ act(a_c)`, `z = recurrent_activation(a_z)`; see `AntisymmetricCell`.

        Both `a_z` and `a_c` read `M h`, so `d = c ⊙ σ'(a_z) + z ⊙ act'(a_c)`
        and the Jacobian keeps the paper's "diagonal times M" form.
        """
        derivative = activation_derivative if return_slope else None
        return equations.vector_field(
            shared, blocks, self.activation, self.recurrent_activation, derivative
        )

    def argument_config(self) -> dict[str, Any]:
        return {
            **super().argument_config(),
            "recurrent_activation": keras.activations.serialize(self.recurrent_activation),
        }
