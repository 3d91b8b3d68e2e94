"""keras_antisym/layers.py: the fused layers, and what a Keras user expects of them.

Most tests run `keras.layers.RNN(cell)` too, which the fused layers must equal.
"""

import copy
import json
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

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


def _x(batch=4, steps=10, features=3, seed=0):
    return np.random.RandomState(seed).standard_normal((batch, steps, features)).astype("float32")


def _outputs_and_gradients(layer, x, mask=None):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, mask=mask, training=True)
        loss = tf.reduce_sum(y * tf.cos(tf.range(tf.size(y), dtype=y.dtype)[: y.shape[-1]]))
    grads = tape.gradient(loss, [x] + layer.trainable_weights)
    return y.numpy(), [g.numpy() for g in grads]


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("antisymmetric", [True, False])
@pytest.mark.parametrize("return_sequences", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("features", [3, 9])  # 9: the fused layers hoist V·x
def test_fused_layer_equals_cell_outputs_and_gradients(
    gated, antisymmetric, return_sequences, masked, features
):
    x = _x(features=features)
    mask = np.ones((4, 10), bool)
    mask[1, 6:] = False
    mask[2, :2] = False
    args = dict(
        epsilon=0.3,
        gamma=0.02,
        antisymmetric=antisymmetric,
        return_sequences=return_sequences,
        hoist_inputs=features >= 8,
    )
    cell_layer = make_layer("cell", gated, 6, **args)
    fused = make_layer("fused", gated, 6, **args)
    cell_layer(x)
    fused(x)
    assert [w.shape for w in fused.weights] == [w.shape for w in cell_layer.weights]
    fused.set_weights(random_weights(cell_layer, seed=1))
    y_cell, g_cell = _outputs_and_gradients(cell_layer, x, mask if masked else None)
    y_fused, g_fused = _outputs_and_gradients(fused, x, mask if masked else None)
    np.testing.assert_allclose(y_fused, y_cell, atol=1e-6)
    for a, b in zip(g_fused, g_cell, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_bidirectional_with_mask(kind):
    x, mask = _x(), np.ones((4, 10), bool)
    mask[0, 5:] = False
    layer = keras.layers.Bidirectional(
        make_layer(kind, True, 4, epsilon=0.5, gamma=0.1, return_sequences=True)
    )
    layer(x)
    forward_w = random_weights(layer.forward_layer, seed=2)
    backward_w = random_weights(layer.backward_layer, seed=3)
    y = np.asarray(layer(x, mask=mask))
    common = dict(units=4, gated=True, epsilon=0.5, gamma=0.1, mask=mask, zero_output_for_mask=True)
    fwd, _ = reference.run(forward_w, x, **common)
    bwd, _ = reference.run(backward_w, x, go_backwards=True, **common)
    np.testing.assert_allclose(y, np.concatenate([fwd, bwd[:, ::-1]], -1), atol=2e-5)


def test_stacked_cells_and_stacked_layers():
    x = _x()
    stacked = keras.layers.RNN(
        keras.layers.StackedRNNCells(
            [AntisymmetricCell(5, epsilon=0.2), GatedAntisymmetricCell(3, epsilon=0.7)]
        ),
        return_sequences=True,
    )
    stacked(x)
    w = random_weights(stacked, seed=4)
    first, _ = reference.run(w[:3], x, units=5, epsilon=0.2, gamma=0.01)
    second, _ = reference.run(
        w[3:], first.astype("float32"), units=3, epsilon=0.7, gamma=0.01, gated=True
    )
    np.testing.assert_allclose(np.asarray(stacked(x)), second, atol=2e-5)

    layers = keras.Sequential(
        [
            keras.Input((10, 3)),
            AntisymmetricRNN(5, epsilon=0.2, return_sequences=True),
            GatedAntisymmetricRNN(3, epsilon=0.7, return_sequences=True),
        ]
    )
    layers.set_weights(w)
    np.testing.assert_allclose(np.asarray(layers(x)), second, atol=2e-5)


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_stateful_continues_from_last_state(kind):
    x = _x(batch=2, steps=8)
    full = make_layer(kind, False, 4, epsilon=0.4, return_sequences=True)
    full(x)
    weights = random_weights(full, seed=5)
    stateful = make_layer(kind, False, 4, epsilon=0.4, return_sequences=True, stateful=True)
    model = keras.Sequential([keras.Input(batch_shape=(2, None, 3)), stateful])
    stateful.set_weights(weights)
    first, second = np.asarray(model(x[:, :5])), np.asarray(model(x[:, 5:]))
    np.testing.assert_allclose(np.concatenate([first, second], 1), np.asarray(full(x)), atol=1e-5)
    stateful.reset_state()
    np.testing.assert_allclose(np.asarray(model(x[:, :5])), first, atol=1e-6)


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_return_state_and_shapes(kind):
    x = _x()
    layer = make_layer(kind, True, 7, return_state=True)
    out, state = layer(x)
    assert out.shape == (4, 7) and state.shape == (4, 7)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(state))
    symbolic = layer(keras.Input((None, 3)))
    assert [tuple(s.shape) for s in symbolic] == [(None, 7), (None, 7)]


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("gated", [False, True])
def test_dropout_one_mask_per_sequence(kind, gated):
    """Input dropout zeroes the same features at every step, a new mask per call."""
    units, features = 3, 40
    layer = make_layer(
        kind, gated, units, dropout=0.5, epsilon=1.0, gamma=0.0, return_sequences=True, seed=11
    )
    x = np.ones((1, 6, features), "float32")
    layer(x)
    kernel = np.zeros((features, units * (2 if gated else 1)), "float32")
    candidate = units if gated else 0
    kernel[:, candidate] = 2.0 ** -np.arange(features)  # each feature leaves its own trace
    weights = layer.get_weights()
    bias = np.zeros_like(weights[2])
    bias[:units] = 30.0 if gated else 0.0  # gate wide open
    layer.set_weights([kernel, np.zeros_like(weights[1]), bias])
    x = np.ones((1, 6, features), "float32")

    def kept_features(y):
        # With W = 0 the unit's increment at step t encodes the kept features.
        increments = np.diff(np.concatenate([np.zeros((1, 1, units)), y], 1), axis=1)
        return increments[0, :, 0]

    a = np.asarray(layer(x, training=True))
    b = np.asarray(layer(x, training=True))
    inc_a, inc_b = kept_features(a), kept_features(b)
    assert np.allclose(inc_a, inc_a[0]), "mask changed within a sequence"
    assert not np.allclose(inc_a, inc_b), "mask not redrawn between calls"
    np.testing.assert_array_equal(np.asarray(layer(x)), np.asarray(layer(x)))  # inference


@pytest.mark.parametrize("gated", [False, True])
def test_fused_and_cell_draw_the_same_dropout_masks(gated):
    x = _x()
    args = dict(dropout=0.3, recurrent_dropout=0.4, seed=7, return_sequences=True)
    cell_layer, fused = make_layer("cell", gated, 5, **args), make_layer("fused", gated, 5, **args)
    cell_layer(x)
    fused(x)
    fused.set_weights(random_weights(cell_layer))
    np.testing.assert_allclose(
        np.asarray(fused(x, training=True)), np.asarray(cell_layer(x, training=True)), atol=1e-6
    )


def test_recurrent_dropout_keeps_the_skip_path():
    """With every recurrent input dropped the update sees only V x + b."""
    layer = AntisymmetricRNN(
        4, recurrent_dropout=0.999999, epsilon=0.5, return_sequences=True, seed=1
    )
    x = _x(batch=2, steps=5)
    layer(x)
    weights = random_weights(layer, seed=9)
    y = np.asarray(layer(x, training=True))
    h, expected = np.zeros((2, 4)), []
    for t in range(5):
        h = h + 0.5 * np.tanh(x[:, t] @ weights[0] + weights[2])
        expected.append(h)
    np.testing.assert_allclose(y, np.stack(expected, 1), atol=1e-5)


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("gated", [False, True])
def test_config_round_trip_keeps_every_argument(kind, gated):
    args = dict(
        epsilon=0.1,
        gamma=0.001,
        activation="relu",
        use_bias=False,
        kernel_initializer="glorot_uniform",
        recurrent_initializer="orthogonal",
        bias_initializer="ones",
        kernel_regularizer="l2",
        recurrent_regularizer=keras.regularizers.L1(0.01),
        bias_regularizer="l1",
        kernel_constraint="max_norm",
        recurrent_constraint="non_neg",
        bias_constraint="unit_norm",
        dropout=0.1,
        recurrent_dropout=0.2,
        seed=3,
        antisymmetric=False,
    )
    if gated:
        args["recurrent_activation"] = "hard_sigmoid"
    layer = make_layer(kind, gated, 6, return_sequences=True, go_backwards=True, **args)
    config = layer.get_config()
    clone = layer.__class__.from_config(copy.deepcopy(config))
    assert clone.get_config() == config
    cell_config = config if kind == "fused" else config["cell"]["config"]
    for name, value in args.items():
        if isinstance(value, (int, float, bool)) and not isinstance(value, str):
            assert cell_config[name] == value, name
    # Objects by value: each argument lands under its own name, as what was given.
    assert cell_config["activation"] == "relu"
    if gated:
        assert cell_config["recurrent_activation"] == "hard_sigmoid"
    expected_classes = {
        "kernel_initializer": "GlorotUniform",
        "recurrent_initializer": "Orthogonal",
        "bias_initializer": "Ones",
        "kernel_regularizer": "L2",
        "recurrent_regularizer": "L1",
        "bias_regularizer": "L1",
        "kernel_constraint": "MaxNorm",
        "recurrent_constraint": "NonNeg",
        "bias_constraint": "UnitNorm",
    }
    for name, class_name in expected_classes.items():
        assert cell_config[name]["class_name"] == class_name, name
    assert cell_config["recurrent_regularizer"]["config"]["l1"] == pytest.approx(0.01)
    clone_cell = clone if kind == "fused" else clone.cell
    clone_cell = getattr(clone_cell, "cell", clone_cell)
    assert isinstance(clone_cell.recurrent_initializer, keras.initializers.Orthogonal)
    assert isinstance(clone_cell.kernel_constraint, keras.constraints.MaxNorm)
    assert clone_cell.activation is keras.activations.relu


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("gated", [False, True])
def test_regularizers_act_on_the_stored_weights(kind, gated):
    layer = make_layer(
        kind,
        gated,
        5,
        kernel_regularizer=keras.regularizers.L2(0.1),
        recurrent_regularizer=keras.regularizers.L2(0.2),
        bias_regularizer=keras.regularizers.L1(0.3),
    )
    layer(_x(batch=2, steps=3))
    kernel, recurrent, bias = random_weights(layer, seed=4)
    expected = 0.1 * np.sum(kernel**2) + 0.2 * np.sum(recurrent**2) + 0.3 * np.sum(np.abs(bias))
    total = sum(float(keras.ops.convert_to_numpy(loss)) for loss in layer.losses)
    assert total == pytest.approx(expected, rel=1e-5)
    # The documented identity: ‖W − Wᵀ‖² = 2‖w‖² for the stored upper triangle w.
    antisymmetric = reference.transition_matrix(recurrent, 5, gamma=0.0)
    assert np.sum(antisymmetric**2) == pytest.approx(2 * np.sum(recurrent**2), rel=1e-6)


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_constraints_hold_after_an_optimizer_step(kind):
    model = keras.Sequential(
        [
            keras.Input((3, 2)),
            make_layer(
                kind,
                True,
                4,
                kernel_constraint=keras.constraints.MaxNorm(0.5),
                recurrent_constraint=keras.constraints.NonNeg(),
                bias_constraint=keras.constraints.NonNeg(),
            ),
        ]
    )
    model.compile(keras.optimizers.SGD(10.0), "mse")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(8, 3, 2)), rng.normal(size=(8, 4)) * 5, epochs=2, verbose=0)
    kernel, recurrent, bias = model.layers[0].get_weights()
    assert np.all(np.linalg.norm(kernel, axis=0) <= 0.5 + 1e-5)
    assert np.all(recurrent >= 0) and np.all(bias >= 0)
    assert np.any(recurrent > 0)  # trained, not just zeroed


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("gated", [False, True])
def test_inference_is_dropout_free(kind, gated):
    layer = make_layer(
        kind, gated, 4, dropout=0.5, recurrent_dropout=0.5, return_sequences=True, seed=2
    )
    x = _x(batch=3, steps=6)
    layer(x)
    weights = random_weights(layer, seed=5)
    first = np.asarray(layer(x, training=False))
    second = np.asarray(layer(x))
    expected, _ = reference.run(
        weights, x.astype("float64"), units=4, epsilon=0.01, gamma=0.01, gated=gated
    )
    np.testing.assert_allclose(first, expected, atol=1e-5)
    np.testing.assert_allclose(second, expected, atol=1e-5)


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("gated", [False, True])
def test_keras_file_round_trip(tmp_path, kind, gated):
    x = _x()
    model = keras.Sequential(
        [
            keras.Input((10, 3)),
            make_layer(kind, gated, 6, epsilon=0.2, gamma=0.05, return_sequences=True),
            keras.layers.Bidirectional(make_layer(kind, gated, 3)),
            keras.layers.Dense(2),
        ]
    )
    random_weights(model, seed=12)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(np.asarray(loaded(x)), np.asarray(model(x)), atol=1e-6)

    def normalized(config):  # tuples come back as lists from JSON
        return json.loads(json.dumps(config))

    assert normalized(loaded.layers[0].get_config()) == normalized(model.layers[0].get_config())


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_mixed_precision(policy, kind):
    x = _x()
    reference_layer = make_layer(kind, True, 8, epsilon=0.3, return_sequences=True)
    reference_layer(x)
    weights = random_weights(reference_layer, seed=13, scale=0.3)
    keras.config.set_dtype_policy(policy)
    layer = make_layer(kind, True, 8, epsilon=0.3, return_sequences=True)
    y = layer(x)
    layer.set_weights(weights)
    y = layer(x)
    # The products in the policy's compute dtype, the state in float32 (the cell's
    # compute dtype, which keras.layers.RNN carries through its loop).
    assert layer.cell.product_dtype == policy.split("_")[1]
    assert layer.cell.compute_dtype == "float32"
    assert all(w.dtype == "float32" for w in layer.weights)
    assert keras.backend.standardize_dtype(y.dtype) == policy.split("_")[1]
    tol = 2e-2 if policy == "mixed_bfloat16" else 5e-3
    np.testing.assert_allclose(
        np.asarray(tf.cast(y, "float32")), np.asarray(reference_layer(x)), atol=tol
    )


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_short_training_reduces_loss(kind):
    rng = np.random.RandomState(0)
    x = rng.standard_normal((64, 15, 2)).astype("float32")
    y = (x[:, :3, 0].sum(1) > 0).astype("int32")  # needs memory of early steps
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((15, 2)),
            make_layer(kind, True, 16, epsilon=0.5, gamma=0.01),
            keras.layers.Dense(2),
        ]
    )
    model.compile(
        keras.optimizers.Adam(0.02), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    history = model.fit(x, y, epochs=15, batch_size=32, verbose=0).history["loss"]
    assert history[-1] < 0.7 * history[0]


def test_fused_layer_under_jit_compile():
    x = _x()
    layer = GatedAntisymmetricRNN(5, return_sequences=True)
    layer(x)
    random_weights(layer)
    eager = np.asarray(layer(x))
    compiled = tf.function(lambda v: layer(v), jit_compile=True)
    np.testing.assert_allclose(compiled(x).numpy(), eager, atol=1e-5)


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_tensorflow_backend_declares_no_xla(kind):
    """XLA measured slower for these loops on TF: jit_compile=True falls back."""
    model = keras.Sequential([keras.Input((5, 2)), make_layer(kind, False, 3)])
    with pytest.warns(UserWarning, match="jit_compile"):
        model.compile("sgd", "mse", jit_compile=True)
    assert model.jit_compile is False


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("gated", [False, True])
def test_weight_gradients_match_finite_differences_of_the_reference(kind, gated):
    """d(Σ R·outputs)/d(weights) against central differences of the float64 NumPy model."""
    layer = make_layer(kind, gated, 3, epsilon=0.4, gamma=0.05, return_sequences=True)
    x = _x(batch=2, steps=4, features=2, seed=3)
    layer(x)
    weights = random_weights(layer, seed=6)
    readout = np.random.RandomState(8).standard_normal((2, 4, 3))
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(layer(tf.constant(x)) * readout)
    grads = [g.numpy() for g in tape.gradient(total, layer.trainable_weights)]

    def objective(values):
        outputs, _ = reference.run(values, x.astype("float64"), units=3, epsilon=0.4,
                                   gamma=0.05, gated=gated)  # fmt: skip
        return float(np.sum(outputs * readout))

    step = 1e-6
    for index, weight in enumerate(weights):
        numeric = np.zeros(weight.shape)
        for position in np.ndindex(weight.shape):
            values = [w.astype("float64") for w in weights]
            values[index][position] += step
            up = objective(values)
            values[index][position] -= 2 * step
            numeric[position] = (up - objective(values)) / (2 * step)
        np.testing.assert_allclose(grads[index], numeric, rtol=1e-3, atol=1e-4, err_msg=index)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("steps", [1, 7, 11])  # odd: the fused loop's one-step iterations
@pytest.mark.parametrize("go_backwards", [False, True])
def test_odd_lengths_match_numpy_reference(gated, steps, go_backwards):
    check_against_reference("fused", gated, inputs(steps=steps), go_backwards, unroll=False)


@pytest.mark.parametrize("layer_class", [AntisymmetricRNN, GatedAntisymmetricRNN])
@pytest.mark.parametrize("shape", [(4, 3), (2, 4, 3, 1)])
def test_fused_layer_rejects_wrong_rank(layer_class, shape):
    with pytest.raises(ValueError, match="expected ndim=3"):
        layer_class(4)(np.zeros(shape, "float32"))


def test_auto_hoists_only_wide_inputs_on_accelerators(monkeypatch):
    from keras_antisym import _fast_path

    wide = _fast_path.HOIST_MIN_INPUT_DIM
    for accelerator in (False, True):
        monkeypatch.setattr(_fast_path, "accelerator_available", lambda a=accelerator: a)
        assert _fast_path.hoists_inputs("auto", wide) is accelerator
        assert _fast_path.hoists_inputs("auto", wide - 1) is False
        assert _fast_path.hoists_inputs("auto", None) is False
        assert _fast_path.hoists_inputs(True, 1) is True
        assert _fast_path.hoists_inputs(False, 100) is False
        assert _fast_path.hoists_inputs(True, 0) is False  # nothing to project


@pytest.mark.parametrize("layer_class", [AntisymmetricRNN, GatedAntisymmetricRNN])
@pytest.mark.parametrize("hoist_inputs", [False, True])
def test_hoist_inputs_switches_the_path_and_keeps_the_numbers(
    monkeypatch, layer_class, hoist_inputs
):
    projected = []
    original = AntisymmetricCell.project_inputs

    def spy(cell, sequences):
        projected.append(tuple(sequences.shape))
        return original(cell, sequences)

    monkeypatch.setattr(AntisymmetricCell, "project_inputs", spy)
    x = _x(features=3)
    layer = layer_class(5, return_sequences=True, hoist_inputs=hoist_inputs)
    reference_layer = layer_class(5, return_sequences=True, hoist_inputs=not hoist_inputs)
    layer(x)
    reference_layer(x)
    reference_layer.set_weights(random_weights(layer))
    projected.clear()
    np.testing.assert_allclose(np.asarray(layer(x)), np.asarray(reference_layer(x)), atol=1e-6)
    assert projected == [(4, 10, 3)], projected  # one (batch, T, m) product, by the hoisting layer


@pytest.mark.parametrize("layer_class", [AntisymmetricRNN, GatedAntisymmetricRNN])
def test_every_argument_round_trips_and_is_a_property(layer_class):
    layer = check_every_argument_round_trips(layer_class)
    cell_arguments = set(constructor_arguments(layer.cell_class))
    for name in constructor_arguments(layer_class):
        if name in cell_arguments:
            assert getattr(layer, name) is getattr(layer.cell, name), name
            assert getattr(layer_class, name).__doc__ == f"The cell's `{name}` (read-only).", name
            with pytest.raises(AttributeError):
                setattr(layer, name, object())
    assert layer.hoist_inputs is True and layer.activity_regularizer.l2 == pytest.approx(0.5)
    with pytest.raises(AttributeError):
        layer.hoist_inputs = False


def test_layers_take_the_cells_arguments_in_the_cells_order():
    for layer_class in (AntisymmetricRNN, GatedAntisymmetricRNN):
        layer_arguments = constructor_arguments(layer_class)
        cell_arguments = constructor_arguments(layer_class.cell_class)
        assert [name for name in layer_arguments if name in cell_arguments] == cell_arguments
        layer = layer_class(4, 0.5, 0.25, "relu")
        assert (layer.epsilon, layer.gamma, layer.activation) == (0.5, 0.25, keras.activations.relu)
    assert AntisymmetricRNN(4).use_bias is True
    assert GatedAntisymmetricRNN(4, recurrent_activation="relu").recurrent_activation is (
        keras.activations.relu
    )


@pytest.mark.parametrize("gated", [False, True])
def test_fused_layer_traced_with_unknown_timesteps_matches_reference(gated):
    """A graph traced for `(batch, None, features)` (the time axis unknown until run time)
    runs sequences of any length, each as the NumPy reference computes it."""
    layer = make_layer("fused", gated, 5, epsilon=0.3, gamma=0.05, return_sequences=True)
    layer(_x())
    weights = random_weights(layer, seed=9)
    traced = tf.function(
        lambda x: layer(x), input_signature=[tf.TensorSpec((None, None, 3), "float32")]
    )
    for steps in (6, 7):
        x = _x(batch=2, steps=steps, seed=steps)
        expected, _ = reference.run(weights, x, units=5, epsilon=0.3, gamma=0.05, gated=gated)
        np.testing.assert_allclose(np.asarray(traced(x)), expected, atol=2e-5)


def test_cell_property_reads_the_cell_at_each_access_and_is_read_only():
    """`_cell_property(name)`: the property behind the layers' read-only cell arguments."""
    from keras_antisym.layers import _cell_property

    class Holder:
        units = _cell_property("units")
        epsilon = _cell_property("epsilon")

        def __init__(self, cell):
            self.cell = cell

    cell = types.SimpleNamespace(units=7, epsilon=0.25)
    holder = Holder(cell)
    assert (holder.units, holder.epsilon) == (7, 0.25)
    cell.units = 9
    assert holder.units == 9  # read through to the cell, not copied
    assert Holder.units.__doc__ == "The cell's `units` (read-only)."
    assert Holder.epsilon.__doc__ == "The cell's `epsilon` (read-only)."
    with pytest.raises(AttributeError):
        holder.units = 3
    assert cell.units == 9


@pytest.mark.parametrize("gated", [False, True])
def test_inner_loop_takes_the_initial_state_as_a_list_or_a_tensor(gated):
    """`inner_loop`, the hook of `keras.layers.RNN` that GRU and LSTM override, takes the
    initial state as Keras' own `RNN.inner_loop` does: a list of one tensor, or the tensor;
    without `training` (default False, as there) it applies no dropout."""
    layer = make_layer(
        "fused",
        gated,
        5,
        epsilon=0.3,
        gamma=0.05,
        return_sequences=True,
        dropout=0.5,
        recurrent_dropout=0.5,
        seed=2,
    )
    x = _x(batch=3, steps=6)
    layer(x)
    weights = random_weights(layer, seed=10)
    h0 = np.random.RandomState(11).standard_normal((3, 5)).astype("float32")
    expected, expected_state = reference.run(
        weights, x, units=5, epsilon=0.3, gamma=0.05, gated=gated, h0=h0
    )
    for initial_state in ([tf.constant(h0)], tf.constant(h0)):
        last, outputs, states = layer.inner_loop(tf.constant(x), initial_state, None)
        np.testing.assert_allclose(np.asarray(outputs), expected, atol=2e-5)
        np.testing.assert_allclose(np.asarray(last), expected_state, atol=2e-5)
        np.testing.assert_allclose(np.asarray(states[0]), expected_state, atol=2e-5)


def test_inner_loop_outside_rnn_call_draws_the_input_dropout_mask():
    """`RNN.call` draws the dropout masks before its loop; `inner_loop` called on its own
    with `training=True` draws the cell's input mask itself, one per sequence."""
    features, rate = 3, 0.5
    layer = AntisymmetricRNN(
        4, dropout=rate, epsilon=0.5, gamma=0.05, return_sequences=True, seed=3
    )
    x = _x(batch=2, steps=5, features=features, seed=4)
    layer(x)
    weights = random_weights(layer, seed=12)
    _, outputs, _ = layer.inner_loop(tf.constant(x), [tf.zeros((2, 4))], None, training=True)
    outputs = np.asarray(outputs)
    layer.cell.reset_dropout_mask()
    # Each sample's mask, among all 2**features: the one whose inputs the reference runs.
    kept = []
    for b in range(2):
        matches = []
        for candidate in np.ndindex(*(2,) * features):
            mask = np.asarray(candidate) / (1 - rate)
            expected, _ = reference.run(
                weights, x[b : b + 1] * mask, units=4, epsilon=0.5, gamma=0.05
            )
            if np.allclose(outputs[b : b + 1], expected, atol=2e-5):
                matches.append(candidate)
        assert len(matches) == 1, (b, matches)
        kept.append(matches[0])
    assert 0 < np.sum(kept) < 2 * features  # some features dropped, some kept


def _recurrence_stand_in(calls):
    """`kernels.recurrence` by its documented contract, as a plain loop of `keras.ops`.

    All states `(B, T, n)` of `h_t = h_{t-1} + ε·rate(h_{t-1}·mt + u_t)`; the real
    kernels run on a CUDA GPU (or interpreted, on JAX and PyTorch only).
    """
    ops = keras.ops

    def recurrence(u, mt, h0, epsilon, gated=False, precision=None):
        calls.append(tuple(u.shape))
        n, h, states = mt.shape[0], h0, []
        for t in range(u.shape[1]):
            shared, u_t = ops.matmul(h, mt), u[:, t]
            if gated:
                rate = ops.sigmoid(shared + u_t[:, :n]) * ops.tanh(shared + u_t[:, n:])
            else:
                rate = ops.tanh(shared + u_t)
            h = h + epsilon * rate
            states.append(h)
        return ops.stack(states, axis=1)

    return recurrence


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("go_backwards", [False, True])
def test_fused_kernel_path_hands_the_whole_call_to_the_kernel(monkeypatch, gated, go_backwards):
    """Where `fused_kernel` applies (no mask, no recurrent dropout), the layer's call is one
    kernel call over the projected inputs of all steps, from the given initial state, in
    processing order; outputs and last state as the NumPy reference computes them."""
    calls = _stand_in_kernel(monkeypatch)
    args = dict(epsilon=0.3, gamma=0.05)
    layer = make_layer(
        "fused",
        gated,
        5,
        return_sequences=True,
        return_state=True,
        go_backwards=go_backwards,
        fused_kernel=True,
        **args,
    )
    x = _x(batch=3, steps=6)
    layer(x)
    weights = random_weights(layer, seed=14)
    h0 = np.random.RandomState(15).standard_normal((3, 5)).astype("float32")
    calls.clear()
    outputs, state = layer(x, initial_state=[h0])
    assert calls == [(3, 6, 10 if gated else 5)]
    expected, expected_state = reference.run(
        weights, x, units=5, gated=gated, go_backwards=go_backwards, h0=h0, **args
    )
    np.testing.assert_allclose(np.asarray(outputs), expected, atol=2e-5)
    np.testing.assert_allclose(np.asarray(state), expected_state, atol=2e-5)


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_stateful_layer_trains_batch_after_batch(kind):
    """Training steps of a stateful layer: each starts from the state the previous batch
    left, with the weights of that step (PyTorch: RNN.call overwrites the state variables
    in place, which the loop's gradient must not hold)."""
    args = dict(epsilon=0.4, gamma=0.05)
    layer = make_layer(kind, True, 4, stateful=True, **args)
    model = keras.Sequential([keras.Input(batch_shape=(2, 5, 3)), layer])
    model.compile(keras.optimizers.SGD(0.5), "mse")
    x = _x(batch=2, steps=10, seed=16)
    target = np.random.RandomState(17).standard_normal((2, 4)).astype("float32")
    random_weights(layer, seed=18)
    h = np.zeros((2, 4))
    for half in (x[:, :5], x[:, 5:]):
        weights = layer.get_weights()
        _, h = reference.run(weights, half, units=4, gated=True, h0=h, **args)
        model.train_on_batch(half, target)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(layer.states[0]), h, atol=2e-5)
        changed = [np.abs(a - b).max() for a, b in zip(layer.get_weights(), weights, strict=True)]
        assert min(changed) > 0, changed  # every weight got a gradient


@pytest.mark.parametrize(
    "steps, masked, unroll, iterations",
    [(6, False, False, 3), (7, False, False, 7), (6, True, False, 6), (6, False, True, 6)],
)
def test_static_even_lengths_take_two_euler_steps_per_loop_iteration(
    monkeypatch, steps, masked, unroll, iterations
):
    """The time loop runs two Euler steps per iteration where they divide a static length
    (no mask, no unroll), one otherwise; the same numbers either way."""
    from keras_antisym import layers

    seen = []

    def counting(original):
        def counting_loop(step, sequences, *args, **kwargs):
            seen.append(tuple(sequences.shape))
            return original(step, sequences, *args, **kwargs)

        return counting_loop

    # Keras' loop, and on TensorFlow outside training the one LiteRT converts.
    monkeypatch.setattr(layers, "rnn_loop", counting(layers.rnn_loop))
    monkeypatch.setattr(layers._tf_loop, "rnn_loop", counting(layers._tf_loop.rnn_loop))
    layer = AntisymmetricRNN(5, epsilon=0.3, gamma=0.05, return_sequences=True, unroll=unroll)
    x = _x(batch=2, steps=steps, seed=steps)
    layer(x)
    weights = random_weights(layer, seed=19)
    mask = np.ones((2, steps), bool) if masked else None
    seen.clear()
    outputs = np.asarray(layer(x, mask=mask))
    # Each step: 3 features and the constant-1 feature of the bias (not hoisted on a CPU).
    assert seen == [(2, iterations, 4 * (steps // iterations))]
    expected, _ = reference.run(weights, x, units=5, epsilon=0.3, gamma=0.05)
    np.testing.assert_allclose(outputs, expected, atol=2e-5)


def test_inner_loop_outside_rnn_call_draws_the_recurrent_dropout_mask():
    """`inner_loop` called on its own with `training=True` draws the cell's recurrent mask
    from the initial state, one per sequence (cached by the cell until reset, as Keras'
    `DropoutRNNCell`): it drops `h_{t-1}` in the recurrent product only, never the skip path."""
    units, epsilon, gamma = 4, 0.5, 0.05
    layer = AntisymmetricRNN(
        units, recurrent_dropout=0.5, epsilon=epsilon, gamma=gamma, return_sequences=True, seed=5
    )
    x = _x(batch=3, steps=6, seed=6)
    layer(x)
    kernel, recurrent, bias = random_weights(layer, seed=13)
    h0 = np.random.RandomState(14).standard_normal((3, units)).astype("float32")
    _, outputs, _ = layer.inner_loop(tf.constant(x), [tf.constant(h0)], None, training=True)
    drop = np.asarray(layer.cell.get_recurrent_dropout_mask(tf.constant(h0)))
    layer.cell.reset_recurrent_dropout_mask()
    assert drop.shape == (3, units)
    assert set(np.unique(drop)) == {0.0, 2.0}  # kept entries scaled by 1 / (1 - rate)
    m = reference.transition_matrix(recurrent, units, gamma)
    h, expected = h0.astype("float64"), []
    for t in range(6):
        h = h + epsilon * np.tanh((h * drop) @ m.T + x[:, t] @ kernel + bias)
        expected.append(h)
    np.testing.assert_allclose(np.asarray(outputs), np.stack(expected, 1), atol=2e-5)


def test_inner_loop_keeps_only_the_last_output_without_return_sequences():
    """As Keras' own `RNN.inner_loop` (`return_all_outputs=return_sequences`): without
    `return_sequences` the outputs hold the last step only, `(batch, 1, units)`."""
    x = _x(batch=2, steps=7, seed=7)  # odd: one Euler step per loop iteration
    layer = AntisymmetricRNN(4, epsilon=0.3, gamma=0.05)
    layer(x)
    weights = random_weights(layer, seed=15)
    keras_layer = keras.layers.RNN(AntisymmetricCell(4, epsilon=0.3, gamma=0.05))
    keras_layer(x)
    keras_layer.set_weights(weights)
    h0 = [tf.zeros((2, 4))]
    last, outputs, states = layer.inner_loop(tf.constant(x), h0, None)
    keras_last, keras_outputs, _ = keras_layer.inner_loop(tf.constant(x), h0, None)
    _, expected_state = reference.run(weights, x, units=4, epsilon=0.3, gamma=0.05)
    assert tuple(outputs.shape) == tuple(keras_outputs.shape) == (2, 1, 4)
    np.testing.assert_allclose(np.asarray(outputs)[:, 0], expected_state, atol=2e-5)
    np.testing.assert_allclose(np.asarray(last), np.asarray(keras_last), atol=1e-6)
    np.testing.assert_allclose(np.asarray(states[0]), expected_state, atol=2e-5)


@pytest.mark.parametrize("unroll", [False, True])
def test_unroll_unrolls_the_time_loop_in_the_graph(unroll):
    """`unroll=True` runs the steps as straight-line ops (no while loop in the traced
    TensorFlow graph), `unroll=False` as one loop; the same numbers either way."""
    x = _x(batch=2, steps=7, seed=8)
    layer = AntisymmetricRNN(4, epsilon=0.3, gamma=0.05, return_sequences=True, unroll=unroll)
    layer(x)
    weights = random_weights(layer, seed=16)
    traced = tf.function(lambda v: layer(v))
    graph = traced.get_concrete_function(tf.TensorSpec(x.shape, "float32")).graph
    loops = [op.type for op in graph.get_operations() if "While" in op.type]
    assert (loops == []) is unroll, loops
    expected, _ = reference.run(weights, x, units=4, epsilon=0.3, gamma=0.05)
    np.testing.assert_allclose(np.asarray(traced(x)), expected, atol=2e-5)


@pytest.mark.parametrize(
    "features, steps, hoisted", [(3, 10, False), (9, 4, True), (8, 8, True), (7, 20, False)]
)
def test_auto_hoisting_on_an_accelerator_follows_the_input_width(
    monkeypatch, features, steps, hoisted
):
    """`hoist_inputs="auto"` on a GPU or TPU hoists inputs of at least
    `HOIST_MIN_INPUT_DIM` features, whatever the sequence length."""
    from keras_antisym import _fast_path

    projected, original = [], AntisymmetricCell.project_inputs

    def spy(cell, sequences):
        projected.append(tuple(sequences.shape))
        return original(cell, sequences)

    monkeypatch.setattr(AntisymmetricCell, "project_inputs", spy)
    monkeypatch.setattr(_fast_path, "accelerator_available", lambda: True)
    layer = AntisymmetricRNN(5, epsilon=0.3, gamma=0.05, return_sequences=True)
    x = _x(batch=2, steps=steps, features=features, seed=features)
    layer(x)
    weights = random_weights(layer, seed=17)
    projected.clear()
    outputs = np.asarray(layer(x))
    assert projected == ([(2, steps, features)] if hoisted else []), projected
    expected, _ = reference.run(weights, x, units=5, epsilon=0.3, gamma=0.05)
    np.testing.assert_allclose(outputs, expected, atol=2e-5)


def _stand_in_kernel(monkeypatch, cuda=False):
    """The current backend counted as a kernel backend, with `_recurrence_stand_in`.

    `fused_kernel=True` runs it as in interpret mode; `"auto"` only if `cuda`.
    """
    from keras_antisym import kernels

    calls = []
    backends = (*kernels.KERNEL_BACKENDS, keras.backend.backend())
    monkeypatch.setattr(kernels, "KERNEL_BACKENDS", backends)
    monkeypatch.setattr(kernels, "recurrence", _recurrence_stand_in(calls))
    monkeypatch.setattr(kernels, "INTERPRET", True)
    monkeypatch.setattr(kernels, "cuda_available", lambda: cuda)
    return calls


@pytest.mark.parametrize("gated", [False, True])
def test_auto_kernel_leaves_masked_calls_and_recurrent_dropout_to_the_loop(monkeypatch, gated):
    """`fused_kernel="auto"` on a CUDA GPU: calls with a mask or recurrent dropout in
    training take the loop (documented), with the loop's numbers; input dropout alone, and
    recurrent dropout at inference, do not: the kernel gets the inputs with their mask
    applied."""
    calls = _stand_in_kernel(monkeypatch, cuda=True)
    args = dict(epsilon=0.3, gamma=0.05, return_sequences=True, seed=4)
    x = _x(batch=3, steps=6, seed=9)
    mask = np.ones((3, 6), bool)
    mask[0, 4:] = False
    mask[2, [1, 3]] = False
    layer = make_layer("fused", gated, 5, fused_kernel="auto", dropout=0.4, **args)
    layer(x)
    weights = random_weights(layer, seed=18)
    calls.clear()
    expected, _ = reference.run(
        weights, x, units=5, gated=gated, mask=mask, epsilon=0.3, gamma=0.05
    )
    np.testing.assert_allclose(np.asarray(layer(x, mask=mask)), expected, atol=2e-5)
    assert calls == []
    kernel_call = [(3, 6, 10 if gated else 5)]
    for rates in (dict(recurrent_dropout=0.4), dict(dropout=0.4)):
        kernel_layer = make_layer("fused", gated, 5, fused_kernel="auto", **rates, **args)
        loop_layer = make_layer("fused", gated, 5, **rates, **args)
        for each in (kernel_layer, loop_layer):
            each(x)
            each.set_weights(weights)
        calls.clear()
        y = np.asarray(kernel_layer(x, training=True))
        assert calls == ([] if "recurrent_dropout" in rates else kernel_call)
        # The same seed draws the same masks: the loop's numbers.
        np.testing.assert_allclose(y, np.asarray(loop_layer(x, training=True)), atol=2e-5)
        calls.clear()
        y = np.asarray(kernel_layer(x))
        assert calls == kernel_call  # no dropout at inference
        np.testing.assert_allclose(y, np.asarray(loop_layer(x)), atol=2e-5)


@pytest.mark.parametrize(
    "layer_args, masked",
    [
        ({"activation": "relu"}, False),
        ({"recurrent_activation": "hard_sigmoid"}, False),
        ({"dtype": "float64"}, False),
        ({"units": 130}, False),
        ({}, True),
    ],
)
def test_auto_kernel_falls_back_to_the_loops_numbers(monkeypatch, layer_args, masked):
    """Where `fused_kernel=True` raises, `"auto"` (on a CUDA GPU) takes the loop: no kernel
    call, and the numbers of `fused_kernel=False`."""
    calls = _stand_in_kernel(monkeypatch, cuda=True)
    args = {"units": 5, "epsilon": 0.3, "gamma": 0.05, "return_sequences": True, **layer_args}
    x = _x(batch=3, steps=6, seed=10)
    mask = (np.arange(6)[None] < np.array([[6], [4], [5]])) if masked else None
    auto = GatedAntisymmetricRNN(fused_kernel="auto", **args)
    loop = GatedAntisymmetricRNN(**args)
    for each in (auto, loop):
        each(x)
    loop.set_weights(random_weights(auto, seed=21))
    calls.clear()
    y = np.asarray(auto(x, mask=mask))
    assert calls == []
    np.testing.assert_allclose(y, np.asarray(loop(x, mask=mask)), rtol=0, atol=0)
    with pytest.raises(ValueError, match="with `fused_kernel=True`"):
        layer = GatedAntisymmetricRNN(fused_kernel=True, **args)
        layer(x, mask=mask)


@pytest.mark.parametrize("layer_class", [AntisymmetricRNN, GatedAntisymmetricRNN])
def test_layer_defaults_are_the_documented_ones(layer_class):
    """The cell's arguments default as in the cell; the layer's own as documented
    (`fused_kernel="auto"`, `hoist_inputs="auto"`)."""
    layer = layer_class(4)
    cell = layer.cell_class(4)
    serialize = keras.saving.serialize_keras_object
    for name in constructor_arguments(layer.cell_class):
        assert serialize(getattr(layer, name)) == serialize(getattr(cell, name)), name
    assert (layer.epsilon, layer.gamma, layer.activation) == (0.01, 0.01, keras.activations.tanh)
    assert layer.use_bias is True and layer.antisymmetric is True
    assert (layer.dropout, layer.recurrent_dropout, layer.seed) == (0.0, 0.0, None)
    assert layer.fused_kernel == "auto" and layer.hoist_inputs == "auto"
    flags = (layer.return_sequences, layer.return_state, layer.go_backwards, layer.stateful)
    assert flags == (False, False, False, False)
    assert layer.unroll is False and layer.activity_regularizer is None
    if layer_class is GatedAntisymmetricRNN:
        assert layer.recurrent_activation is keras.activations.sigmoid


@pytest.mark.parametrize("layer_class", [AntisymmetricRNN, GatedAntisymmetricRNN])
def test_layer_passes_its_dtype_and_trainability_to_its_cell(layer_class):
    """As Keras' own `GRU` does: the layer's `dtype` and `trainable` are the cell's."""
    gru = keras.layers.GRU(4, dtype="float64", trainable=False)
    layer = layer_class(4, dtype="float64", trainable=False, return_sequences=True)
    assert layer.cell.trainable is gru.cell.trainable is False
    assert layer.cell.dtype_policy.name == gru.cell.dtype_policy.name == "float64"
    x = _x(batch=2, steps=5).astype("float64")
    outputs = layer(x)
    assert keras.backend.standardize_dtype(outputs.dtype) == "float64"
    assert all(keras.backend.standardize_dtype(w.dtype) == "float64" for w in layer.weights)
    assert layer.trainable_weights == [] and layer.cell.trainable_weights == []
    weights = random_weights(layer, seed=20)
    gated = layer_class is GatedAntisymmetricRNN
    expected, _ = reference.run(weights, x, units=4, epsilon=0.01, gamma=0.01, gated=gated)
    # float64 all the way: far closer than float32's ~1e-7 relative rounding.
    np.testing.assert_allclose(np.asarray(layer(x)), expected, rtol=0, atol=1e-12)
    assert layer_class(4).cell.trainable is True
