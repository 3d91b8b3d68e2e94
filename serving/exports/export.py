r"""Export a trained `.keras` model as a versioned SavedModel for TensorFlow Serving.

    python -m serving.export --model runs/x/model.keras \
        --export-base models/antisym --version 1

writes `models/antisym/1/saved_model.pb` and `models/antisym/1/variables/`. The
`serving_default` signature follows the model's head, recorded by training as the
name of its output layer (`training.tasks.heads.Head.layer_name`):

* classification, `(batch, classes)` logits: `probabilities`, `class_id`, `logits`;
* regression, `(batch, k)`: `value` (`(batch,)` when k = 1);
* per_step_classification, `(batch, T, classes)` logits: `probabilities`,
  `class_ids` (`(batch, T)`) and `logits`.

Two more signatures, where the model allows (`serving.exports.signatures`): `stream`
takes a chunk `sequence` of any length and the recurrent states (`state_*`,
zeros to start) and returns the head's outputs after the chunk and the new
states; `padded` takes `sequence` padded at the end with anything and each
example's `length`. A model that cannot have one is exported without it and a
note says why; `--no-stream` and `--no-padded` leave them out.

`--head` overrides the recorded head. Errors print one line and exit with status 2
(invalid arguments, a version that exists) or 1 (the model cannot be read, the export
cannot be written).

Keras and TensorFlow are imported when a model is loaded or exported, not with
this module. The SavedModel is a TensorFlow graph, so the export sets
`KERAS_BACKEND=tensorflow` when Keras is not imported yet (`build_archive`
refuses a model of another backend).
"""

from __future__ import annotations

import argparse
import os
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from apputil.cli import EXIT_FAILURE, EXIT_USAGE, OneLineParser, run
from apputil.errors import Literal, UsageError, invalid
from apputil.files import write_atomically
from apputil.quiet import import_keras, import_tensorflow
from serving.exports import versions, warmup
from serving.exports.heads import HEAD_NAMES, resolve_head
from serving.exports.litert import QUANTIZATIONS
from serving.exports.signatures import (
    StreamPlanError,
    head_outputs,
    padded_endpoint,
    padded_plan,
    stream_endpoint,
    stream_plan,
)
from serving.exports.steploop import PortableExportError
from serving.exports.versions import VersionExistsError
from serving.names import (
    DEFAULT_SIGNATURE,
    PADDED_SIGNATURE,
    SEQUENCE_INPUT,
    STREAM_SIGNATURE,
)

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

# Staging folders `.tmp-<version>-<pid>@<host>-<random>`; dot-prefixed, because
class ModelFileError(ValueError):
    """The `.keras` file exists but cannot be loaded (exit status 1)."""


class ExportWriteError(OSError):
    """The export could not be written (a full disk, no permission; exit status 1)."""


def _keras(backend: str = "tensorflow") -> ModuleType:
    """Keras on `backend` (unless imported already), with the layers registered."""
    if "keras" not in sys.modules:
        os.environ["KERAS_BACKEND"] = backend
    keras = import_keras()
    import keras_antisym  # noqa: F401  (heavy: Keras; registers the layers for `load_model`)

    return keras


def input_shape(model: keras.Model, variable_length: bool = False) -> tuple[int | None, int]:
    """`(T, m)` of the model's single `(batch, T, m)` input (T None: any length).

    Raises:
        apputil.errors.UsageError: several inputs, another rank, an unknown m, or
            `variable_length` for a model built with a fixed T.
    """
    inputs = getattr(model, "inputs", None) or []
    if len(inputs) > 1:
        names = ", ".join(repr(getattr(each, "name", "?")) for each in inputs)
        raise invalid(
            "model",
            "a model with one input of shape (batch, T, m), which the export serves as `sequence`",
            Literal(f"{len(inputs)} inputs ({names})"),
        )
    shape = tuple(inputs[0].shape) if inputs else None
    if shape is None or len(shape) != 3 or shape[2] is None:
        raise invalid(
            "model",
            "a model with one input of shape (batch, T, m) with known m",
            Literal(f"input shape {shape}"),
        )
    if variable_length and shape[1] is not None:
        raise invalid(
            "variable_length",
            "a model built with T=None (any number of time steps)",
            Literal(f"a model built with a fixed T={shape[1]}"),
        )
    return shape[1], shape[2]


def _input_spec(model: keras.Model, variable_length: bool) -> tf.TensorSpec:
    """The `(batch, T, m)` float32 spec of the model's single input."""
    steps, features = input_shape(model, variable_length)
    tf = import_tensorflow()  # heavy: only an export makes TensorFlow objects
    return tf.TensorSpec([None, steps, features], tf.float32, name=SEQUENCE_INPUT)


def _serve(model: keras.Model, head: str) -> Callable:
    def serve(sequence):
        return head_outputs(model(sequence, training=False), head)

    return serve


def build_archive(
    model: keras.Model,
    variable_length: bool = False,
    head: str | None = None,
    stream: bool = True,
    padded: bool = True,
    notes: list[str] | None = None,
) -> keras.export.ExportArchive:
    """An `ExportArchive` whose `serving_default` maps `sequence` to the head's outputs.

    Beside it, where the model allows (see `serving.exports.signatures`), `stream`
    takes a chunk of any length and the recurrent states and returns the
    head's outputs and the new states, and `padded` takes `(batch, T, m)`
    sequences padded with anything and their `length`.

    Args:
        model: A Keras model from `(batch, T, m)` float32 sequences to the
            outputs of its head (see the module doc).
        variable_length: Boolean, accept any number of time steps instead of
            the model's fixed `T` (only for models built with `T=None`).
        head: One of `HEAD_NAMES`, or None for the head recorded in `model`.
        stream: Boolean, add the `stream` signature if the model can stream.
        padded: Boolean, add the `padded` signature if the model can mask padding.
        notes: Optional list; one line is appended per signature left out and why.

    Returns:
        A `keras.export.ExportArchive` ready for `write_out`.

    Raises:
        apputil.errors.UsageError: the model, `variable_length` or `head` does not fit.
    """
    keras = _keras()
    if keras.backend.backend() != "tensorflow":
        raise invalid(
            "model",
            "a model on the TensorFlow backend",
            Literal(f"backend {keras.backend.backend()!r} (set KERAS_BACKEND=tensorflow)"),
        )
    spec = _input_spec(model, variable_length)
    head, _ = resolve_head(model, head)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(name=DEFAULT_SIGNATURE, fn=_serve(model, head), input_signature=[spec])
    notes = [] if notes is None else notes
    steps, features = spec.shape[1], spec.shape[2]
    for name, wanted, plan, endpoint in (
        (STREAM_SIGNATURE, stream, stream_plan, lambda p: stream_endpoint(p, head, features)),
        (PADDED_SIGNATURE, padded, padded_plan,
         lambda p: padded_endpoint(p, head, steps, features)),
    ):  # fmt: skip
        if not wanted:
            continue
        try:
            fn, signature = endpoint(plan(model))
        except StreamPlanError as error:
            notes.append(f"no `{name}` signature: {error}")
            continue
        archive.add_endpoint(name=name, fn=fn, input_signature=signature)
    return archive


def load_keras_model(path: str | os.PathLike) -> keras.Model:
    """Loads a `.keras` file; any reason it cannot be read becomes one `ModelFileError` line.

    Raises:
        apputil.errors.UsageError: `path` is not a file.
        ModelFileError: the file exists but cannot be loaded.
    """
    if not os.path.isfile(path):
        raise invalid("model", "an existing .keras file", str(path))
    if str(path).endswith(".keras") and not zipfile.is_zipfile(path):
        raise ModelFileError(
            f"cannot read model {str(path)!r}: not a .keras archive (not a zip file)"
        )
    keras = _keras()
    try:
        return keras.saving.load_model(path, compile=False)
    except Exception as error:  # Keras raises anything from a damaged archive
        reason = (str(error).strip().splitlines() or [""])[0][:300]
        raise ModelFileError(
            f"cannot read model {str(path)!r}: {type(error).__name__}: {reason}"
        ) from None


def export_model(
    model: keras.Model | str | os.PathLike,
    export_base: str | os.PathLike,
    version: int,
    variable_length: bool = False,
    head: str | None = None,
    stream: bool = True,
    padded: bool = True,
    notes: list[str] | None = None,
    format: str = "savedmodel",
    quantize: str | None = None,
) -> str:
    """Write `model` to `export_base/<version>` atomically, never over an existing version.

    The export is written to a staging folder beside the target (named
    with this process's pid), flushed to disk and renamed into place, so a
    server watching `export_base` never sees a half-written version. Staging
    folders of exports that died are removed first.

    `format` (`FORMATS`) chooses what the folder holds: a SavedModel with
    TensorFlow Serving's warmup requests (`savedmodel`); `model.tflite` of
    LiteRT's builtin ops (`litert`, see `serving.exports.litert`); or
    `serving_default.onnx` and `stream.onnx` (`onnx`, see `serving.exports.onnxgraphs`).
    LiteRT and ONNX exports have no `padded` signature.

    Args:
        model: A Keras model or the path of a `.keras` file.
        export_base: Folder holding one numbered sub-folder per version.
        version: Positive integer, the version to write.
        variable_length: Boolean, as in `build_archive`.
        head: As in `build_archive`.
        stream: As in `build_archive`.
        padded: As in `build_archive`.
        notes: As in `build_archive`: why a signature was left out.
        format: One of `FORMATS`.
        quantize: None, or (`litert` only) one of `serving.exports.litert.QUANTIZATIONS`.

    Returns:
        The path of the written version folder.

    Raises:
        apputil.errors.UsageError: an invalid argument.
        ModelFileError: an unreadable model file.
        VersionExistsError: the version exists, or another export wrote it meanwhile.
        serving.exports.steploop.PortableExportError: a model LiteRT or ONNX cannot take.
        OSError: the export could not be written.
    """
    writer = _writer(format, quantize)
    target = versions.target(export_base, version)
    if isinstance(model, str | os.PathLike):
        model = load_keras_model(model)
    write = writer(model, _Options(variable_length, head, stream, padded, quantize), notes)
    return versions.write_version(export_base, version, target, write)


FORMATS = ("savedmodel", "litert", "onnx")
#: The Keras backends each format exports from (the model's graph is traced on it).
FORMAT_BACKENDS = {
    "savedmodel": ("tensorflow",),
    "litert": ("tensorflow",),
    "onnx": ("tensorflow", "torch"),
}


@dataclass(frozen=True)
class _Options:
    variable_length: bool
    head: str | None
    stream: bool
    padded: bool
    quantize: str | None


# A format's writer: checks the model, then returns the function that fills the staging folder.
_Writer = Callable[["keras.Model", _Options, "list[str] | None"], Callable[[str], None]]


def _savedmodel(model: keras.Model, options: _Options, notes: list[str] | None) -> Callable:
    archive = build_archive(
        model, options.variable_length, options.head, options.stream, options.padded, notes
    )

    def write(staging: str) -> None:
        _write(archive, staging)
        _write_warmup(staging)

    return write


def _portable_head(model: keras.Model, options: _Options, format: str) -> str:
    """The head of a LiteRT or ONNX export, once the model's backend and input are checked."""
    _check_backend(model, format)
    input_shape(model, options.variable_length)
    head, _ = resolve_head(model, options.head)
    return head


def _litert(model: keras.Model, options: _Options, notes: list[str] | None) -> Callable:
    from serving.exports import litert

    head = _portable_head(model, options, "litert")
    blob = litert.convert(model, head, options.stream, options.quantize, notes)
    return lambda staging: write_atomically(os.path.join(staging, litert.FILE_NAME), blob)


def _onnx(model: keras.Model, options: _Options, notes: list[str] | None) -> Callable:
    from serving.exports import onnxgraphs
    from serving.exports.runtimes import ONNX_SUFFIX

    head = _portable_head(model, options, "onnx")
    models = onnxgraphs.convert(model, head, options.stream, notes)

    def write(staging: str) -> None:
        for name, blob in models.items():
            write_atomically(os.path.join(staging, name + ONNX_SUFFIX), blob)

    return write


_WRITERS: dict[str, _Writer] = {"savedmodel": _savedmodel, "litert": _litert, "onnx": _onnx}


def _writer(format: str, quantize: str | None) -> _Writer:
    """The writer of `format`, once `format` and `quantize` are checked."""
    if format not in _WRITERS:
        raise invalid("format", f"one of {', '.join(FORMATS)}", format)
    if quantize is not None and (format != "litert" or quantize not in QUANTIZATIONS):
        raise invalid(
            "quantize",
            f"None, or with format 'litert' one of {', '.join(QUANTIZATIONS)}",
            Literal(f"{quantize!r} with format {format!r}"),
        )
    return _WRITERS[format]


def _check_backend(model: keras.Model, format: str) -> None:
    keras = _keras()
    backend = keras.backend.backend()
    if backend not in FORMAT_BACKENDS[format]:
        raise invalid(
            "model",
            f"a model on the {' or '.join(FORMAT_BACKENDS[format])} backend for format {format!r}",
            Literal(f"backend {backend!r}"),
        )


def _write_warmup(staging: str) -> None:
    """TensorFlow Serving's warmup requests, one per signature of the written SavedModel."""
    tf = import_tensorflow()
    warmup.write(staging, dict(tf.saved_model.load(staging).signatures))


def _write(archive: keras.export.ExportArchive, staging: str) -> None:
    tf = import_tensorflow()
    try:
        archive.write_out(staging, verbose=False)
    except tf.errors.OpError as error:  # TensorFlow's own I/O errors (a full disk) are no OSError
        reason = (str(error.message).strip().splitlines() or [""])[0][:300]
        base = os.path.dirname(staging)
        raise ExportWriteError(f"cannot write the export to {base!r}: {reason}") from None


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the process exit status."""
    parser = OneLineParser(
        prog="python -m serving.export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", required=True, help="path of the trained .keras file")
    parser.add_argument("--export-base", required=True, help="base path, e.g. models/antisym")
    parser.add_argument("--version", required=True, type=int, help="positive integer version")
    parser.add_argument(
        "--variable-length",
        action="store_true",
        help="accept any number of time steps (models built with T=None only)",
    )
    parser.add_argument(
        "--head",
        choices=HEAD_NAMES,
        help="the model's head, for models that do not record it (default: recorded)",
    )
    parser.add_argument("--no-stream", action="store_true", help="leave out the `stream` signature")
    parser.add_argument("--no-padded", action="store_true", help="leave out the `padded` signature")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="savedmodel",
        help="savedmodel (TensorFlow Serving; default), litert (model.tflite, builtin ops "
        "only) or onnx (serving_default.onnx and stream.onnx)",
    )
    parser.add_argument(
        "--quantize",
        choices=QUANTIZATIONS,
        help="--format litert: float16 weights, or int8 weights with float32 "
        "activations and state (dynamic-int8)",
    )
    parser.add_argument(
        "--backend",
        choices=("tensorflow", "torch"),
        default="tensorflow",
        help="the Keras backend that loads and traces the model (--format onnx: "
        "tf2onnx on tensorflow, torch.onnx on torch; the others: tensorflow)",
    )
    args = parser.parse_args(argv)
    expected: dict[type[BaseException], int] = {
        PortableExportError: EXIT_USAGE,
        ModelFileError: EXIT_FAILURE,
        VersionExistsError: EXIT_USAGE,
        ExportWriteError: EXIT_FAILURE,
    }
    return run(parser.prog, lambda: _export(parser.prog, args), expected)


def _export(prog: str, args: argparse.Namespace) -> None:
    """Checks the version first (before the slow model load), exports, prints the folder."""
    _writer(args.format, args.quantize)  # checks the pair before the slow model load
    if args.backend not in FORMAT_BACKENDS[args.format]:
        raise invalid(
            "backend",
            f"one of {', '.join(FORMAT_BACKENDS[args.format])} for --format {args.format}",
            args.backend,
        )
    versions.target(args.export_base, args.version)
    _keras(args.backend)
    model = load_keras_model(args.model)
    head, how = resolve_head(model, args.head)
    notes: list[str] = []
    try:
        target = export_model(
            model, args.export_base, args.version, args.variable_length, head,
            stream=not args.no_stream, padded=not args.no_padded, notes=notes,
            format=args.format, quantize=args.quantize,
        )  # fmt: skip
    except (UsageError, VersionExistsError, ExportWriteError, PortableExportError):
        raise
    except OSError as error:
        raise ExportWriteError(
            f"cannot write the export to {args.export_base!r}: {error}"
        ) from error
    if how not in ("recorded", "given"):
        print(f"{prog}: note: exported as {head}, {how}", file=sys.stderr)
    for note in notes:
        print(f"{prog}: note: {note}", file=sys.stderr)
    print(target)

