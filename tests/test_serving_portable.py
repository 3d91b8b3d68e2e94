"""LiteRT and ONNX exports: builtin ops only, equal to Keras whole and chunk by chunk.

Every layer type the `stream` signature walks, exported on the TensorFlow
backend to LiteRT (`ai_edge_litert`'s interpreter, no delegate) and to ONNX
(tf2onnx, in ONNX Runtime); the PyTorch backend's ONNX export runs in a
subprocess (`tests/portable_probe.py`), as TensorFlow and PyTorch cannot share
one process. The reference is the Keras model itself on the whole sequence.
"""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_antisym import AntisymmetricCell, AntisymmetricRNN, GatedAntisymmetricRNN
from serving.exports import litert, onnxgraphs
from serving.exports.export import export_model, main
from serving.exports.runtimes import (
    InputSpec,
    LiteRTModel,
    OnnxModel,
    RuntimeInputError,
    check_inputs,
)
from serving.exports.steploop import PortableExportError, step_program
from tests.limits import limit
from tests.serving_helpers import REPO_ROOT, digits

STEPS, FEATURES, CLASSES = 20, 3, 4
CHUNKS = (1, 7, STEPS)
TOLERANCE = 1e-5


def portable_model(kind, steps=None):
    """A small float32 model of `kind` on `(batch, steps, 3)` sequences, 4 logits."""
    keras.utils.set_random_seed(3)
    per_step = kind in ("stack_per_step", "per_step")
    head = keras.layers.Dense(
        CLASSES, name="per_step_classification_head" if per_step else "classification_head"
    )
    recurrent = {
        "antisymmetric": lambda: [AntisymmetricRNN(6, epsilon=0.3, gamma=0.05)],
        "gated": lambda: [GatedAntisymmetricRNN(6, epsilon=0.3, gamma=0.05)],
        "cell": lambda: [keras.layers.RNN(AntisymmetricCell(6, epsilon=0.3))],
        "simple_rnn": lambda: [keras.layers.SimpleRNN(6)],
        "gru": lambda: [keras.layers.GRU(6)],
        "lstm": lambda: [keras.layers.LSTM(6)],
        # Per-step layers between recurrent layers, and a head on every step.
        "stack_per_step": lambda: [
            keras.layers.LSTM(6, return_sequences=True),
            keras.layers.LayerNormalization(),
            keras.layers.TimeDistributed(keras.layers.Dense(5, activation="relu")),
            GatedAntisymmetricRNN(6, epsilon=0.3, return_sequences=True),
            keras.layers.Dropout(0.2),
        ],
        "per_step": lambda: [
            AntisymmetricRNN(6, epsilon=0.3, return_sequences=True),
            keras.layers.TimeDistributed(keras.layers.Dense(5, activation="relu")),
            keras.layers.Dropout(0.2),
        ],
        "stack": lambda: [
            AntisymmetricRNN(6, epsilon=0.3, return_sequences=True),
            keras.layers.Dense(5),
            keras.layers.GRU(6),
            keras.layers.Dense(8, activation="tanh"),
        ],
    }[kind]()
    model = keras.Sequential([keras.Input((steps, FEATURES)), *recurrent, head], name=kind)
    # Non-zero biases and recurrent weights everywhere, so that every term matters.
    rng = np.random.default_rng(5)
    for weight in model.weights:
        weight.assign(0.4 * rng.standard_normal(weight.shape).astype("float32"))
    return model, "per_step_classification" if per_step else "classification"


KINDS = (
    "antisymmetric", "gated", "cell", "simple_rnn", "gru", "lstm", "stack", "per_step",
    "stack_per_step",
)  # fmt: skip
# The TorchScript ONNX exporter cannot trace Keras' LayerNormalization on PyTorch.
TORCH_REFUSED = {"stack_per_step": "'layer_normalization'"}


def _sequence(batch=2, steps=STEPS):
    return np.random.default_rng(7).standard_normal((batch, steps, FEATURES)).astype("float32")


def _streamed(runtime, sequence, chunk, per_step):
    """`logits` of `stream` fed `chunk` steps at a time (per step: all chunks' outputs)."""
    states, outputs = runtime.start(sequence.shape[0]), []
    for start in range(0, sequence.shape[1], chunk):
        answer = runtime.run("stream", sequence=sequence[:, start : start + chunk], **states)
        states = {name: answer[name] for name in states}
        outputs.append(answer["logits"])
    return np.concatenate(outputs, axis=1) if per_step else outputs[-1]


def _check_equal(runtime, model, head, steps=STEPS, batch=2):
    sequence = _sequence(batch, steps)
    expected = keras.ops.convert_to_numpy(model(sequence))
    whole = runtime.run("serving_default", sequence=sequence)
    np.testing.assert_allclose(whole["logits"], expected, atol=TOLERANCE, rtol=0)
    probabilities = np.exp(expected - expected.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    np.testing.assert_allclose(whole["probabilities"], probabilities, atol=TOLERANCE, rtol=0)
    ids = "class_ids" if head == "per_step_classification" else "class_id"
    np.testing.assert_array_equal(whole[ids], expected.argmax(-1))
    for chunk in CHUNKS:
        streamed = _streamed(runtime, sequence, chunk, head == "per_step_classification")
        np.testing.assert_allclose(streamed, expected, atol=TOLERANCE, rtol=0, err_msg=f"{chunk=}")


def loop_body_operators(blob):
    """The op types inside the ONNX `Loop` bodies of an ONNX model (its step)."""
    import onnx

    found = []

    def walk(graph, inside):
        for node in graph.node:
            if inside:
                found.append(node.op_type)
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    walk(attribute.g, inside or node.op_type == "Loop")

    walk(onnx.load_from_string(blob).graph, False)
    return found


# The ops that form `W − Wᵀ − γI` from the stored triangle: once before the loop, as
# `keras.layers.RNN` forms it, never inside the step.
FORMING = {"ScatterND", "Transpose"}


def check_onnx_models(models):
    """Each signature's ONNX model: named after it, in opset `OPSET`, and a `Loop` body
    that forms no transition matrix."""
    import onnx

    for name, blob in models.items():
        proto = onnx.load_from_string(blob)
        assert proto.graph.name == name
        opsets = {entry.domain: entry.version for entry in proto.opset_import}
        assert opsets[""] == onnxgraphs.OPSET, opsets
        body = loop_body_operators(blob)
        assert "MatMul" in body and not FORMING & set(body), (name, sorted(set(body)))


@pytest.mark.parametrize("kind", KINDS)
def test_litert_export_is_builtin_only_and_equals_keras(kind, tmp_path):
    model, head = portable_model(kind)
    path = litert.write(model, tmp_path / "model.tflite", head)
    blob = open(path, "rb").read()
    operators = litert.operators(blob)
    assert "WHILE" in operators
    assert not [op for op in operators if op.startswith("Flex") or not op.isupper()], operators
    assert not {"SCATTER_ND", "TRANSPOSE"} & set(operators), operators
    runtime = LiteRTModel(path)
    assert runtime.signatures == ["serving_default", "stream"]
    stream_inputs = [spec.name for spec in runtime.specs["stream"]]
    assert stream_inputs == sorted(["sequence", *(n for n in stream_inputs if n != "sequence")])
    _check_equal(runtime, model, head)


@pytest.mark.parametrize("kind", KINDS)
def test_onnx_export_from_tensorflow_equals_keras(kind, tmp_path):
    model, head = portable_model(kind)
    models = onnxgraphs.convert(model, head)
    check_onnx_models(models)
    for name, blob in models.items():
        (tmp_path / f"{name}.onnx").write_bytes(blob)
    runtime = OnnxModel(tmp_path)
    assert runtime.signatures == ["serving_default", "stream"]
    _check_equal(runtime, model, head)


@pytest.mark.parametrize("kind", ["per_step", "stack_per_step"])
def test_a_per_step_head_s_outputs_are_written_once_not_grown(kind):
    """Growing the outputs by one step per iteration (a concatenation) copies every step
    so far at every step; LiteRT writes each into a slice of a tensor made before the
    loop, and the ONNX `Loop` hands them out as its scan output."""
    import onnx

    model, head = portable_model(kind)
    blob = litert.convert(model, head)
    assert "DYNAMIC_UPDATE_SLICE" in litert.operators(blob)
    # Concatenations of shapes (a Dense on a sequence reshapes) are int32.
    assert _tensor_types(blob, "CONCATENATION") <= {"INT32"}
    for name, blob in onnxgraphs.convert(model, head).items():
        (loop,) = [
            node for node in onnx.load_from_string(blob).graph.node if node.op_type == "Loop"
        ]
        body = loop.attribute[0].g
        # Body inputs: iteration, condition, the carried values; outputs: condition, the
        # carried values, then the scan outputs.
        scanned = len(body.output) - 1 - (len(body.input) - 2)
        assert scanned == 1, (name, [output.name for output in body.output])


def test_the_stream_signatures_take_the_savedmodels_state_names(tmp_path):
    """The same `state_*` inputs as the SavedModel's `stream`, in LiteRT and ONNX."""
    from serving.exports.signatures import stream_plan

    model, head = portable_model("stack")
    litert.write(model, tmp_path / "model.tflite", head)
    for name, blob in onnxgraphs.convert(model, head).items():
        (tmp_path / f"{name}.onnx").write_bytes(blob)
    wanted = {"sequence", *stream_plan(model).states}
    for runtime in (LiteRTModel(tmp_path / "model.tflite"), OnnxModel(tmp_path)):
        assert {spec.name for spec in runtime.specs["stream"]} == wanted
        answer = runtime.run("stream", sequence=_sequence(), **runtime.start(2))
        assert wanted - {"sequence"} <= set(answer)
    assert len(wanted) == 1 + 1 + 1  # AntisymmetricRNN h, GRU h


def test_a_fixed_length_model_keeps_its_length_in_serving_default(tmp_path):
    model, head = portable_model("gated", steps=STEPS)
    litert.write(model, tmp_path / "model.tflite", head)
    runtime = LiteRTModel(tmp_path / "model.tflite")
    assert runtime.specs["serving_default"][0].shape == (None, STEPS, FEATURES)
    assert runtime.specs["stream"][0].shape == (None, None, FEATURES)  # any chunk
    _check_equal(runtime, model, head)
    with pytest.raises(RuntimeInputError, match=r"'sequence' .* must have shape \(any, 20, 3\)"):
        runtime.run("serving_default", sequence=_sequence(steps=STEPS + 1))


def test_the_pytorch_backend_exports_onnx_equal_to_keras(tmp_path):
    """`tests/portable_probe.py` on KERAS_BACKEND=torch: each kind's whole-sequence and
    chunked answers from ONNX Runtime against that backend's own Keras model."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.portable_probe", str(tmp_path)],
        cwd=REPO_ROOT,
        env=dict(os.environ, KERAS_BACKEND="torch"),
        capture_output=True,
        text=True,
        timeout=limit(300),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    checked = [line for line in lines if line.startswith("checked ")]
    assert sorted(checked) == sorted(f"checked {k}" for k in KINDS if k not in TORCH_REFUSED)
    refused = [line for line in lines if line.startswith("refused ")]
    assert len(refused) == len(TORCH_REFUSED)
    for kind, layer in TORCH_REFUSED.items():
        assert (
            f"refused {kind}: layer {layer} (LayerNormalization) cannot be traced by "
            "PyTorch's ONNX exporter (its shape is read at run time): export it from the "
            "TensorFlow backend (--backend tensorflow)"
        ) in refused
    assert f"fixed length {STEPS} kept" in lines


@pytest.mark.parametrize("layer", ["antisymmetric", "gated", "cell"])
def test_keras_own_onnx_export_of_these_layers_runs_in_onnx_runtime(layer, tmp_path):
    """`model.export(format="onnx")`: the whole-sequence graph, no states."""
    import onnxruntime

    model, _ = portable_model(layer, steps=STEPS)
    sequence = _sequence()
    expected = keras.ops.convert_to_numpy(model(sequence))
    model.export(str(tmp_path / "model.onnx"), format="onnx", verbose=False)
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    (got,) = session.run(None, {session.get_inputs()[0].name: sequence})
    np.testing.assert_allclose(got, expected, atol=1e-5)


# Quantization: documented bounds (docs/devices.md) on a small fixed set.


@pytest.fixture(scope="module")
def digits_model():
    """A gated model fit on digits, its recurrent matrix large enough (48² >= 1,024
    elements) for dynamic-range quantization."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64, 1)),
            GatedAntisymmetricRNN(48, epsilon=0.1, gamma=0.01),
            keras.layers.Dense(10, name="classification_head"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x, y = digits()
    model.fit(x[:1200], y[:1200], batch_size=64, epochs=3, verbose=0)
    return model


@pytest.mark.parametrize("quantize", litert.QUANTIZATIONS)
def test_quantized_litert_models_stay_within_their_bounds(quantize, digits_model, tmp_path):
    """float16 and dynamic-int8 agree with the float32 model's classes on held-out
    digits (accuracy within 1 point), and the logits stay close."""
    x, y = digits()
    held_out, labels = x[-300:], y[-300:]
    expected = keras.ops.convert_to_numpy(digits_model(held_out))
    plain = litert.convert(digits_model, "classification")
    small = litert.convert(digits_model, "classification", quantize=quantize)
    path = tmp_path / "model.tflite"
    path.write_bytes(small)
    answer = LiteRTModel(path).run("serving_default", sequence=held_out)
    float_accuracy = (expected.argmax(-1) == labels).mean()
    accuracy = (answer["class_id"] == labels).mean()
    assert abs(accuracy - float_accuracy) <= 0.01
    assert float_accuracy > 0.3  # a model that learned something, so that the bound says something
    assert np.abs(answer["logits"] - expected).max() < 0.1
    # At least a byte saved per element of the recurrent matrix, in the asked-for type.
    assert len(plain) - len(small) >= 48 * 48
    assert not {"FLOAT16", "INT8"} & _tensor_types(plain)
    assert _tensor_types(small) - _tensor_types(plain) == {QUANTIZED_TYPES[quantize]}


QUANTIZED_TYPES = {"float16": "FLOAT16", "dynamic-int8": "INT8"}


def _tensor_types(blob, operator=None):
    """The types of every tensor in every subgraph of a `.tflite` (the loop body's weights
    included), as LiteRT's schema names them; with `operator`, of its outputs only."""
    from ai_edge_litert import schema_py_generated as schema

    names = {value: name for name, value in vars(schema.TensorType).items() if name.isupper()}
    operators = iter(litert.operators(blob))  # in the order the walk below takes
    model = schema.Model.GetRootAs(blob, 0)
    found = set()
    for g in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(g)
        if operator is None:
            tensors = range(subgraph.TensorsLength())
        else:
            tensors = [
                op.Outputs(i)
                for op in map(subgraph.Operators, range(subgraph.OperatorsLength()))
                if next(operators) == operator
                for i in range(op.OutputsLength())
            ]
        found |= {names[subgraph.Tensors(t).Type()] for t in tensors}
    return found


def test_dynamic_int8_keeps_the_state_float32(tmp_path):
    """Only the weights are int8: no QUANTIZE op on the path of the state."""
    model = keras.Sequential(
        [keras.Input((None, FEATURES)), GatedAntisymmetricRNN(48), keras.layers.Dense(4)]
    )
    path = litert.write(model, tmp_path / "model.tflite", "classification", quantize="dynamic-int8")
    with open(path, "rb") as file:
        blob = file.read()
    assert "INT8" in _tensor_types(blob)
    operators = litert.operators(blob)
    assert "QUANTIZE" not in operators and "DEQUANTIZE" not in operators
    runtime = LiteRTModel(path)
    sequence = _sequence()
    expected = keras.ops.convert_to_numpy(model(sequence))
    np.testing.assert_allclose(
        runtime.run("serving_default", sequence=sequence)["logits"], expected, atol=0.05
    )
    assert len(litert.convert(model, "classification")) - len(blob) >= 48 * 48 * 2
    details = litert.signature_details(blob)
    assert sorted(details) == ["serving_default", "stream"]  # streams unless told not to
    sequence_input, state_input = sorted(details["stream"]["inputs"])
    assert sequence_input == "sequence" and state_input.startswith("state_gated_antisymmetric_rnn")
    with pytest.raises(ValueError, match=r"argument `quantize`, expected None or one of float16"):
        litert.convert(model, "classification", quantize="int4")


# Bad input: one line, nothing half-written.


def _one_line_error(capsys, argv, status=2):
    assert main(argv) == status
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@keras.saving.register_keras_serializable(package="tests")
class Doubling(keras.layers.Layer):
    """Per-step, but unknown to the exports: the step program cannot include it."""

    def call(self, inputs):
        return 2.0 * inputs


@pytest.mark.parametrize("kind", ["doubling", "bidirectional"])
def test_a_model_without_a_builtin_lowering_is_refused_with_nothing_on_disk(kind, tmp_path, capsys):
    """A layer the step program cannot take, before a recurrent layer whose loop in
    Keras' own graph needs TensorList ops; a Bidirectional layer reads backwards."""
    middle = {
        "doubling": [Doubling(name="doubling"), keras.layers.GRU(4)],
        "bidirectional": [keras.layers.Bidirectional(keras.layers.GRU(4), name="bidirectional")],
    }[kind]
    model = keras.Sequential(
        [
            keras.Input((STEPS, FEATURES)),
            *middle,
            keras.layers.Dense(CLASSES, name="classification_head"),
        ]
    )
    path = tmp_path / "unknown.keras"
    model.save(path)
    base = tmp_path / "models"
    base.mkdir()
    argv = ["--model", str(path), "--export-base", str(base), "--version", "1"]
    err = _one_line_error(capsys, [*argv, "--format", "litert"])
    assert "LiteRT has no builtins for (TensorList" in err and f"layer '{kind}'" in err
    assert os.listdir(base) == []  # no version, no staging folder, no partial file


def _unstreamable_model():
    """A convolution over time: it mixes steps, so there is no `stream` signature."""
    middle = [keras.layers.Conv1D(4, 3, name="conv"), keras.layers.GlobalAveragePooling1D()]
    return keras.Sequential([keras.Input((STEPS, FEATURES)), *middle, keras.layers.Dense(CLASSES)])


def test_a_model_that_cannot_stream_gets_serving_default_and_a_note(tmp_path, capsys):
    from serving.exports.tfloop import UpdatedSlices, graphs

    model = _unstreamable_model()
    asked = graphs(model, "classification", UpdatedSlices())
    assert list(asked.functions) == ["serving_default"] and "'conv'" in asked.stream_missing
    unasked = graphs(model, "classification", UpdatedSlices(), stream=False)
    assert list(unasked.functions) == ["serving_default"] and unasked.stream_missing is None
    path = tmp_path / "conv.keras"
    model.save(path)
    argv = ["--model", str(path), "--export-base", str(tmp_path / "m"), "--version", "1"]
    assert main([*argv, "--format", "litert"]) == 0
    assert "no `stream` signature" in capsys.readouterr().err
    file = tmp_path / "m" / "1" / "model.tflite"
    assert all(op.isupper() for op in litert.operators(file.read_bytes()))
    runtime = LiteRTModel(file)
    assert runtime.signatures == ["serving_default"]
    sequence = _sequence()
    np.testing.assert_allclose(
        runtime.run("serving_default", sequence=sequence)["logits"],
        keras.ops.convert_to_numpy(model(sequence)),
        atol=TOLERANCE,
    )
    with pytest.raises(RuntimeInputError, match="no 'stream' signature"):
        runtime.start()
    with pytest.raises(RuntimeInputError, match="no signature 'stream'; this export has"):
        runtime.run("stream", sequence=sequence)
    onnx_argv = [*argv[:3], str(tmp_path / "o"), *argv[4:], "--format", "onnx"]
    assert main(onnx_argv) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "`stream`" in line]
    assert len(notes) == 1 and "layer 'conv'" in notes[0], notes


def test_a_mixed_precision_model_is_refused_naming_the_layer():
    model = keras.Sequential(
        [
            keras.Input((None, FEATURES)),
            GatedAntisymmetricRNN(4, dtype="mixed_bfloat16", name="recurrent"),
            keras.layers.Dense(CLASSES),
        ]
    )
    # A float32 RNN layer around a mixed-precision cell: the cell is named.
    wrapped = keras.Sequential(
        [
            keras.Input((None, FEATURES)),
            keras.layers.RNN(AntisymmetricCell(4, dtype="mixed_float16", name="cell")),
            keras.layers.Dense(CLASSES),
        ]
    )
    for convert, runtime in ((litert.convert, "LiteRT"), (onnxgraphs.convert, "ONNX")):
        with pytest.raises(
            PortableExportError,
            match=rf"'recurrent' .* 'mixed_bfloat16': the {runtime} export takes float32 layers; "
            r"save a float32 copy of the model \(its weights with a float32 policy\) and export "
            r"that, with `--quantize float16`",
        ):
            convert(model, "classification")
        with pytest.raises(PortableExportError, match=r"^layer 'cell' \(AntisymmetricCell\) "):
            convert(wrapped, "classification")


def test_an_unbuilt_model_is_refused_naming_its_last_recurrent_layer():
    from serving.exports.signatures import StreamPlanError

    layers = [AntisymmetricRNN(4, return_sequences=True, name=name) for name in "ab"]
    model = keras.Sequential([*layers, AntisymmetricRNN(4, name="c"), keras.layers.Dense(CLASSES)])
    with pytest.raises(StreamPlanError) as refused:
        step_program(model)
    assert str(refused.value) == "layer 'c' has no known output size (build the model first)"


def _one_step_inputs(program, state):
    """One time step of two sequences of 2 features, and every state filled with `state`."""
    x = np.linspace(-1, 1, 4, dtype="float32").reshape(2, 1, 2)
    return x, [np.full((2, units), state, "float32") for units in program.states.values()]


def test_a_step_is_float32_whatever_keras_default_float_type():
    """The exported loop's states and outputs stay float32 under `floatx` float64 too."""
    model = keras.Sequential(
        [keras.Input((None, 2)), AntisymmetricRNN(3, return_sequences=True),
         AntisymmetricRNN(4), keras.layers.Dense(CLASSES)]
    )  # fmt: skip
    program = step_program(model)
    x, states = _one_step_inputs(program, state=0.1)
    with program.sequence():
        expected = program.step(x, states)
    previous = keras.config.floatx()
    keras.config.set_floatx("float64")
    try:
        with program.sequence():
            output, finals = program.step(x, states)
    finally:
        keras.config.set_floatx(previous)
    for got, want in zip([output, *finals], [expected[0], *expected[1]], strict=True):
        assert keras.backend.standardize_dtype(got.dtype) == "float32"
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


def test_a_step_runs_a_time_distributed_dropout_as_at_inference():
    model = keras.Sequential([
        keras.Input((None, 2)), AntisymmetricRNN(3, return_sequences=True),
        keras.layers.TimeDistributed(keras.layers.Dropout(0.9)), keras.layers.Dense(CLASSES),
    ])  # fmt: skip
    program = step_program(model)
    x, states = _one_step_inputs(program, state=0.0)
    with program.sequence():
        output, _ = program.step(x, states)
    expected = keras.ops.convert_to_numpy(model(x))[:, 0]
    np.testing.assert_allclose(np.asarray(output), expected, rtol=1e-5, atol=1e-6)


def test_the_graphs_of_a_model_that_streams_give_no_reason_for_a_missing_stream():
    from serving.exports.tfloop import UpdatedSlices, graphs

    model = keras.Sequential(
        [keras.Input((STEPS, FEATURES)), AntisymmetricRNN(4), keras.layers.Dense(CLASSES)]
    )
    made = graphs(model, "classification", UpdatedSlices())
    assert sorted(made.functions) == ["serving_default", "stream"]
    assert made.stream_missing is None


@pytest.mark.parametrize(
    "message, missing",
    [
        ("converter failed\nat line 2\n", "converter failed"),
        ("x" * 300, "x" * 200),
        ("", ""),
        ("tf.ListReserve, 'tf.ListReserve' tf.Where2 tf.x", "ListReserve, Where2"),
    ],
)
def test_a_failed_conversion_names_what_the_converter_said(message, missing, monkeypatch):
    """Without the ops' names the converter's first line (cut at 200 characters) stands in
    for them; the model's reason not to stream, when it has one, follows."""
    _converter_fails_with(message, monkeypatch)
    with pytest.raises(PortableExportError) as refused:
        litert.convert(*portable_model("antisymmetric"))
    assert str(refused.value) == (
        f"the model's graph needs TensorFlow ops LiteRT has no builtins for ({missing}): "
        "export it as a SavedModel (the default --format) instead"
    )
    # A model that cannot stream: why, between the ops and the advice.
    with pytest.raises(PortableExportError) as refused:
        litert.convert(_unstreamable_model(), "classification")
    assert str(refused.value).endswith(
        f"({missing}); layer 'conv' (Conv1D) is not known to treat each time step alone: "
        "export it as a SavedModel (the default --format) instead"
    )


def test_operators_reads_every_subgraph_s_codes_as_the_schema_writes_them():
    """A `.tflite` built with the schema's own classes: an old file's code in the
    deprecated field, a code above 127 (whose deprecated field holds the placeholder 127),
    a custom op by its name, and a code this schema does not know, by its number."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    def code(builtin, deprecated=127, custom=None):
        entry = schema.OperatorCodeT()
        entry.builtinCode = builtin
        entry.deprecatedBuiltinCode = deprecated
        entry.customCode = custom
        return entry

    def subgraph(*indices):
        graph = schema.SubGraphT()
        graph.operators = []
        for index in indices:
            operator = schema.OperatorT()
            operator.opcodeIndex = index
            graph.operators.append(operator)
        return graph

    model = schema.ModelT()
    model.version = 3
    model.operatorCodes = [
        code(0, deprecated=schema.BuiltinOperator.ADD),
        code(schema.BuiltinOperator.CUMSUM),
        code(schema.BuiltinOperator.CUSTOM, schema.BuiltinOperator.CUSTOM, "MyOp"),
        code(9999),
    ]
    model.subgraphs = [subgraph(1, 0, 2), subgraph(3, 0)]
    builder = flatbuffers.Builder(0)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    assert litert.operators(bytes(builder.Output())) == ["CUMSUM", "ADD", "MyOp", "9999", "ADD"]


def test_a_litert_export_asked_for_no_stream_has_serving_default_alone():
    model, head = portable_model("antisymmetric")
    notes = []
    blob = litert.convert(model, head, stream=False, notes=notes)
    assert list(litert.signature_details(blob)) == ["serving_default"] and notes == []
    assert sorted(litert.signature_details(litert.convert(model, head))) == [
        "serving_default",
        "stream",
    ]


def _converter_fails_with(message, monkeypatch):
    """LiteRT's converter, as set up by the export, raising `message` when it converts."""
    import tensorflow as tf

    real = tf.lite.TFLiteConverter.from_saved_model

    def failing(*args, **kwargs):
        converter = real(*args, **kwargs)

        def convert():
            raise RuntimeError(message)

        converter.convert = convert
        return converter

    monkeypatch.setattr(tf.lite.TFLiteConverter, "from_saved_model", staticmethod(failing))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--format", "onnx", "--quantize", "float16"], "`quantize`"),
        (["--format", "savedmodel", "--quantize", "dynamic-int8"], "`quantize`"),
        (["--format", "litert", "--backend", "torch"], "`backend`"),
    ],
)
def test_the_cli_refuses_options_that_do_not_fit_the_format(flags, message, tmp_path, capsys):
    argv = ["--model", str(tmp_path / "none.keras"), "--export-base", str(tmp_path), "--version"]
    err = _one_line_error(capsys, [*argv, "1", *flags])
    assert message in err


def test_export_model_writes_each_format_into_its_version_folder(tmp_path):
    model, _ = portable_model("gated")
    notes = []
    litert_folder = export_model(model, tmp_path, 1, format="litert", quantize="float16")
    onnx_folder = export_model(model, tmp_path, 2, format="onnx", notes=notes)
    assert sorted(os.listdir(litert_folder)) == ["model.tflite"]
    with open(os.path.join(litert_folder, "model.tflite"), "rb") as file:
        assert "FLOAT16" in _tensor_types(file.read())  # quantized as asked
    assert sorted(os.listdir(onnx_folder)) == ["serving_default.onnx", "stream.onnx"]
    assert sorted(os.listdir(tmp_path)) == ["1", "2"] and notes == []


# Inference-time input checks, the same for both runtimes.


@pytest.fixture(scope="module")
def runtime_folder(tmp_path_factory):
    """A folder with an LSTM's `model.tflite` and its ONNX files."""
    folder = tmp_path_factory.mktemp("runtimes")
    model = keras.Sequential(
        [keras.Input((None, FEATURES)), keras.layers.LSTM(6, name="lstm"), keras.layers.Dense(4)]
    )
    litert.write(model, folder / "model.tflite", "classification")
    for name, blob in onnxgraphs.convert(model, "classification").items():
        (folder / f"{name}.onnx").write_bytes(blob)
    return folder


@pytest.fixture(scope="module")
def runtimes(runtime_folder):
    return LiteRTModel(runtime_folder / "model.tflite"), OnnxModel(runtime_folder)


def test_the_threads_and_provider_asked_for_reach_each_runtime(runtime_folder, monkeypatch):
    import ai_edge_litert.interpreter
    import onnxruntime

    real_interpreter = ai_edge_litert.interpreter.Interpreter
    real_session = onnxruntime.InferenceSession
    asked = []

    def interpreter(**kwargs):
        asked.append(kwargs.get("num_threads"))
        return real_interpreter(**kwargs)

    def session(*args, **kwargs):
        asked.append(kwargs.get("providers"))
        return real_session(*args, **kwargs)

    monkeypatch.setattr(ai_edge_litert.interpreter, "Interpreter", interpreter)
    monkeypatch.setattr(onnxruntime, "InferenceSession", session)
    LiteRTModel(runtime_folder / "model.tflite", threads=3)
    LiteRTModel(runtime_folder / "model.tflite")
    assert asked == [3, None]
    # The CPU provider, also where a GPU build of ONNX Runtime would choose another.
    for threads, expected in ((3, 3), (None, 0)):  # 0: ONNX Runtime's own choice
        sessions = OnnxModel(runtime_folder, threads=threads).sessions.values()
        assert [s.get_session_options().intra_op_num_threads for s in sessions] == [expected] * 2
    assert asked[2:] == [["CPUExecutionProvider"]] * 4


def test_a_runtime_starts_one_sequence_unless_asked_for_more(runtimes):
    for runtime in runtimes:
        assert {name: state.shape for name, state in runtime.start().items()} == {
            "state_lstm_0": (1, 6),
            "state_lstm_1": (1, 6),
        }
        assert all(not state.any() for state in runtime.start(3).values())
        assert runtime.start(3)["state_lstm_1"].shape == (3, 6)


def test_a_folder_without_onnx_files_is_refused_naming_it(tmp_path):
    (tmp_path / "model.tflite").write_bytes(b"")
    with pytest.raises(FileNotFoundError) as refused:
        OnnxModel(tmp_path)
    assert str(refused.value) == f"no .onnx files in {str(tmp_path)!r}"


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda i: {**i, "sequence": i["sequence"][..., :2]}, r"'sequence' .*\(any, any, 3\), got \(2, 4, 2\)"),  # noqa: E501
        (lambda i: {**i, "state_lstm_0": i["state_lstm_0"][:, :5]}, r"'state_lstm_0' .*\(any, 6\), got \(2, 5\)"),  # noqa: E501
        (lambda i: {**i, "state_lstm_1": i["state_lstm_1"][0]}, r"'state_lstm_1' .*got \(6,\)"),  # noqa: E501
        (lambda i: {k: v for k, v in i.items() if k != "state_lstm_1"}, r"needs input 'state_lstm_1' .*zeros"),  # noqa: E501
        (lambda i: {k: v for k, v in i.items() if k != "sequence"}, r"needs input 'sequence' of shape \(any, any, 3\)$"),  # noqa: E501
        (lambda i: {**i, "sequence": i["sequence"][:, :0]}, r"no time steps: send a chunk of at least one step$"),  # noqa: E501
        (lambda i: {**i, "state_lstm_0": np.zeros((3, 6))}, r"'stream' have different batch sizes: sequence 2, state_lstm_0 3, state_lstm_1 2$"),  # noqa: E501
        (lambda i: {**i, "extra": 1}, r"no input 'extra'"),  # noqa: E501
    ],
)  # fmt: skip
def test_a_wrong_chunk_or_state_is_one_line_naming_the_input(runtimes, change, message):
    good = {"sequence": _sequence(steps=4), **runtimes[0].start(2)}
    for runtime in runtimes:
        runtime.run("stream", **good)
        with pytest.raises(RuntimeInputError, match=message) as raised:
            runtime.run("stream", **change(good))
        assert "\n" not in str(raised.value)
        runtime.run("stream", **good)  # the runtime still answers


def test_an_unknown_signature_names_the_ones_there(runtimes):
    for runtime in runtimes:
        with pytest.raises(
            RuntimeInputError, match="no signature 'padded'; .*serving_default, stream"
        ):
            runtime.run("padded", sequence=_sequence())


def test_check_inputs_accepts_nested_lists():
    specs = [InputSpec("sequence", (None, None, 2))]
    arrays = check_inputs("stream", specs, {"sequence": [[[1, 2], [3, 4]]]})
    assert arrays["sequence"].dtype == np.float32 and arrays["sequence"].shape == (1, 2, 2)
