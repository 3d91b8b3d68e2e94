"""keras_antisym/_keras_private.py: each private-Keras assumption on this Keras, and each fallback.

The numbered assumptions are those of the module's docstring.
"""

import importlib
import json
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest

from benchmarks import reference
from keras_antisym import AntisymmetricCell, AntisymmetricRNN, _keras_private
from tests.limits import limit

ROOT = Path(__file__).resolve().parents[1]


def test_keras_floor_and_version_parsing():
    assert _keras_private.version_tuple(keras.__version__) >= _keras_private.MINIMUM_KERAS
    assert _keras_private.version_tuple("3.16.0rc1") == (3, 16, 0)
    assert _keras_private.version_tuple("3.16.0.dev2026010103") == (3, 16, 0)
    assert _keras_private.version_tuple("4.1") == (4, 1, 0)
    for too_old in ("3.10.0", "3.11.2", "2.15.0"):
        with pytest.raises(ImportError, match=f"needs Keras >= 3.11.3, found keras {too_old}"):
            _keras_private.check_keras_version(too_old)
    for newer in ("3.11.3", "3.16.0", "3.16.0rc1", "4.0.0"):
        _keras_private.check_keras_version(newer)  # newer releases are checked by behaviour


def test_version_tuple_keeps_three_numbers_and_stops_at_a_tag():
    assert _keras_private.version_tuple("3.16.0.5") == (3, 16, 0)  # a fourth number is dropped
    assert _keras_private.version_tuple("3.dev0") == (3, 0, 0)  # numbers end at the first tag
    assert _keras_private.version_tuple("3.15") == (3, 15, 0)


def test_this_keras_has_every_private_piece():
    from keras.src.backend import rnn
    from keras.src.layers.rnn.dropout_rnn_cell import DropoutRNNCell

    assert _keras_private.MISSING == []
    assert _keras_private.rnn_loop is rnn
    assert _keras_private.DropoutRNNCell is DropoutRNNCell


@pytest.mark.parametrize("loop", ["rnn_loop", "public_rnn_loop"])
@pytest.mark.parametrize("zero_output_for_mask", [False, True])
def test_assumption_1_rnn_loop_semantics(loop, zero_output_for_mask):
    """(last_output, outputs, states), outputs in processing order; masked steps keep the state."""
    x = np.arange(1, 5, dtype="float32").reshape(1, 4, 1)
    mask = np.array([[True, True, False, True]])

    def step(inputs, states):
        total = states[0] + inputs
        return total, [total]

    held = 0.0 if zero_output_for_mask else None
    for go_backwards, expected in [(False, [1, 3, 3, 7]), (True, [4, 4, 6, 7])]:
        last, outputs, states = getattr(_keras_private, loop)(
            step,
            keras.ops.convert_to_tensor(x),
            [keras.ops.zeros((1, 1))],
            go_backwards=go_backwards,
            mask=keras.ops.convert_to_tensor(mask),
            input_length=4,
            zero_output_for_mask=zero_output_for_mask,
            return_all_outputs=True,
        )
        masked_position = 1 if go_backwards else 2
        if held is not None:
            expected = list(expected)
            expected[masked_position] = held
        np.testing.assert_allclose(np.asarray(outputs)[0, :, 0], expected)
        np.testing.assert_allclose(np.asarray(last)[0, 0], expected[-1])
        np.testing.assert_allclose(np.asarray(states[0])[0, 0], 7.0)


A_LOOP = np.array([[0.3, -0.2, 0.5, 0.1], [-0.4, 0.6, 0.2, -0.3]], "float32")
W_LOOP = np.array([0.7, -1.1, 0.4], "float32")


def loop_step(inputs, states):
    """A step with two states of different widths (4 and 2); the output is the first."""
    h, c = states
    h_new = keras.ops.tanh(
        0.5 * h + keras.ops.pad(inputs * W_LOOP, [[0, 0], [0, 1]]) + keras.ops.matmul(c, A_LOOP)
    )
    c_new = 0.9 * c + inputs[:, :2] * np.array([1.0, -1.0], "float32") + h[:, 1:3]
    return h_new, [h_new, c_new]


def numpy_loop(x, states, go_backwards=False, mask=None, zero_output_for_mask=False):
    """`rnn_loop`'s documented semantics, one step at a time."""
    order = range(x.shape[1])[::-1] if go_backwards else range(x.shape[1])
    states = [np.asarray(s) for s in states]
    previous = np.zeros_like(states[0])
    outputs = []
    for t in order:
        output, new_states = loop_step(x[:, t], states)
        output = keras.ops.convert_to_numpy(output)
        new_states = [keras.ops.convert_to_numpy(s) for s in new_states]
        if mask is not None:
            keep = mask[:, t].astype(bool)[:, None]
            new_states = [
                np.where(keep, new, old) for new, old in zip(new_states, states, strict=True)
            ]
            output = np.where(keep, output, 0.0 if zero_output_for_mask else previous)
        states, previous = new_states, output
        outputs.append(output)
    outputs = np.stack(outputs, axis=1)
    return outputs[:, -1], outputs, states


def loop_inputs():
    """Batch 3, 5 steps, 3 features; masks: post-padding, first and middle steps masked, none."""
    rng = np.random.RandomState(1)
    x = rng.standard_normal((3, 5, 3)).astype("float32")
    states = [rng.standard_normal((3, width)).astype("float32") for width in (4, 2)]
    mask = np.array([[1, 1, 1, 0, 0], [0, 1, 0, 1, 1], [1, 1, 1, 1, 1]], "int32")
    return x, states, mask


def assert_loop_result(result, expected):
    last, outputs, states = result
    expected_last, expected_outputs, expected_states = expected
    np.testing.assert_allclose(keras.ops.convert_to_numpy(outputs), expected_outputs, atol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(last), expected_last, atol=1e-6)
    assert len(states) == len(expected_states)
    for state, expected_state in zip(states, expected_states, strict=True):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(state), expected_state, atol=1e-6)


def tensors(*arrays):
    return [keras.ops.convert_to_tensor(a) for a in arrays]


@pytest.mark.parametrize("loop", ["rnn_loop", "public_rnn_loop"])
def test_assumption_1_rnn_loop_defaults(loop):
    """Forwards, no mask; given a mask, a masked step repeats the previous output."""
    x, (h, c), mask = loop_inputs()
    run = getattr(_keras_private, loop)
    assert_loop_result(run(loop_step, *tensors(x), tensors(h, c)), numpy_loop(x, [h, c]))
    assert_loop_result(
        run(loop_step, *tensors(x), tensors(h, c), mask=keras.ops.convert_to_tensor(mask)),
        numpy_loop(x, [h, c], mask=mask),
    )


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("zero_output_for_mask", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "int32", "bool"])
def test_assumption_1_public_loop_matches_keras_and_numpy(
    go_backwards, zero_output_for_mask, mask_kind
):
    """Several batch rows, features and states: the public loop is Keras' loop."""
    x, (h, c), mask = loop_inputs()
    mask = None if mask_kind is None else mask.astype(mask_kind)
    expected = numpy_loop(x, [h, c], go_backwards, mask, zero_output_for_mask)
    for loop in (_keras_private.public_rnn_loop, _keras_private.rnn_loop):
        result = loop(
            loop_step,
            keras.ops.convert_to_tensor(x),
            tensors(h, c),
            go_backwards=go_backwards,
            mask=None if mask is None else keras.ops.convert_to_tensor(mask),
            unroll=False,
            input_length=5,
            zero_output_for_mask=zero_output_for_mask,
            return_all_outputs=True,
        )
        assert_loop_result(result, expected)


def test_public_loop_refuses_a_step_that_drops_a_state():
    """With a mask, each new state is matched to its old one: a lost state is an error."""
    x, states, mask = loop_inputs()

    def dropping_step(inputs, states):
        output = states[0] + keras.ops.sum(inputs, axis=-1, keepdims=True)
        return output, [output]  # any number of states in, one out

    with pytest.raises(ValueError):
        _keras_private.public_rnn_loop(
            dropping_step, *tensors(x), tensors(*states), mask=keras.ops.convert_to_tensor(mask)
        )


def test_accepts_needs_every_name_as_a_parameter():
    def exact(go_backwards, mask):
        pass

    def more(step, go_backwards, mask, unroll=False):
        pass

    def fewer(go_backwards):
        pass

    def keywords(**kwargs):
        pass

    names = ("go_backwards", "mask")
    assert _keras_private._accepts(exact, names)
    assert _keras_private._accepts(more, names)
    assert not _keras_private._accepts(fewer, names)
    assert not _keras_private._accepts(keywords, names)
    # No signature: None and an int raise TypeError, a builtin class ValueError (Python 3.11).
    for unsigned in (None, 42, ZeroDivisionError):
        assert not _keras_private._accepts(unsigned, names)
    assert _keras_private._accepts(keras.layers.RNN.inner_loop, _keras_private.INNER_LOOP_ARGUMENTS)


def test_find_rnn_loop(monkeypatch):
    import keras.src.backend as backend

    assert _keras_private._find_rnn_loop() is backend.rnn

    def narrower(step_function, inputs, initial_states, go_backwards=False, mask=None):
        pass

    monkeypatch.setattr(backend, "rnn", narrower)
    assert _keras_private._find_rnn_loop() is None  # lacks unroll, input_length, ...
    monkeypatch.delattr(backend, "rnn")
    assert _keras_private._find_rnn_loop() is None


def test_find_dropout_cell(monkeypatch):
    from keras.src.layers.rnn.dropout_rnn_cell import DropoutRNNCell

    rnn_module = importlib.import_module("keras.src.layers.rnn.rnn")
    assert _keras_private._find_dropout_cell() is DropoutRNNCell
    monkeypatch.setattr(rnn_module, "DropoutRNNCell", type("Other", (), {}))
    assert _keras_private._find_dropout_cell() is None  # RNN checks another class
    monkeypatch.delattr(rnn_module, "DropoutRNNCell")
    assert _keras_private._find_dropout_cell() is None  # RNN checks no class

    # RNN checks the class, but it lacks a method, or has one that is not callable.
    methods = {name: lambda self, *args: None for name in _keras_private.DROPOUT_CELL_METHODS}
    for broken in ({**methods, "reset_dropout_mask": None}, dict(list(methods.items())[:-1])):
        fake = types.ModuleType("keras.src.layers.rnn.dropout_rnn_cell")
        fake.DropoutRNNCell = type("DropoutRNNCell", (), broken)
        monkeypatch.setitem(sys.modules, fake.__name__, fake)
        monkeypatch.setattr(rnn_module, "DropoutRNNCell", fake.DropoutRNNCell, raising=False)
        assert _keras_private._find_dropout_cell() is None
    fake.DropoutRNNCell = type("DropoutRNNCell", (), methods)
    monkeypatch.setattr(rnn_module, "DropoutRNNCell", fake.DropoutRNNCell)
    assert _keras_private._find_dropout_cell() is fake.DropoutRNNCell  # checked by what it offers

    monkeypatch.setitem(sys.modules, fake.__name__, None)  # the module cannot be imported
    assert _keras_private._find_dropout_cell() is None


def warn_as_the_module_would():
    """Stands for `_keras_private`'s module-level code, which calls `_missing`."""
    _keras_private._missing("the piece `x`", "the fallback `y`")


def test_missing_warns_and_records_the_piece(monkeypatch):
    monkeypatch.setattr(_keras_private, "MISSING", [])
    with pytest.warns(RuntimeWarning) as caught:
        warn_as_the_module_would()
    assert _keras_private.MISSING == ["the piece `x`"]
    assert len(caught) == 1
    assert str(caught[0].message) == (
        f"keras_antisym: Keras {keras.__version__} lacks the piece `x`; using the fallback `y` "
        "instead (keras_antisym is tested with Keras 3.15)."
    )
    # The warning names the code importing keras_antisym, not _keras_private itself.
    assert Path(caught[0].filename).resolve() != Path(_keras_private.__file__).resolve()

    # stacklevel 3: past `_missing` and the module code calling it, to the import. Checked
    # as the argument too: a wrapper around `_missing` (as mutation testing adds) moves it.
    calls = []
    monkeypatch.setattr(warnings, "warn", lambda *args, **kwargs: calls.append((args, kwargs)))
    warn_as_the_module_would()
    assert calls == [((str(caught[0].message), RuntimeWarning), {"stacklevel": 3})]
    assert _keras_private.MISSING == ["the piece `x`"] * 2


class FakeDevice:
    def __str__(self):
        return "CUDA:0"


def test_torch_device_on_stand_in_modules(monkeypatch):
    """Keras' torch backend's device, lower case; without it, whether PyTorch sees CUDA.

    Fake modules only: the real PyTorch must not load next to TensorFlow.
    """
    core = types.ModuleType("keras.src.backend.torch.core")
    core.get_device = FakeDevice
    monkeypatch.setitem(sys.modules, core.__name__, core)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` would fail
    assert _keras_private.torch_device() == "cuda:0"
    core.get_device = lambda: "cpu"
    assert _keras_private.torch_device() == "cpu"

    monkeypatch.setitem(sys.modules, core.__name__, None)  # no Keras torch backend
    for available, device in ((True, "cuda"), (False, "cpu")):
        torch = types.ModuleType("torch")
        torch.cuda = types.SimpleNamespace(is_available=lambda a=available: a)
        monkeypatch.setitem(sys.modules, "torch", torch)
        assert _keras_private.torch_device() == device


def test_accelerator_available_on_torch_and_without_devices(monkeypatch):
    monkeypatch.setattr(keras.distribution, "list_devices", lambda: ["cpu:0"])
    monkeypatch.setattr(_keras_private, "torch_device", lambda: "cuda:0")
    assert _keras_private.accelerator_available() is False  # not torch: the devices decide
    for missing in (AttributeError, NotImplementedError):

        def no_devices(error=missing):
            raise error

        monkeypatch.setattr(keras.distribution, "list_devices", no_devices)
        assert _keras_private.accelerator_available() is False
    monkeypatch.setattr(keras.backend, "backend", lambda: "torch")
    for device, answer in (("cuda:0", True), ("cpu", False), ("mps", True)):
        monkeypatch.setattr(_keras_private, "torch_device", lambda d=device: d)
        assert _keras_private.accelerator_available() is answer


class SeededDropoutCell(_keras_private.PublicDropoutCell):
    def __init__(self, dropout, recurrent_dropout, seed):
        self.dropout = dropout
        self.recurrent_dropout = recurrent_dropout
        self.seed_generator = keras.random.SeedGenerator(seed)


def test_public_dropout_cell_draws_a_new_seeded_mask_per_call():
    step = np.random.RandomState(2).standard_normal((64, 128)).astype("float32")
    assert SeededDropoutCell(0.0, 0.0, seed=1).get_dropout_mask(step) is None
    assert SeededDropoutCell(0.0, 0.0, seed=1).get_recurrent_dropout_mask(step) is None

    cell = SeededDropoutCell(0.25, 0.75, seed=1)
    masks = {}
    for name, rate in (("get_dropout_mask", 0.25), ("get_recurrent_dropout_mask", 0.75)):
        first, second = (keras.ops.convert_to_numpy(getattr(cell, name)(step)) for _ in range(2))
        assert first.shape == step.shape
        for mask in (first, second):
            np.testing.assert_allclose(np.unique(mask), [0.0, 1 / (1 - rate)])
            assert abs(np.mean(mask == 0) - rate) < 0.03  # 8192 draws: 6 standard deviations
        assert not np.array_equal(first, second)  # a new mask at each call
        masks[name] = first
    before = dict(vars(cell))
    assert cell.reset_dropout_mask() is None and cell.reset_recurrent_dropout_mask() is None
    assert vars(cell) == before  # nothing is cached, so nothing to reset

    # The cell's seed generator makes the masks reproducible.
    again = SeededDropoutCell(0.25, 0.75, seed=1)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(again.get_dropout_mask(step)), masks["get_dropout_mask"]
    )


def test_sequence_constants_cell_outside_an_rnn():
    """Masks for a cell called directly: no constants before the cell is built, none cached."""
    cell = AntisymmetricCell(3, recurrent_dropout=0.5, seed=0)
    h = np.ones((64, 3), "float32")
    for draw in (cell.get_recurrent_dropout_mask, cell.step_recurrent_dropout_mask):
        mask = draw(h)
        assert cell._sequence_cache is None  # not built: nothing to form
        np.testing.assert_allclose(np.unique(keras.ops.convert_to_numpy(mask)), [0.0, 2.0])
        assert tuple(mask.shape) == h.shape
        cell.reset_recurrent_dropout_mask()


def test_assumption_2_dropout_cell_protocol():
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
    assert cell.get_dropout_mask(step) is not first  # a new mask after the reset


class CountingCell(AntisymmetricCell):
    formed = 0

    def sequence_constants(self):
        CountingCell.formed += 1
        return super().sequence_constants()


def test_assumption_2_rnn_calls_the_hook_once_per_call_and_resets():
    CountingCell.formed = 0
    cell = CountingCell(3, dropout=0.5, seed=0)
    layer = keras.layers.RNN(cell)
    x = np.ones((2, 7, 4), "float32")
    layer(x, training=True)  # eager: the cell runs 7 steps
    assert CountingCell.formed == 1
    assert cell._dropout_mask is None and cell._sequence_cache is None
    layer(x)
    assert CountingCell.formed == 2


def test_sequence_scope_forms_the_constants_once_for_a_hand_written_loop():
    """A loop outside `keras.layers.RNN`: one forming for all steps, the same states as
    the RNN's loop, and per-call forming again after the block."""
    cell = CountingCell(3, epsilon=0.4, gamma=0.1)
    layer = keras.layers.RNN(cell)
    x = np.random.default_rng(0).standard_normal((2, 6, 4)).astype("float32")
    expected = keras.ops.convert_to_numpy(layer(x))
    CountingCell.formed = 0
    h = [np.zeros((2, 3), "float32")]
    with cell.sequence_scope() as scoped:
        assert scoped is cell
        for t in range(x.shape[1]):
            _, h = cell(x[:, t], h)
    assert CountingCell.formed == 1
    np.testing.assert_allclose(keras.ops.convert_to_numpy(h[0]), expected, atol=1e-6)
    cell(x[:, 0], h)
    cell(x[:, 0], h)
    assert CountingCell.formed == 3  # outside the block: at each call, never stale


def test_sequence_scope_restores_what_was_cached_and_refuses_an_unbuilt_cell():
    cell = AntisymmetricCell(3)
    with pytest.raises(ValueError, match=r"`sequence_scope\(\)` needs a built cell"):
        with cell.sequence_scope():
            pass
    cell.build((None, 2))
    cell.get_recurrent_dropout_mask(np.ones((1, 3), "float32"))  # as RNN.call does
    cached = cell._sequence_cache
    assert cached is not None
    with pytest.raises(RuntimeError):
        with cell.sequence_scope():
            assert cell._sequence_cache[0] is not cached[0]
            raise RuntimeError
    # The enclosing loop's constants, even on error (Keras re-wraps the tuple itself).
    assert cell._sequence_cache[0] is cached[0]
    cell.reset_recurrent_dropout_mask()


def test_assumption_2_direct_cell_calls_never_see_stale_constants():
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


class CountingRNN(AntisymmetricRNN):
    cell_class = CountingCell


class RecordingRNN(AntisymmetricRNN):
    """Records what `inner_loop` receives from `RNN.call`."""

    def inner_loop(self, sequences, initial_state, mask, training=False):
        self.seen = {
            "masks drawn": self.cell._dropout_mask is not None
            and self.cell._recurrent_dropout_mask is not None,
            "constants formed": self.cell._sequence_cache is not None,
            "mask": mask,
            "training": training,
            "state shapes": [tuple(s.shape) for s in initial_state],
        }
        return super().inner_loop(sequences, initial_state, mask, training)


def test_assumption_3_rnn_call_draws_the_masks_then_calls_inner_loop():
    layer = RecordingRNN(4, dropout=0.5, recurrent_dropout=0.5, seed=0, stateful=True)
    x = np.ones((2, 5, 3), "float32")
    mask = np.ones((2, 5), bool)
    layer(x, mask=mask, training=True)
    assert layer.seen["masks drawn"] and layer.seen["constants formed"]
    assert layer.seen["training"] is True and layer.seen["state shapes"] == [(2, 4)]
    np.testing.assert_array_equal(np.asarray(layer.seen["mask"]), mask)
    assert layer.cell._dropout_mask is None  # reset after the loop
    state_variable = layer.states[0]
    before = np.asarray(state_variable).copy()
    layer(x)
    assert layer.states[0] is state_variable  # assigned in place
    assert not np.allclose(np.asarray(state_variable), before)


def test_assumption_3_fused_layer_forms_the_matrix_once_per_call():
    CountingCell.formed = 0
    layer = CountingRNN(4, return_sequences=True)
    layer(np.ones((1, 9, 2), "float32"))  # eager: 9 steps
    assert CountingCell.formed == 1
    assert layer.cell._sequence_cache is None


def test_assumption_4_accelerator_available_reads_keras_default_devices(monkeypatch):
    import importlib.util

    import tensorflow as tf

    expected = bool(tf.config.list_physical_devices("GPU"))
    assert _keras_private.accelerator_available() is expected
    for devices, answer in ((["cpu:0"], False), (["gpu:0", "gpu:1"], True), (["tpu:0"], True)):
        monkeypatch.setattr(keras.distribution, "list_devices", lambda d=devices: d)
        assert _keras_private.accelerator_available() is answer
    # PyTorch's answer comes from `get_device` in this module (run on torch by
    # tests/test_backends.py). Read, not imported: importing Keras' torch backend here,
    # after TensorFlow, loads Triton (where installed), which aborts next to TensorFlow.
    backend_dir = Path(importlib.util.find_spec("keras.src.backend").origin).parent
    assert "def get_device(" in (backend_dir / "torch" / "core.py").read_text()


FALLBACK_SCRIPT = """
import json, sys, warnings
import keras
import keras.src.backend as backend
import numpy as np

# Simulate a Keras without the private pieces: no `keras.src.backend.rnn`, no
# importable DropoutRNNCell. Keras' own layers keep theirs (restored after import).
real_rnn = backend.rnn
del backend.rnn
real_module = sys.modules["keras.src.layers.rnn.dropout_rnn_cell"]
sys.modules["keras.src.layers.rnn.dropout_rnn_cell"] = None
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from keras_antisym import AntisymmetricCell, GatedAntisymmetricRNN, _keras_private
backend.rnn = real_rnn
sys.modules["keras.src.layers.rnn.dropout_rnn_cell"] = real_module

data = np.load(sys.argv[1])
x, mask, weights = data["x"], data["mask"], [data["w0"], data["w1"], data["w2"]]
out = {"warnings": [str(w.message) for w in caught], "missing": _keras_private.MISSING,
       "loop": _keras_private.rnn_loop.__name__}
fused = GatedAntisymmetricRNN(5, epsilon=0.3, gamma=0.05, go_backwards=True,
                              return_sequences=True, return_state=True)
fused(x)
fused.set_weights(weights)
outputs, state = fused(x, mask=mask)
out["fused"] = [keras.ops.convert_to_numpy(outputs).tolist(),
                keras.ops.convert_to_numpy(state).tolist()]
cell = keras.layers.RNN(AntisymmetricCell(5, epsilon=0.3, gamma=0.05), return_sequences=True)
cell(x)
cell.set_weights([data["w0"][:, :5], data["w1"], data["w2"][:5]])
out["cell"] = keras.ops.convert_to_numpy(cell(x)).tolist()
# Input dropout still draws one mask per sequence in the fused layer.
features, units = 40, 3
drop = GatedAntisymmetricRNN(units, dropout=0.5, epsilon=1.0, gamma=0.0, return_sequences=True,
                             seed=11)
ones = np.ones((1, 6, features), "float32")
drop(ones)
kernel = np.zeros((features, 2 * units), "float32")
kernel[:, units] = 2.0 ** -np.arange(features)
bias = np.zeros(2 * units, "float32")
bias[:units] = 30.0
drop.set_weights([kernel, np.zeros(units * (units - 1) // 2, "float32"), bias])
out["dropout"] = [keras.ops.convert_to_numpy(drop(ones, training=True))[0, :, 0].tolist()
                  for _ in range(2)]
json.dump(out, open(sys.argv[2], "w"))
"""


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_fallbacks_when_the_private_pieces_are_missing(backend, tmp_path):
    rng = np.random.RandomState(0)
    x = rng.standard_normal((3, 8, 4)).astype("float32")
    mask = np.ones((3, 8), bool)
    mask[0, 5:] = False
    mask[2, [1, 2]] = False
    weights = [0.5 * rng.standard_normal(s).astype("float32") for s in [(4, 10), (10,), (10,)]]
    np.savez(tmp_path / "in.npz", x=x, mask=mask, **{f"w{i}": w for i, w in enumerate(weights)})
    env = {**os.environ, "KERAS_BACKEND": backend, "CUDA_VISIBLE_DEVICES": ""}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", FALLBACK_SCRIPT, str(tmp_path / "in.npz"), str(tmp_path / "o")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=limit(300),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads((tmp_path / "o").read_text())
    assert out["loop"] == "public_rnn_loop" and len(out["missing"]) == 2
    assert len(out["warnings"]) == 2
    for warning in out["warnings"]:
        assert f"Keras {keras.__version__} lacks" in warning and "instead" in warning
    assert "keras.src.backend.rnn" in out["warnings"][0]
    assert "DropoutRNNCell" in out["warnings"][1]
    common = dict(units=5, epsilon=0.3, gamma=0.05)
    expected, state = reference.run(weights, x, gated=True, mask=mask, go_backwards=True, **common)
    np.testing.assert_allclose(out["fused"][0], expected, atol=2e-5)
    np.testing.assert_allclose(out["fused"][1], state, atol=2e-5)
    plain = [weights[0][:, :5], weights[1], weights[2][:5]]
    np.testing.assert_allclose(out["cell"], reference.run(plain, x, **common)[0], atol=2e-5)
    first, second = (np.diff(np.concatenate([[0.0], run])) for run in out["dropout"])
    assert np.allclose(first, first[0]), "mask changed within a sequence"
    assert not np.allclose(first, second), "mask not redrawn between calls"
