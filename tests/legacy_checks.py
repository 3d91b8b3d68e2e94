"""The legacy-Keras side of tests/test_legacy.py, run in one subprocess.

    TF_USE_LEGACY_KERAS=1 python -m tests.legacy_checks WORK_DIR

Runs every `check_*` below under Keras 2 (tf_keras) and writes
`WORK_DIR/results.json`: `{check name: "ok" or the traceback}` plus
`__file__` (the `keras_antisym` imported). One process for all checks: each
TensorFlow start costs seconds. `WORK_DIR/keras3.npz` holds what the Keras 3
side wrote first (weights and outputs); `WORK_DIR/legacy.npz` gets what it reads
back (weights trained here, outputs, exported models' predictions).
"""

import json
import os
import sys
import time
import traceback

import numpy as np

#: Built from the same list by the Keras 3 side: `(name, gated, antisymmetric)`.
MODELS = (("plain", False, True), ("gated", True, True), ("ablation", True, False))
UNITS, STEPS, FEATURES = 6, 10, 3
ARGS = dict(epsilon=0.3, gamma=0.05)
ATOL = 2e-5  # float32 against the float64 reference
MOVE_ATOL = 1e-6  # the same weights in Keras 3 and Keras 2
CHECKS = []


def check(function):
    CHECKS.append(function)
    return function


def ragged_mask(batch=3, steps=STEPS):
    mask = np.ones((batch, steps), dtype=bool)
    mask[0, 7:] = False  # right padding
    mask[1, :3] = False  # left padding
    mask[2, [4, 5, 8]] = False  # holes
    return mask


def sequences(batch=3, steps=STEPS, features=FEATURES, seed=1):
    return np.random.RandomState(seed).standard_normal((batch, steps, features)).astype("float32")


def random_weights(layer, seed=0, scale=0.5):
    rng = np.random.RandomState(seed)
    weights = [scale * rng.standard_normal(w.shape).astype("float32") for w in layer.get_weights()]
    layer.set_weights(weights)
    return weights


def cell_class(gated):
    from keras_antisym import legacy

    return legacy.GatedAntisymmetricCell if gated else legacy.AntisymmetricCell


def classifier(gated, antisymmetric, **cell_args):
    """`Input((STEPS, FEATURES)) -> RNN(cell) -> Dense(3)`, as the Keras 3 side builds it."""
    import tensorflow as tf

    cell = cell_class(gated)(UNITS, antisymmetric=antisymmetric, **ARGS, **cell_args)
    return tf.keras.Sequential(
        [
            tf.keras.Input((STEPS, FEATURES)),
            tf.keras.layers.RNN(cell),
            tf.keras.layers.Dense(3, name="classification_head"),
        ]
    )


@check
def check_legacy_keras_is_active():
    import tensorflow as tf

    from keras_antisym import legacy

    assert tf.keras.layers.RNN.__module__.startswith("tf_keras"), tf.keras.layers.RNN
    assert issubclass(legacy.AntisymmetricCell, tf.keras.layers.AbstractRNNCell)
    assert issubclass(legacy.GatedAntisymmetricCell, tf.keras.layers.AbstractRNNCell)
    # What this module is for: Keras 2's RNN cannot run the Keras 3 cells.
    from keras_antisym import AntisymmetricCell

    try:
        tf.keras.layers.RNN(AntisymmetricCell(4))(np.zeros((2, 3, 4), "float32"))
    except TypeError:
        pass
    else:
        raise AssertionError("tf.keras.layers.RNN ran a Keras 3 cell: not legacy Keras")


@check
def check_docstring_examples():
    import doctest

    from keras_antisym import legacy

    result = doctest.testmod(legacy, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 4 and result.failed == 0, result


@check
def check_against_reference():
    """Both cells, the ablation, masks, initial states, go_backwards, no bias, unroll."""
    import tensorflow as tf

    from benchmarks import reference

    x = sequences()
    h0 = np.random.RandomState(7).standard_normal((3, UNITS)).astype("float32")
    cases = [
        dict(gated=g, antisymmetric=a, mask=m, h0=h, go_backwards=b, use_bias=u, unroll=r)
        for g in (False, True)
        for a, m, h, b, u, r in [
            (True, None, None, False, True, False),
            (True, ragged_mask(), None, False, True, False),
            (True, ragged_mask(), None, True, True, True),
            (True, None, h0, False, False, False),
            (True, None, h0, True, True, True),
            (False, ragged_mask(), None, False, True, False),
            (False, None, h0, False, True, False),
        ]
    ]
    for case in cases:
        cell = cell_class(case["gated"])(
            UNITS, antisymmetric=case["antisymmetric"], use_bias=case["use_bias"], **ARGS
        )
        layer = tf.keras.layers.RNN(
            cell,
            return_sequences=True,
            return_state=True,
            go_backwards=case["go_backwards"],
            unroll=case["unroll"],
        )
        layer(x)
        weights = random_weights(layer)
        initial = None if case["h0"] is None else [tf.constant(case["h0"])]
        mask = None if case["mask"] is None else tf.constant(case["mask"])
        outputs, state = layer(x, mask=mask, initial_state=initial)
        expected, expected_state = reference.run(
            weights,
            x,
            units=UNITS,
            gated=case["gated"],
            antisymmetric=case["antisymmetric"],
            mask=case["mask"],
            go_backwards=case["go_backwards"],
            h0=case["h0"],
            **ARGS,
        )
        message = f"case {case}"
        np.testing.assert_allclose(outputs.numpy(), expected, atol=ATOL, err_msg=message)
        np.testing.assert_allclose(state.numpy(), expected_state, atol=ATOL, err_msg=message)
        m = cell.transition_matrix().numpy()
        np.testing.assert_allclose(
            m,
            reference.transition_matrix(weights[1], UNITS, ARGS["gamma"], case["antisymmetric"]),
            atol=1e-6,
        )


@check
def check_masking_layer_and_bidirectional():
    import tensorflow as tf

    from benchmarks import reference

    x = sequences()
    x[0, 6:] = 0.0
    model = tf.keras.Sequential(
        [
            tf.keras.Input((STEPS, FEATURES)),
            tf.keras.layers.Masking(0.0),
            tf.keras.layers.Bidirectional(tf.keras.layers.RNN(cell_class(True)(UNITS, **ARGS))),
        ]
    )
    weights = random_weights(model.layers[-1])
    mask = np.any(x != 0.0, axis=-1)
    _, forward = reference.run(weights[:3], x, units=UNITS, gated=True, mask=mask, **ARGS)
    _, backward = reference.run(
        weights[3:], x, units=UNITS, gated=True, mask=mask, go_backwards=True, **ARGS
    )
    expected = np.concatenate([forward, backward], axis=-1)
    np.testing.assert_allclose(model(x).numpy(), expected, atol=ATOL)


@check
def check_stateful():
    import tensorflow as tf

    from benchmarks import reference

    x = sequences()
    layer = tf.keras.layers.RNN(cell_class(False)(UNITS, **ARGS), stateful=True)
    model = tf.keras.Sequential([tf.keras.Input((None, FEATURES), batch_size=3), layer])
    weights = random_weights(layer)
    model(x[:, :4])
    second = model(x[:, 4:]).numpy()
    _, expected = reference.run(weights, x, units=UNITS, **ARGS)
    np.testing.assert_allclose(second, expected, atol=ATOL)
    layer.reset_states()
    _, expected = reference.run(weights, x[:, 4:], units=UNITS, **ARGS)
    np.testing.assert_allclose(model(x[:, 4:]).numpy(), expected, atol=ATOL)


@check
def check_dropout_one_input_mask_per_sequence():
    """A constant input through `h_t = h_{t-1} + ε·tanh(x·mask)` shows the mask of each step."""
    import tensorflow as tf

    rate, epsilon = 0.5, 0.1
    cell = cell_class(False)(FEATURES, epsilon=epsilon, gamma=0.0, dropout=rate, seed=3)
    layer = tf.keras.layers.RNN(cell, return_sequences=True)
    x = np.full((64, STEPS, FEATURES), 0.5, "float32")
    layer(x)
    layer.set_weights([np.eye(FEATURES, dtype="float32"), np.zeros(3, "float32"), np.zeros(3)])
    h = layer(x, training=True).numpy()
    steps = np.diff(np.concatenate([np.zeros_like(h[:, :1]), h], axis=1), axis=1)
    masks = np.arctanh(steps / epsilon) / 0.5
    np.testing.assert_allclose(masks, masks[:, :1].repeat(STEPS, axis=1), atol=1e-4)
    assert set(np.round(masks.ravel(), 3)) == {0.0, 1 / (1 - rate)}
    expected = epsilon * np.tanh(0.5) * np.arange(1, STEPS + 1)[None, :, None]
    np.testing.assert_allclose(layer(x).numpy(), np.broadcast_to(expected, h.shape), atol=1e-5)


@check
def check_recurrent_dropout_only_in_training():
    import tensorflow as tf

    x = sequences()
    plain = tf.keras.layers.RNN(cell_class(True)(UNITS, **ARGS))
    dropped = tf.keras.layers.RNN(
        cell_class(True)(UNITS, dropout=0.3, recurrent_dropout=0.4, seed=1, **ARGS)
    )
    plain(x), dropped(x)
    dropped.set_weights(random_weights(plain))
    np.testing.assert_allclose(dropped(x).numpy(), plain(x).numpy(), atol=1e-6)
    training = dropped(x, training=True).numpy()
    assert np.all(np.isfinite(training))
    assert np.abs(training - plain(x).numpy()).max() > 1e-3


@check
def check_transition_matrix_formed_once_per_sequence():
    """In a graph, `W - Wᵀ - γI` is formed before the time loop, not in its body."""
    import tensorflow as tf

    x = sequences()
    for gated in (False, True):
        layer = tf.keras.layers.RNN(cell_class(gated)(UNITS, **ARGS), return_sequences=True)
        layer(x)
        random_weights(layer)
        function = tf.function(lambda inputs, layer=layer: layer(inputs, training=True))
        graph = function.get_concrete_function(tf.TensorSpec((None, STEPS, FEATURES))).graph
        library = graph.as_graph_def().library.function
        loop_ops = [node.op for body in library for node in body.node_def]
        top_ops = [node.type for node in graph.get_operations()]
        assert "TensorScatterUpdate" not in loop_ops, gated
        assert top_ops.count("TensorScatterUpdate") == 1, top_ops
        assert "MatMul" in loop_ops
        eager = layer(x).numpy()
        np.testing.assert_allclose(function(x).numpy(), eager, atol=1e-6)
        # A cell called on its own forms the matrix each time: never stale.
        cell = layer.cell
        step = cell(x[:, 0], [tf.zeros((3, UNITS))])[0].numpy()
        cell.recurrent_kernel.assign(cell.recurrent_kernel * 2.0)
        again = tf.function(lambda cell=cell: cell(x[:, 0], [tf.ones((3, UNITS))])[0])()
        assert not np.allclose(step, again.numpy())


@check
def check_config_round_trip():
    import tensorflow as tf

    from keras_antisym.legacy import FanInNormal

    arguments = dict(
        epsilon=0.1,
        gamma=0.001,
        activation="relu",
        use_bias=False,
        kernel_initializer="glorot_uniform",
        recurrent_initializer=FanInNormal(4.0, seed=2),
        bias_initializer="ones",
        kernel_regularizer="l2",
        recurrent_regularizer=tf.keras.regularizers.L1(0.01),
        bias_regularizer="l1",
        kernel_constraint="max_norm",
        recurrent_constraint="non_neg",
        bias_constraint="unit_norm",
        dropout=0.1,
        recurrent_dropout=0.2,
        seed=3,
        antisymmetric=False,
    )
    for gated in (False, True):
        extra = {"recurrent_activation": "hard_sigmoid"} if gated else {}
        cell = cell_class(gated)(6, **arguments, **extra)
        config = cell.get_config()
        clone = type(cell).from_config(config)
        assert clone.get_config() == config
        for name, value in {**arguments, **extra}.items():
            if not hasattr(value, "get_config"):
                assert config[name] == value or isinstance(config[name], dict), name
        assert config["recurrent_initializer"]["config"] == {"sigma": 4.0, "seed": 2}
        layer = tf.keras.layers.RNN(cell)
        revived = tf.keras.layers.deserialize(tf.keras.layers.serialize(layer))
        assert type(revived.cell) is type(cell)
        assert revived.cell.get_config() == config


@check
def check_invalid_arguments():
    from keras_antisym.legacy import FanInNormal

    for cls in (cell_class(False), cell_class(True)):
        for name, value, expected in [
            ("units", 0, "a positive integer"),
            ("epsilon", 0.0, "a positive float"),
            ("gamma", -1.0, "a non-negative float"),
            ("dropout", 1.0, "a float in [0, 1)"),
            ("antisymmetric", "yes", "a boolean"),
        ]:
            arguments = {"units": 4, name: value}
            try:
                cls(**arguments)
            except ValueError as error:
                assert str(error).startswith(
                    f"Received an invalid value for argument `{name}`, expected {expected}, got "
                ), error
            else:
                raise AssertionError(f"{name}={value!r} was accepted")
    try:
        FanInNormal(-1.0)
    except ValueError as error:
        assert "argument `sigma`, expected a non-negative float" in str(error)
    else:
        raise AssertionError("sigma=-1 was accepted")


@check
def check_paper_initialization():
    import tensorflow as tf

    from keras_antisym.legacy import FanInNormal

    layer = tf.keras.layers.RNN(cell_class(True)(64, recurrent_initializer=FanInNormal(2.0)))
    layer(np.zeros((1, 2, 16), "float32"))
    kernel, recurrent, bias = layer.get_weights()
    assert kernel.shape == (16, 128) and recurrent.shape == (64 * 63 // 2,)
    assert abs(kernel.std() / (1 / 4) - 1) < 0.1  # N(0, 1/m), m = 16
    assert abs(recurrent.std() / (2 / 8) - 1) < 0.1  # N(0, σ_w²/n), σ_w = 2, n = 64
    assert not bias.any()
    assert [w.name.split("/")[-1] for w in layer.weights] == [
        "kernel:0", "recurrent_kernel:0", "bias:0"]  # fmt: skip
    zeros = FanInNormal(0.0)((3, 3))
    assert not np.asarray(zeros).any()


@check
def check_weights_from_keras3_and_training_back():
    """Keras 3 weights give Keras 3's outputs here; the weights trained here go back."""
    import tensorflow as tf

    keras3 = np.load(os.environ["LEGACY_WORK_DIR"] + "/keras3.npz")
    x, y = keras3["x"], keras3["y"]
    back = {}
    for name, gated, antisymmetric in MODELS:
        model = classifier(gated, antisymmetric)
        count = len(model.get_weights())
        model.set_weights([keras3[f"{name}/{i}"] for i in range(count)])
        np.testing.assert_allclose(model.predict(x, verbose=0), keras3[f"{name}/out"],
                                   atol=MOVE_ATOL, err_msg=name)  # fmt: skip
        model.compile(
            optimizer=tf.keras.optimizers.Adam(1e-2),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        tf.keras.utils.set_random_seed(0)
        history = model.fit(x, y, batch_size=32, epochs=6, verbose=0).history["loss"]
        assert history[-1] < 0.9 * history[0], (name, history)
        back.update({f"{name}/{i}": w for i, w in enumerate(model.get_weights())})
        back[f"{name}/out"] = model.predict(x, verbose=0)
    _save("trained", back)


@check
def check_save_and_load_each_format():
    import tensorflow as tf

    x = sequences()
    work = os.environ["LEGACY_WORK_DIR"]
    for name, gated, antisymmetric in MODELS:
        model = classifier(gated, antisymmetric, dropout=0.1)
        model.compile(optimizer="adam", loss="mse")
        random_weights(model)
        expected = model.predict(x, verbose=0)
        formats = [(f"{work}/{name}.keras", {})]
        if name == "gated":  # every format, for the model with every kind of weight
            formats += [(f"{work}/{name}.h5", {}), (f"{work}/{name}_sm", {"save_format": "tf"})]
        for path, how in formats:
            model.save(path, **how)
            loaded = tf.keras.models.load_model(path)
            cell = loaded.layers[0].cell
            assert type(cell) is type(model.layers[0].cell), (path, type(cell))
            assert cell.get_config() == model.layers[0].cell.get_config(), path
            np.testing.assert_allclose(loaded.predict(x, verbose=0), expected, atol=1e-6,
                                       err_msg=path)  # fmt: skip


@check
def check_exports_for_serving():
    """`serving.export.export_model` and `tf.saved_model.save` of a Keras 2 model."""
    import tensorflow as tf

    from serving.exports.export import export_model

    work = os.environ["LEGACY_WORK_DIR"]
    x = sequences(batch=4)
    model = classifier(True, True)
    random_weights(model)
    logits = model.predict(x, verbose=0)
    notes = []
    export_model(model, f"{work}/export_model", 1, notes=notes)
    # The streaming signatures walk Keras 3 layers: the note says so, not that a layer
    # would not treat each step alone.
    reason = "a tf_keras model is not a Keras 3 model: the signatures walk Keras 3 layers"
    assert notes == [
        f"no `stream` signature: {reason} (see docs/legacy.md)",
        f"no `padded` signature: {reason} (see docs/legacy.md)",
    ], notes
    tf.saved_model.save(model, f"{work}/saved_model/1")
    _save("served", {"x": x, "logits": logits})


def _save(name, arrays):
    np.savez(os.path.join(os.environ["LEGACY_WORK_DIR"], f"{name}.npz"), **arrays)


def main(work_dir):
    assert os.environ.get("TF_USE_LEGACY_KERAS") == "1", "run with TF_USE_LEGACY_KERAS=1"
    os.environ["LEGACY_WORK_DIR"] = work_dir
    results, seconds = {}, {}
    for function in CHECKS:
        start = time.perf_counter()
        try:
            function()
            results[function.__name__] = "ok"
        except Exception:
            results[function.__name__] = traceback.format_exc()
        seconds[function.__name__] = round(time.perf_counter() - start, 2)
    results["__seconds__"] = seconds
    import keras_antisym

    results["__file__"] = keras_antisym.__file__
    with open(os.path.join(work_dir, "results.json"), "w") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
