"""`serving.export`: TensorFlow Serving's layout, named signature, no Keras needed to serve."""

import json
import os
import subprocess
import sys
import types
import warnings

import keras
import numpy as np
import pytest

from serving.exports import versions
from serving.exports.export import build_archive, export_model
from tests.helpers import TrainingByDefault, ended_pid
from tests.limits import limit
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


def test_a_model_with_two_inputs_is_refused_with_one_line_and_nothing_written(capsys):
    from keras_antisym import AntisymmetricRNN

    first, second = keras.Input((STEPS, FEATURES), name="a"), keras.Input((STEPS, 2), name="b")
    joined = keras.layers.Concatenate()([first, second])
    head = keras.layers.Dense(3, name="classification_head")(AntisymmetricRNN(4)(joined))
    path, base = work_dir("two-inputs.keras"), work_dir("two-inputs")
    keras.Model([first, second], head).save(path)
    status, lines = _cli(["--model", path, "--export-base", base, "--version", "1"], capsys)
    assert (status, lines) == (2, [
        "python -m serving.export: error: Received an invalid value for argument `model`, "
        "expected a model with one input of shape (batch, T, m), which the export serves as "
        "`sequence`, got 2 inputs ('a', 'b')."
    ])  # fmt: skip
    assert not os.path.exists(base) or os.listdir(base) == []


def test_cli_writes_a_version_and_refuses_to_overwrite():
    exported("gated")
    keras_path, base = work_dir("gated.keras"), work_dir("cli-export")
    command = [sys.executable, "-m", "serving.export", "--model", keras_path,
               "--export-base", base, "--version", "7"]  # fmt: skip
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=limit(120))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert os.path.isfile(os.path.join(base, "7", "saved_model.pb"))
    again = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                           timeout=limit(120))  # fmt: skip
    assert again.returncode == 2
    assert "argument `version`" in again.stderr.splitlines()[-1]


def test_signature_names_shapes_and_dtypes():
    import tensorflow as tf

    _, base = exported("antisymmetric")
    loaded = tf.saved_model.load(os.path.join(base, "1"))
    assert sorted(loaded.signatures) == ["padded", "serving_default", "stream"]
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
        timeout=limit(120),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    logits = model.predict(x, verbose=0)
    np.testing.assert_allclose(answer["logits"], logits, rtol=1e-5, atol=1e-5)
    probabilities = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(answer["probabilities"], probabilities, rtol=1e-5, atol=1e-6)
    assert answer["class_id"] == logits.argmax(-1).tolist()


# --- Heads: the signature follows the head training recorded in the model ---------------------


def _task_model(task_name, timesteps, variable_length=False):
    """A `training.tasks.models.build_model` model of the task, saved as `.keras` and copied."""
    import dataclasses
    import shutil

    from training.tasks import catalog as tasks
    from training.tasks import models

    task = tasks.get_task(task_name, timesteps=timesteps)
    spec = task.spec
    if variable_length:
        spec = dataclasses.replace(spec, timesteps=None)
    model = models.build_model(spec, "antisymmetric", units=8, seed=3)
    saved = work_dir(f"{task_name}-{variable_length}.keras")
    model.save(saved)
    copied = work_dir("copied", os.path.basename(saved))  # the head survives a copy
    os.makedirs(os.path.dirname(copied), exist_ok=True)
    shutil.copyfile(saved, copied)
    images, labels = task.examples("test")
    x, _ = task.make_batch(images[:4], labels[:4], (0, 0))
    return model, copied, np.asarray(x, "float32")


def _softmax(logits):
    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


@pytest.mark.parametrize(
    "task_name, timesteps, names",
    [
        ("digits", None, ["class_id", "logits", "probabilities"]),
        ("adding", 12, ["value"]),
        ("copy", 24, ["class_ids", "logits", "probabilities"]),
    ],
)
def test_signature_follows_the_recorded_head(task_name, timesteps, names):
    import tensorflow as tf

    model, path, x = _task_model(task_name, timesteps)
    version = export_model(path, work_dir("heads", task_name), 1)
    signature = tf.saved_model.load(version).signatures["serving_default"]
    assert sorted(signature.structured_outputs) == names
    answer = {k: v.numpy() for k, v in signature(sequence=tf.constant(x)).items()}
    outputs = np.asarray(model.predict(x, verbose=0))
    if task_name == "adding":  # regression: one value per example, no softmax
        assert answer["value"].shape == (len(x),)
        np.testing.assert_allclose(answer["value"], outputs[:, 0], rtol=1e-5, atol=1e-5)
        return
    ids = "class_id" if task_name == "digits" else "class_ids"
    assert answer[ids].shape == outputs.shape[:-1]  # (batch,) or (batch, T)
    np.testing.assert_allclose(answer["logits"], outputs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(answer["probabilities"], _softmax(outputs), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(answer[ids], outputs.argmax(-1))


def _unrecorded(output_shape):
    """A model whose output layer records no head (default layer names)."""
    layers = [keras.Input((STEPS, FEATURES)), keras.layers.SimpleRNN(4)]
    if len(output_shape) == 2:
        layers += [keras.layers.Dense(output_shape[1])]
    else:
        layers[1] = keras.layers.SimpleRNN(4, return_sequences=True)
        layers += [keras.layers.Dense(output_shape[2])]
    return keras.Sequential(layers)


@pytest.mark.parametrize(
    "shape, head", [((None, 1), "regression"), ((None, STEPS, 10), "per_step_classification")]
)
def test_a_model_without_a_recorded_head_is_refused_unless_given(shape, head):
    import tensorflow as tf

    model = _unrecorded(shape)
    with pytest.raises(ValueError, match="--head") as error:
        build_archive(model)
    assert "\n" not in str(error.value) and "regression_head" in str(error.value)
    version = export_model(model, work_dir("given", head), 1, head=head)
    outputs = tf.saved_model.load(version).signatures["serving_default"].structured_outputs
    assert ("value" in outputs) == (head == "regression")


def test_a_head_that_does_not_fit_the_outputs_is_refused():
    model, _, _ = _task_model("adding", 12)
    with pytest.raises(ValueError, match="argument `head`.*per_step_classification"):
        build_archive(model, head="per_step_classification")
    with pytest.raises(ValueError, match="argument `head`.*classes >= 2"):
        build_archive(model, head="classification")  # softmax over 1 output is always 1.0


def test_variable_length_needs_a_model_built_without_t():
    import tensorflow as tf

    fixed, _, _ = _task_model("copy", 24)
    with pytest.raises(ValueError, match="argument `variable_length`.*fixed T=24"):
        build_archive(fixed, variable_length=True)
    model, path, x = _task_model("copy", 24, variable_length=True)
    version = export_model(path, work_dir("variable"), 1, variable_length=True)
    signature = tf.saved_model.load(version).signatures["serving_default"]
    assert signature.structured_input_signature[1]["sequence"].shape.as_list() == [None, None, 10]
    for steps in (24, 7):
        answer = signature(sequence=tf.constant(x[:, :steps]))["logits"].numpy()
        expected = np.asarray(model.predict(x[:, :steps], verbose=0))
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-5)


# --- Errors: one line each; concurrent exports; staging folders of dead exports ---------------


def _damaged(kind):
    """A `.keras` file that exists but cannot be loaded, damaged as `kind`."""
    import zipfile

    exported("antisymmetric")
    source = work_dir("antisymmetric.keras")
    path = work_dir(f"damaged-{kind}.keras")
    data = open(source, "rb").read()
    if kind == "random":
        open(path, "wb").write(np.random.default_rng(0).bytes(len(data)))
    elif kind == "truncated":
        open(path, "wb").write(data[: len(data) // 2])
    else:  # a valid zip whose weights file is cut in half
        with zipfile.ZipFile(source) as old, zipfile.ZipFile(path, "w") as new:
            for name in old.namelist():
                content = old.read(name)
                new.writestr(
                    name, content[: len(content) // 2] if name.endswith(".h5") else content
                )
    return path


def _cli(args, capsys):
    """`serving.export.main(args)` in this process: `(status, stderr lines)`."""
    from serving.exports.export import main

    try:
        status = main(args)
    except SystemExit as stop:  # argparse's own errors
        status = stop.code
    return status, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize(
    "kind, message",
    [
        ("random", "not a .keras archive"),
        ("truncated", "not a .keras archive"),
        ("weights", "cannot read model"),
    ],
)
def test_an_unreadable_model_file_is_one_line(kind, message, capsys):
    path = _damaged(kind)
    base = work_dir(f"never-{kind}")
    status, lines = _cli(["--model", path, "--export-base", base, "--version", "1"], capsys)
    assert status == 1 and len(lines) == 1, lines
    assert message in lines[0] and path in lines[0] and "File not found" not in lines[0]
    assert not os.path.exists(base)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--export-base", "x", "--version", "1"], "--model"),  # missing flags
        (["--model", "M", "--version", "1"], "--export-base"),
        (["--model", "M", "--export-base", "x"], "--version"),
        (["--model", "/no/such.keras", "--export-base", "x", "--version", "1"], "`model`"),
        (["--model", "M", "--export-base", "x", "--version", "0"], "`version`"),
        (["--model", "M", "--export-base", "x", "--version", "1", "--head", "x"], "--head"),
        (["--model", "M", "--export-base", "x", "--version", "1", "--variable-length"], "fixed T"),
    ],
)
def test_usage_errors_are_one_line_without_the_usage_text(args, message, capsys):
    exported("antisymmetric")
    args = [work_dir("antisymmetric.keras") if a == "M" else a for a in args]
    args = [work_dir("usage") if a == "x" else a for a in args]
    status, lines = _cli(args, capsys)
    assert status == 2 and len(lines) == 1, lines
    assert message in lines[0] and "usage:" not in lines[0]


def test_a_damaged_weights_file_prints_no_traceback():
    path = _damaged("weights")
    done = subprocess.run(
        [sys.executable, "-m", "serving.export", "--model", path,
         "--export-base", work_dir("never-sub"), "--version", "1"],
        cwd=REPO_ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True, text=True, timeout=limit(120),
    )  # fmt: skip
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "serving.export" in line]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr


def test_a_version_written_meanwhile_is_one_clear_error(monkeypatch):
    """The race of two exports of one version, made deterministic: the other export
    finishes while this one writes its staging folder."""
    import serving.exports.export as export

    model = build_model("antisymmetric")
    base = work_dir("race")
    write = export._write

    def write_then_lose_the_race(archive, staging):
        write(archive, staging)
        monkeypatch.setattr(export, "_write", write)
        export_model(model, base, 1)  # the other exporter wins

    monkeypatch.setattr(export, "_write", write_then_lose_the_race)
    with pytest.raises(export.VersionExistsError) as lost:
        export_model(model, base, 1)
    target = os.path.join(base, "1")
    assert str(lost.value) == (
        "Received an invalid value for argument `version`, expected a version not yet "
        f"exported, got 1 (`{target}` was written by another export meanwhile)."
    )
    assert sorted(os.listdir(base)) == ["1"]  # the loser's staging folder is gone


def test_an_export_is_staged_beside_its_target_named_for_its_version_pid_and_host(monkeypatch):
    """The name `remove_stale_staging` reads to tell a dead exporter's folder."""
    import re

    import serving.exports.export as export

    write, staged = export._write, []

    def recording(archive, staging):
        staged.append(staging)
        write(archive, staging)

    monkeypatch.setattr(export, "_write", recording)
    base = work_dir("staged")
    export_model(build_model("antisymmetric"), base, 3)
    (staging,) = staged
    assert os.path.dirname(staging) == base
    name = os.path.basename(staging)
    assert re.fullmatch(rf"\.tmp-3-{os.getpid()}@{re.escape(versions._host())}-\w+", name), name
    match = versions._STAGING.match(name)
    assert (match["pid"], match["host"]) == (str(os.getpid()), versions._host())
    assert sorted(os.listdir(base)) == ["3"]


def test_two_concurrent_cli_exports_of_one_version():
    exported("gated")
    base = work_dir("concurrent")
    command = [sys.executable, "-m", "serving.export", "--model", work_dir("gated.keras"),
               "--export-base", base, "--version", "3"]  # fmt: skip
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    runs = [subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    results = [(run.wait(timeout=limit(180)), *run.communicate()) for run in runs]
    assert sorted(status for status, _, _ in results) == [0, 2], results
    ((_, _, loser_err),) = [r for r in results if r[0] == 2]
    errors = [line for line in loser_err.splitlines() if "serving.export" in line]
    assert len(errors) == 1 and "argument `version`" in errors[0], loser_err
    assert "Traceback" not in loser_err
    assert sorted(os.listdir(base)) == ["3"]
    import tensorflow as tf

    assert "serving_default" in tf.saved_model.load(os.path.join(base, "3")).signatures


def test_only_stale_staging_folders_are_removed():
    import time

    from serving.exports.versions import _host

    base = work_dir("stale")
    dead = ended_pid()
    host = _host()
    names = {
        f".tmp-1-{dead}@{host}-abc": False,  # killed export: removed
        f".tmp-1-{os.getpid()}@{host}-def": True,  # a live export (this process): kept
        f".tmp-1-{dead}@other_host-ghi": True,  # another machine's: cannot tell, kept
        ".tmp-1-oldlegacy": False,  # an older export's, untouched for 2 hours: removed
        ".tmp-1-newlegacy": True,  # an older export's, just written: kept
    }
    for name in names:
        os.makedirs(os.path.join(base, name, "variables"))
    old = time.time() - 7200
    os.utime(os.path.join(base, ".tmp-1-oldlegacy"), (old, old))
    export_model(build_model("antisymmetric"), base, 2)
    kept = {name for name, keep in names.items() if keep}
    assert set(os.listdir(base)) == kept | {"2"}


def test_build_model_records_every_task_head_and_stays_short():
    import inspect

    from serving.exports.heads import HEAD_NAMES, recorded_head
    from training.tasks import catalog as tasks
    from training.tasks import models

    served = {}
    for name, timesteps in (("digits", None), ("adding", 12), ("copy", 24)):
        spec = tasks.get_task(name, timesteps=timesteps).spec
        served[spec.head] = recorded_head(models.build_model(spec, "lstm", units=4))
    # Training and serving name each head alike: the exporter reads back the task's own.
    assert served == {head: head for head in ("classification", "regression",
                                              "per_step_classification")}  # fmt: skip
    assert set(served.values()) == set(HEAD_NAMES)
    assert len(inspect.getsource(models.build_model).splitlines()) <= 60


def test_an_export_that_cannot_be_written_is_one_line_status_1(capsys):
    exported("antisymmetric")
    blocker = work_dir("a-file")
    open(blocker, "w").close()
    base = os.path.join(blocker, "models")  # under a regular file: cannot be created
    args = ["--model", work_dir("antisymmetric.keras"), "--export-base", base, "--version", "1"]
    status, lines = _cli(args, capsys)
    assert status == 1 and len(lines) == 1, lines
    assert lines[0].startswith("python -m serving.export: error: cannot write the export to")


def _signatures(version_path):
    import tensorflow as tf

    loaded = tf.saved_model.load(version_path)
    return loaded, sorted(loaded.signatures)


def test_cli_in_process_infers_the_head_and_notes_how(capsys):
    exported("antisymmetric")
    keras_path, base = work_dir("antisymmetric.keras"), work_dir("cli-inferred")
    layer = keras.saving.load_model(keras_path, compile=False).layers[-1].name
    status = _cli(["--model", keras_path, "--export-base", base, "--version", "4"], capsys)
    assert status == (0, [
        f"python -m serving.export: note: exported as classification, inferred from output "
        f"layer {layer!r} of shape (None, 10)"
    ])  # fmt: skip
    _, names = _signatures(os.path.join(base, "4"))
    assert names == ["padded", "serving_default", "stream"]


def test_cli_exports_a_recorded_head_without_a_note(capsys):
    _, path, _ = _task_model("digits", None)
    base = work_dir("cli-recorded")
    assert _cli(["--model", path, "--export-base", base, "--version", "1"], capsys) == (0, [])
    assert _signatures(os.path.join(base, "1"))[1] == ["padded", "serving_default", "stream"]


def test_cli_given_head_and_no_extra_signatures(capsys):
    """`--head regression` overrides the inferred classifier (no note: it was given), and
    `--no-stream --no-padded` leave only `serving_default`, whose `value` is the logits."""
    from serving.exports.export import main

    model, _ = exported("antisymmetric")
    keras_path, base = work_dir("antisymmetric.keras"), work_dir("cli-given")
    args = ["--model", keras_path, "--export-base", base, "--version", "5",
            "--head", "regression", "--no-stream", "--no-padded"]  # fmt: skip
    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out == os.path.join(base, "5") + "\n"
    loaded, names = _signatures(os.path.join(base, "5"))
    assert names == ["serving_default"]
    x = digits()[0][:3]
    answer = loaded.signatures["serving_default"](sequence=x)
    assert sorted(answer) == ["value"]
    np.testing.assert_allclose(answer["value"], model.predict(x, verbose=0), atol=1e-5)


def test_cli_stream_flag_alone_keeps_padded(capsys):
    from serving.exports.export import main

    exported("antisymmetric")
    base = work_dir("cli-no-stream")
    args = ["--model", work_dir("antisymmetric.keras"), "--export-base", base, "--version", "6",
            "--head", "classification", "--no-stream"]  # fmt: skip
    assert main(args) == 0
    assert capsys.readouterr().err == ""
    assert _signatures(os.path.join(base, "6"))[1] == ["padded", "serving_default"]


@pytest.mark.parametrize("folder", ["7", "007"])
def test_an_exported_version_is_refused_with_the_folder_that_holds_it(folder, capsys):
    base = work_dir(f"exists-{folder}")
    os.makedirs(os.path.join(base, folder))
    args = ["--model", work_dir("never.keras"), "--export-base", base, "--version", "7"]
    status = _cli(args, capsys)  # the version is checked before the model is read
    assert status == (2, [
        "python -m serving.export: error: Received an invalid value for argument `version`, "
        f"expected a version not yet exported, got 7 (`{os.path.join(base, folder)}` exists)."
    ])  # fmt: skip


@pytest.mark.parametrize(
    "module, lines",
    [("serving.exports.export", ["    python -m serving.export --model runs/x/model.keras \\\n",
                         "        --export-base models/antisym --version 1\n",
                         "--model MODEL path of the trained .keras file",
                         "--export-base EXPORT_BASE base path, e.g. models/antisym",
                         "--version VERSION positive integer version",
                         "--variable-length accept any number of time steps (models built "
                         "with T=None only)", "--no-stream leave out the `stream` signature",
                         "--head {classification,regression,per_step_classification} the "
                         "model's head, for models that do not record it (default: recorded)",
                         "--no-padded leave out the `padded` signature"]),
     ("serving.client", ["    python -m serving.client --url http://127.0.0.1:8501 --model "
                         "antisym predict \\\n"])],
)  # fmt: skip
def test_cli_help_shows_the_module_doc_as_written(module, lines, capsys):
    import importlib

    with pytest.raises(SystemExit) as stop:
        importlib.import_module(module).main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    # The raw formatter keeps the doc's own lines (a command's continuation too); the
    # flags' help is wrapped to the terminal's width.
    for line in lines:
        assert line in out if line.endswith("\n") else line in " ".join(out.split())
    assert importlib.import_module(module).__doc__.splitlines()[0] in out


def test_a_missing_model_file_is_named_whole():
    from serving.exports.export import load_keras_model

    path = work_dir("no", "such.keras")
    with pytest.raises(ValueError) as caught:
        load_keras_model(path)
    assert str(caught.value) == (
        "Received an invalid value for argument `model`, expected an existing .keras file, "
        f"got {path!r}."
    )


@pytest.mark.parametrize(
    "error, said",
    [(ValueError("x" * 400 + "\nsecond line"), "ValueError: " + "x" * 300),
     (KeyError(), "KeyError: "), (OSError("  bad header  \n"), "OSError: bad header")],
)  # fmt: skip
def test_a_model_keras_cannot_load_is_one_line_with_the_first_line_of_why(error, said, monkeypatch):
    from serving.exports import export

    exported("antisymmetric")
    path = work_dir("antisymmetric.keras")

    def refuse(*args, **kwargs):
        raise error

    monkeypatch.setattr(keras.saving, "load_model", refuse)
    with pytest.raises(export.ModelFileError) as caught:
        export.load_keras_model(path)
    assert str(caught.value) == f"cannot read model {path!r}: {said}"


def test_a_compiled_model_loads_uncompiled():
    """Serving needs no loss or optimizer: a training run's compiled `.keras` loads without
    them (a custom loss that cannot be deserialized here would otherwise be needed)."""
    from serving.exports.export import load_keras_model

    model = build_model("antisymmetric")
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(True))
    path = work_dir("compiled.keras")
    model.save(path)
    with warnings.catch_warnings():  # the default also restores the optimizer, partly
        warnings.simplefilter("ignore")
        assert keras.saving.load_model(path).compiled
    loaded = load_keras_model(path)
    assert not loaded.compiled and getattr(loaded, "optimizer", None) is None


def test_the_head_is_read_from_the_layer_that_makes_the_output_not_the_last_listed():
    """A head layer applied twice (a refinement loop) is listed before the layer between
    its calls: the recorded head is the output's own layer."""
    from serving.exports.heads import recorded_head

    inputs = keras.Input((STEPS, FEATURES))
    head = keras.layers.Dense(4, name="regression_head")
    between = keras.layers.Dense(4, name="between")
    model = keras.Model(inputs, head(between(head(keras.layers.SimpleRNN(4)(inputs)))))
    assert model.layers[-1].name == "between"
    assert recorded_head(model) == "regression"
    assert recorded_head(keras.Sequential([keras.Input((STEPS, FEATURES)), keras.layers.GRU(3),
                                           keras.layers.Dense(2)])) is None  # fmt: skip


class _Subclassed(keras.Model):
    """A subclassed model: no `outputs` to read the head from, only its layers."""

    def __init__(self, last_name):
        super().__init__()
        self.rnn = keras.layers.GRU(3)
        self.hidden = keras.layers.Dense(3)
        self.out = keras.layers.Dense(2, name=last_name)

    def call(self, x):
        return self.out(self.hidden(self.rnn(x)))


def test_without_a_single_output_the_head_is_the_last_layer_s():
    from serving.exports.heads import recorded_head

    for name, head in (("classification_head", "classification"), ("dense_out", None)):
        model = _Subclassed(name)
        model(np.zeros((1, STEPS, FEATURES), "float32"))
        assert recorded_head(model) == head
    inputs = keras.Input((STEPS, FEATURES))
    hidden = keras.layers.GRU(3)(inputs)
    first = keras.layers.Dense(2, name="classification_head")(hidden)
    two = keras.Model(inputs, [first, keras.layers.Dense(2, name="other")(hidden)])
    assert recorded_head(two) is None  # two outputs: the last layer, no head of its own
    assert recorded_head(keras.Sequential()) is None


@pytest.mark.parametrize(
    "make, shape",
    [(lambda: keras.Sequential([keras.Input((5,)), keras.layers.Dense(10)]), "(None, 5)"),
     (lambda: keras.Sequential([keras.Input((4, None)), keras.layers.Activation("tanh")]),
      "(None, 4, None)"),
     (lambda: _Subclassed("regression_head"), "None")],
)  # fmt: skip
def test_a_model_without_one_sequence_input_of_known_width_is_refused_naming_its_shape(make, shape):
    """A subclassed model called on nothing yet has no `inputs` at all."""
    with pytest.raises(ValueError) as refused:
        build_archive(make(), head="regression")
    assert str(refused.value) == (
        "Received an invalid value for argument `model`, expected a model with one input of "
        f"shape (batch, T, m) with known m, got input shape {shape}."
    )


def test_variable_length_refusal_names_the_fixed_t():
    model = keras.Sequential([keras.Input((24, FEATURES)), keras.layers.GRU(3),
                              keras.layers.Dense(2, name="regression_head")])  # fmt: skip
    with pytest.raises(ValueError) as refused:
        build_archive(model, variable_length=True)
    assert str(refused.value) == (
        "Received an invalid value for argument `variable_length`, expected a model built with "
        "T=None (any number of time steps), got a model built with a fixed T=24."
    )


def test_an_export_base_that_is_a_file_is_refused_before_anything_is_built():
    base = work_dir("a-file")
    os.makedirs(os.path.dirname(base), exist_ok=True)
    with open(base, "w") as f:
        f.write("not a folder")
    with pytest.raises(ValueError) as refused:
        export_model(build_model("antisymmetric"), base, 1)
    assert str(refused.value) == (
        "Received an invalid value for argument `export_base`, expected a folder, or a path to "
        f"create one, got {base!r}."
    )
    with open(base) as f:
        assert f.read() == "not a folder"


@pytest.mark.parametrize(
    "hostname, host",
    [("node-7.example", "node_7.example"), ("a b/c:d", "a_b_c_d"), ("", "localhost")],
)
def test_the_host_in_a_staging_folder_s_name_is_the_hostname_with_only_word_characters_and_dots(
    hostname, host, monkeypatch
):

    monkeypatch.setattr(versions.socket, "gethostname", lambda: hostname)
    assert versions._host() == host


@pytest.mark.parametrize(
    "message, reason",
    [("  No space left on device\nsecond line", "No space left on device"),
     ("x" * 400, "x" * 300), ("", "")],
)  # fmt: skip
def test_a_tensorflow_write_error_is_one_line_naming_the_base_and_leaves_nothing(
    message, reason, monkeypatch
):
    """TensorFlow's own I/O errors (a full disk) are no `OSError`: they become one
    `ExportWriteError` with the first line of why, at most 300 characters."""
    import tensorflow as tf

    from serving.exports import export

    def fail(self, *args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, message)

    monkeypatch.setattr(type(keras.export.ExportArchive()), "write_out", fail)
    base = work_dir("write-error")
    with pytest.raises(export.ExportWriteError) as failed:
        export_model(build_model("antisymmetric"), base, 1)
    assert str(failed.value) == f"cannot write the export to {base!r}: {reason}"
    assert os.listdir(base) == []  # the staging folder removed


@pytest.mark.parametrize("imported", [False, True])
def test_keras_is_imported_on_tensorflow_unless_it_was_already(imported, monkeypatch):
    """An export needs TensorFlow: a Keras not yet imported gets that backend whatever
    `KERAS_BACKEND` says; one imported already keeps its own (and `build_archive` refuses)."""
    from serving.exports import export

    monkeypatch.setenv("KERAS_BACKEND", "jax")
    if not imported:
        monkeypatch.delitem(sys.modules, "keras")
    backends = []

    def import_keras():
        backends.append(os.environ["KERAS_BACKEND"])
        return keras

    monkeypatch.setattr(export, "import_keras", import_keras)
    assert export._keras() is keras
    assert backends == ["jax" if imported else "tensorflow"]


def test_a_model_off_tensorflow_is_refused_naming_its_backend(monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(ValueError) as refused:
        build_archive(build_model("antisymmetric"))
    assert str(refused.value) == (
        "Received an invalid value for argument `model`, expected a model on the TensorFlow "
        "backend, got backend 'jax' (set KERAS_BACKEND=tensorflow)."
    )


def _ending_in(units, name, per_step=False):
    return keras.Sequential([
        keras.Input((STEPS, FEATURES)), keras.layers.SimpleRNN(4, return_sequences=per_step),
        keras.layers.Dense(units, name=name),
    ])  # fmt: skip


_EXPECTED_HEADS = (
    "a model whose output layer is named for its head (classification_head, regression_head, "
    "per_step_classification_head) as training.tasks.models builds it, or --head "
    "classification|regression|per_step_classification"
)


@pytest.mark.parametrize(
    "units, name, per_step, head, resolved",
    [(2, "scores", False, None,
      ("classification", "inferred from output layer 'scores' of shape (None, 2)")),
     (2, "classification_head", False, None, ("classification", "recorded")),
     (3, "per_step_classification_head", True, None, ("per_step_classification", "recorded")),
     (1, "regression_head", False, None, ("regression", "recorded")),
     (2, "scores", False, "classification", ("classification", "given")),
     (1, "scores", False, "regression", ("regression", "given")),
     (2, "scores", True, "per_step_classification", ("per_step_classification", "given")),
     (1, "scores", False, None,
      f"`model`, expected {_EXPECTED_HEADS}, got output layer 'scores' with output shape "
      "(None, 1)."),
     (2, "scores", True, None,
      f"`model`, expected {_EXPECTED_HEADS}, got output layer 'scores' with output shape "
      f"(None, {STEPS}, 2)."),
     (1, "classification_head", False, None,
      "`head`, expected a model with (batch, classes >= 2) outputs for head 'classification' "
      "(recorded), got output shape (None, 1)."),
     (3, "scores", True, "regression",
      "`head`, expected a model with (batch, k) outputs for head 'regression' (given), got "
      f"output shape (None, {STEPS}, 3)."),
     (1, "scores", True, "per_step_classification",
      "`head`, expected a model with (batch, T, classes >= 2) outputs for head "
      f"'per_step_classification' (given), got output shape (None, {STEPS}, 1)."),
     (2, "scores", False, "softmax",
      "`head`, expected one of classification, regression, per_step_classification, got "
      "'softmax'.")],
)  # fmt: skip
def test_the_head_is_given_recorded_or_inferred_and_must_fit_the_output(
    units, name, per_step, head, resolved
):
    """Classes from 2 on: one class would make a softmax of always 1.0."""
    from serving.exports.heads import resolve_head

    model = _ending_in(units, name, per_step)
    if isinstance(resolved, tuple):
        assert resolve_head(model, head) == resolved
        return
    with pytest.raises(ValueError) as refused:
        resolve_head(model, head)
    assert str(refused.value) == f"Received an invalid value for argument {resolved}"


class _Doubled(keras.layers.Layer):
    """A layer outside Keras: the plans cannot tell that it treats each step alone."""

    def call(self, x):
        return 2.0 * x


def test_an_archive_tries_both_extra_signatures_unless_told_and_notes_why_not():
    model = keras.Sequential([
        keras.Input((STEPS, FEATURES)), _Doubled(name="doubled"), keras.layers.SimpleRNN(4),
        keras.layers.Dense(2, name="classification_head"),
    ])  # fmt: skip
    notes = []
    build_archive(model, notes=notes)
    assert [note.split(":")[0] for note in notes] == [
        "no `stream` signature", "no `padded` signature",
    ]  # fmt: skip
    assert all("layer 'doubled' (_Doubled)" in note for note in notes), notes
    quiet = []
    build_archive(model, stream=False, padded=False, notes=quiet)
    assert quiet == []
    build_archive(model)  # without a list to note them in: no error
    exported_notes = []
    export_model(model, work_dir("noted"), 1, notes=exported_notes)
    assert exported_notes == notes


def test_the_served_function_runs_the_model_in_inference_mode():
    """Dropout at rate 0.5 in training mode would zero about half the units at random; a
    layer that trains by default would double its input."""
    model = keras.Sequential([
        keras.Input((STEPS, FEATURES)), keras.layers.SimpleRNN(16), keras.layers.Dropout(0.5),
        TrainingByDefault(), keras.layers.Dense(3, name="regression_head"),
    ])  # fmt: skip
    import tensorflow as tf

    version = export_model(model, work_dir("inference"), 1, stream=False, padded=False)
    signature = tf.saved_model.load(version).signatures["serving_default"]
    x = np.random.default_rng(0).normal(size=(4, STEPS, FEATURES)).astype("float32")
    served = signature(sequence=tf.constant(x))["value"].numpy()
    np.testing.assert_allclose(served, model(x, training=False), rtol=1e-5, atol=1e-6)


def test_a_subclassed_model_has_no_output_shape_to_fit_a_head():
    from serving.exports.heads import resolve_head

    model = _Subclassed("classification_head")
    model(np.zeros((1, STEPS, FEATURES), "float32"))
    with pytest.raises(ValueError) as refused:
        resolve_head(model)
    assert str(refused.value) == (
        "Received an invalid value for argument `head`, expected a model with (batch, "
        "classes >= 2) outputs for head 'classification' (recorded), got output shape None."
    )
    with pytest.raises(ValueError) as refused:
        resolve_head(keras.Sequential())  # no layer, no output
    assert str(refused.value) == (
        f"Received an invalid value for argument `model`, expected {_EXPECTED_HEADS}, got "
        "output layer None with output shape None."
    )


def test_a_model_outside_keras_functional_api_is_read_from_its_layers_or_its_shape():
    """A wrapper whose outputs carry no Keras history: the head is its last layer's name;
    one with no layers at all is inferred from its output shape alone. An output of
    unknown width has no classes to classify into."""
    from types import SimpleNamespace

    from serving.exports.heads import resolve_head

    def model(width, *layer_names):
        outputs = [SimpleNamespace(shape=(None, width))]  # no `_keras_history`
        layers = [SimpleNamespace(name=name) for name in layer_names]
        return SimpleNamespace(outputs=outputs, **({"layers": layers} if layers else {}))

    assert resolve_head(model(3, "dense", "regression_head")) == ("regression", "recorded")
    assert resolve_head(model(3)) == (
        "classification", "inferred from output layer None of shape (None, 3)"
    )  # fmt: skip
    with pytest.raises(ValueError) as refused:
        resolve_head(model(None, "classification_head"))
    assert str(refused.value) == (
        "Received an invalid value for argument `head`, expected a model with (batch, "
        "classes >= 2) outputs for head 'classification' (recorded), got output shape "
        "(None, None)."
    )


def test_stale_staging_removal_reads_every_entry_and_removes_only_staging_folders(tmp_path):
    from serving.exports.versions import _host, remove_stale_staging

    dead = ended_pid()
    stale = [f".tmp-{version}-{dead}@{_host()}-abc" for version in (1, 2)]
    kept = [".a-notes", f".tmp-3-{dead}@{_host()}-file"]  # another name; a file
    (tmp_path / kept[0]).mkdir()
    (tmp_path / kept[1]).write_text("not a folder")
    for name in stale:
        (tmp_path / name / "variables").mkdir(parents=True)
    assert remove_stale_staging(tmp_path) == stale
    assert sorted(os.listdir(tmp_path)) == kept


def test_a_failed_export_whose_staging_folder_went_meanwhile_raises_its_own_error(monkeypatch):
    """Removing the staging folder never hides why the export stopped."""
    import shutil

    import serving.exports.export as export

    def fail(archive, staging):
        shutil.rmtree(staging)
        raise OSError("the disk went away")

    monkeypatch.setattr(export, "_write", fail)
    base = work_dir("staging-gone")
    with pytest.raises(OSError, match="the disk went away"):
        export_model(build_model("antisymmetric"), base, 1)
    assert os.listdir(base) == []


def test_an_ownerless_staging_folder_is_stale_after_more_than_an_hour(tmp_path, monkeypatch):

    now = 2_000_000_000
    # The module's clock alone (other threads keep the real one).
    monkeypatch.setattr(versions, "time", types.SimpleNamespace(time=lambda: float(now)))
    for name, age in ((".tmp-1-hour", 3600), (".tmp-1-older", 3601)):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (now - age, now - age))
    assert versions.remove_stale_staging(tmp_path) == [".tmp-1-older"]
    assert os.listdir(tmp_path) == [".tmp-1-hour"]


def test_a_stale_folder_removed_meanwhile_by_another_export_is_no_error(tmp_path, monkeypatch):
    import shutil


    dead = ended_pid()
    name = f".tmp-1-{dead}@{versions._host()}-abc"
    (tmp_path / name).mkdir()
    rmtree = shutil.rmtree

    def removed_first_by_another(path, **kwargs):
        rmtree(path)
        rmtree(path, **kwargs)

    monkeypatch.setattr(versions, "shutil", types.SimpleNamespace(rmtree=removed_first_by_another))
    assert versions.remove_stale_staging(tmp_path) == [name]


def test_the_padded_signature_of_a_fixed_length_model_takes_its_t_steps():
    import tensorflow as tf

    version = export_model(build_model("antisymmetric"), work_dir("padded-t"), 1, stream=False)
    _, spec = tf.saved_model.load(version).signatures["padded"].structured_input_signature
    assert spec["sequence"].shape.as_list() == [None, STEPS, FEATURES]
    assert spec["length"].shape.as_list() == [None]
