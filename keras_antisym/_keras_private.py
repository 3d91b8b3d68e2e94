"""Every use of private Keras code in keras_antisym, and what it assumes.

Keras 3 has no public equivalent of the pieces below. When this module is
imported, each is looked up and checked by what it offers (names, call
signatures), not by Keras' version number; a missing one is replaced by a
public fallback, with a warning that names the Keras version and the piece.
The checks run no computation: importing keras_antisym must not start a
device. tests/test_keras_private.py tests each assumption's behaviour on the
installed Keras, and each fallback. Tested with Keras 3.15; Keras older than
`MINIMUM_KERAS` is refused (its `.keras` loading lacks the safe_mode fixes).

Assumptions:

1. `keras.src.backend.rnn` (here `rnn_loop`) is the time loop of Keras' own
   recurrent layers: `rnn_loop(step_function, inputs, initial_states,
   go_backwards=, mask=, unroll=, input_length=, zero_output_for_mask=,
   return_all_outputs=)` returns `(last_output, outputs, new_states)`,
   outputs in processing order; a masked step keeps the states and repeats
   the previous output (or zeros). The public `keras.ops.scan` is 20% slower
   per training step on TensorFlow (it routes the carry through a
   TensorArray). Fallback: `public_rnn_loop`, those semantics on `ops.scan`.
   (On TensorFlow outside training the fused layers run `keras_antisym._tf_loop`,
   the same semantics in ops LiteRT has builtins for.)
2. `keras.src.layers.rnn.dropout_rnn_cell.DropoutRNNCell` is the mixin that
   makes `keras.layers.RNN` treat a cell as a dropout cell: `RNN.call` calls
   `get_dropout_mask(sequences[:, 0])` and
   `get_recurrent_dropout_mask(initial_state[0])` once before its loop, and
   `reset_dropout_mask()` and `reset_recurrent_dropout_mask()` after it; a
   mask is cached from its first `get_*` call until its reset. The cells
   inherit from it for Keras' dropout semantics (one mask per sequence,
   shared by all steps), and use the once-per-sequence call to form the
   per-sequence constants (the transition matrix) before the loop
   (`SequenceConstantsCell`). Fallback: `PublicDropoutCell`; inside
   `keras.layers.RNN` the cells then draw new masks at each step and form
   the constants at each step (the fused layers keep one mask per sequence).
3. `keras.layers.RNN.call` draws those masks, then calls
   `self.inner_loop(sequences, initial_state, mask, training)` (the method
   `GRU` and `LSTM` override) and, when `stateful`, assigns the states it
   returns into `self.states` in place. The fused layers override
   `inner_loop` and read the masks that RNN drew: the mask a `get_*` call
   returns there is the one the cell sees at every step. Without such an
   `inner_loop`, Keras runs its own loop over the cell: the same numbers,
   slower.
4. `keras.src.backend.torch.core.get_device()` is the device Keras' PyTorch
   backend computes on (`torch_device`, used by `accelerator_available` and
   the fused kernels): PyTorch has no
   `keras.distribution` backend to ask publicly. Fallback: whether PyTorch
   sees a CUDA device.
"""

import contextlib
import inspect
import re
import warnings
from typing import Any

import keras
from keras import ops

#: Keras releases before this one are refused; keep in sync with setup.cfg.
MINIMUM_KERAS = (3, 11, 3)
#: The keyword arguments that the fused layers pass to `rnn_loop`.
RNN_LOOP_ARGUMENTS = (
    "go_backwards",
    "mask",
    "unroll",
    "input_length",
    "zero_output_for_mask",
    "return_all_outputs",
)
DROPOUT_CELL_METHODS = (
    "get_dropout_mask",
    "get_recurrent_dropout_mask",
    "reset_dropout_mask",
    "reset_recurrent_dropout_mask",
)
INNER_LOOP_ARGUMENTS = ("sequences", "initial_state", "mask", "training")
#: Descriptions of the private pieces this Keras lacks (each one warned about).
MISSING: list[str] = []


def version_tuple(version):
    """`(major, minor, patch)` of a version string, ignoring pre-release tags."""
    numbers = []
    for part in version.split(".")[:3]:
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
    return tuple(numbers + [0] * (3 - len(numbers)))


def check_keras_version(version):
    """Raises `ImportError` for a Keras older than `MINIMUM_KERAS`."""
    if version_tuple(version) < MINIMUM_KERAS:
        minimum = ".".join(map(str, MINIMUM_KERAS))
        raise ImportError(f"keras_antisym needs Keras >= {minimum}, found keras {version}.")


def _missing(piece, fallback):
    MISSING.append(piece)
    warnings.warn(
        f"keras_antisym: Keras {keras.__version__} lacks {piece}; using {fallback} instead "
        "(keras_antisym is tested with Keras 3.15).",
        RuntimeWarning,
        stacklevel=3,
    )


def _accepts(function, names):
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return set(names) <= set(parameters)


def _find_rnn_loop():
    """Keras' own time loop (assumption 1), or None."""
    try:
        from keras.src.backend import rnn
    except ImportError:
        return None
    return rnn if _accepts(rnn, RNN_LOOP_ARGUMENTS) else None


def _find_dropout_cell():
    """The mixin `keras.layers.RNN` treats as a dropout cell (assumption 2), or None."""
    try:
        from keras.src.layers.rnn import rnn as rnn_module
        from keras.src.layers.rnn.dropout_rnn_cell import DropoutRNNCell
    except ImportError:
        return None
    if getattr(rnn_module, "DropoutRNNCell", None) is not DropoutRNNCell:
        return None  # RNN no longer checks for this class
    if not all(callable(getattr(DropoutRNNCell, name, None)) for name in DROPOUT_CELL_METHODS):
        return None
    return DropoutRNNCell


def public_rnn_loop(
    step_function,
    inputs,
    initial_states,
    go_backwards=False,
    mask=None,
    unroll=False,
    input_length=None,
    zero_output_for_mask=False,
    return_all_outputs=True,
):
    """`rnn_loop`'s semantics on the public `keras.ops.scan` (fallback of assumption 1).

    With a mask, the step's output must have the shape of the first state
    (true of the fused layers' masked loop). `unroll` and `input_length` are
    accepted for compatibility; `ops.scan` handles any length.
    """
    del unroll, input_length, return_all_outputs  # `outputs` always has every step
    steps = ops.moveaxis(inputs, 1, 0)
    keeps = None if mask is None else ops.moveaxis(ops.cast(mask, "bool"), 1, 0)
    if go_backwards:
        steps = ops.flip(steps, 0)
        keeps = None if keeps is None else ops.flip(keeps, 0)

    def advance(carry, step):
        states, previous = carry
        x, keep = step if keeps is not None else (step, None)
        output, new_states = step_function(x, list(states))
        new_states = list(new_states)
        if keep is not None:
            keep = ops.expand_dims(keep, -1)
            held = previous if previous is not None and not zero_output_for_mask else None
            new_states = [
                ops.where(keep, new, old) for new, old in zip(new_states, states, strict=True)
            ]
            output = ops.where(keep, output, ops.zeros_like(output) if held is None else held)
        return (new_states, output), (new_states, output)

    # The first step runs before the loop: it gives the carried output its
    # shape (the TensorFlow scan needs each step's result shaped as the carry).
    carry, _ = advance((list(initial_states), None), _step(steps, keeps, 0))
    (states, _), (_, outputs) = ops.scan(advance, carry, _step(steps, keeps, slice(1, None)))
    outputs = ops.concatenate([ops.expand_dims(carry[1], 0), outputs], axis=0)
    return outputs[-1], ops.moveaxis(outputs, 0, 1), states


def _step(steps, keeps, index):
    return steps[index] if keeps is None else (steps[index], keeps[index])


class PublicDropoutCell:
    """The fallback of `DropoutRNNCell` (assumption 2), on public `keras.random`.

    Nothing resets a cached mask when `keras.layers.RNN` does not know this
    class, so each `get_*` call draws a new mask.
    """

    # Set by the cell that mixes this class in.
    dropout: float
    recurrent_dropout: float
    seed_generator: Any

    def _new_mask(self, step_input, rate):
        if rate <= 0:
            return None
        ones = ops.ones_like(step_input)
        return keras.random.dropout(ones, rate=rate, seed=self.seed_generator)

    def get_dropout_mask(self, step_input):
        return self._new_mask(step_input, self.dropout)

    def get_recurrent_dropout_mask(self, step_input):
        return self._new_mask(step_input, self.recurrent_dropout)

    def reset_dropout_mask(self):
        pass

    def reset_recurrent_dropout_mask(self):
        pass


check_keras_version(keras.__version__)
rnn_loop = _find_rnn_loop()
if rnn_loop is None:
    rnn_loop = public_rnn_loop
    _missing("the time loop `keras.src.backend.rnn`", "a `keras.ops.scan` loop")
DropoutRNNCell: Any = _find_dropout_cell()
if DropoutRNNCell is None:
    DropoutRNNCell = PublicDropoutCell
    _missing(
        "`DropoutRNNCell` as used by `keras.layers.RNN`",
        "a new dropout mask at every step of `keras.layers.RNN(cell)` (the fused layers "
        "keep one per sequence)",
    )
if not _accepts(getattr(keras.layers.RNN, "inner_loop", None), INNER_LOOP_ARGUMENTS):
    _missing("`keras.layers.RNN.inner_loop`", "Keras' own loop over the cell (slower)")


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

    @contextlib.contextmanager
    def sequence_scope(self):
        """Forms the per-sequence constants once, for every call of the cell in the block.

        For a loop over the steps written outside `keras.layers.RNN` (an
        export's while loop, a hand-written stream): entered before the loop,
        the transition matrix is formed once, not at every step. On exit the
        cell forms them at each call again (or as the enclosing RNN had them).
        The weights must not change inside the block.

        Example:

        >>> import numpy as np
        >>> from keras_antisym import AntisymmetricCell
        >>> cell = AntisymmetricCell(4)
        >>> cell.build((None, 3))
        >>> h = [np.zeros((2, 4), "float32")]
        >>> with cell.sequence_scope():
        ...     for x_t in np.ones((5, 2, 3), "float32"):
        ...         _, h = cell(x_t, h)
        >>> tuple(h[0].shape)
        (2, 4)
        """
        if not self.built:
            raise ValueError(
                f"`sequence_scope()` needs a built cell, and {self.name!r} is not built: "
                "call it once, or `build(input_shape)`, first"
            )
        previous = self._sequence_cache
        self._sequence_cache = self.sequence_constants()
        try:
            yield self
        finally:
            self._sequence_cache = previous

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


def torch_device():
    """The device Keras' PyTorch backend computes on now, as a string ("cuda:0", "cpu")."""
    try:
        from keras.src.backend.torch.core import get_device
    except ImportError:  # assumption 4's fallback
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(get_device()).lower()


def accelerator_available():
    """Whether Keras computes on a GPU or TPU by default, rather than a CPU.

    Asked at each call (cheap): on PyTorch the answer follows a
    `keras.device(...)` scope; on TensorFlow and JAX it is the machine's
    default device type (`keras.distribution.list_devices`).
    """
    if keras.backend.backend() == "torch":
        return not torch_device().startswith("cpu")
    try:
        devices = keras.distribution.list_devices()
    except (AttributeError, NotImplementedError):  # no distribution backend
        return False
    return any(not device.lower().startswith("cpu") for device in devices)


__all__ = [
    "DropoutRNNCell",
    "MINIMUM_KERAS",
    "MISSING",
    "PublicDropoutCell",
    "SequenceConstantsCell",
    "accelerator_available",
    "public_rnn_loop",
    "rnn_loop",
    "torch_device",
]
