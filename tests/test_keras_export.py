"""Keras' own `model.export` of models with the fused layers: LiteRT without Flex, ONNX.

`model.export(path, format="litert")` converts with TensorFlow's converter; the
fused layers' inference loop on TensorFlow (`keras_antisym._tf_loop`) must become
builtin ops only, so that `ai_edge_litert`'s standard interpreter runs the model
without the Flex delegate, for any batch size and (with `T=None`) any length.
`keras.layers.RNN(cell)` runs Keras' own loop: builtin-only for a fixed batch.
Each model is checked against Keras' own outputs.
"""

import os

import keras
import numpy as np
import pytest

from keras_antisym import (
    AntisymmetricCell,
    AntisymmetricRNN,
    GatedAntisymmetricCell,
    GatedAntisymmetricRNN,
)
from tests.conftest import random_weights

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="Keras' LiteRT export of TensorFlow models"
)

FEATURES = 3


def _fused(gated, units=4, **kwargs):
    layer = GatedAntisymmetricRNN if gated else AntisymmetricRNN
    return layer(units, epsilon=0.3, gamma=0.05, **kwargs)


def _model(name, steps):
    """The model `name` on `(batch, steps, 3)` sequences (`steps` None: any length)."""
    inputs = keras.Input((steps, FEATURES))
    x = inputs
    if name == "last":
        outputs = keras.layers.Dense(2)(_fused(False)(x))
    elif name == "sequences_gated":
        outputs = _fused(True, return_sequences=True)(x)
    elif name == "state":
        output, state = _fused(False, return_sequences=True, return_state=True)(x)
        outputs = [output, state]
    elif name == "masked":
        # Zero rows are padding: the layer holds its state over them.
        x = keras.layers.Masking(0.0)(x)
        outputs = _fused(True, return_sequences=True)(x)
    elif name == "backwards_gated":
        outputs = _fused(True, go_backwards=True, return_sequences=True)(x)
    elif name == "bidirectional_stacked":
        x = keras.layers.Bidirectional(_fused(False, return_sequences=True))(x)
        outputs = keras.layers.Dense(2)(_fused(True, units=3)(x))
    elif name == "unrolled":
        outputs = _fused(False, unroll=True, return_sequences=True)(x)
    elif name == "cell":
        outputs = keras.layers.RNN(AntisymmetricCell(4, epsilon=0.3, gamma=0.05))(x)
    elif name == "cell_gated":
        cell = GatedAntisymmetricCell(4, epsilon=0.3, gamma=0.05)
        outputs = keras.layers.RNN(cell, return_sequences=True)(x)
    else:
        raise AssertionError(name)
    model = keras.Model(inputs, outputs)
    for seed, layer in enumerate(model.layers):
        if layer.weights:
            random_weights(layer, seed=seed)
    return model


def _sequences(batch, steps, seed=0):
    x = np.random.RandomState(seed).standard_normal((batch, steps, FEATURES)).astype("float32")
    x[0, steps - 2 :] = 0.0  # padding, for the masked model
    return x


def _litert(path, x):
    """The model's outputs from LiteRT's standard interpreter (no Flex delegate), in the
    order of Keras' outputs, and its operators."""
    from ai_edge_litert.interpreter import Interpreter

    from serving.exports.litert import operators

    with open(path, "rb") as f:
        blob = f.read()
    interpreter = Interpreter(model_content=blob)
    runner = interpreter.get_signature_runner()
    (name,) = runner.get_input_details()
    results = runner(**{name: x})
    # The signature names its outputs output_0, output_1, ... in Keras' order.
    return [results[key] for key in sorted(results, key=lambda k: int(k.rsplit("_", 1)[1]))], set(
        operators(blob)
    )


def _keras_outputs(model, x):
    outputs = model(x, training=False)
    return [np.asarray(o) for o in (outputs if isinstance(outputs, list) else [outputs])]


def _assert_builtin(ops, loop=True):
    assert ("WHILE" in ops) is loop, ops  # `unroll=True`: the steps one after another
    assert not [op for op in ops if op.startswith("Flex") or not op.isupper()], ops


FUSED = ["last", "sequences_gated", "state", "masked", "backwards_gated", "bidirectional_stacked",
         "unrolled"]  # fmt: skip


@pytest.mark.parametrize("name", FUSED)
def test_keras_litert_export_is_builtin_only_and_equals_keras(name, tmp_path):
    """Fixed length (6: two Euler steps per loop iteration), the batch left free: the
    interpreter runs batches of 1 and 5."""
    model = _model(name, 6)
    path = os.path.join(tmp_path, "model.tflite")
    model.export(path, format="litert", verbose=False)
    for batch in (5, 1):
        x = _sequences(batch, 6, seed=batch)
        got, ops = _litert(path, x)
        _assert_builtin(ops, loop=name != "unrolled")
        expected = _keras_outputs(model, x)
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("name", ["sequences_gated", "masked"])
def test_keras_litert_export_of_any_length_runs_every_length(name, tmp_path):
    model = _model(name, None)
    path = os.path.join(tmp_path, "model.tflite")
    model.export(path, format="litert", verbose=False)
    for batch, steps in ((2, 7), (3, 4), (1, 1 + 2)):
        x = _sequences(batch, steps, seed=steps)
        got, ops = _litert(path, x)
        _assert_builtin(ops)
        np.testing.assert_allclose(got[0], _keras_outputs(model, x)[0], atol=1e-5)
        assert got[0].shape == (batch, steps, 4)


@pytest.mark.parametrize("name", ["cell", "cell_gated"])
def test_keras_loop_of_a_cell_is_builtin_only_for_a_fixed_batch(name, tmp_path):
    """`keras.layers.RNN(cell)` runs Keras' loop, whose output list LiteRT lowers to builtin
    ops only when the batch is static: the README's way is an `input_signature`."""
    import tensorflow as tf

    model = _model(name, 6)
    path = os.path.join(tmp_path, "model.tflite")
    signature = [tf.TensorSpec((2, 6, FEATURES), tf.float32)]
    model.export(path, format="litert", verbose=False, input_signature=signature)
    x = _sequences(2, 6)
    got, ops = _litert(path, x)
    _assert_builtin(ops)
    np.testing.assert_allclose(got[0], _keras_outputs(model, x)[0], atol=1e-5)


def test_a_stateful_layer_keeps_its_state_between_litert_calls(tmp_path):
    """LiteRT keeps a `stateful` layer's state in its resource variables: two calls of the
    interpreter answer what two calls of the model answer."""
    from ai_edge_litert.interpreter import Interpreter

    inputs = keras.Input((6, FEATURES), batch_size=2)
    model = keras.Model(inputs, _fused(True, stateful=True)(inputs))
    random_weights(model.layers[1], seed=3)
    path = os.path.join(tmp_path, "model.tflite")
    model.export(path, format="litert", verbose=False)  # before any call: zero states
    runner = Interpreter(model_path=path).get_signature_runner()
    (name,) = runner.get_input_details()
    for seed in (1, 2):
        x = _sequences(2, 6, seed=seed)
        np.testing.assert_allclose(runner(**{name: x})["output_0"], _keras_outputs(model, x)[0],
                                   atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("name", ["state", "masked", "bidirectional_stacked"])
def test_keras_onnx_export_equals_keras(name, tmp_path):
    import onnxruntime

    model = _model(name, 6)
    x = _sequences(4, 6)
    expected = _keras_outputs(model, x)  # Keras' ONNX export needs a model called once
    path = os.path.join(tmp_path, "model.onnx")
    model.export(path, format="onnx", verbose=False)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x})
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_inference_gradients_flow_through_the_litert_loop():
    """Gradients of an inference call (saliency, `keras_antisym.diagnostics`) go through
    the inference loop as through Keras' training loop."""
    import tensorflow as tf

    model = _model("masked", 6)
    x = tf.constant(_sequences(3, 6))
    grads = []
    for training in (False, True):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(model(x, training=training) ** 2)
        grads.append(tape.gradient(loss, [x, *model.trainable_weights]))
    for a, b in zip(*grads, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
