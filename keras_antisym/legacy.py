"""AntisymmetricRNN cells for legacy Keras 2 (`tf_keras`, `TF_USE_LEGACY_KERAS=1`).

With `TF_USE_LEGACY_KERAS=1`, `tf.keras` is Keras 2 (the `tf_keras` package), whose
`tf.keras.layers.RNN` takes only `tf_keras` cells. The cells here are those: the
same constructor arguments, equations, weights (names, shapes, order, the strictly
upper-triangular storage of `W`) and initialization as `keras_antisym.AntisymmetricCell`
and `keras_antisym.GatedAntisymmetricCell`, so `get_weights()`/`set_weights()` move a
model between Keras 3 and Keras 2 both ways. The equations are not restated here:
both compute through `keras_antisym._equations`, with TensorFlow ops (`TF_OPS`)
here and `keras.ops` there.

This is the only module of `keras_antisym` that imports `tf_keras`
(`pip install "keras-antisym[legacy]"`). Two private `tf_keras` pieces are used:
`DropoutRNNCellMixin` (`tf.keras.layers.RNN` resets the dropout masks of cells of
this class before each sequence, giving one mask per sequence, as Keras' own
`SimpleRNNCell`) and `BaseRandomLayer` (Keras 2's seeded dropout), both present
in tf_keras 2.16 to 2.21.

Examples:
    >>> import os; os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow is imported
    >>> import numpy as np, tensorflow as tf
    >>> from keras_antisym.legacy import AntisymmetricCell
    >>> layer = tf.keras.layers.RNN(AntisymmetricCell(8, epsilon=0.1), return_sequences=True)
    >>> tuple(layer(np.zeros((2, 5, 3), "float32")).shape)
    (2, 5, 8)
"""

import types

import tensorflow as tf
import tf_keras
from tf_keras.__internal__.layers import BaseRandomLayer
from tf_keras.src.layers.rnn.dropout_rnn_cell_mixin import DropoutRNNCellMixin

from keras_antisym import _equations as equations
from keras_antisym._validation import check_bool, check_float, check_positive_int, check_rate

__all__ = ["TF_OPS", "AntisymmetricCell", "FanInNormal", "GatedAntisymmetricCell"]

#: The array functions of `keras_antisym._equations`, as TensorFlow ops.
TF_OPS = types.SimpleNamespace(
    matmul=tf.matmul,
    transpose=tf.transpose,
    eye=tf.eye,
    zeros=tf.zeros,
    scatter_update=tf.tensor_scatter_nd_update,
    reshape=tf.reshape,
    take=tf.gather,
)


@tf_keras.saving.register_keras_serializable(package="keras_antisym")
class FanInNormal(tf_keras.initializers.RandomNormal):
    """Normal initializer `N(0, sigma**2 / fan_in)`, `fan_in = shape[0]`, for tf_keras.

    The paper's initialization (Chang et al., 2019, Appendix C), as
    `keras_antisym.FanInNormal` for Keras 3: `N(0, 1/m)` for the input kernel
    and `N(0, sigma_w**2 / n)` for `W`. `sigma=0` gives zeros. Seeding follows
    tf_keras' `RandomNormal`.

    Args:
        sigma: Non-negative float, the scale `sigma` (the paper's `sigma_w`).
        seed: Optional integer.

    Examples:
        >>> init = FanInNormal(sigma=4.0, seed=0)
        >>> w = init((128, 128))  # entries drawn from N(0, 16 / 128)
    """

    def __init__(self, sigma=1.0, seed=None):
        sigma = check_float("sigma", sigma, "a non-negative float", allow_zero=True)
        super().__init__(mean=0.0, stddev=1.0, seed=seed)
        self.sigma = sigma

    def __call__(self, shape, dtype=None, **kwargs):
        shape = tuple(shape)
        if not shape:
            raise ValueError(
                "Received an invalid value for argument `shape`, expected at "
                f"least one dimension, got {shape}."
            )
        dtype = tf.as_dtype(dtype or tf_keras.backend.floatx())
        if self.sigma == 0.0:
            return tf.zeros(shape, dtype)
        stddev = equations.fan_in_stddev(self.sigma, shape)
        return self._random_generator.random_normal(shape, 0.0, stddev, dtype, None)

    def get_config(self):
        return {"sigma": self.sigma, "seed": self.seed}


@tf_keras.saving.register_keras_serializable(package="keras_antisym")
class AntisymmetricCell(DropoutRNNCellMixin, tf_keras.layers.AbstractRNNCell, BaseRandomLayer):
    """Cell of the AntisymmetricRNN (Chang et al., ICLR 2019, eq. 9) for tf_keras.

    The Keras 2 twin of `keras_antisym.AntisymmetricCell`, for
    `tf.keras.layers.RNN` under `TF_USE_LEGACY_KERAS=1`:

        h_t = h_{t-1} + epsilon * tanh((W - Wᵀ - gamma*I) h_{t-1} + V x_t + b)

    Weights `kernel` `(input_dim, units)` (`Vᵀ`), `recurrent_kernel` (the
    strictly upper triangle of `W`, `units·(units-1)/2` entries in the order of
    `numpy.triu_indices(units, 1)`; `(units, units)` when not antisymmetric)
    and `bias`, in this order and layout, as the Keras 3 cell: weights move
    between the two with `get_weights()`/`set_weights()`.

    Args:
        units: Positive integer, the dimension `n` of the hidden state.
        epsilon: Positive float, the step size `ε`.
        gamma: Non-negative float, the diffusion `γ`.
        activation: Activation of the update (`tanh` in the paper).
        use_bias: Boolean, whether the update has a bias `b`.
        kernel_initializer: Initializer for `kernel`. Defaults to the paper's
            `N(0, 1/m)`, `FanInNormal(1.0)` (of this module).
        recurrent_initializer: Initializer for `W`, called with the full
            `(units, units)` shape; the strictly upper triangle is kept.
            Defaults to `FanInNormal(1.0)`, the paper's `N(0, σ_w²/n)`, σ_w = 1.
        bias_initializer: Initializer for the bias (zeros in the paper).
        kernel_regularizer: Regularizer for `kernel`.
        recurrent_regularizer: Regularizer for the stored vector of `W`.
        bias_regularizer: Regularizer for the bias.
        kernel_constraint: Constraint for `kernel`.
        recurrent_constraint: Constraint for the stored vector of `W`.
        bias_constraint: Constraint for the bias.
        dropout: Float in [0, 1), fraction of the inputs to drop (one mask per
            sequence).
        recurrent_dropout: Float in [0, 1), fraction of `h_{t-1}` to drop in
            the recurrent product only; the skip path is never dropped.
        seed: Integer, random seed for dropout.
        antisymmetric: Boolean. `False` gives the paper's ablation model, a
            free `(units, units)` matrix `U` in place of `W - Wᵀ` (`U - γI`).

    Call arguments:
        - `inputs`: A 2D tensor `(batch, input_dim)`, one time step.
        - `states`: A list with one tensor `(batch, units)`, `h_{t-1}`.
        - `training`: Python boolean, whether dropout is applied.

    Examples:
        >>> import os; os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before importing TensorFlow
        >>> import numpy as np, tensorflow as tf
        >>> from keras_antisym.legacy import AntisymmetricCell
        >>> layer = tf.keras.layers.RNN(AntisymmetricCell(32, epsilon=0.1, gamma=0.01))
        >>> tuple(layer(np.zeros((4, 100, 3), "float32")).shape)
        (4, 32)
    """

    #: Number of `units`-wide blocks in the input projection.
    num_blocks = 1

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
        kernel_constraint=None,
        recurrent_constraint=None,
        bias_constraint=None,
        dropout=0.0,
        recurrent_dropout=0.0,
        seed=None,
        antisymmetric=True,
        **kwargs,
    ):
        super().__init__(seed=seed, **kwargs)
        self.units = check_positive_int("units", units)
        self.epsilon = check_float("epsilon", epsilon, "a positive float", allow_zero=False)
        self.gamma = check_float("gamma", gamma, "a non-negative float", allow_zero=True)
        self.activation = tf_keras.activations.get(activation)
        self.use_bias = check_bool("use_bias", use_bias)
        self.kernel_initializer = tf_keras.initializers.get(
            kernel_initializer if kernel_initializer is not None else FanInNormal(1.0)
        )
        self.recurrent_initializer = tf_keras.initializers.get(
            recurrent_initializer if recurrent_initializer is not None else FanInNormal(1.0)
        )
        self.bias_initializer = tf_keras.initializers.get(bias_initializer)
        self.kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)
        self.recurrent_regularizer = tf_keras.regularizers.get(recurrent_regularizer)
        self.bias_regularizer = tf_keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = tf_keras.constraints.get(kernel_constraint)
        self.recurrent_constraint = tf_keras.constraints.get(recurrent_constraint)
        self.bias_constraint = tf_keras.constraints.get(bias_constraint)
        self.dropout = check_rate("dropout", dropout)
        self.recurrent_dropout = check_rate("recurrent_dropout", recurrent_dropout)
        self.seed = seed
        self.antisymmetric = check_bool("antisymmetric", antisymmetric)
        self._upper_indices = (
            equations.upper_triangle_indices(self.units) if self.antisymmetric else None
        )

    @property
    def state_size(self):
        return self.units

    @property
    def output_size(self):
        return self.units

    def build(self, input_shape):
        input_shape = tuple(tf.TensorShape(input_shape).as_list())
        equations.add_weights(self, input_shape, "tf.keras.layers.RNN")
        super().build(input_shape)

    def _upper_triangle_initializer(self, shape, dtype=None, **kwargs):
        full = self.recurrent_initializer((self.units, self.units), dtype=dtype)
        return equations.upper_triangle(TF_OPS, full, self.units)

    def recurrent_operand(self):
        """`(W - Wᵀ - γI)ᵀ`, the matrix that multiplies `h` from the right."""
        stored = tf.convert_to_tensor(self.recurrent_kernel)
        return equations.recurrent_operand(
            TF_OPS, stored, self.units, self.gamma, self.antisymmetric, self._upper_indices
        )

    def transition_matrix(self):
        """The paper's `W - Wᵀ - γI` (or `U - γI` when not antisymmetric)."""
        return tf.transpose(self.recurrent_operand())

    def input_weights(self):
        """`[(V_k, b_k)]`: the kernel and bias as `units`-wide blocks."""
        kernel = tf.convert_to_tensor(self.kernel)
        bias = None if self.bias is None else tf.convert_to_tensor(self.bias)
        return equations.input_blocks(kernel, bias, self.units, self.num_blocks)

    def _gate_activation(self):
        return None

    def sequence_constants(self):
        """`(recurrent_operand(), input_weights())`, what every step of a sequence reads."""
        return self.recurrent_operand(), self.input_weights()

    def reset_dropout_mask(self):
        # `tf.keras.layers.RNN` calls this before its time loop: in a graph (`fit`,
        # `tf.function`) the constants are formed here once, and every step traced in
        # this graph or in its loop body reads them, instead of forming `W - Wᵀ - γI`
        # at each step. Eagerly, and for a cell called on its own, each call forms them.
        super().reset_dropout_mask()
        self._sequence_cache = None
        if self.built and not tf.executing_eagerly():
            graph = tf.compat.v1.get_default_graph()
            self._sequence_cache = (graph, self.sequence_constants())

    def _cached_sequence_constants(self):
        cache = getattr(self, "_sequence_cache", None)
        if cache is not None and not tf.executing_eagerly():
            # This graph, or the body of a `tf.while_loop` in it (the RNN's time loop).
            # Not any other function traced inside it (SavedModel saving traces the
            # cell's call alone), which cannot be saved if it captures the constants.
            graph = tf.compat.v1.get_default_graph()
            while graph is not cache[0] and type(graph).__name__ == "WhileBodyFuncGraph":
                graph = graph.outer_graph
            if graph is cache[0]:
                return cache[1]
        return self.sequence_constants()

    def call(self, inputs, states, training=None):
        h = states[0] if tf.nest.is_nested(states) else states
        dropout_mask = self.get_dropout_mask_for_cell(inputs, training)
        recurrent_mask = self.get_recurrent_dropout_mask_for_cell(h, training)
        if dropout_mask is not None:
            inputs = inputs * dropout_mask
        operand, weights = self._cached_sequence_constants()
        blocks = equations.project_blocks(TF_OPS, inputs, weights)
        shared = equations.recurrent_term(TF_OPS, h, operand, recurrent_mask)
        rate = equations.vector_field(shared, blocks, self.activation, self._gate_activation())
        h_new = equations.euler_step(h, self.epsilon, rate)
        return h_new, ([h_new] if tf.nest.is_nested(states) else h_new)

    def get_config(self):
        serialize = tf_keras.saving.serialize_keras_object
        config = {
            "units": self.units,
            "epsilon": self.epsilon,
            "gamma": self.gamma,
            "activation": tf_keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            "kernel_initializer": serialize(self.kernel_initializer),
            "recurrent_initializer": serialize(self.recurrent_initializer),
            "bias_initializer": serialize(self.bias_initializer),
            "kernel_regularizer": serialize(self.kernel_regularizer),
            "recurrent_regularizer": serialize(self.recurrent_regularizer),
            "bias_regularizer": serialize(self.bias_regularizer),
            "kernel_constraint": serialize(self.kernel_constraint),
            "recurrent_constraint": serialize(self.recurrent_constraint),
            "bias_constraint": serialize(self.bias_constraint),
            "dropout": self.dropout,
            "recurrent_dropout": self.recurrent_dropout,
            "seed": self.seed,
            "antisymmetric": self.antisymmetric,
        }
        return {**super().get_config(), **config}


@tf_keras.saving.register_keras_serializable(package="keras_antisym")
class GatedAntisymmetricCell(AntisymmetricCell):
    """Cell of the AntisymmetricRNN with an input gate (Chang et al., eq. 10) for tf_keras.

    The Keras 2 twin of `keras_antisym.GatedAntisymmetricCell`:

        z_t = sigmoid((W - Wᵀ - γI) h_{t-1} + V_z x_t + b_z)
        h_t = h_{t-1} + ε · z_t ⊙ tanh((W - Wᵀ - γI) h_{t-1} + V_h x_t + b_h)

    `kernel` `(input_dim, 2·units)` and `bias` `(2·units,)` are laid out
    `[gate z | candidate h]`, as in the Keras 3 cell.

    Args:
        units, epsilon, gamma, activation: As in `AntisymmetricCell`.
        recurrent_activation: Activation of the gate `z` (sigmoid in the paper).
        use_bias, kernel_initializer, recurrent_initializer,
        bias_initializer, kernel_regularizer, recurrent_regularizer,
        bias_regularizer, kernel_constraint, recurrent_constraint,
        bias_constraint, dropout, recurrent_dropout, seed, antisymmetric:
            As in `AntisymmetricCell`.

    Examples:
        >>> import os; os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before importing TensorFlow
        >>> import numpy as np, tensorflow as tf
        >>> from keras_antisym.legacy import GatedAntisymmetricCell
        >>> layer = tf.keras.layers.RNN(GatedAntisymmetricCell(32), return_sequences=True)
        >>> tuple(layer(np.zeros((4, 100, 3), "float32")).shape)
        (4, 100, 32)
    """

    num_blocks = 2

    def __init__(
        self,
        units,
        epsilon=0.01,
        gamma=0.01,
        activation="tanh",
        recurrent_activation="sigmoid",
        use_bias=True,
        kernel_initializer=None,
        recurrent_initializer=None,
        bias_initializer="zeros",
        kernel_regularizer=None,
        recurrent_regularizer=None,
        bias_regularizer=None,
        kernel_constraint=None,
        recurrent_constraint=None,
        bias_constraint=None,
        dropout=0.0,
        recurrent_dropout=0.0,
        seed=None,
        antisymmetric=True,
        **kwargs,
    ):
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
        self.recurrent_activation = tf_keras.activations.get(recurrent_activation)

    def _gate_activation(self):
        return self.recurrent_activation

    def get_config(self):
        return {
            **super().get_config(),
            "recurrent_activation": tf_keras.activations.serialize(self.recurrent_activation),
        }


# tf_keras' `.h5` loader (and any load inside its `in_tf_saved_model_scope`) reads the
# objects nested in a layer's config (the cell in `RNN`'s, the initializers in the cell's)
# by their bare class names, not by the registered names `keras_antisym>...` that the
# configs also hold: the bare names are added to tf_keras' custom objects too, unless
# another class already took them.
for _cls in (FanInNormal, AntisymmetricCell, GatedAntisymmetricCell):
    tf_keras.utils.get_custom_objects().setdefault(_cls.__name__, _cls)
del _cls
