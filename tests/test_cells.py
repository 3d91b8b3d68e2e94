"""keras_antisym/cells.py: the paper's equations, through `keras.layers.RNN` and the fused layers.

The recurrence of both cells is checked against the NumPy reference
(benchmarks/reference.py) through `keras.layers.RNN(cell)` and, since the fused
layers must compute exactly the same, through them too.
"""

import keras
import numpy as np
import pytest

from benchmarks import reference
from keras_antisym import (
    AntisymmetricCell,
    AntisymmetricRNN,
    GatedAntisymmetricCell,
    GatedAntisymmetricRNN,
)
from tests.conftest import (
    LAYER_KINDS,
    check_against_reference,
    check_every_argument_round_trips,
    constructor_arguments,
    inputs,
    make_layer,
    random_weights,
)

ATOL = 2e-5


def _ragged_mask(batch=3, steps=12):
    mask = np.ones((batch, steps), dtype=bool)
    mask[0, 9:] = False  # right padding
    mask[1, :3] = False  # left padding
    mask[2, [4, 5, 8]] = False  # holes
    return mask


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("unroll", [False, True])
@pytest.mark.parametrize("features", [3, 9])  # 9: the fused layers hoist V·x
@pytest.mark.parametrize("masked", [False, True])
def test_matches_numpy_reference(kind, gated, go_backwards, unroll, features, masked):
    mask = _ragged_mask() if masked else None
    check_against_reference(kind, gated, inputs(features=features), go_backwards, unroll, mask)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_the_fused_training_loop_matches_the_numpy_reference_too(gated, go_backwards, masked):
    """In training (no dropout here) the fused layers run Keras' loop on every backend;
    outside it, on TensorFlow, their own (the test above): both are the equations."""
    mask = _ragged_mask() if masked else None
    x = inputs(features=3)
    check_against_reference("fused", gated, x, go_backwards, False, mask, training=True)


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_masking_layer_and_last_output(kind):
    x = inputs()
    x[0, 7:] = 0.0  # padded with the mask value
    model = keras.Sequential(
        [
            keras.Input((12, 4)),
            keras.layers.Masking(0.0),
            make_layer(kind, True, 5, epsilon=0.5, gamma=0.1),
        ]
    )
    weights = random_weights(model.layers[-1], seed=4)
    _, expected_state = reference.run(
        weights, x, units=5, gated=True, epsilon=0.5, gamma=0.1, mask=np.any(x != 0.0, axis=-1)
    )
    np.testing.assert_allclose(np.asarray(model(x)), expected_state, atol=ATOL)
    # The padded sample equals the same sample cut to its 7 real steps.
    short = make_layer(kind, True, 5, epsilon=0.5, gamma=0.1)
    short(x[:1, :7])
    short.set_weights(weights)
    np.testing.assert_allclose(np.asarray(model(x))[0], np.asarray(short(x[:1, :7]))[0], atol=ATOL)


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("gated", [False, True])
def test_ablation_model_matches_reference(kind, gated):
    x = inputs()
    args = dict(epsilon=0.1, gamma=0.2)
    layer = make_layer(kind, gated, 4, return_sequences=True, antisymmetric=False, **args)
    layer(x)
    weights = random_weights(layer, seed=5)
    assert weights[1].shape == (4, 4)
    expected, _ = reference.run(weights, x, units=4, gated=gated, antisymmetric=False, **args)
    np.testing.assert_allclose(np.asarray(layer(x)), expected, atol=ATOL)


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("features", [4, 9])  # 9: the fused layers hoist V·x
def test_initial_state_and_no_bias(kind, gated, features):
    x = inputs(features=features)
    h0 = np.random.RandomState(7).standard_normal((3, 5)).astype("float32")
    layer = make_layer(
        kind,
        gated,
        5,
        epsilon=0.4,
        gamma=0.3,
        use_bias=False,
        return_sequences=True,
        hoist_inputs=features >= 8,
    )
    layer(x)
    weights = random_weights(layer, seed=8)
    assert len(weights) == 2
    expected, _ = reference.run(weights, x, units=5, epsilon=0.4, gamma=0.3, gated=gated, h0=h0)
    np.testing.assert_allclose(np.asarray(layer(x, initial_state=[h0])), expected, atol=ATOL)


def test_hand_computed_single_step():
    # units=2, m=1: W = [[0, 2], [0, 0]] so W - Wᵀ - γI = [[-γ, 2], [-2, -γ]].
    layer = keras.layers.RNN(AntisymmetricCell(2, epsilon=0.5, gamma=0.25), return_sequences=True)
    x = np.array([[[1.0], [0.0]]], dtype="float32")
    layer(x)
    layer.set_weights(
        [
            np.array([[1.0, -1.0]], "float32"),
            np.array([2.0], "float32"),
            np.array([0.0, 0.5], "float32"),
        ]
    )
    out = np.asarray(layer(x))[0]
    h1 = 0.5 * np.tanh(np.array([1.0, -0.5]))
    m = np.array([[-0.25, 2.0], [-2.0, -0.25]])
    h2 = h1 + 0.5 * np.tanh(m @ h1 + np.array([0.0, 0.5]))
    np.testing.assert_allclose(out, np.stack([h1, h2]), atol=1e-6)


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("steps", [5, 6])  # 6: the fused loop's two-step iterations
def test_inputs_without_features(kind, gated, steps):
    # No input features: V·x = 0 and the state is driven by the bias alone.
    x = np.zeros((2, steps, 0), "float32")
    layer = make_layer(kind, gated, 4, epsilon=0.3, gamma=0.1, return_sequences=True)
    layer(x)
    weights = random_weights(layer, seed=3)
    expected, _ = reference.run(weights, x, units=4, epsilon=0.3, gamma=0.1, gated=gated)
    assert np.abs(expected).max() > 0.1
    np.testing.assert_allclose(np.asarray(layer(x)), expected, atol=ATOL)


@pytest.mark.parametrize("gamma", [0.0, 0.01, 1.0])
def test_transition_matrix_is_antisymmetric_minus_diffusion(gamma):
    layer = AntisymmetricRNN(7, gamma=gamma)
    layer(np.zeros((1, 2, 3), "float32"))
    weights = random_weights(layer)
    m = np.asarray(layer.transition_matrix(), dtype="float64")
    np.testing.assert_allclose(m + m.T, -2 * gamma * np.eye(7), atol=1e-6)
    np.testing.assert_allclose(m, reference.transition_matrix(weights[1], 7, gamma), atol=1e-6)
    eig = np.linalg.eigvals(m + gamma * np.eye(7))
    np.testing.assert_allclose(eig.real, 0.0, atol=1e-5)
    # The diffusion shifts every eigenvalue by -γ: real parts are exactly -γ.
    np.testing.assert_allclose(np.linalg.eigvals(m).real, -gamma, atol=1e-5)


def test_cell_step_jacobian_matches_paper_form():
    """∂h_t/∂h_{t-1} = I + ε·diag(tanh'(a))·M, checked with autodiff (TF)."""
    import tensorflow as tf

    cell = AntisymmetricCell(5, epsilon=0.3, gamma=0.1)
    x = np.random.RandomState(0).standard_normal((1, 2)).astype("float32")
    h = tf.constant(np.random.RandomState(1).standard_normal((1, 5)).astype("float32"))
    cell.build((1, 2))
    weights = [w.numpy() for w in cell.weights]
    with tf.GradientTape() as tape:
        tape.watch(h)
        out, _ = cell(x, [h])
    jac = tape.batch_jacobian(out, h).numpy()[0]
    m = reference.transition_matrix(weights[1], 5, 0.1)
    a = m @ h.numpy()[0] + weights[0].T @ x[0] + weights[2]
    expected = np.eye(5) + 0.3 * np.diag(1 - np.tanh(a) ** 2) @ m
    np.testing.assert_allclose(jac, expected, atol=1e-5)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("activation", ["tanh", "softsign", "relu", "linear", "elu"])
def test_step_with_slope_against_numpy(gated, activation):
    """`step(..., return_slope=True)`: the Euler step and `d` of `I + ε·diag(d)·M`, by hand."""
    rng = np.random.RandomState(3)
    cell_class = GatedAntisymmetricCell if gated else AntisymmetricCell
    cell = cell_class(4, epsilon=0.2, gamma=0.1, activation=activation)
    cell.build((None, 3))
    weights = [0.8 * rng.standard_normal(w.shape).astype("float32") for w in cell.weights]
    for variable, value in zip(cell.weights, weights, strict=True):
        variable.assign(value)
    h = rng.standard_normal((2, 4)).astype("float32")
    x = rng.standard_normal((2, 3)).astype("float32")
    operand, blocks = cell.sequence_constants()
    h_new, slope = cell.step(h, cell.project_blocks(x, blocks), operand, return_slope=True)
    plain = cell.step(h, cell.project_blocks(x, blocks), operand)
    act = {
        "tanh": (np.tanh, lambda a: 1 - np.tanh(a) ** 2),
        "softsign": (lambda a: a / (1 + abs(a)), lambda a: 1 / (1 + abs(a)) ** 2),
        "relu": (lambda a: np.maximum(a, 0), lambda a: (a > 0).astype(float)),
        "linear": (lambda a: a, np.ones_like),
        "elu": (lambda a: np.where(a > 0, a, np.expm1(a)), lambda a: np.where(a > 0, 1, np.exp(a))),
    }[activation]
    m = reference.transition_matrix(weights[1], 4, 0.1)
    shared, projected = h @ m.T, x @ weights[0] + weights[2]
    if gated:
        a_z, a_c = shared + projected[:, :4], shared + projected[:, 4:]
        z, c = reference.sigmoid(a_z), act[0](a_c)
        expected_h, expected_d = h + 0.2 * z * c, c * z * (1 - z) + z * act[1](a_c)
    else:
        expected_h, expected_d = h + 0.2 * act[0](shared + projected), act[1](shared + projected)
    tolerance = 2e-3 if activation == "elu" else 1e-5  # elu: central differences
    np.testing.assert_allclose(np.asarray(h_new), expected_h, atol=1e-5)
    np.testing.assert_allclose(np.asarray(plain), np.asarray(h_new), atol=1e-7)
    np.testing.assert_allclose(np.asarray(slope), expected_d, atol=tolerance)


def _scaled_tanh(x):
    return 2.0 * keras.ops.tanh(0.5 * x)


def _tensorflow_function(name):
    import tensorflow as tf

    return tf.function(getattr(tf.math, name))


@pytest.mark.parametrize(
    "activation",
    ["tanh", "sigmoid", "linear", "relu", "softsign", "elu", "gelu", _scaled_tanh, "tf-tanh",
     "tf-sigmoid", "leaky-relu-layer"],
)  # fmt: skip
def test_activation_derivative_against_autodiff(activation):
    """`activation'(x)` against TensorFlow's autodiff (`relu'(0) = 0` as there): the closed
    forms to float32 rounding, any other activation by central differences (~1e-3).

    Closed forms also for callables other than Python functions named after the usual
    activations (as `jax.numpy.tanh` or `torch.tanh` on their backends; here `tf.function`s),
    central differences for callables without a name (a Keras layer).
    """
    import tensorflow as tf

    from keras_antisym.cells import activation_derivative

    if activation == "leaky-relu-layer":
        function = keras.layers.LeakyReLU(negative_slope=0.2)
    elif activation in ("tf-tanh", "tf-sigmoid"):
        function = _tensorflow_function(activation[3:])
        activation = activation[3:]
    else:
        function = keras.activations.get(activation)
    grid = np.concatenate([np.linspace(-4.0, 4.0, 41), [1e-3, -1e-3, 0.3, -0.7]])
    x = tf.constant(grid.astype("float32"))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = function(x)
    expected = tape.gradient(y, x).numpy()
    closed_form = activation in ("tanh", "sigmoid", "linear", "relu", "softsign")
    tolerance = dict(atol=1e-6, rtol=0) if closed_form else dict(atol=1e-4, rtol=2e-3)
    got = np.asarray(activation_derivative(function, x))
    assert got.shape == expected.shape
    # Central differences of step 1e-2 straddle elu's kink at 0: compared away from it.
    smooth = np.ones(grid.shape, bool) if closed_form else np.abs(grid) > 1e-2
    np.testing.assert_allclose(got[smooth], expected[smooth], **tolerance)
    if closed_form:  # in the dtype of `x`
        double = activation_derivative(function, tf.constant(grid))
        assert keras.backend.standardize_dtype(double.dtype) == "float64"
        np.testing.assert_allclose(np.asarray(double), expected, atol=1e-6)


def _head_count(rnn, features):
    model = keras.Sequential([keras.Input((None, features)), rnn, keras.layers.Dense(10)])
    return model.count_params()


@pytest.mark.parametrize(
    "make, features, expected",
    [
        (lambda: AntisymmetricRNN(128), 1, 9674),
        (lambda: GatedAntisymmetricRNN(128), 1, 9930),
        (lambda: AntisymmetricRNN(256), 3, 36234),
        (lambda: GatedAntisymmetricRNN(256), 3, 37258),
        (lambda: GatedAntisymmetricRNN(196, antisymmetric=False), 3, 41954),
        (lambda: keras.layers.RNN(AntisymmetricCell(128)), 1, 9674),
        (lambda: keras.layers.RNN(GatedAntisymmetricCell(256)), 3, 37258),
        (lambda: keras.layers.LSTM(128), 3, 68874),
    ],
)
def test_paper_parameter_counts(make, features, expected):
    assert _head_count(make(), features) == expected


@pytest.mark.parametrize("units", [1, 2, 10])
def test_weight_shapes(units):
    for antisymmetric, rec_shape in [(True, (units * (units - 1) // 2,)), (False, (units, units))]:
        layer = GatedAntisymmetricRNN(units, antisymmetric=antisymmetric)
        layer(np.zeros((2, 3, 4), "float32"))
        shapes = [tuple(w.shape) for w in layer.weights]
        assert shapes == [(4, 2 * units), rec_shape, (2 * units,)]
        assert [w.name for w in layer.weights] == ["kernel", "recurrent_kernel", "bias"]


def test_recurrent_initializer_sees_the_full_matrix():
    layer = AntisymmetricRNN(
        4,
        recurrent_initializer=keras.initializers.Constant(
            np.arange(16, dtype="float32").reshape(4, 4)
        ),
    )
    layer(np.zeros((1, 1, 1), "float32"))
    np.testing.assert_array_equal(layer.get_weights()[1], [1, 2, 3, 6, 7, 11])


@pytest.mark.parametrize("cell_class", [AntisymmetricCell, GatedAntisymmetricCell])
def test_recurrent_initializer_gives_the_ablation_matrix(cell_class):
    """`antisymmetric=False`: the free `(units, units)` matrix `U` is the initializer's
    result as it is."""
    full = np.arange(16, dtype="float32").reshape(4, 4)
    layer = keras.layers.RNN(
        cell_class(4, antisymmetric=False, recurrent_initializer=keras.initializers.Constant(full))
    )
    layer(np.zeros((1, 1, 1), "float32"))
    np.testing.assert_array_equal(layer.get_weights()[1], full)


@pytest.mark.parametrize("cell_class", [AntisymmetricCell, GatedAntisymmetricCell])
def test_cell_arguments_round_trip_by_value(cell_class):
    cell = check_every_argument_round_trips(cell_class)
    assert cell.epsilon == 0.1 and cell.activation is keras.activations.relu


def test_arguments_in_keras_order_and_positional_like_the_ungated_cell():
    """Both cells take `(units, epsilon, gamma, activation, ...)`; the gate's
    activation follows `activation`, as in `keras.layers.GRUCell`."""
    plain = constructor_arguments(AntisymmetricCell)
    gated = constructor_arguments(GatedAntisymmetricCell)
    assert gated == plain[:4] + ["recurrent_activation"] + plain[4:]
    assert plain[:5] == ["units", "epsilon", "gamma", "activation", "use_bias"]
    for cell_class in (AntisymmetricCell, GatedAntisymmetricCell):
        cell = cell_class(4, 0.5, 0.25, "relu")
        assert (cell.epsilon, cell.gamma, cell.activation) == (0.5, 0.25, keras.activations.relu)


@pytest.mark.parametrize("shape", [(4, 3), (2, 4, 3, 1), (5,)])
def test_cell_in_rnn_rejects_wrong_rank(shape):
    layer = keras.layers.RNN(AntisymmetricCell(4))
    with pytest.raises(ValueError, match=r"sequences of shape \(batch, timesteps, features\)"):
        layer(np.zeros(shape, "float32"))


@pytest.mark.parametrize("cell_class", [AntisymmetricCell, GatedAntisymmetricCell])
def test_cell_rejects_wrong_rank_step(cell_class):
    """The whole message: the cell, the shape a step takes, how to give it sequences, the shape."""
    with pytest.raises(ValueError) as info:
        cell_class(4)(np.zeros((2, 3, 4), "float32"), [np.zeros((2, 4), "float32")])
    assert str(info.value) == (
        f"{cell_class.__name__} expects step inputs of shape (batch, features) with a known "
        "number of features, that is sequences of shape (batch, timesteps, features) given "
        "to keras.layers.RNN; got a step input shape of (2, 3, 4)."
    )


def test_unknown_feature_dimension():
    with pytest.raises(ValueError, match="known number of features"):
        AntisymmetricRNN(4)(keras.Input((None, None)))


def test_tensorflow_allows_xla_only_on_an_accelerator(monkeypatch):
    import keras_antisym.cells

    if keras.backend.backend() != "tensorflow":
        pytest.skip("the choice is TensorFlow's; JAX always compiles")
    assert not keras_antisym.cells.AntisymmetricCell(4).supports_jit  # this CPU
    monkeypatch.setattr(keras_antisym.cells, "accelerator_available", lambda: True)
    assert keras_antisym.cells.AntisymmetricCell(4).supports_jit
    assert keras_antisym.cells.GatedAntisymmetricCell(4).supports_jit


def _direct_step(cell, weights, x, h, input_mask=1.0, recurrent_mask=1.0):
    """One step of `cell` by NumPy, with optional dropout masks of `x` and of `h_{t-1}`."""
    units, gated = cell.units, isinstance(cell, GatedAntisymmetricCell)
    m = reference.transition_matrix(weights[1], units, cell.gamma)
    shared = (h * recurrent_mask) @ m.T
    projected = (x * input_mask) @ weights[0] + weights[2]
    if gated:
        z = reference.sigmoid(shared + projected[:, :units])
        return h + cell.epsilon * z * np.tanh(shared + projected[:, units:])
    return h + cell.epsilon * np.tanh(shared + projected)


def _built_cell(cell_class, **kwargs):
    rng = np.random.RandomState(21)
    cell = cell_class(4, epsilon=0.4, gamma=0.1, **kwargs)
    cell.build((None, 3))
    weights = [0.7 * rng.standard_normal(w.shape).astype("float32") for w in cell.weights]
    for variable, value in zip(cell.weights, weights, strict=True):
        variable.assign(value)
    x = rng.standard_normal((5, 3)).astype("float32")
    h = rng.standard_normal((5, 4)).astype("float32")
    return cell, weights, x, h


@pytest.mark.parametrize("cell_class", [AntisymmetricCell, GatedAntisymmetricCell])
def test_cell_returns_its_state_in_the_structure_it_was_given(cell_class):
    """As Keras' own cells: `states` a list of one tensor gives `[h_t]`, a bare tensor `h_t`."""
    cell, weights, x, h = _built_cell(cell_class)
    expected = _direct_step(cell, weights, x, h)
    for states in ([h], h):
        output, new_states = cell(x, states)
        np.testing.assert_allclose(np.asarray(output), expected, atol=1e-5)
        if isinstance(states, list):
            assert isinstance(new_states, list) and len(new_states) == 1
            new_states = new_states[0]
        else:
            assert not isinstance(new_states, (list, tuple))
        np.testing.assert_allclose(np.asarray(new_states), expected, atol=1e-5)


@pytest.mark.parametrize("cell_class", [AntisymmetricCell, GatedAntisymmetricCell])
def test_cell_called_directly_applies_dropout_only_when_training(cell_class):
    """Outside an RNN, `training=True` draws the cell's masks from the step's input and
    state (cached until reset, as Keras' `DropoutRNNCell`): inputs dropped, `h_{t-1}` dropped
    in the recurrent product only. `training` defaults to False."""
    cell, weights, x, h = _built_cell(cell_class, dropout=0.5, recurrent_dropout=0.5, seed=6)
    plain = _direct_step(cell, weights, x, h)
    np.testing.assert_allclose(np.asarray(cell(x, [h])[0]), plain, atol=1e-5)
    np.testing.assert_allclose(np.asarray(cell.call(x, [h])[0]), plain, atol=1e-5)
    output, _ = cell(x, [h], training=True)
    input_mask = np.asarray(cell.get_dropout_mask(x))
    recurrent_mask = np.asarray(cell.get_recurrent_dropout_mask(h))
    cell.reset_dropout_mask()
    cell.reset_recurrent_dropout_mask()
    assert input_mask.shape == x.shape and recurrent_mask.shape == h.shape
    for mask in (input_mask, recurrent_mask):
        assert set(np.unique(mask)) == {0.0, 2.0}  # kept entries scaled by 1 / (1 - rate)
    expected = _direct_step(cell, weights, x, h, input_mask, recurrent_mask)
    np.testing.assert_allclose(np.asarray(output), expected, atol=1e-5)


@pytest.mark.parametrize("cell_class", [AntisymmetricCell, GatedAntisymmetricCell])
@pytest.mark.parametrize("dtype", ["float64", "mixed_float16"])
def test_initial_state_is_zeros_in_the_compute_dtype(cell_class, dtype):
    """As Keras' own cells: `[zeros (batch, units)]` in the cell's compute dtype, which is
    the state's dtype: the variable dtype (float32 under a mixed policy, where the
    products run in `product_dtype`; `GRUCell` would give float16)."""
    cell = cell_class(5, dtype=dtype)
    (state,) = cell.get_initial_state(batch_size=3)
    assert keras.backend.standardize_dtype(state.dtype) == cell.compute_dtype
    assert cell.compute_dtype == ("float64" if dtype == "float64" else "float32")
    assert cell.product_dtype == dtype.split("_")[-1]
    np.testing.assert_array_equal(np.asarray(state), np.zeros((3, 5)))


@pytest.mark.parametrize("cell_class", [AntisymmetricCell, GatedAntisymmetricCell])
@pytest.mark.parametrize("antisymmetric", [True, False])
def test_recurrent_initializer_is_called_in_the_weights_dtype(cell_class, antisymmetric):
    """The recurrent initializer gets the weights' dtype (Keras' `initializer(shape, dtype)`
    contract): float64 weights hold float64 values, `1/3` not rounded to float32 first."""
    called = []

    def third(shape, dtype=None):
        called.append((tuple(shape), dtype))
        return keras.ops.full(shape, 1.0 / 3.0, dtype=dtype or "float32")

    cell = cell_class(4, dtype="float64", recurrent_initializer=third, antisymmetric=antisymmetric)
    cell.build((None, 2))
    assert [(shape, keras.backend.standardize_dtype(d)) for shape, d in called] == [
        ((4, 4), "float64")
    ]
    recurrent = keras.ops.convert_to_numpy(cell.recurrent_kernel)
    assert recurrent.dtype == np.float64
    np.testing.assert_array_equal(recurrent, np.full((6,) if antisymmetric else (4, 4), 1 / 3))
    assert float(np.float32(1.0 / 3.0)) != 1.0 / 3.0  # the values tell the two dtypes apart


@pytest.mark.parametrize("cell_class", [AntisymmetricCell, GatedAntisymmetricCell])
def test_cell_declares_keras_cell_sizes(cell_class):
    """The attributes of Keras' cell protocol (as `GRUCell`): `state_size` and `output_size`
    are both `units`, the width of `h_t`, for the gated cell's two-block kernel too."""
    cell, gru = cell_class(7), keras.layers.GRUCell(7)
    assert (cell.state_size, cell.output_size) == (7, 7) == (gru.state_size, gru.output_size)
