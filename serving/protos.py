"""TensorFlow Serving's protos, and TensorFlow's that they use, without TensorFlow's Python
package.

The generated modules of `tensorflow-serving-api` import `tensorflow.core.*_pb2`, which
live inside the `tensorflow` package: imported the usual way, they run
`tensorflow/__init__.py` first, seconds of start-up and TensorFlow's C++ lines on
stderr, for what is only protobuf classes. A client that builds and reads messages
(`serving.client --grpc`, `serving.local.tensors`) loads them here instead: the `tensorflow`
package's folder stands in as a bare namespace while they import, then the stand-in is
removed, so a later `import tensorflow` runs the real package, which finds the same
proto modules already imported (one `TensorProto` class for both).

Assumptions, each checked by `tests/test_serving_protos.py`:

1. `importlib.util.find_spec("tensorflow")` finds the package without importing it.
2. The proto modules under `tensorflow/core/` import only `google.protobuf` and each
   other, and the `__init__.py` files of their folders import nothing.
3. TensorFlow imported afterwards uses the modules loaded here.

Where TensorFlow is imported already, the modules are imported as usual.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from typing import Any

# The modules a TensorFlow Serving client needs, by the name callers use.
MODULES = {
    "tensor_pb2": "tensorflow.core.framework.tensor_pb2",
    "predict_pb2": "tensorflow_serving.apis.predict_pb2",
    "get_model_metadata_pb2": "tensorflow_serving.apis.get_model_metadata_pb2",
    "get_model_status_pb2": "tensorflow_serving.apis.get_model_status_pb2",
    "prediction_service_pb2_grpc": "tensorflow_serving.apis.prediction_service_pb2_grpc",
    "model_service_pb2_grpc": "tensorflow_serving.apis.model_service_pb2_grpc",
}

_lock = threading.Lock()
_loaded: types.SimpleNamespace | None = None


def load() -> Any:
    """The modules of `MODULES` as attributes (`load().predict_pb2`), imported once."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = types.SimpleNamespace(**_import_all())
        return _loaded


def _import_all() -> dict[str, types.ModuleType]:
    if "tensorflow" in sys.modules:
        return {key: importlib.import_module(name) for key, name in MODULES.items()}
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "TensorFlow Serving's protos need the tensorflow package's proto modules: "
            'pip install "keras-antisym[serve]"',
            name="tensorflow",
        )
    stand_in = types.ModuleType("tensorflow")
    stand_in.__path__ = list(spec.submodule_search_locations)
    sys.modules["tensorflow"] = stand_in
    try:
        return {key: importlib.import_module(name) for key, name in MODULES.items()}
    finally:
        # The stand-in and the bare package folders go, the proto modules stay: TensorFlow
        # imported later runs its real packages and finds these modules in `sys.modules`.
        for name in [n for n in sys.modules if n == "tensorflow" or n.startswith("tensorflow.")]:
            if not name.endswith("_pb2"):
                del sys.modules[name]
