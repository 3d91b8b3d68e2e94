"""The one place where keras_antisym touches private Keras code.

`keras.layers.RNN` creates, caches and resets per-sequence dropout masks only
for cells that inherit from its private `DropoutRNNCell` mixin (see
`RNN._maybe_config_dropout_masks`). A cell that wants Keras' dropout semantics
(one mask per sequence, shared by all time steps) must therefore inherit from
it. The import is isolated here and checked against the pinned Keras range.
"""

import keras

# Keep in sync with `install_requires` in setup.cfg.
SUPPORTED_KERAS = ((3, 10), (3, 16))


def _version_tuple(version):
    return tuple(int(part) for part in version.split(".")[:2] if part.isdigit())


def _check_keras_version():
    version = _version_tuple(keras.__version__)
    low, high = SUPPORTED_KERAS
    if not (low <= version < high):
        raise ImportError(
            f"keras_antisym supports Keras >={low[0]}.{low[1]},<{high[0]}.{high[1]}, "
            f"found keras {keras.__version__}."
        )


_check_keras_version()

from keras.src.layers.rnn.dropout_rnn_cell import DropoutRNNCell  # noqa: E402

__all__ = ["DropoutRNNCell"]
