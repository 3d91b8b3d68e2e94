"""The one place where keras_antisym touches private Keras code.

Two pieces of `keras.layers.RNN` have no public equivalent:

- `DropoutRNNCell`: RNN creates, caches and resets per-sequence dropout masks
  only for cells inheriting from this private mixin (`RNN.call` calls
  `get_dropout_mask`/`get_recurrent_dropout_mask` once before its loop and
  `reset_*_mask` after it). A cell that wants Keras' dropout semantics (one
  mask per sequence, shared by all steps) must inherit from it. The same
  once-per-sequence call is the only hook where a cell can form per-sequence
  constants (the AntisymmetricRNN's transition matrix) before the loop.
- `rnn_loop` (`keras.src.backend.rnn`): the time loop of Keras' own recurrent
  layers, with their exact masking, `go_backwards`, `unroll` and
  `zero_output_for_mask` semantics on every backend. The public
  `keras.ops.scan` is 20% slower per training step on TensorFlow (it routes
  the carry through a TensorArray) and lacks these semantics.

A third, `accelerator_available`, asks Keras' PyTorch backend for its device:
PyTorch has no `keras.distribution` backend to ask publicly.

All are checked against the pinned Keras range by tests/test_keras_private.py.
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

from keras.src.backend import rnn as rnn_loop  # noqa: E402
from keras.src.layers.rnn.dropout_rnn_cell import DropoutRNNCell  # noqa: E402


class SequenceConstantsCell(DropoutRNNCell):
    """A `DropoutRNNCell` that forms per-sequence constants once per RNN call.

    Subclasses implement `sequence_constants()`. Inside `keras.layers.RNN`
    it runs once, before the time loop (when RNN prepares the dropout masks),
    and `cached_sequence_constants()` returns that result at every step until
    RNN resets the masks after the loop. A cell called directly, outside an
    RNN, forms the constants at each call, so they are never stale.
    """

    _sequence_cache = None

    def sequence_constants(self):
        raise NotImplementedError

    def cached_sequence_constants(self):
        if self._sequence_cache is not None:
            return self._sequence_cache
        return self.sequence_constants()

    def step_recurrent_dropout_mask(self, state):
        """The recurrent dropout mask, for use inside the cell's `call`."""
        return DropoutRNNCell.get_recurrent_dropout_mask(self, state)

    def get_recurrent_dropout_mask(self, step_input):
        # Called by RNN.call once per sequence, before the loop.
        self._sequence_cache = self.sequence_constants() if self.built else None
        return DropoutRNNCell.get_recurrent_dropout_mask(self, step_input)

    def reset_recurrent_dropout_mask(self):
        # Called by RNN.call after the loop.
        self._sequence_cache = None
        DropoutRNNCell.reset_recurrent_dropout_mask(self)


def accelerator_available():
    """Whether Keras computes on a GPU or TPU by default, rather than a CPU.

    Asked at each call (cheap): on PyTorch the answer follows a
    `keras.device(...)` scope; on TensorFlow and JAX it is the machine's
    default device type (`keras.distribution.list_devices`).
    """
    if keras.backend.backend() == "torch":
        from keras.src.backend.torch.core import get_device

        return not str(get_device()).lower().startswith("cpu")
    try:
        devices = keras.distribution.list_devices()
    except (AttributeError, NotImplementedError):  # no distribution backend
        return False
    return any(not device.lower().startswith("cpu") for device in devices)


__all__ = ["DropoutRNNCell", "SequenceConstantsCell", "accelerator_available", "rnn_loop"]
