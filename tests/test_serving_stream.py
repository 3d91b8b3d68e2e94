"""The `stream` and `padded` signatures: chunked equals whole, padding masked, served, streamed."""

import functools
import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_antisym import AntisymmetricCell, AntisymmetricRNN, GatedAntisymmetricRNN
from serving.client import NoStreamSignatureError, ServingClient, stream
from serving.exports.export import export_model
from tests.limits import limit
from tests.serving_helpers import (
    NO_KERAS_PRELUDE,
    REPO_ROOT,
    ThreadServer,
    http_call,
    work_dir,
)

pytestmark = pytest.mark.timeout(300)

T, M, UNITS = 14, 2, 5
HEAD_NAMES = {
    "classification": ["class_id", "logits", "probabilities"],
    "regression": ["value"],
    "per_step_classification": ["class_ids", "logits", "probabilities"],
}


def _recurrent(kind, **kwargs):
    return {
        "antisymmetric": lambda: AntisymmetricRNN(UNITS, epsilon=0.2, gamma=0.01, **kwargs),
        "gated": lambda: GatedAntisymmetricRNN(UNITS, epsilon=0.2, **kwargs),
        "rnn_cell": lambda: keras.layers.RNN(AntisymmetricCell(UNITS, epsilon=0.2), **kwargs),
        "simple_rnn": lambda: keras.layers.SimpleRNN(UNITS, **kwargs),
        "gru": lambda: keras.layers.GRU(UNITS, **kwargs),
        # Named: the state inputs carry the layer's name, which would otherwise depend
        # on how many LSTMs this process made before.
        "lstm": lambda: keras.layers.LSTM(UNITS, name="lstm", **kwargs),
    }[kind]()


# kind -> (recurrent layers, head): every layer type and every head the export knows.
CASES = {
    "antisymmetric": (["antisymmetric"], "classification"),
    "gated": (["gated"], "regression"),
    "rnn_cell": (["rnn_cell"], "classification"),
    "simple_rnn": (["simple_rnn"], "per_step_classification"),
    "gru": (["gru"], "classification"),
    "lstm": (["lstm"], "regression"),
    "stacked": (["antisymmetric", "lstm", "gated"], "classification"),
    "stacked_per_step": (["gated", "antisymmetric"], "per_step_classification"),
}


def _model(kind, steps=T):
    """A seeded model of `kind`; stacked ones have per-step layers between the RNNs."""
    keras.utils.set_random_seed(7)
    kinds, head = CASES[kind]
    per_step = head == "per_step_classification"
    layers = [keras.Input((steps, M))]
    for index, name in enumerate(kinds):
        last = index == len(kinds) - 1
        layers.append(_recurrent(name, return_sequences=per_step or not last))
        if not last:  # per-step layers between recurrent ones
            layers += [
                keras.layers.Dropout(0.3),
                keras.layers.Dense(6, activation="tanh"),
                keras.layers.LayerNormalization(),
                # Keras' TimeDistributed loses steps in a graph of unknown T (its
                # vectorized_map); the stream signature applies it itself.
                keras.layers.TimeDistributed(keras.layers.Dense(4))
                if steps
                else keras.layers.Dense(4),
                # Inference inside TimeDistributed too: dropout would show in any answer.
                keras.layers.TimeDistributed(keras.layers.Dropout(0.5))
                if steps
                else keras.layers.Dropout(0.5),
            ]
    width = 1 if head == "regression" else 3
    layers.append(keras.layers.Dense(width, name=f"{head}_head"))
    model = keras.Sequential(layers, name=kind)
    for weight in model.weights:  # away from zero biases: a wrong state would show
        weight.assign(weight + np.random.default_rng(1).normal(0, 0.1, weight.shape))
    return model


@functools.cache
def _exported(kind, variable_length=False):
    """`(model, signatures)` of the model of `kind`, exported and loaded back."""
    import tensorflow as tf

    model = _model(kind, None if variable_length else T)
    base = work_dir("stream", f"{kind}-{variable_length}")
    notes = []
    path = export_model(model, base, 1, variable_length=variable_length, notes=notes)
    assert notes == []
    loaded = tf.saved_model.load(path)
    _exported.keep = getattr(_exported, "keep", []) + [loaded]  # signatures need it alive
    return model, dict(loaded.signatures), path


def _numpy(outputs):
    return {name: value.numpy() for name, value in outputs.items()}


def _run_stream(signature, x, chunk):
    """The stream signature fed `x` chunk by chunk from zero states: per-chunk answers."""
    import tensorflow as tf

    inputs = signature.structured_input_signature[1]
    states = {
        name: tf.zeros([len(x), spec.shape[1]])
        for name, spec in inputs.items()
        if name != "sequence"
    }
    answers = []
    for start in range(0, x.shape[1], chunk):
        out = signature(sequence=tf.constant(x[:, start : start + chunk]), **states)
        states = {name: out[name] for name in states}
        answers.append(_numpy({k: v for k, v in out.items() if k not in states}))
    return answers


def _assert_close(got, expected, names):
    assert sorted(got) == names
    for name in names:
        if name in ("class_id", "class_ids"):
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
        else:
            np.testing.assert_allclose(got[name], expected[name], atol=1e-5, rtol=0, err_msg=name)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_chunked_equals_whole_and_padded_equals_unpadded(kind):
    import tensorflow as tf

    _, signatures, _ = _exported(kind)
    assert sorted(signatures) == ["padded", "serving_default", "stream"]
    head = CASES[kind][1]
    names = HEAD_NAMES[head]
    x = np.random.default_rng(0).normal(size=(3, T, M)).astype("float32")
    whole = _numpy(signatures["serving_default"](sequence=tf.constant(x)))
    for chunk in (1, 7, T):
        answers = _run_stream(signatures["stream"], x, chunk)
        if head == "per_step_classification":  # one answer per step of each chunk
            got = {name: np.concatenate([a[name] for a in answers], 1) for name in names}
        else:
            got = answers[-1]
        _assert_close(got, whole, names)
    # Padded (fixed T): each example as the stream signature answers its unpadded steps.
    lengths = np.array([T, 1, 9], "int32")
    garbage = x.copy()
    for i, length in enumerate(lengths):
        garbage[i, length:] = np.random.default_rng(i).uniform(-1e4, 1e4, (T - length, M))
    padded = _numpy(signatures["padded"](sequence=tf.constant(garbage), length=lengths))
    for i, length in enumerate(lengths):
        (alone,) = _run_stream(signatures["stream"], x[i : i + 1, :length], T)
        got = {name: value[i : i + 1] for name, value in padded.items()}
        if head == "per_step_classification":
            got, rest = (
                {k: v[:, :length] for k, v in got.items()},
                {k: v[:, length:] for k, v in got.items()},
            )
            assert (rest["class_ids"] == -1).all()
            assert not rest["probabilities"].any() and not rest["logits"].any()
        _assert_close(got, alone, names)


@pytest.mark.parametrize("kind", ["stacked_per_step", "lstm"])
def test_padded_equals_unpadded_with_random_lengths(kind):
    """`--variable-length` exports: `padded` with garbage against `serving_default` unpadded."""
    import tensorflow as tf

    _, signatures, _ = _exported(kind, variable_length=True)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, 20, M)).astype("float32")
    lengths = rng.integers(1, 21, size=6).astype("int32")
    garbage = x.copy()
    for i, length in enumerate(lengths):
        garbage[i, length:] = rng.choice([0.0, 1e3, -7.5]) + rng.normal(size=(20 - length, M))
    padded = _numpy(signatures["padded"](sequence=tf.constant(garbage), length=lengths))
    for i, length in enumerate(lengths):
        alone = _numpy(signatures["serving_default"](sequence=tf.constant(x[i : i + 1, :length])))
        got = {name: value[i : i + 1] for name, value in padded.items()}
        if CASES[kind][1] == "per_step_classification":
            got = {k: v[:, :length] for k, v in got.items()}
        _assert_close(got, alone, sorted(alone))
    with pytest.raises(tf.errors.InvalidArgumentError, match="length"):
        signatures["padded"](sequence=tf.constant(x), length=np.array([0, 1, 1, 1, 1, 21], "int32"))


# Loads the export where Keras cannot be imported and runs its three signatures.
_THREE_WITHOUT_KERAS = """
import json, sys
import numpy as np
import tensorflow as tf
try:
    import keras  # noqa
    sys.exit("keras is importable: the blocker does not work")
except ImportError:
    pass
loaded = tf.saved_model.load(sys.argv[1])
x = np.load(sys.argv[2])
sigs = loaded.signatures
inputs = sigs["stream"].structured_input_signature[1]
states = {n: tf.zeros([len(x), s.shape[1]]) for n, s in inputs.items() if n != "sequence"}
for start in range(0, x.shape[1], 5):
    out = sigs["stream"](sequence=tf.constant(x[:, start:start + 5]), **states)
    states = {n: out[n] for n in states}
padded = sigs["padded"](sequence=tf.constant(x), length=tf.fill([len(x)], x.shape[1]))
whole = sigs["serving_default"](sequence=tf.constant(x))
json.dump({"stream": out["logits"].numpy().tolist(), "padded": padded["logits"].numpy().tolist(),
           "whole": whole["logits"].numpy().tolist(), "states": sorted(states)}, sys.stdout)
assert not [m for m in sys.modules if m.split(".")[0] in ("keras", "keras_antisym")]
"""


def test_three_signatures_load_and_run_without_keras():
    model, _, path = _exported("stacked")
    x = np.random.default_rng(5).normal(size=(2, T, M)).astype("float32")
    x_path = work_dir("stream-x.npy")
    np.save(x_path, x)
    done = subprocess.run(
        [sys.executable, "-c", NO_KERAS_PRELUDE + _THREE_WITHOUT_KERAS, path, x_path],
        cwd=REPO_ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True, text=True, timeout=limit(120),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    expected = model.predict(x, verbose=0)
    for name in ("stream", "padded", "whole"):
        np.testing.assert_allclose(answer[name], expected, atol=1e-5, rtol=0, err_msg=name)
    patterns = [r"state_antisymmetric_rnn\w*_0", r"state_gated_antisymmetric_rnn\w*_0",
                r"state_lstm\w*_0", r"state_lstm\w*_1"]  # fmt: skip
    assert len(answer["states"]) == 4
    for pattern in patterns:
        assert any(re.fullmatch(pattern, name) for name in answer["states"]), answer["states"]


@pytest.fixture(scope="module")
def lstm_server():
    """The LSTM export (two states) served in this process."""
    _, signatures, path = _exported("lstm")
    server = ThreadServer(os.path.dirname(path), "lstm")
    try:
        yield server, signatures
    finally:
        server.stop()


def test_metadata_lists_the_three_signatures(lstm_server):
    server, _ = lstm_server
    status, body = http_call(f"{server.url}/v1/models/lstm/metadata")
    assert status == 200
    signatures = body["metadata"]["signature_def"]["signature_def"]

    def shapes(part, name):
        return {
            key: [int(d["size"]) for d in value["tensor_shape"]["dim"]]
            for key, value in signatures[name][part].items()
        }

    assert {"serving_default", "stream", "padded"} <= set(signatures)
    assert shapes("inputs", "stream") == {
        "sequence": [-1, -1, M], "state_lstm_0": [-1, UNITS], "state_lstm_1": [-1, UNITS]
    }  # fmt: skip
    assert shapes("outputs", "stream") == {
        "value": [-1], "state_lstm_0": [-1, UNITS], "state_lstm_1": [-1, UNITS]
    }  # fmt: skip
    assert shapes("inputs", "padded") == {"sequence": [-1, T, M], "length": [-1]}
    assert signatures["padded"]["inputs"]["length"]["dtype"] == "DT_INT32"


def test_server_answers_stream_in_both_formats_and_refuses_bad_states(lstm_server):
    import tensorflow as tf

    server, signatures = lstm_server
    url = f"{server.url}/v1/models/lstm:predict"
    x = np.random.default_rng(2).normal(size=(2, 4, M)).astype("float32")
    h = np.random.default_rng(3).normal(size=(2, UNITS)).astype("float32")
    inputs = {"sequence": x, "state_lstm_0": h, "state_lstm_1": -h}
    expected = _numpy(signatures["stream"](**{k: tf.constant(v) for k, v in inputs.items()}))
    lists = {k: v.tolist() for k, v in inputs.items()}
    status, columns = http_call(url, "POST", {"signature_name": "stream", "inputs": lists})
    assert status == 200, columns
    rows = [{k: v[i] for k, v in lists.items()} for i in range(2)]
    status, answer = http_call(url, "POST", {"signature_name": "stream", "instances": rows})
    assert status == 200, answer
    for name, value in expected.items():
        np.testing.assert_allclose(columns["outputs"][name], value, atol=1e-6)
        np.testing.assert_allclose([p[name] for p in answer["predictions"]], value, atol=1e-6)
    padded = {"sequence": np.zeros((1, T, M)).tolist(), "length": [3]}
    status, answer = http_call(url, "POST", {"signature_name": "padded", "inputs": padded})
    assert status == 200 and len(answer["outputs"]) == 1, answer
    narrow = {**lists, "state_lstm_1": h[:, :-1].tolist()}
    missing = {k: v for k, v in lists.items() if k != "state_lstm_1"}
    bad = [
        ("wrong state width", {"inputs": narrow}, "state_lstm_1"),
        ("wrong state width, rows", {"instances": _rows(narrow)}, "state_lstm_1"),
        ("wrong state rank", {"inputs": {**lists, "state_lstm_0": h[0].tolist()}}, "state_lstm_0"),
        ("wrong state rank, rows",
         {"instances": [{**row, "state_lstm_0": [row["state_lstm_0"]]} for row in rows]},
         "state_lstm_0"),
        ("wrong state batch", {"inputs": {**lists, "state_lstm_0": h[:1].tolist()}}, "batch"),
        ("missing state", {"inputs": missing}, "Missing but required: {state_lstm_1}"),
        ("missing state, rows", {"instances": _rows(missing)},
         "Missing but required: {state_lstm_1}"),
    ]  # fmt: skip
    for case, body, message in bad:
        status, answer = http_call(url, "POST", {"signature_name": "stream", **body})
        assert status == 400 and message in answer["error"], (case, answer)
    for request in (
        {"signature_name": "streaming", "inputs": lists},
        {"signature_name": "padded", "inputs": {"sequence": padded["sequence"]}},
        {"signature_name": "padded", "inputs": {**padded, "length": [T + 1]}},
    ):
        status, answer = http_call(url, "POST", request)
        assert status == 400 and answer["error"].strip(), (request, answer)
    status, answer = http_call(url, "POST", {"instances": x[:, :1].repeat(T, 1).tolist()})
    assert status == 200 and len(answer["predictions"]) == 2  # serving_default as before


def test_padded_lengths_outside_the_steps_are_refused_naming_the_row_and_the_range(lstm_server):
    server, _ = lstm_server
    url = f"{server.url}/v1/models/lstm:predict"
    sequence = np.zeros((3, T, M)).tolist()
    for lengths, row, value in (([3, 0, 2], 1, 0), ([-4, 1, 1], 0, -4), ([1, T, T + 1], 2, T + 1)):
        request = {"signature_name": "padded", "inputs": {"sequence": sequence, "length": lengths}}
        status, answer = http_call(url, "POST", request)
        assert (status, answer) == (400, {
            "error": f"Input 'length' of row {row} is {value}; each row's length must be in "
                     f"1..{T} (the steps of input 'sequence')"
        })  # fmt: skip
    rows = [{"sequence": sequence[0], "length": length} for length in (T, 0)]
    status, answer = http_call(url, "POST", {"signature_name": "padded", "instances": rows})
    assert status == 400 and "Input 'length' of row 1 is 0" in answer["error"]


def test_a_prediction_out_of_float32_range_is_a_400_in_strict_json():
    """A huge but finite state (3e38) makes the classification head's logits infinite."""
    _, signatures, path = _exported("antisymmetric")
    server = ThreadServer(os.path.dirname(path), "antisymmetric")
    try:
        url = f"{server.url}/v1/models/antisymmetric:predict"
        (state,) = (name for name in signatures["stream"].structured_input_signature[1]
                    if name.startswith("state_"))  # fmt: skip
        huge = np.full((1, UNITS), 3e38).tolist()
        inputs = {"sequence": np.ones((1, 2, M)).tolist(), state: huge}
        status, raw = http_call(url, "POST", {"signature_name": "stream", "inputs": inputs})
        assert status == 400 and isinstance(raw, dict), raw
        json.dumps(raw, allow_nan=False)  # strict JSON: no NaN or Infinity anywhere in it
        assert re.fullmatch(
            r"Output '\w+' of signature 'stream' holds NaN or Infinity \(row 0\), which "
            r"JSON cannot carry: the inputs \(a state, say\) drive the model out of float32 "
            r"range",
            raw["error"],
        ), raw
        status, raw = http_call(url, "POST", {"signature_name": "stream", "inputs": {
            **inputs, state: np.zeros((1, UNITS)).tolist()}})  # fmt: skip
        assert status == 200, raw  # still serving
    finally:
        server.stop()


def test_every_answer_of_a_version_names_it_in_a_header(lstm_server):
    import http.client

    server, _ = lstm_server
    host, port = server.url.removeprefix("http://").split(":")

    def version_header(method, path, body=None):
        connection = http.client.HTTPConnection(host, int(port), timeout=limit(30))
        try:
            connection.request(method, path, body=body and json.dumps(body))
            response = connection.getresponse()
            response.read()
            return response.status, response.getheader("X-Model-Version")
        finally:
            connection.close()

    whole = {"instances": np.zeros((1, T, M)).tolist()}
    assert version_header("POST", "/v1/models/lstm:predict", whole) == (200, "1")
    assert version_header("POST", "/v1/models/lstm/versions/1:predict", whole) == (200, "1")
    assert version_header("GET", "/v1/models/lstm/metadata") == (200, "1")
    assert version_header("GET", "/v1/models/lstm") == (200, None)  # status: every version
    assert version_header("POST", "/v1/models/lstm/versions/2:predict", whole) == (404, None)


def _rows(columns):
    """Columnar inputs as instances (one object per example)."""
    size = len(columns["sequence"])
    return [{name: value[i] for name, value in columns.items()} for i in range(size)]


def test_client_stream_equals_whole_sequence(lstm_server, capsys):
    server, signatures = lstm_server
    import tensorflow as tf

    x = np.random.default_rng(4).normal(size=(2, T, M)).astype("float32")
    whole = signatures["serving_default"](sequence=tf.constant(x))["value"].numpy()
    chunks = [x[:, start : start + 5] for start in range(0, T, 5)]
    answers = list(stream(server.url, chunks, "lstm", timeout=limit(30)))
    assert len(answers) == 3 and sorted(answers[-1]) == ["value"]
    np.testing.assert_allclose(answers[-1]["value"], whole, atol=1e-5)
    one = list(ServingClient(server.url, "lstm").stream(x[1, start : start + 4] for start in
                                                        range(0, T, 4)))  # fmt: skip
    np.testing.assert_allclose(one[-1]["value"], whole[1], atol=1e-5)
    # The CLI: a .npy sequence in chunks of --chunk steps, one JSON line per answer.
    from serving.client import main

    path = work_dir("stream-sequence.npy")
    np.save(path, x[0])
    assert main(["--url", server.url, "--model", "lstm", "stream", "--sequence-file", path,
                 "--chunk", "6"]) == 0  # fmt: skip
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["steps"] for line in lines] == [6, 12, T]
    np.testing.assert_allclose(lines[-1]["value"], whole[0], atol=1e-5)
    assert main(["--model", "m", "stream", "--sequence-file", path, "--chunk", "0"]) == 2
    assert "`--chunk`" in capsys.readouterr().err


def test_a_model_that_cannot_stream_is_exported_with_a_note_and_served(capsys):
    import tensorflow as tf

    from serving.exports.export import main

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((T, M)), keras.layers.Bidirectional(keras.layers.GRU(3), name="reader"),
         keras.layers.Dense(3, name="classification_head")]
    )  # fmt: skip
    keras_path = work_dir("bidirectional.keras")
    model.save(keras_path)
    base = work_dir("stream", "bidirectional")
    assert main(["--model", keras_path, "--export-base", base, "--version", "1"]) == 0
    err = capsys.readouterr().err.splitlines()
    # The layer is named: Keras numbers unnamed layers per process, whatever ran before.
    assert err == [
        "python -m serving.export: note: no `stream` signature: layer 'reader' "
        "(Bidirectional) reads the sequence backwards too (needs all of it)"
    ]
    signatures = tf.saved_model.load(os.path.join(base, "1")).signatures
    assert sorted(signatures) == ["padded", "serving_default"]
    assert main(["--model", keras_path, "--export-base", base, "--version", "2",
                 "--no-stream", "--no-padded"]) == 0  # fmt: skip
    assert list(tf.saved_model.load(os.path.join(base, "2")).signatures) == ["serving_default"]
    x = np.random.default_rng(0).normal(size=(2, T, M)).astype("float32")
    server = ThreadServer(base, "bidi")
    try:
        client = ServingClient(server.url, "bidi")
        answer = client.predict(inputs=x)["outputs"]
        np.testing.assert_allclose(answer["logits"], model.predict(x, verbose=0), atol=1e-5)
        with pytest.raises(NoStreamSignatureError, match="no 'stream' signature"):
            list(client.stream([x]))
    finally:
        server.stop()


def test_every_layer_after_the_last_sequence_is_a_head_step_of_the_plan():
    """A head of several layers: each one runs once, on the last output."""
    from serving.exports import signatures

    model = keras.Sequential([
        keras.Input((None, 2)),
        keras.layers.Dense(3),  # per step
        keras.layers.RNN(AntisymmetricCell(4)),
        keras.layers.Dense(5, activation="relu"),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(2),
    ])  # fmt: skip
    for plan in (signatures.stream_plan(model), signatures.padded_plan(model)):
        assert [step.kind for step in plan.steps] == [
            "per_step", "recurrent", "head", "head", "head",
        ]  # fmt: skip
        assert [step.layer for step in plan.steps] == model.layers


def test_plans_name_the_layer_a_sequence_cannot_be_served_through():
    from serving.exports import signatures

    class SelfAttention(keras.layers.Layer):
        """Mixes the time steps (a stand-in for an attention layer of one input)."""

        def call(self, x):
            weights = keras.ops.softmax(keras.ops.matmul(x, keras.ops.swapaxes(x, 1, 2)))
            return keras.ops.matmul(weights, x)

    attending = keras.Sequential([
        keras.Input((None, 2)), SelfAttention(name="mixer"), keras.layers.RNN(AntisymmetricCell(4)),
    ])  # fmt: skip
    with pytest.raises(signatures.StreamPlanError) as refused:
        signatures.stream_plan(attending)
    assert str(refused.value) == "layer 'mixer' (SelfAttention) attends over the whole sequence"

    stateful = keras.Sequential([
        keras.Input(batch_shape=(2, 5, 2)),
        keras.layers.Bidirectional(keras.layers.LSTM(3, stateful=True), name="both_ways"),
    ])  # fmt: skip
    with pytest.raises(signatures.StreamPlanError) as refused:
        signatures.padded_plan(stateful)
    assert str(refused.value) == (
        "layer 'both_ways' (Bidirectional) is stateful (states in variables)"
    )
    stateful_rnn = keras.Sequential([
        keras.Input(batch_shape=(2, 5, 2)),
        keras.layers.RNN(AntisymmetricCell(3), stateful=True, name="kept"),
    ])  # fmt: skip
    with pytest.raises(signatures.StreamPlanError) as refused:
        signatures.stream_plan(stateful_rnn)
    assert str(refused.value) == "layer 'kept' (RNN) is stateful (states in variables)"


def test_a_plan_refuses_a_normalization_over_time_naming_its_axis():
    from serving.exports import signatures

    over_time = keras.Sequential([
        keras.Input((5, 2)),
        keras.layers.RNN(AntisymmetricCell(3), return_sequences=True),
        keras.layers.LayerNormalization(axis=1, name="over_time"),
        keras.layers.RNN(AntisymmetricCell(3)),
    ])  # fmt: skip
    with pytest.raises(signatures.StreamPlanError) as refused:
        signatures.stream_plan(over_time)
    assert str(refused.value) == (
        "layer 'over_time' (LayerNormalization) normalizes over axis [1], not the features alone"
    )


def test_state_names_keep_the_characters_tensorflow_keeps_and_stay_apart():
    """`state_<layer>_<k>`: other characters become `_`, and a name taken gets one more `_`."""
    from serving.exports import signatures

    model = keras.Sequential([
        keras.Input((None, 2)),
        keras.layers.RNN(AntisymmetricCell(3), return_sequences=True, name="rnn-a.1"),
        keras.layers.RNN(AntisymmetricCell(4), name="rnn_a_1"),
    ])  # fmt: skip
    assert signatures.stream_plan(model).states == {"state_rnn_a_1_0": 3, "state_rnn_a_1__0": 4}


def test_a_plan_streams_the_first_output_only_when_it_is_the_last_layer_s():
    """Two outputs: streaming serves the first, which must be the chain's end."""
    from serving.exports import signatures

    inputs = keras.Input((5, 3))
    hidden = keras.layers.RNN(AntisymmetricCell(4), return_sequences=True)(inputs)
    last = keras.layers.Dense(2)(hidden)
    plan = signatures.stream_plan(keras.Model(inputs, [last, hidden]))
    assert [step.kind for step in plan.steps] == ["recurrent", "per_step"]
    for make_plan in (signatures.stream_plan, signatures.padded_plan):
        with pytest.raises(signatures.StreamPlanError) as refused:
            make_plan(keras.Model(inputs, [hidden, last]))
        assert str(refused.value) == "the model's output is not its last layer's (a shared layer)"


def test_a_plan_refuses_a_branched_or_subclassed_model_saying_why():
    from serving.exports import signatures

    inputs = keras.Input((5, 3))
    left = keras.layers.Dense(4, name="left")(inputs)
    right = keras.layers.Dense(4, name="right")(inputs)
    branched = keras.Model(inputs, keras.layers.Add()([left, right]))

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.recurrent = AntisymmetricRNN(4)

        def call(self, x):
            return self.recurrent(x)

    subclassed = Subclassed()
    subclassed(keras.ops.zeros((1, 5, 3)))
    for make_plan in (signatures.stream_plan, signatures.padded_plan):
        with pytest.raises(signatures.StreamPlanError) as refused:
            make_plan(branched)
        assert str(refused.value) == (
            "layer 'right' (Dense) does not take the previous layer's output "
            "(branches, several inputs or a shared layer)"
        )
        with pytest.raises(signatures.StreamPlanError) as refused:
            make_plan(subclassed)
        assert str(refused.value) == (
            "the model is not a chain of layers ('Subclassed' object has no attribute 'inputs')"
        )


def test_the_padded_endpoint_refuses_lengths_outside_its_steps_with_the_reason():
    import tensorflow as tf

    from serving.exports import signatures

    model = keras.Sequential([keras.Input((None, 2)), AntisymmetricRNN(4), keras.layers.Dense(3)])
    fn, spec = signatures.padded_endpoint(signatures.padded_plan(model), "classification", None, 2)
    padded = tf.function(fn, input_signature=spec)
    sequence = np.zeros((2, 5, 2), "float32")
    assert padded(sequence, np.array([1, 5], "int32"))["logits"].shape == (2, 3)
    for lengths, reason in (  # TensorFlow shows the quotes escaped
        ([0, 3], r"\[Input \\?'length\\?' must be at least 1\]"),
        ([6, 3], r"\[Input \\?'length\\?' must be at most the sequence\\?'s steps\]"),
    ):
        with pytest.raises(tf.errors.InvalidArgumentError, match=reason):
            padded(sequence, np.array(lengths, "int32"))
