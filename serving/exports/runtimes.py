"""Exported models run in LiteRT and ONNX Runtime with the SavedModel's contract.

`LiteRTModel(path)` and `OnnxModel(folder)` load what `serving.export
--format litert|onnx` wrote and answer `run(signature, **inputs)` with the
outputs named as the SavedModel's: `stream` returns the new states under the
names of the state inputs, ready for the next chunk (ONNX's graphs name them
`next_<state>`, as a graph cannot use one name for an input and an output).
`start(batch)` gives the zero states that start a sequence.

Inputs are checked before they reach a runtime, which would answer a wrong
shape with a native error or a crash: a missing or unknown input, a wrong
rank, width or state size, an empty chunk, or different batch sizes raise
`RuntimeInputError`, one line naming the input and what it should be.

`ai_edge_litert` and `onnxruntime` are imported when a model is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving.names import DEFAULT_SIGNATURE, SEQUENCE_INPUT, STATE_PREFIX, STREAM_SIGNATURE

#: ONNX's output name of a new state, from its input's name.
NEXT_PREFIX = "next_"
ONNX_SUFFIX = ".onnx"


class RuntimeInputError(ValueError):
    """Inputs that do not fit an exported signature (one line naming the input)."""


@dataclass(frozen=True)
class InputSpec:
    """An input's name and shape (`None`: any size) as the exported graph declares it."""

    name: str
    shape: tuple[int | None, ...]


def _shape_text(shape: Sequence[int | None]) -> str:
    return "(" + ", ".join("any" if dim is None else str(dim) for dim in shape) + ")"


def check_inputs(
    signature: str, specs: Sequence[InputSpec], inputs: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """`inputs` as float32 arrays in `specs` order, or a `RuntimeInputError`."""
    wanted = [spec.name for spec in specs]
    unknown = sorted(set(inputs) - set(wanted))
    if unknown:
        raise RuntimeInputError(
            f"signature {signature!r} has no input {unknown[0]!r}; its inputs: {', '.join(wanted)}"
        )
    arrays: dict[str, np.ndarray] = {}
    for spec in specs:
        if spec.name not in inputs:
            hint = (
                " (zeros of shape (batch, units) start a sequence)"
                if spec.name.startswith(STATE_PREFIX)
                else ""
            )
            raise RuntimeInputError(
                f"signature {signature!r} needs input {spec.name!r} of shape "
                f"{_shape_text(spec.shape)}{hint}"
            )
        array = np.asarray(inputs[spec.name], dtype=np.float32)
        fits = array.ndim == len(spec.shape) and all(
            want is None or want == got for want, got in zip(spec.shape, array.shape, strict=True)
        )
        if not fits:
            raise RuntimeInputError(
                f"input {spec.name!r} of signature {signature!r} must have shape "
                f"{_shape_text(spec.shape)}, got {tuple(array.shape)}"
            )
        if spec.name == SEQUENCE_INPUT and array.shape[1] == 0:
            raise RuntimeInputError(
                f"input {spec.name!r} of signature {signature!r} has no time steps: "
                "send a chunk of at least one step"
            )
        arrays[spec.name] = array
    batches = {name: array.shape[0] for name, array in arrays.items()}
    if len(set(batches.values())) > 1:
        raise RuntimeInputError(
            f"inputs of signature {signature!r} have different batch sizes: "
            + ", ".join(f"{name} {size}" for name, size in batches.items())
        )
    return arrays


class _Model:
    specs: dict[str, list[InputSpec]]

    @property
    def signatures(self) -> list[str]:
        """The signature names, `serving_default` first."""
        return sorted(self.specs, key=lambda name: name != DEFAULT_SIGNATURE)

    def _check(self, signature: str, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if signature not in self.specs:
            raise RuntimeInputError(
                f"no signature {signature!r}; this export has {', '.join(self.signatures)}"
            )
        return check_inputs(signature, self.specs[signature], inputs)

    def start(self, batch: int = 1) -> dict[str, np.ndarray]:
        """Zero states for the `stream` signature, one `(batch, units)` array each."""
        if STREAM_SIGNATURE not in self.specs:
            raise RuntimeInputError(f"this export has no {STREAM_SIGNATURE!r} signature")
        return {
            spec.name: np.zeros((batch, *(int(dim or 0) for dim in spec.shape[1:])), np.float32)
            for spec in self.specs[STREAM_SIGNATURE]
            if spec.name.startswith(STATE_PREFIX)
        }


class LiteRTModel(_Model):
    """A `.tflite` in `ai_edge_litert`'s interpreter, with no delegate beyond its builtins."""

    def __init__(self, path: str | os.PathLike, threads: int | None = None):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=os.fspath(path), num_threads=threads)
        self.runners = {
            name: self.interpreter.get_signature_runner(name)
            for name in self.interpreter.get_signature_list()
        }
        self.specs = {
            name: [
                InputSpec(key, tuple(None if d < 0 else int(d) for d in detail["shape_signature"]))
                for key, detail in sorted(runner.get_input_details().items())
            ]
            for name, runner in self.runners.items()
        }

    def run(self, signature: str, **inputs: Any) -> dict[str, np.ndarray]:
        """The outputs of `signature` for `inputs` (NumPy arrays or nested lists)."""
        arrays = self._check(signature, inputs)
        return dict(self.runners[signature](**arrays))


class OnnxModel(_Model):
    """The `<signature>.onnx` files of a folder in ONNX Runtime's CPU provider."""

    def __init__(self, folder: str | os.PathLike, threads: int | None = None):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3  # errors only: no notes about the graph on stderr
        if threads:
            options.intra_op_num_threads = threads
        self.sessions = {
            name[: -len(ONNX_SUFFIX)]: onnxruntime.InferenceSession(
                os.path.join(folder, name), options, providers=["CPUExecutionProvider"]
            )
            for name in sorted(os.listdir(folder))
            if name.endswith(ONNX_SUFFIX)
        }
        if not self.sessions:
            raise FileNotFoundError(f"no {ONNX_SUFFIX} files in {os.fspath(folder)!r}")
        self.specs = {
            name: [
                InputSpec(
                    node.name,
                    tuple(dim if isinstance(dim, int) else None for dim in node.shape),
                )
                for node in session.get_inputs()
            ]
            for name, session in self.sessions.items()
        }
        self.outputs = {
            name: [node.name for node in session.get_outputs()]
            for name, session in self.sessions.items()
        }

    def run(self, signature: str, **inputs: Any) -> dict[str, np.ndarray]:
        """The outputs of `signature` for `inputs`, new states named as their inputs."""
        arrays = self._check(signature, inputs)
        names = self.outputs[signature]
        values = self.sessions[signature].run(names, arrays)
        return {_input_name(name): value for name, value in zip(names, values, strict=True)}


def _input_name(output: str) -> str:
    if output.startswith(NEXT_PREFIX + STATE_PREFIX):
        return output[len(NEXT_PREFIX) :]
    return output


def next_name(state: str) -> str:
    """The ONNX output name of the new value of state input `state`."""
    return NEXT_PREFIX + state
