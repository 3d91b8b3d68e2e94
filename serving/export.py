"""Export a trained `.keras` classifier as a versioned SavedModel for TensorFlow Serving.

    python -m serving.export --model runs/x/model.keras \
        --export-base models/antisym --version 1

writes `models/antisym/1/saved_model.pb` and `models/antisym/1/variables/`.
"""

import argparse
import os
import shutil
import sys
import tempfile

# The SavedModel is a TensorFlow graph: the model must be traced by the
# TensorFlow backend whatever the user's default backend is (unless Keras was
# already imported, which `build_archive` checks).
if "keras" not in sys.modules:
    os.environ["KERAS_BACKEND"] = "tensorflow"

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_antisym  # noqa: E402,F401  (registers the layers for `load_model`)

INPUT_NAME = "sequence"
SIGNATURE_NAME = "serving_default"
OUTPUT_NAMES = ("probabilities", "class_id", "logits")


def _input_spec(model, variable_length):
    """The `(batch, T, m)` float32 spec of the model's single input."""
    shape = tuple(model.inputs[0].shape) if getattr(model, "inputs", None) else None
    if shape is None or len(shape) != 3 or shape[2] is None:
        raise ValueError(
            "Received an invalid value for argument `model`, expected a model with one "
            f"input of shape (batch, T, m) with known m, got input shape {shape}"
        )
    steps = None if variable_length else shape[1]
    return tf.TensorSpec([None, steps, shape[2]], tf.float32, name=INPUT_NAME)


def build_archive(model, variable_length=False):
    """An `ExportArchive` whose `serving_default` maps `sequence` to named outputs.

    Args:
        model: A Keras classifier from `(batch, T, m)` float32 sequences to
            `(batch, classes)` logits.
        variable_length: Boolean, accept any number of time steps instead of
            the model's fixed `T` (only for models built with `T=None`).

    Returns:
        A `keras.export.ExportArchive` ready for `write_out`.
    """
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "Received an invalid value for argument `model`, expected a model on the "
            f"TensorFlow backend, got backend {keras.backend.backend()!r} "
            "(set KERAS_BACKEND=tensorflow)"
        )
    spec = _input_spec(model, variable_length)
    archive = keras.export.ExportArchive()
    archive.track(model)

    def serve(sequence):
        logits = tf.cast(model(sequence, training=False), tf.float32)
        return {
            "probabilities": tf.nn.softmax(logits, axis=-1),
            "class_id": tf.argmax(logits, axis=-1, output_type=tf.int64),
            "logits": logits,
        }

    archive.add_endpoint(name=SIGNATURE_NAME, fn=serve, input_signature=[spec])
    return archive


def export_model(model, export_base, version, variable_length=False):
    """Write `model` to `export_base/<version>` atomically, never over an existing version.

    The SavedModel is written to a temporary folder beside the target and
    renamed into place, so a server watching `export_base` never sees a
    half-written version.

    Args:
        model: A Keras model or the path of a `.keras` file.
        export_base: Folder holding one numbered sub-folder per version.
        version: Positive integer, the version to write.
        variable_length: Boolean, as in `build_archive`.

    Returns:
        The path of the written version folder.
    """
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(
            "Received an invalid value for argument `version`, expected a positive "
            f"integer, got {version!r}"
        )
    target = os.path.join(export_base, str(version))
    if os.path.exists(target):
        raise FileExistsError(
            f"Received an invalid value for argument `version`, expected a version not "
            f"yet exported, got {version} (`{target}` exists)"
        )
    if isinstance(model, str | os.PathLike):
        model = keras.saving.load_model(model, compile=False)
    os.makedirs(export_base, exist_ok=True)
    # A dot-prefixed sibling: TensorFlow Serving only loads all-digit names.
    staging = tempfile.mkdtemp(prefix=f".tmp-{version}-", dir=export_base)
    try:
        build_archive(model, variable_length).write_out(staging, verbose=False)
        os.chmod(staging, 0o755)  # mkdtemp makes it 0700; the server may run as another user
        os.rename(staging, target)  # atomic on one filesystem; fails if target appeared
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def main(argv=None):
    """CLI entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="python -m serving.export", description=__doc__)
    parser.add_argument("--model", required=True, help="path of the trained .keras file")
    parser.add_argument("--export-base", required=True, help="base path, e.g. models/antisym")
    parser.add_argument("--version", required=True, type=int, help="positive integer version")
    parser.add_argument(
        "--variable-length",
        action="store_true",
        help="accept any number of time steps (models built with T=None only)",
    )
    args = parser.parse_args(argv)
    if not os.path.isfile(args.model):
        parser.error(
            "Received an invalid value for argument `--model`, expected an existing "
            f".keras file, got {args.model!r}"
        )
    try:
        target = export_model(args.model, args.export_base, args.version, args.variable_length)
    except (ValueError, FileExistsError) as error:
        parser.error(str(error))
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
