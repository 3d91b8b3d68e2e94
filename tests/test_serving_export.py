"""`serving.export`: TensorFlow Serving's layout, named signature, no Keras needed to serve."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from serving.export import build_archive, export_model
from tests.serving_helpers import (
    FEATURES,
    NO_KERAS_PRELUDE,
    REPO_ROOT,
    STEPS,
    build_model,
    digits,
    exported,
    work_dir,
)


def test_layout_and_no_leftovers():
    _, base = exported("antisymmetric")
    assert sorted(os.listdir(base)) == ["1"]  # no temporary folder left behind
    version = os.path.join(base, "1")
    assert os.path.isfile(os.path.join(version, "saved_model.pb"))
    assert os.path.isdir(os.path.join(version, "variables"))
    assert os.stat(version).st_mode & 0o755 == 0o755  # readable by the server's user


def test_never_overwrites_a_version():
    model, base = exported("antisymmetric")
    before = os.path.getmtime(os.path.join(base, "1", "saved_model.pb"))
    with pytest.raises(FileExistsError, match="`version`"):
        export_model(model, base, 1)
    assert os.path.getmtime(os.path.join(base, "1", "saved_model.pb")) == before
    assert sorted(os.listdir(base)) == ["1"]


@pytest.mark.parametrize("version", [0, -1, 1.5, "2", True])
def test_rejects_invalid_versions(version):
    with pytest.raises(ValueError, match="argument `version`"):
        export_model(build_model("antisymmetric"), work_dir("never"), version)


def test_rejects_models_without_sequence_input():
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(10)])
    with pytest.raises(ValueError, match="argument `model`"):
        build_archive(model)


def test_cli_writes_a_version_and_refuses_to_overwrite():
    exported("gated")
    keras_path, base = work_dir("gated.keras"), work_dir("cli-export")
    command = [sys.executable, "-m", "serving.export", "--model", keras_path,
               "--export-base", base, "--version", "7"]  # fmt: skip
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert os.path.isfile(os.path.join(base, "7", "saved_model.pb"))
    again = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert again.returncode == 2
    assert "argument `version`" in again.stderr.splitlines()[-1]


def test_signature_names_shapes_and_dtypes():
    import tensorflow as tf

    _, base = exported("antisymmetric")
    loaded = tf.saved_model.load(os.path.join(base, "1"))
    assert list(loaded.signatures) == ["serving_default"]
    signature = loaded.signatures["serving_default"]
    (inputs,) = [signature.structured_input_signature[1]]
    assert list(inputs) == ["sequence"]
    assert inputs["sequence"].shape.as_list() == [None, STEPS, FEATURES]
    assert inputs["sequence"].dtype == tf.float32
    outputs = signature.structured_outputs
    assert sorted(outputs) == ["class_id", "logits", "probabilities"]
    assert outputs["probabilities"].shape.as_list() == [None, 10]
    assert outputs["class_id"].dtype == tf.int64


# Loads the SavedModel where Keras cannot be imported, answers a batch, prints JSON.
_LOAD_WITHOUT_KERAS = """
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
out = loaded.signatures["serving_default"](sequence=tf.constant(x))
json.dump({k: v.numpy().tolist() for k, v in out.items()}, sys.stdout)
blocked = [m for m in sys.modules if m.split(".")[0] in ("keras", "keras_antisym")]
assert not blocked, blocked
"""


@pytest.mark.parametrize("kind", ["antisymmetric", "gated"])
def test_loads_and_answers_without_keras(kind):
    model, base = exported(kind)
    x = digits()[0][:5]
    x_path = work_dir(f"x-{kind}.npy")
    np.save(x_path, x)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            NO_KERAS_PRELUDE + _LOAD_WITHOUT_KERAS,
            os.path.join(base, "1"),
            x_path,
        ],  # fmt: skip
        cwd=REPO_ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    logits = model.predict(x, verbose=0)
    np.testing.assert_allclose(answer["logits"], logits, rtol=1e-5, atol=1e-5)
    probabilities = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(answer["probabilities"], probabilities, rtol=1e-5, atol=1e-6)
    assert answer["class_id"] == logits.argmax(-1).tolist()
