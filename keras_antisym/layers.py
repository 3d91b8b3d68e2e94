"""Fused AntisymmetricRNN layers: the fast path for whole sequences."""

import keras
from keras import ops

from keras_antisym._keras_private import accelerator_available, rnn_loop
from keras_antisym.cells import AntisymmetricCell, GatedAntisymmetricCell

# Hoisting `x·Vᵀ + b` of all steps out of the loop into one product. Measured
# (training step, batch 128, units 128, T=400, m=96): on an H200 it made the
# step 8-12% faster (gated 15-28%; JAX and PyTorch); on a 2-core CPU 16-35%
# slower (gated 36-81%; TensorFlow and JAX), at m=16 too. So the fused layers
# hoist on accelerators only, for inputs of at least HOIST_MIN_INPUT_DIM features.
# `benchmarks` measures both choices on any machine (its `hoist` section).
HOIST_MIN_INPUT_DIM = 8
#: None: on accelerators only; True or False: always or never (for inputs of at
#: least HOIST_MIN_INPUT_DIM features).
HOIST_INPUTS = None
# Euler steps per iteration of the time loop (sequences of a static length that
# it divides, without mask or unroll). Measured as above: 2 steps per iteration
# made a training step 12% faster (gated 9%); 4 gained less.
STEPS_PER_ITERATION = 2


def hoists_inputs(input_dim):
    """Whether the fused layers project all steps' inputs before the loop."""
    if input_dim is None or input_dim < HOIST_MIN_INPUT_DIM:
        return False
    return accelerator_available() if HOIST_INPUTS is None else bool(HOIST_INPUTS)


@keras.saving.register_keras_serializable(package="keras_antisym")
class AntisymmetricRNN(keras.layers.RNN):
    """Fused AntisymmetricRNN layer (Chang et al., ICLR 2019, eq. 9).

        h_t = h_{t-1} + epsilon * tanh((W - Wᵀ - gamma*I) h_{t-1} + V x_t + b)

    Computes exactly what `keras.layers.RNN(AntisymmetricCell(...))` computes,
    with the same weights in the same order and shapes (so `set_weights`
    moves a model between the two), on the same time loop as Keras' own
    recurrent layers. `W - Wᵀ - γI` is formed once per call. On a GPU or TPU,
    for inputs with at least `HOIST_MIN_INPUT_DIM` features, the input
    projection `V x_t + b` of all time steps is one matrix product before the
    loop; otherwise each step projects its own input, with a constant-1
    feature carrying the bias.

    Args:
        units: Positive integer, the dimension of the hidden state.
        epsilon, gamma, activation, use_bias, kernel_initializer,
        recurrent_initializer, bias_initializer, kernel_regularizer,
        recurrent_regularizer, bias_regularizer, kernel_constraint,
        recurrent_constraint, bias_constraint, dropout, recurrent_dropout,
        seed, antisymmetric: As in `AntisymmetricCell`.
        activity_regularizer: Regularizer for the layer's output.
        return_sequences: Boolean, return the whole output sequence instead
            of the last output.
        return_state: Boolean, also return the last state.
        go_backwards: Boolean, process the input sequence backwards and
            return the reversed sequence.
        stateful: Boolean, the last state of sample `i` of a batch is the
            initial state of sample `i` of the next batch.
        unroll: Boolean, unroll the loop in Python (static length only).

    Call arguments:
        sequences: A 3D tensor `(batch, timesteps, features)`.
        initial_state: Optional list with one `(batch, units)` tensor.
        mask: Optional boolean `(batch, timesteps)`; `True` marks the steps
            to process.
        training: Python boolean, whether dropout is applied.

    Example:

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

    cell_class = AntisymmetricCell
    cell_name = "antisymmetric_cell"
    cell_only_arguments = ()

    def __init__(
        self,
        units,
        epsilon=0.01,
        gamma=0.01,
        activation="tanh",
        use_bias=True,
        kernel_initializer=None,
        recurrent_initializer=None,
        bias_initializer="zeros",
        kernel_regularizer=None,
        recurrent_regularizer=None,
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        recurrent_constraint=None,
        bias_constraint=None,
        dropout=0.0,
        recurrent_dropout=0.0,
        seed=None,
        antisymmetric=True,
        return_sequences=False,
        return_state=False,
        go_backwards=False,
        stateful=False,
        unroll=False,
        **kwargs,
    ):
        extra = {name: kwargs.pop(name) for name in self.cell_only_arguments if name in kwargs}
        cell = self.cell_class(
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
            dtype=kwargs.get("dtype"),
            trainable=kwargs.get("trainable", True),
            name=self.cell_name,
            **extra,
        )
        super().__init__(
            cell,
            return_sequences=return_sequences,
            return_state=return_state,
            go_backwards=go_backwards,
            stateful=stateful,
            unroll=unroll,
            activity_regularizer=activity_regularizer,
            **kwargs,
        )
        self.input_spec = keras.layers.InputSpec(ndim=3)

    def inner_loop(self, sequences, initial_state, mask, training=False):
        cell = self.cell
        h0 = initial_state[0] if isinstance(initial_state, (list, tuple)) else initial_state
        # RNN.call has already drawn this call's dropout masks (one per
        # sequence) and formed the per-sequence constants.
        dropout_mask = cell.get_dropout_mask(sequences[:, 0])
        if training and dropout_mask is not None:
            sequences = sequences * ops.expand_dims(dropout_mask, 1)
        recurrent_mask = cell.step_recurrent_dropout_mask(h0) if training else None
        operand, weights = cell.cached_sequence_constants()
        blocks = len(weights)
        features = sequences.shape[-1]
        hoist = hoists_inputs(features)
        if hoist:
            sequences = cell.project_inputs(sequences)  # blocks side by side
        elif features and weights[0][1] is not None:
            # A constant-1 input feature makes each bias a row of its kernel:
            # one product per block and step instead of a product and a bias
            # add, whose gradient is a per-step reduction (6% faster, gated 4%).
            sequences = ops.concatenate([sequences, ops.ones_like(sequences[..., :1])], -1)
            weights = [
                (ops.concatenate([kernel, ops.expand_dims(bias, 0)], 0), None)
                for kernel, bias in weights
            ]
        steps, width = sequences.shape[1], sequences.shape[-1]
        chunk = STEPS_PER_ITERATION
        if mask is not None or self.unroll or steps is None or steps % chunk or not width:
            chunk = 1
        go_backwards = self.go_backwards
        if chunk > 1:
            # `chunk` Euler steps per loop iteration: the loop's own per-iteration
            # work is shared by several steps. Reversal happens before chunking.
            if go_backwards:
                sequences = ops.flip(sequences, axis=1)
                go_backwards = False
            sequences = ops.reshape(sequences, (-1, steps // chunk, chunk * width))

        # RNN.call assigns the last state into the state variables in place;
        # under torch autograd the loop must not hold those tensors (as RNN's own loop).
        copy_states = keras.backend.backend() == "torch" and self.stateful

        def step_blocks(inputs):
            """The projected input blocks of each of the `chunk` steps."""
            if hoist:
                pieces = [inputs] if chunk * blocks == 1 else ops.split(inputs, chunk * blocks, -1)
                return [pieces[j * blocks : (j + 1) * blocks] for j in range(chunk)]
            # Strided slices of narrow raw inputs (measured faster than a split).
            raw = (
                [inputs]
                if chunk == 1
                else [inputs[:, j * width : (j + 1) * width] for j in range(chunk)]
            )
            return [cell.project_blocks(x_j, weights) for x_j in raw]

        def step(inputs, states):
            h = ops.copy(states[0]) if copy_states else states[0]
            outputs = []
            for projected in step_blocks(inputs):
                h = cell.step(h, projected, operand, recurrent_mask)
                outputs.append(h)
            return (h if chunk == 1 else ops.concatenate(outputs, axis=-1)), [h]

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

    def transition_matrix(self):
        """The paper's `W - Wᵀ - γI` (see `AntisymmetricCell`)."""
        return self.cell.transition_matrix()

    @property
    def units(self):
        return self.cell.units

    @property
    def epsilon(self):
        return self.cell.epsilon

    @property
    def gamma(self):
        return self.cell.gamma

    @property
    def antisymmetric(self):
        return self.cell.antisymmetric

    @property
    def activation(self):
        return self.cell.activation

    @property
    def dropout(self):
        return self.cell.dropout

    @property
    def recurrent_dropout(self):
        return self.cell.recurrent_dropout

    def get_config(self):
        base_config = super().get_config()
        del base_config["cell"]
        return {**base_config, **self.cell.argument_config()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


@keras.saving.register_keras_serializable(package="keras_antisym")
class GatedAntisymmetricRNN(AntisymmetricRNN):
    """Fused AntisymmetricRNN with an input gate (Chang et al., eq. 10).

        z_t = sigmoid((W - Wᵀ - γI) h_{t-1} + V_z x_t + b_z)
        h_t = h_{t-1} + ε · z_t ⊙ tanh((W - Wᵀ - γI) h_{t-1} + V_h x_t + b_h)

    The same weights, in the same order and shapes, as
    `keras.layers.RNN(GatedAntisymmetricCell(...))`. Arguments are those of
    `AntisymmetricRNN`, plus:

    Args:
        recurrent_activation: Activation of the gate `z` (sigmoid).

    Example:

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

    cell_class = GatedAntisymmetricCell
    cell_name = "gated_antisymmetric_cell"
    cell_only_arguments = ("recurrent_activation",)

    def __init__(self, units, recurrent_activation="sigmoid", **kwargs):
        super().__init__(units, recurrent_activation=recurrent_activation, **kwargs)

    @property
    def recurrent_activation(self):
        return self.cell.recurrent_activation
