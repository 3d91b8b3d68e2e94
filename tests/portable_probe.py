"""Run by test_serving_portable.py with KERAS_BACKEND=torch: ONNX from PyTorch.

For each kind of `tests.test_serving_portable.KINDS`, exports the model with
`serving.exports.onnxgraphs` on this backend and checks ONNX Runtime's whole-sequence
and chunked (1, 7, T steps) answers against the Keras model on this backend, at a
batch size other than the trace's, each ONNX model's name, opset and `Loop` body
(`check_onnx_models`) and its outputs' symbolic batch (and time, per step) as its
sequence's; prints `checked <kind>` for each, or `refused <kind>: <the one-line
error>`; then `fixed length <T> kept` for a model of a fixed length T, whose
`serving_default` keeps it.
"""

import sys

import keras

from serving.exports import onnxgraphs
from serving.exports.runtimes import NEXT_PREFIX, OnnxModel
from serving.exports.steploop import PortableExportError
from serving.names import SEQUENCE_INPUT

assert keras.backend.backend() == "torch"
# The test module's models and checks (Keras is imported first, on PyTorch).
from tests.test_serving_portable import (  # noqa: E402
    FEATURES,
    KINDS,
    STEPS,
    _check_equal,
    check_onnx_models,
    portable_model,
)


def _written(models, target):
    import os

    os.makedirs(target)
    for name, blob in models.items():
        with open(os.path.join(target, f"{name}.onnx"), "wb") as file:
            file.write(blob)
    return OnnxModel(target)


def _check_symbolic_dims(runtime, per_step):
    """Each output's batch dimension is the sequence's, and so is time per step."""
    for session in runtime.sessions.values():
        sequence = next(node.shape for node in session.get_inputs() if node.name == SEQUENCE_INPUT)
        for node in session.get_outputs():
            stepwise = per_step and not node.name.startswith(NEXT_PREFIX)
            assert node.shape[: 2 if stepwise else 1] == sequence[: 2 if stepwise else 1], (
                node.name,
                node.shape,
                sequence,
            )


def main(folder: str) -> None:
    import os

    for kind in KINDS:
        model, head = portable_model(kind)
        try:
            models = onnxgraphs.convert(model, head)
        except PortableExportError as error:
            print(f"refused {kind}: {error}", flush=True)
            continue
        check_onnx_models(models)
        runtime = _written(models, os.path.join(folder, kind))
        _check_equal(runtime, model, head, batch=3)  # the trace's batch is 2
        _check_symbolic_dims(runtime, head == "per_step_classification")
        print(f"checked {kind}", flush=True)
    model, head = portable_model("gated", steps=STEPS)
    runtime = _written(onnxgraphs.convert(model, head), os.path.join(folder, "fixed"))
    assert runtime.specs["serving_default"][0].shape == (None, STEPS, FEATURES)
    assert runtime.specs["stream"][0].shape == (None, None, FEATURES)  # any chunk
    _check_equal(runtime, model, head)
    print(f"fixed length {STEPS} kept", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
