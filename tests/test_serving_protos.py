"""TensorFlow Serving's protos without TensorFlow's Python package (`serving.protos`): its
three assumptions, and the gRPC client command that starts without TensorFlow."""

import json
import os
import subprocess
import sys

from tests.limits import limit
from tests.serving_helpers import REPO_ROOT, ThreadServer, exported

_WITHOUT_TENSORFLOW = """
import importlib.util, json, sys
import numpy as np
spec = importlib.util.find_spec("tensorflow")
assert spec is not None and "tensorflow" not in sys.modules  # 1. found, not imported
from serving import protos
from serving.local import tensors
modules = protos.load()
assert protos.load() is modules
loaded = sorted(n for n in sys.modules if n.split(".")[0] == "tensorflow")
assert loaded and all(n.endswith("_pb2") for n in loaded), loaded  # 2. protos only
x = np.arange(6, dtype="float32").reshape(2, 3) / 7
proto = tensors.to_tensor_proto(x)
assert type(proto) is modules.tensor_pb2.TensorProto
request = modules.predict_pb2.PredictRequest()
request.inputs["x"].CopyFrom(proto)
print("before tensorflow", flush=True)
import tensorflow as tf  # 3. the real package, with the same proto classes
assert type(tf.make_tensor_proto(x)) is modules.tensor_pb2.TensorProto
np.testing.assert_array_equal(tf.make_ndarray(request.inputs["x"]), x)
assert tf.constant([1.0, 2.0]).numpy().tolist() == [1.0, 2.0]
print("ok", flush=True)
"""


def _python(code, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=limit(180))  # fmt: skip


def test_the_protos_load_without_tensorflow_and_tensorflow_imports_after_them():
    done = _python(_WITHOUT_TENSORFLOW)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "before tensorflow\nok\n"


_TENSORFLOW_FIRST = """
import sys
import tensorflow as tf
from serving import protos
modules = protos.load()
assert sys.modules["tensorflow"] is tf  # the package imported already stays
assert modules.tensor_pb2 is sys.modules["tensorflow.core.framework.tensor_pb2"]
assert type(tf.make_tensor_proto([1.0])) is modules.tensor_pb2.TensorProto
assert tf.constant([2.0]).numpy().tolist() == [2.0]
print("ok", flush=True)
"""

_NO_TENSORFLOW = """
import sys

class Hidden:
    \"\"\"A finder that finds nothing of the `tensorflow` package: as if not installed.\"\"\"

    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, name):  # the rest of the finder's API (package metadata, caches)
        return getattr(self.finder, name)

sys.meta_path[:] = [Hidden(finder) for finder in sys.meta_path]
from serving import protos
try:
    protos.load()
except ModuleNotFoundError as error:
    print(error.name, str(error), sep="\\n")
assert not [n for n in sys.modules if n.split(".")[0] == "tensorflow"]
"""


def test_with_tensorflow_imported_first_the_protos_are_its_own():
    done = _python(_TENSORFLOW_FIRST)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "ok\n"


def test_without_the_tensorflow_package_the_protos_say_what_to_install():
    done = _python(_NO_TENSORFLOW)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == (
        "tensorflow\nTensorFlow Serving's protos need the tensorflow package's proto modules: "
        'pip install "keras-antisym[serve]"\n'
    )


def test_the_grpc_client_command_answers_without_tensorflow_s_start_up():
    """`python -m serving.client --grpc` prints the status JSON and nothing on stderr:
    TensorFlow's C++ start-up lines (printed whatever `TF_CPP_MIN_LOG_LEVEL`) never come."""
    _, base = exported("antisymmetric")
    server = ThreadServer(base, "antisym", grpc_port=0)
    try:
        host, port = server.server.grpc_address
        done = subprocess.run(
            [sys.executable, "-m", "serving.client", "--grpc", f"{host}:{port}", "--model",
             "antisym", "status"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=limit(120),
            env={k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")},
        )  # fmt: skip
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ""
    (status,) = json.loads(done.stdout)["model_version_status"]
    assert status["state"] == "AVAILABLE"
    assert status["version"] == "1"
