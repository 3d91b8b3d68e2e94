"""The one private Keras piece we rely on: RNN's dropout-mask protocol."""

import keras
import numpy as np

from keras_antisym import AntisymmetricCell, _keras_private


def test_keras_version_is_in_the_pinned_range():
    low, high = _keras_private.SUPPORTED_KERAS
    version = _keras_private._version_tuple(keras.__version__)
    assert low <= version < high


def test_cell_is_a_dropout_rnn_cell_with_the_expected_protocol():
    cell = AntisymmetricCell(3, dropout=0.5, recurrent_dropout=0.5, seed=0)
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


def test_rnn_resets_the_masks_after_each_call():
    cell = AntisymmetricCell(3, dropout=0.5, seed=0)
    layer = keras.layers.RNN(cell)
    layer(np.ones((2, 5, 4), "float32"), training=True)
    assert cell._dropout_mask is None
    assert AntisymmetricCell(3).get_dropout_mask(np.ones((1, 2), "float32")) is None
