"""Run by test_serving_portable.py with KERAS_BACKEND=torch: ONNX from PyTorch.

For each kind of `tests.test_serving_portable.KINDS`, exports the model with
`serving.exports.onnxgraphs` on this backend and checks ONNX Runtime's whole-sequence
and chunked (1, 7, T steps) answers against the Keras model on this backend,
and each ONNX model's name, opset and `Loop` body (`check_onnx_models`);
prints `checked <kind>` for each, or `refused <kind>: <the one-line error>`.
"""

import sys

import keras

from serving.exports import onnxgraphs
from serving.exports.runtimes import OnnxModel
from serving.exports.steploop import PortableExportError

assert keras.backend.backend() == "torch"
# The test module's models and checks (Keras is imported first, on PyTorch).
from tests.test_serving_portable import (  # noqa: E402
    KINDS,
    _check_equal,
    check_onnx_models,
    portable_model,
)


def main(folder: str) -> None:
    import os

    for kind in KINDS:
        model, head = portable_model(kind)
        target = os.path.join(folder, kind)
        os.makedirs(target)
        try:
            models = onnxgraphs.convert(model, head)
        except PortableExportError as error:
            print(f"refused {kind}: {error}", flush=True)
            continue
        check_onnx_models(models)
        for name, blob in models.items():
            with open(os.path.join(target, f"{name}.onnx"), "wb") as file:
                file.write(blob)
        _check_equal(OnnxModel(target), model, head)
        print(f"checked {kind}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
