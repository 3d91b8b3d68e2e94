"""LiteRT (`.tflite`) exports of builtin ops only, with `serving_default` and `stream`.

Keras' own `model.export(path, format="litert")` converts a recurrent layer's
loop into TensorFlow's `TensorList` ops, which need the Flex delegate that
stock interpreters on devices lack. This export converts the graphs of
`serving.exports.tfloop` instead: one builtin `WHILE` over the model's step, weights
as constants, and nothing but `TFLITE_BUILTINS` allowed in the converter, so a
model that would need any TensorFlow op is refused, not written.

The file has the SavedModel's signatures with the same input and output
names (`serving_default`, and `stream` with `state_*` in and out) and runs in
`ai_edge_litert.interpreter.Interpreter` without any delegate
(`serving.exports.runtimes.LiteRTModel`).

Quantization (`QUANTIZATIONS`): `float16` stores weights as float16 and
computes in float32; `dynamic-int8` stores the weights of 1,024 elements or
more as int8 (LiteRT's dynamic-range quantization) and keeps activations and
the recurrent state in float32. Full-integer int8 is not offered: LiteRT's
converter quantizes the loop-carried state and the Euler update `h + ε·f`
inside `WHILE` to int8 as well, whose spacing is coarser than a step's
increment (docs/devices.md has the measurement).

Only the export imports this module; it imports TensorFlow when called.
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import TYPE_CHECKING, Any

from apputil.files import write_atomically
from apputil.quiet import import_tensorflow, native_stderr_silenced
from serving.exports.steploop import PortableExportError, check_float32
from serving.exports.tfloop import UpdatedSlices, graphs
from serving.names import STREAM_SIGNATURE

if TYPE_CHECKING:
    import keras

QUANTIZATIONS = ("float16", "dynamic-int8")
FILE_NAME = "model.tflite"


def convert(
    model: keras.Model,
    head: str,
    stream: bool = True,
    quantize: str | None = None,
    notes: list[str] | None = None,
) -> bytes:
    """The `.tflite` bytes of `model`: builtin ops only, `serving_default` and `stream`.

    Args:
        model: A float32 Keras model on the TensorFlow backend.
        head: The head (`serving.exports.heads.HEAD_NAMES`).
        stream: Boolean, add `stream` if the model can stream.
        quantize: None, or one of `QUANTIZATIONS`.
        notes: Optional list; a line is appended when `stream` is left out.

    Raises:
        PortableExportError: a float16/bfloat16 layer, or a graph that needs
            TensorFlow ops LiteRT has no builtins for.
    """
    if quantize is not None and quantize not in QUANTIZATIONS:
        from apputil.errors import invalid

        raise invalid("quantize", f"None or one of {', '.join(QUANTIZATIONS)}", quantize)
    check_float32(model, "LiteRT")
    built = graphs(model, head, UpdatedSlices(), stream)
    tf = import_tensorflow()
    with tempfile.TemporaryDirectory(prefix="litert-") as folder:
        module = tf.Module()
        for name, function in built.functions.items():
            setattr(module, name, function)
        tf.saved_model.save(module, folder, signatures=built.functions)
        converter = tf.lite.TFLiteConverter.from_saved_model(
            folder, signature_keys=list(built.functions)
        )
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if quantize is not None:
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if quantize == "float16":
            converter.target_spec.supported_types = [tf.float16]
        try:
            with native_stderr_silenced():
                blob = converter.convert()
        except Exception as error:  # the converter's ConverterError lists the missing ops
            raise PortableExportError(_conversion_failure(error, built.stream_missing)) from None
    if notes is not None and stream and built.stream_missing:
        notes.append(f"no `{STREAM_SIGNATURE}` signature: {built.stream_missing}")
    return bytes(blob)


def _conversion_failure(error: Exception, reason: str | None) -> str:
    ops = sorted(set(re.findall(r"\btf\.([A-Z]\w+)", str(error))))
    missing = ", ".join(ops) if ops else (str(error).strip().splitlines() or [""])[0][:200]
    where = f"; {reason}" if reason else ""
    return (
        f"the model's graph needs TensorFlow ops LiteRT has no builtins for ({missing}){where}: "
        "export it as a SavedModel (the default --format) instead"
    )


def operators(blob: bytes) -> list[str]:
    """The names of every operator in every subgraph of a `.tflite` (custom ops: their name)."""
    from ai_edge_litert import schema_py_generated as schema

    names = {value: name for name, value in vars(schema.BuiltinOperator).items() if name.isupper()}
    model = schema.Model.GetRootAs(blob, 0)
    codes = []
    for index in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(index)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        custom = code.CustomCode()
        codes.append(custom.decode() if custom else names.get(builtin, str(builtin)))
    found = []
    for index in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(index)
        for position in range(subgraph.OperatorsLength()):
            found.append(codes[subgraph.Operators(position).OpcodeIndex()])
    return found


def write(
    model: keras.Model,
    path: str | os.PathLike,
    head: str,
    stream: bool = True,
    quantize: str | None = None,
    notes: list[str] | None = None,
) -> str:
    """Writes `convert(...)` to `path` atomically (`NAME.partial.tflite`, then renamed).

    Returns:
        `path` as a string.
    """
    blob = convert(model, head, stream, quantize, notes)
    write_atomically(path, blob)
    return os.fspath(path)


def signature_details(blob: bytes) -> dict[str, Any]:
    """`{signature: {"inputs": [...], "outputs": [...]}}` of a `.tflite`, without running it."""
    from ai_edge_litert.interpreter import Interpreter

    return dict(Interpreter(model_content=blob).get_signature_list())
