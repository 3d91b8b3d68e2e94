"""Property-based REST tests (hypothesis) against a `--variable-length` export.

Good bodies (row and columnar formats, named or bare, any batch and length)
predict what the SavedModel signature returns when called directly; bad ones
(a wrong leaf, nesting, shape or envelope) get a JSON 4xx and the server keeps
serving.
"""

import json
import os
import tempfile
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.exports.export import export_model
from tests.limits import limit
from tests.serving_helpers import ServerProcess, ThreadServer, http_call, work_dir

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def variable_length():
    """`(server, signature)`: a `--variable-length` export of (T, 2) inputs, served."""
    import keras
    import tensorflow as tf

    from keras_antisym import AntisymmetricRNN

    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((None, 2)), AntisymmetricRNN(4, epsilon=0.1), keras.layers.Dense(3)]
    )
    # A folder of its own each time: a module fixture is set up again when the tests are
    # reordered across modules (mutation testing runs the fastest first).
    os.makedirs(work_dir("models"), exist_ok=True)
    base = tempfile.mkdtemp(prefix="variable-", dir=work_dir("models"))
    export_model(model, base, 1, variable_length=True)
    signature = tf.saved_model.load(os.path.join(base, "1")).signatures["serving_default"]
    server = ThreadServer(base, "var")
    server.base_path = base
    try:
        yield server, signature
    finally:
        server.stop()


def test_variable_length_input_is_bounded(variable_length):
    # A server process of its own: an in-process server shares the GIL with this
    # test's client and, on a loaded CI machine, once took over 30 s to read the body.
    server = ServerProcess(variable_length[0].base_path, "var")
    url = f"{server.url}/v1/models/var:predict"
    try:
        # 500,000 steps: ~1.5M JSON values, over the byte-count bound (5 x 262,144 + 1,024),
        # so refused before parsing; 200,000: under it, refused from the decoded shape.
        for steps in (500_000, 200_000):
            start = time.monotonic()
            body = {"instances": [[[0.5, 0.5]] * steps]}
            status, answer = http_call(url, "POST", body, timeout=limit(60))
            assert status == 400 and "--max-input-elements" in answer["error"], answer
            assert time.monotonic() - start < 10
        assert http_call(url, "POST", {"instances": [[[0.5, 0.5]] * 1000]})[0] == 200
    finally:
        server.stop()


_NUMBERS = st.floats(-100, 100, allow_nan=False, width=32) | st.integers(-1000, 1000)
_FORMATS = ("rows", "named rows", "columns", "named columns")


@st.composite
def _batches(draw):
    """A valid (batch, T, 2) nested list of JSON numbers."""
    batch, steps = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    step = st.lists(_NUMBERS, min_size=2, max_size=2)
    instance = st.lists(step, min_size=steps, max_size=steps)
    return draw(st.lists(instance, min_size=batch, max_size=batch))


def _envelope(x, fmt):
    return {
        "rows": lambda: {"instances": x},
        "named rows": lambda: {"instances": [{"sequence": row} for row in x]},
        "columns": lambda: {"inputs": x},
        "named columns": lambda: {"inputs": {"sequence": x}},
    }[fmt]()


_BAD_LEAVES = (True, False, None, "1", [], {}, [1.0], float("nan"), float("inf"), 10**40)


@st.composite
def _bad_bodies(draw):
    """A body with one thing wrong: a leaf, the nesting, the shape or the envelope."""
    x, fmt = draw(_batches()), draw(st.sampled_from(_FORMATS))
    i, j = draw(st.integers(0, len(x) - 1)), draw(st.integers(0, len(x[0]) - 1))
    kind = draw(st.sampled_from(["leaf", "feature", "ragged", "rank", "empty", "envelope"]))
    if kind == "leaf":
        x[i][j][draw(st.integers(0, 1))] = draw(st.sampled_from(_BAD_LEAVES))
    elif kind == "feature":
        x[i][j] = x[i][j][:1] if draw(st.booleans()) else x[i][j] + [0.5]
    elif kind == "ragged" and len(x) > 1:
        x[i] = x[i] + [[0.5, 0.5]]
    elif kind in ("rank", "ragged"):
        x = draw(st.sampled_from([x[0], [x], [[[[v] for v in step] for step in r] for r in x]]))
    elif kind == "empty":
        x = draw(st.sampled_from([[], [[]], [[[]]]]))
    else:
        return draw(st.sampled_from([
            {"instances": x, "inputs": x}, {"data": x}, [x], {"instances": {"sequence": x}},
            {"instances": x, "signature_name": draw(st.sampled_from([7, None, "nope"]))},
            {"inputs": {"sequence": x, "other": x}}, {"inputs": {"Sequence": x}},
        ]))  # fmt: skip
    return _envelope(x, fmt)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(x=_batches(), fmt=st.sampled_from(_FORMATS))
def test_property_good_bodies_predict_like_the_signature(variable_length, x, fmt):
    server, signature = variable_length
    status, answer = http_call(f"{server.url}/v1/models/var:predict", "POST", _envelope(x, fmt))
    assert status == 200, answer
    expected = {k: v.numpy() for k, v in signature(sequence=np.array(x, "float32")).items()}
    if fmt.endswith("rows"):
        got = {k: [row[k] for row in answer["predictions"]] for k in expected}
    else:
        got = answer["outputs"]
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


@settings(max_examples=120, deadline=None, derandomize=True, database=None)
@given(body=_bad_bodies())
def test_property_bad_bodies_get_json_4xx(variable_length, body):
    server, _ = variable_length
    url = f"{server.url}/v1/models/var"
    status, answer = http_call(f"{url}:predict", "POST", json.dumps(body, allow_nan=True))
    assert 400 <= status < 500, (status, answer)
    assert isinstance(answer, dict) and answer["error"].strip(), answer
    assert http_call(url)[0] == 200
