"""The private Keras pieces we rely on (keras_antisym/_keras_private.py)."""

import keras
import numpy as np
import pytest

from keras_antisym import AntisymmetricCell, AntisymmetricRNN, _keras_private


def test_keras_version_is_in_the_pinned_range():
    low, high = _keras_private.SUPPORTED_KERAS
    version = _keras_private._version_tuple(keras.__version__)
    assert low <= version < high


def test_cell_is_a_dropout_rnn_cell_with_the_expected_protocol():
    cell = AntisymmetricCell(3, dropout=0.5, recurrent_dropout=0.5, seed=0)
    cell.build((2, 4))
    assert isinstance(cell, _keras_private.DropoutRNNCell)
    step = np.ones((2, 4), "float32")
    first = cell.get_dropout_mask(step)
    assert first is cell.get_dropout_mask(step)  # cached across steps
    recurrent = cell.get_recurrent_dropout_mask(np.ones((2, 3), "float32"))
    assert set(np.unique(np.asarray(first))) <= {0.0, 2.0}
    assert set(np.unique(np.asarray(recurrent))) <= {0.0, 2.0}
    cell.reset_dropout_mask()
    cell.reset_recurrent_dropout_mask()
    assert cell._dropout_mask is None and cell._recurrent_dropout_mask is None


class CountingCell(AntisymmetricCell):
    formed = 0

    def sequence_constants(self):
        CountingCell.formed += 1
        return super().sequence_constants()


def test_rnn_forms_sequence_constants_once_per_call_and_resets():
    CountingCell.formed = 0
    cell = CountingCell(3, dropout=0.5, seed=0)
    layer = keras.layers.RNN(cell)
    x = np.ones((2, 7, 4), "float32")
    layer(x, training=True)  # eager: the cell runs 7 steps
    assert CountingCell.formed == 1
    assert cell._dropout_mask is None and cell._sequence_cache is None
    layer(x)
    assert CountingCell.formed == 2


def test_direct_cell_calls_never_see_stale_constants():
    cell = AntisymmetricCell(3, epsilon=1.0, gamma=0.0)
    layer = keras.layers.RNN(cell)
    x = np.ones((1, 2, 1), "float32")
    layer(x)
    h = np.array([[1.0, 0.0, 0.0]], "float32")
    kernel, rec, bias = (np.zeros_like(w) for w in layer.get_weights())
    layer.set_weights([kernel, rec, bias])
    np.testing.assert_allclose(np.asarray(cell(x[:, 0], [h])[0]), h, atol=1e-7)
    rec[0] = 1.0  # W[0, 1] = 1: (W - Wᵀ) h = (0, -1, 0)
    layer.set_weights([kernel, rec, bias])
    np.testing.assert_allclose(
        np.asarray(cell(x[:, 0], [h])[0]), [[1.0, np.tanh(-1.0), 0.0]], atol=1e-6
    )


def test_rnn_loop_signature_and_semantics():
    """`rnn_loop` returns (last_output, outputs, states), outputs in processing order."""
    x = np.arange(1, 5, dtype="float32").reshape(1, 4, 1)
    mask = np.array([[True, True, False, True]])

    def step(inputs, states):
        total = states[0] + inputs
        return total, [total]

    for go_backwards, expected in [(False, [1, 3, 3, 7]), (True, [4, 4, 6, 7])]:
        last, outputs, states = _keras_private.rnn_loop(
            step,
            keras.ops.convert_to_tensor(x),
            [keras.ops.zeros((1, 1))],
            go_backwards=go_backwards,
            mask=keras.ops.convert_to_tensor(mask),
            input_length=4,
            return_all_outputs=True,
        )
        np.testing.assert_allclose(np.asarray(outputs)[0, :, 0], expected)
        np.testing.assert_allclose(np.asarray(last)[0, 0], expected[-1])
        np.testing.assert_allclose(np.asarray(states[0])[0, 0], 7.0)


class CountingRNN(AntisymmetricRNN):
    cell_class = CountingCell


def test_fused_layer_forms_the_matrix_once_per_call():
    CountingCell.formed = 0
    layer = CountingRNN(4, return_sequences=True)
    layer(np.ones((1, 9, 2), "float32"))  # eager: 9 steps
    assert CountingCell.formed == 1
    assert layer.cell._sequence_cache is None


def test_accelerator_available_reads_keras_default_devices(monkeypatch):
    import tensorflow as tf

    expected = bool(tf.config.list_physical_devices("GPU"))
    assert _keras_private.accelerator_available() is expected
    for devices, answer in ((["cpu:0"], False), (["gpu:0", "gpu:1"], True), (["tpu:0"], True)):
        monkeypatch.setattr(keras.distribution, "list_devices", lambda d=devices: d)
        assert _keras_private.accelerator_available() is answer


def test_fused_layers_hoist_only_wide_inputs_on_accelerators(monkeypatch):
    from keras_antisym import layers

    for accelerator in (False, True):
        monkeypatch.setattr(layers, "accelerator_available", lambda a=accelerator: a)
        assert layers.hoists_inputs(layers.HOIST_MIN_INPUT_DIM) is accelerator
        assert layers.hoists_inputs(layers.HOIST_MIN_INPUT_DIM - 1) is False
        assert layers.hoists_inputs(None) is False
    monkeypatch.setattr(layers, "HOIST_INPUTS", False)
    assert layers.hoists_inputs(100) is False


def test_tensorflow_allows_xla_only_on_an_accelerator(monkeypatch):
    import keras_antisym.cells

    if keras.backend.backend() != "tensorflow":
        pytest.skip("the choice is TensorFlow's; JAX always compiles")
    assert not keras_antisym.cells.AntisymmetricCell(4).supports_jit  # this CPU
    monkeypatch.setattr(keras_antisym.cells, "accelerator_available", lambda: True)
    assert keras_antisym.cells.AntisymmetricCell(4).supports_jit
    assert keras_antisym.cells.GatedAntisymmetricCell(4).supports_jit
