"""keras_antisym/legacy.py: the cells for legacy Keras 2 (tf_keras, `TF_USE_LEGACY_KERAS=1`).

This process runs Keras 3 and must never import tf_keras: every legacy-Keras
check runs in one subprocess with `TF_USE_LEGACY_KERAS=1` (tests/legacy_checks.py,
one TensorFlow start for all of them), and each of its checks is one test
here. Weights go Keras 3 (here) -> Keras 2 (there, then trained) -> Keras 3
(here); the SavedModels exported there are served here by the local server
with `keras`, `keras_antisym` and `tf_keras` unimportable, as TF Serving would.
"""

import concurrent.futures
import importlib.util
import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_antisym import AntisymmetricRNN, GatedAntisymmetricCell, GatedAntisymmetricRNN
from tests import legacy_checks
from tests.legacy_checks import FEATURES, MODELS, MOVE_ATOL, STEPS, UNITS

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBPROCESS_SECONDS = 300

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tf_keras") is None,
    reason='tf_keras is not installed (pip install "keras-antisym[legacy]")',
)


def keras3_classifier(name, gated, antisymmetric, fused):
    """The Keras 3 twin of `legacy_checks.classifier`, `keras.layers.RNN(cell)` or fused."""
    if fused:
        layer_class = GatedAntisymmetricRNN if gated else AntisymmetricRNN
        recurrent = layer_class(UNITS, antisymmetric=antisymmetric, **legacy_checks.ARGS)
    else:
        from keras_antisym import AntisymmetricCell

        cell_class = GatedAntisymmetricCell if gated else AntisymmetricCell
        recurrent = keras.layers.RNN(
            cell_class(UNITS, antisymmetric=antisymmetric, **legacy_checks.ARGS)
        )
    return keras.Sequential(
        [keras.Input((STEPS, FEATURES)), recurrent, keras.layers.Dense(3)], name=name
    )


@pytest.fixture(scope="module")
def legacy_run(tmp_path_factory):
    """Writes Keras 3 weights and outputs, runs tests/legacy_checks.py, returns its results."""
    work = tmp_path_factory.mktemp("legacy")
    rng = np.random.RandomState(0)
    x = rng.standard_normal((96, STEPS, FEATURES)).astype("float32")
    y = (x[:, :, 0].sum(axis=1) > 0).astype("int32") + (x[:, -1, 1] > 0.5)
    arrays = {"x": x, "y": y}
    for name, gated, antisymmetric in MODELS:
        # The fused layer's weights: the same as RNN(cell)'s (test_layers.py).
        model = keras3_classifier(name, gated, antisymmetric, fused=True)
        weights = [0.5 * rng.standard_normal(w.shape).astype("float32") for w in model.weights]
        model.set_weights(weights)
        arrays.update({f"{name}/{i}": w for i, w in enumerate(weights)})
        arrays[f"{name}/out"] = np.asarray(model(x))
    np.savez(work / "keras3.npz", **arrays)
    env = dict(
        os.environ,
        TF_USE_LEGACY_KERAS="1",
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]),
    )
    env.pop("KERAS_BACKEND", None)  # serving.exports.export sets the TensorFlow backend itself
    process = subprocess.run(
        [sys.executable, "-m", "tests.legacy_checks", str(work)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_SECONDS,
    )
    results_path = work / "results.json"
    assert results_path.exists(), process.stdout[-3000:] + process.stderr[-5000:]
    with open(results_path) as handle:
        results = json.load(handle)
    print("legacy checks, seconds:", results["__seconds__"])  # shown with `pytest -s`
    return work, results


def test_subprocess_uses_this_checkout(legacy_run):
    _, results = legacy_run
    expected = os.path.join(REPO_ROOT, "keras_antisym", "__init__.py")
    assert os.path.realpath(results["__file__"]) == os.path.realpath(expected)


@pytest.mark.parametrize("name", [check.__name__ for check in legacy_checks.CHECKS])
def test_legacy_check(legacy_run, name):
    _, results = legacy_run
    assert results[name] == "ok", results[name]


def test_keras_antisym_does_not_import_tf_keras():
    """Only keras_antisym/legacy.py imports tf_keras; importing the package loads neither.

    Checked in this process (Keras 3, TensorFlow without `TF_USE_LEGACY_KERAS`,
    which would itself import tf_keras with TensorFlow).
    """
    import keras_antisym  # noqa: F401

    assert "tf_keras" not in sys.modules
    assert "keras_antisym.legacy" not in sys.modules
    package = os.path.join(REPO_ROOT, "keras_antisym")
    importing = []
    for folder, _, files in os.walk(package):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as handle:
                source = handle.read() if name.endswith(".py") else ""
            if re.search(r"^\s*(import|from)\s+tf_keras\b", source, re.MULTILINE):
                importing.append(os.path.relpath(path, package))
    assert importing == ["legacy.py"]


@pytest.mark.parametrize("fused", [False, True])
def test_weights_trained_in_keras2_come_back(legacy_run, fused):
    """Keras 3 -> Keras 2 (trained there) -> Keras 3: the same outputs (1e-6)."""
    work, results = legacy_run
    assert results["check_weights_from_keras3_and_training_back"] == "ok"
    trained, keras3 = np.load(work / "trained.npz"), np.load(work / "keras3.npz")
    for name, gated, antisymmetric in MODELS:
        model = keras3_classifier(name, gated, antisymmetric, fused=fused)
        weights = [trained[f"{name}/{i}"] for i in range(len(model.weights))]
        assert [w.shape for w in weights] == [tuple(w.shape) for w in model.weights]
        model.set_weights(weights)
        out = np.asarray(model(keras3["x"]))
        np.testing.assert_allclose(out, trained[f"{name}/out"], atol=MOVE_ATOL, err_msg=name)
        assert np.abs(out - keras3[f"{name}/out"]).max() > 1e-2, "the weights were not trained"


def test_served_like_the_model(legacy_run):
    """The Keras 2 model's SavedModels, served without Keras, predict what the model does.

    `export_model`: `serving.export.export_model` (input `sequence`, outputs
    `logits`, `probabilities`, `class_id`); `saved_model`: `tf.saved_model.save`
    (Keras 2's own signature: input `input_1`, output `classification_head`).
    Both are served by the local server with `keras`, `keras_antisym` and
    `tf_keras` unimportable, the two servers starting side by side.
    """
    from tests.serving_helpers import ServerProcess, http_call

    work, results = legacy_run
    assert results["check_exports_for_serving"] == "ok"
    served = np.load(work / "served.npz")
    request = {"instances": served["x"].tolist()}
    folders = ("export_model", "saved_model")
    with concurrent.futures.ThreadPoolExecutor(len(folders)) as pool:
        servers = list(pool.map(lambda f: ServerProcess(str(work / f), "legacy"), folders))
    try:
        answers = {}
        for folder, server in zip(folders, servers, strict=True):
            status, body = http_call(f"{server.url}/v1/models/legacy:predict", "POST", request)
            assert status == 200, (folder, body)
            answers[folder] = body["predictions"]
    finally:
        for server in servers:
            server.stop()
    logits = np.array([row["logits"] for row in answers["export_model"]])
    np.testing.assert_allclose(logits, served["logits"], atol=1e-5)
    classes = [row["class_id"] for row in answers["export_model"]]
    assert classes == served["logits"].argmax(-1).tolist()
    np.testing.assert_allclose(np.array(answers["saved_model"]), served["logits"], atol=1e-5)
