"""`training.backends.trainer_tf` in this process: the step against a NumPy softmax regression, the
checkpoints it keeps and the state file, the fallback past a torn one, leftovers of killed
saves, and the replica slices of the input pipeline."""

import os
import tempfile
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import TrainingByDefault
from training.backends import trainer_tf
from training.backends.strategies import TensorFlowBackend
from training.backends.trainer_tf import TFTrainer, checkpoint_paths, remove_leftovers
from training.tasks import catalog as tasks

BATCH = 16
RATE = 0.5


def _task():
    task = tasks.get_task("digits")
    inputs, targets = task.examples("train")
    return task, inputs, targets


def _build_of(layers=lambda: [keras.layers.Dense(10)]):
    """A trainer's `build`: the flattened sequence through `layers()` (made anew for each
    model), seeded, and SGD. By default a softmax regression: its gradient is known in
    closed form."""

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((64, 1)), keras.layers.Flatten(), *layers()])
        return model, keras.optimizers.SGD(RATE)

    return build


_build = _build_of()


def _batch_norm_then_dense():
    return [keras.layers.BatchNormalization(momentum=0.5), keras.layers.Dense(10)]


def _trainer(checkpoint_dir=None, build=_build, backend=None, **kwargs):
    task, inputs, targets = _task()
    backend = backend or TensorFlowBackend(tf.distribute.get_strategy())
    return TFTrainer(task, build, inputs, targets, backend=backend, batch_size=BATCH, seed=3,
                     checkpoint_dir=checkpoint_dir, **kwargs)  # fmt: skip


def _numpy_step(kernel, bias, x, y):
    """Mean cross-entropy, accuracy and one SGD step of a softmax regression, in float64."""
    x = x.reshape(len(x), -1).astype(np.float64)
    logits = x @ kernel + bias
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    onehot = np.eye(10)[y]
    loss = -(onehot * log_p).sum(axis=1).mean()
    accuracy = (logits.argmax(axis=1) == y).mean()
    delta = (np.exp(log_p) - onehot) / len(x)
    return loss, accuracy, kernel - RATE * x.T @ delta, bias - RATE * delta.sum(axis=0)


@pytest.mark.parametrize("start", [0, 7])
def test_a_step_is_one_sgd_update_on_the_batch_of_the_optimizer_step(start):
    trainer = _trainer()
    trainer.optimizer.iterations.assign(start)  # as after a restore: the batch of that step
    kernel, bias = (w.astype(np.float64) for w in trainer.model.get_weights())
    x, y = trainer.batches(start)
    loss, accuracy, want_kernel, want_bias = _numpy_step(kernel, bias, x, y)
    got_loss, got_accuracy = trainer.step()
    assert isinstance(got_loss, float) and isinstance(got_accuracy, float)
    assert got_loss == pytest.approx(loss, rel=1e-5)
    assert got_accuracy == pytest.approx(accuracy, abs=1e-7)
    new_kernel, new_bias = trainer.model.get_weights()
    np.testing.assert_allclose(new_kernel, want_kernel, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(new_bias, want_bias, rtol=1e-4, atol=1e-6)
    # The next step takes the next batch.
    x, y = trainer.batches(start + 1)
    loss, *_ = _numpy_step(new_kernel.astype(np.float64), new_bias.astype(np.float64), x, y)
    assert trainer.step()[0] == pytest.approx(loss, rel=1e-5)
    assert int(trainer.optimizer.iterations.numpy()) == start + 2
    x = trainer.batches(0)[0][:3]
    np.testing.assert_allclose(trainer.predict(x), trainer.model(x), rtol=1e-6)


def _save_at(trainer, step):
    """Saves with the optimizer at `step` and the bias filled with `step`."""
    trainer.optimizer.iterations.assign(step)
    trainer.model.layers[-1].bias.assign(np.full(10, float(step), "float32"))
    trainer.save(step)


def _files(directory):
    return sorted(os.listdir(directory))


def _checkpoint_files(*steps):
    return [f"ckpt-{n}.{kind}" for n in steps for kind in ("data-00000-of-00001", "index")]


def test_saves_keep_the_newest_three_and_write_the_state_file(tmp_path, monkeypatch):
    flushed, folders = [], []
    monkeypatch.setattr(trainer_tf, "fsync_file", flushed.append)
    monkeypatch.setattr(trainer_tf, "fsync_directory", folders.append)
    trainer = _trainer(str(tmp_path))
    for step in (5, 10, 15, 20):
        _save_at(trainer, step)
    assert _files(tmp_path) == sorted(["checkpoint", *_checkpoint_files(10, 15, 20)])
    assert (tmp_path / "checkpoint").read_text() == (
        'model_checkpoint_path: "ckpt-20"\n'
        'all_model_checkpoint_paths: "ckpt-10"\n'
        'all_model_checkpoint_paths: "ckpt-15"\n'
        'all_model_checkpoint_paths: "ckpt-20"\n'
    )
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-20")
    # Each save flushed its own index and data files before naming them.
    assert sorted(map(os.path.basename, flushed[-2:])) == _checkpoint_files(20)
    assert len(flushed) == 8
    assert folders == [str(tmp_path)] * 4  # the renames TF made into the folder, flushed

    fresh = _trainer(str(tmp_path))
    assert fresh.restore() == (20, str(tmp_path / "ckpt-20"))
    np.testing.assert_array_equal(fresh.model.layers[-1].bias.numpy(), np.full(10, 20.0))


def test_restore_passes_a_torn_checkpoint_and_the_next_save_replaces_it(tmp_path, capsys):
    trainer = _trainer(str(tmp_path))
    for step in (5, 10, 15):
        _save_at(trainer, step)
    data = tmp_path / "ckpt-15.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:10])
    capsys.readouterr()
    fresh = _trainer(str(tmp_path))
    assert fresh.restore() == (10, str(tmp_path / "ckpt-10"))
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"skipping unreadable checkpoint {tmp_path / 'ckpt-15'}: ")
    assert len(line) > len(f"skipping unreadable checkpoint {tmp_path / 'ckpt-15'}: ")
    np.testing.assert_array_equal(fresh.model.layers[-1].bias.numpy(), np.full(10, 10.0))
    _save_at(fresh, 11)  # the torn newer one goes; the older ones stay, up to three in all
    assert _files(tmp_path) == sorted(["checkpoint", *_checkpoint_files(5, 10, 11)])
    assert (tmp_path / "checkpoint").read_text().splitlines()[0] == (
        'model_checkpoint_path: "ckpt-11"'
    )


def test_restore_without_checkpoints_starts_at_the_optimizer_step(tmp_path):
    trainer = _trainer(str(tmp_path / "none-yet"))
    assert trainer.restore() == (0, None)
    assert _trainer().restore() == (0, None)
    trainer.save(3)  # makes the folder
    assert _files(tmp_path / "none-yet") == sorted(["checkpoint", *_checkpoint_files(3)])
    _trainer(None).save(3)  # without a folder: nothing to write, no error


def test_a_new_trainer_removes_what_killed_saves_left_and_nothing_else(tmp_path):
    left = ["ckpt-3_temp", "checkpoint.tmp" + "0123456789abcdef" * 2, "tmp.tmp",
            "tmpk1ll_3d.tmp", "ckpt-4.index.partial"]  # fmt: skip
    kept = ["checkpoint", "ckpt-3.index", "ckpt-3.data-00000-of-00001", "ckpt-x_temp",
            "ckpt-3_temp.bak", "a.tmp" + "0" * 31, "a.tmp" + "g" * 32, "tmp-1.tmp", "xtmp.tmp",
            "tmp.tmpx", "notes.txt"]  # fmt: skip
    (tmp_path / "ckpt-3_temp").mkdir()
    (tmp_path / "ckpt-3_temp" / "part-00000-of-00001.index").write_bytes(b"killed")
    for name in left[1:] + kept:
        (tmp_path / name).write_text("x")
    _trainer(str(tmp_path))
    assert _files(tmp_path) == sorted(kept)
    (tmp_path / left[0]).mkdir()
    (tmp_path / left[2]).write_text("x")
    assert remove_leftovers(str(tmp_path)) == [left[0], left[2]]
    assert remove_leftovers(str(tmp_path / "missing")) == []


def test_checkpoint_paths_are_the_complete_looking_ones_in_step_order(tmp_path):
    for name in (
        "ckpt-10.index",
        "ckpt-9.index",
        "ckpt-100.index",
        "ckpt-7.data-00000-of-00001",
        "ckpt-8.index.partial",
        "xckpt-6.index",
        "ckpt-5.indexx",
        "ckpt-.index",
    ):
        (tmp_path / name).write_text("x")  # fmt: skip
    assert checkpoint_paths(str(tmp_path)) == [str(tmp_path / f"ckpt-{n}") for n in (9, 10, 100)]
    assert checkpoint_paths(None) == []
    assert checkpoint_paths(str(tmp_path / "missing")) == []


def _temporary_folder(tmp_path, monkeypatch):
    """Where `tempfile.mkdtemp` makes its folders for the rest of the test (beside
    `tmp_path`, which the tests use as the chief's checkpoint folder)."""
    folder = tmp_path.parent / f"system-temp-{tmp_path.name}"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return str(folder)


def test_a_worker_that_is_not_the_chief_saves_aside(tmp_path, monkeypatch):
    temporary = _temporary_folder(tmp_path, monkeypatch)
    worker = TensorFlowBackend(tf.distribute.get_strategy())
    worker.chief, worker.label = False, "worker-1"
    (tmp_path / "tmp.tmp").write_text("the chief's to clean")
    trainer = _trainer(str(tmp_path), backend=worker)
    _save_at(trainer, 5)
    assert _files(tmp_path) == ["tmp.tmp"]  # the chief's folder untouched
    aside = trainer._save_dir
    assert os.path.basename(aside) == "worker-1" and not aside.startswith(str(tmp_path))
    # In a fresh temporary folder of its own, not beside the process's working folder.
    assert os.path.dirname(os.path.dirname(aside)) == temporary
    assert _files(aside) == sorted(["checkpoint", *_checkpoint_files(5)])


@pytest.mark.parametrize(
    "pipelines, pipeline, replicas, expected",
    [(1, 0, 1, (0,)), (1, 0, 4, (0, 1, 2, 3)), (2, 1, 4, (2, 3)), (4, 2, 4, (2,))],
)
def test_each_input_pipeline_feeds_its_own_replicas(pipelines, pipeline, replicas, expected):
    context = types.SimpleNamespace(num_input_pipelines=pipelines, input_pipeline_id=pipeline)
    assert trainer_tf._replica_ids(context, replicas) == expected


def test_the_dataset_starts_at_the_given_step_whole_batches_on_one_replica():
    task, inputs, targets = _task()
    batches = tasks.TrainingBatches(task, inputs, targets, 8, seed=1)
    got = list(trainer_tf.training_dataset(batches, start_step=5).take(2))
    for (x, y), step in zip(got, (5, 6), strict=True):
        want_x, want_y = batches(step)
        assert x.shape == (8, 64, 1)  # one replica's slice: the whole batch
        np.testing.assert_array_equal(x.numpy(), want_x)
        np.testing.assert_array_equal(y.numpy(), want_y)


def test_save_model_writes_a_keras_file_with_the_weights(tmp_path):
    trainer = _trainer()
    trainer.step()
    path = str(tmp_path / "model.keras")
    trainer.save_model(path)
    loaded = keras.saving.load_model(path)
    for a, b in zip(loaded.get_weights(), trainer.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_old_checkpoint_removed_meanwhile_by_another_process_is_no_error(tmp_path, monkeypatch):
    trainer = _trainer(str(tmp_path))
    for step in (5, 10, 15):
        _save_at(trainer, step)
    remove = os.remove

    def removed_first_by_another(path):
        remove(path)
        raise FileNotFoundError(path)

    monkeypatch.setattr(os, "remove", removed_first_by_another)
    _save_at(trainer, 20)
    monkeypatch.undo()
    assert _files(tmp_path) == sorted(["checkpoint", *_checkpoint_files(10, 15, 20)])


@pytest.mark.parametrize(
    "error, reason",
    [(ValueError("  torn index\nthe rest  "), "torn index"), (OSError(), "OSError"),
     (IndexError(""), "IndexError"), (tf.errors.DataLossError(None, None, "bad crc"), "bad crc")],
)  # fmt: skip
def test_a_skipped_checkpoint_is_named_with_the_first_line_of_why(
    tmp_path, capsys, monkeypatch, error, reason
):
    trainer = _trainer(str(tmp_path))
    for step in (5, 10):
        _save_at(trainer, step)
    read = trainer_tf._read_all

    def torn_newest(path):
        if path.endswith("ckpt-10"):
            raise error
        read(path)

    monkeypatch.setattr(trainer_tf, "_read_all", torn_newest)
    capsys.readouterr()
    assert _trainer(str(tmp_path)).restore() == (5, str(tmp_path / "ckpt-5"))
    assert capsys.readouterr().out == (
        f"skipping unreadable checkpoint {tmp_path / 'ckpt-10'}: {reason}\n"
    )


def test_leftovers_removed_meanwhile_by_another_process_are_no_error(tmp_path, monkeypatch):
    """Two trainers starting on one folder (a restarted job beside a stale one) both clean
    it: what the other removed first is gone, not an error."""
    (tmp_path / "ckpt-3_temp").mkdir()
    (tmp_path / "ckpt-3_temp" / "part-00000-of-00001.index").write_bytes(b"killed")
    (tmp_path / "tmp.tmp").write_text("killed mid-save")
    rmtree, remove = trainer_tf.shutil.rmtree, os.remove

    def rmtree_after_another(path, **kwargs):
        rmtree(path)
        rmtree(path, **kwargs)

    def remove_after_another(path):
        remove(path)
        remove(path)

    monkeypatch.setattr(trainer_tf.shutil, "rmtree", rmtree_after_another)
    monkeypatch.setattr(os, "remove", remove_after_another)
    assert remove_leftovers(str(tmp_path)) == ["ckpt-3_temp", "tmp.tmp"]
    monkeypatch.undo()
    assert _files(tmp_path) == []


def test_predict_runs_the_model_in_inference_mode():
    """With dropout in the model, a training-mode call would drop units at random; a layer
    that trains by default would double its input."""

    def layers():
        return [keras.layers.Dropout(0.5), TrainingByDefault(), keras.layers.Dense(10)]

    trainer = _trainer(build=_build_of(layers))
    x = _task()[1][:8].astype("float32")
    kernel, bias = trainer.model.get_weights()
    want = x.reshape(8, -1) @ kernel + bias  # no unit dropped, none rescaled
    for _ in range(2):
        np.testing.assert_allclose(trainer.predict(x), want, rtol=1e-5, atol=1e-5)


def test_a_step_runs_the_model_in_training_mode():
    """Batch normalization in training mode moves its moving mean toward the batch's mean
    (momentum 0.5: halfway from 0); in inference mode it would leave it at 0."""
    trainer = _trainer(build=_build_of(_batch_norm_then_dense))
    x, _ = trainer.batches(0)
    trainer.step()
    moving_mean = trainer.model.layers[1].moving_mean.numpy()
    want = 0.5 * x.reshape(len(x), -1).astype(np.float64).mean(axis=0)
    np.testing.assert_allclose(moving_mean, want, rtol=1e-5, atol=1e-6)


def test_regularization_losses_join_the_gradient_not_the_reported_loss():
    """An L2 kernel penalty `c·ΣW²` adds `2c·W` to the kernel's gradient; the loss a step
    reports is the task's alone."""
    penalty = 0.01

    def regularized():
        return [keras.layers.Dense(10, kernel_regularizer=keras.regularizers.L2(penalty))]

    trainer = _trainer(build=_build_of(regularized))
    kernel, bias = (w.astype(np.float64) for w in trainer.model.get_weights())
    x, y = trainer.batches(0)
    loss, _, want_kernel, want_bias = _numpy_step(kernel, bias, x, y)
    assert trainer.step()[0] == pytest.approx(loss, rel=1e-5)
    new_kernel, new_bias = trainer.model.get_weights()
    np.testing.assert_allclose(new_kernel, want_kernel - RATE * 2 * penalty * kernel,
                               rtol=1e-4, atol=1e-6)  # fmt: skip
    np.testing.assert_allclose(new_bias, want_bias, rtol=1e-4, atol=1e-6)


def _xla_calls(trainer):
    """`_XlaMustCompile` of each call in the traced training step's graph and functions."""
    graph = trainer._train_step.get_concrete_function(trainer._iterator).graph.as_graph_def()
    nodes = [*graph.node, *(node for f in graph.library.function for node in f.node_def)]
    return [node.attr["_XlaMustCompile"].b for node in nodes if "_XlaMustCompile" in node.attr]


@pytest.mark.parametrize("jit_compile", [False, True])
def test_jit_compile_compiles_the_replica_step_with_xla_and_keeps_the_update(jit_compile):
    # False is left to the default.
    trainer = _trainer(jit_compile=jit_compile) if jit_compile else _trainer()
    assert trainer.jit_compile is jit_compile
    kernel, bias = (w.astype(np.float64) for w in trainer.model.get_weights())
    x, y = trainer.batches(0)
    loss, accuracy, want_kernel, _ = _numpy_step(kernel, bias, x, y)
    assert trainer.step() == pytest.approx((loss, accuracy), rel=1e-5)
    np.testing.assert_allclose(trainer.model.get_weights()[0], want_kernel, rtol=1e-4, atol=1e-6)
    assert _xla_calls(trainer) == ([True] if jit_compile else [])


class _StandInWorker:
    """A `tf.distribute.MultiWorkerMirroredStrategy` worker 1 (`task_type` "worker") without
    its cluster: one replica, the default strategy's scope."""

    num_replicas_in_sync = 1

    def __init__(self):
        self.cluster_resolver = types.SimpleNamespace(task_type="worker", task_id=1)

    def scope(self):
        return tf.distribute.get_strategy().scope()


def test_a_trainer_knows_its_strategy_role_and_label(tmp_path, monkeypatch):
    """What a run records and logs: the public strategy name, whether this process is the
    chief, its label, and whether workers must compare weights."""
    trainer = _trainer(str(tmp_path / "chief"))
    assert (trainer.strategy_name, trainer.chief, trainer.label) == ("default", True, "chief")
    assert trainer.distributed is False
    assert trainer._save_dir == str(tmp_path / "chief")

    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", _StandInWorker)
    temporary = _temporary_folder(tmp_path, monkeypatch)
    task, inputs, targets = _task()
    backend = TensorFlowBackend(_StandInWorker())
    worker = TFTrainer(task, _build, inputs, targets, backend=backend, batch_size=BATCH, seed=3,
                       checkpoint_dir=str(tmp_path / "chief"))  # fmt: skip
    assert (worker.strategy_name, worker.chief, worker.label) == (
        "MultiWorkerMirroredStrategy",
        False,
        "worker1",
    )
    assert worker.distributed is True
    assert os.path.basename(worker._save_dir) == "worker1"
    assert os.path.dirname(os.path.dirname(worker._save_dir)) == temporary


def test_a_restore_brings_back_every_model_variable_the_non_trainable_ones_too(tmp_path):
    """Batch normalization's moving statistics are no optimizer's variables: the checkpoint
    must hold the model itself for them."""
    build = _build_of(_batch_norm_then_dense)
    trained = _trainer(str(tmp_path), build=build)
    trained.step()
    trained.save(1)
    fresh = _trainer(str(tmp_path), build=build)
    assert fresh.restore() == (1, str(tmp_path / "ckpt-1"))
    for a, b in zip(fresh.model.variables, trained.model.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    assert np.abs(fresh.model.layers[1].moving_mean.numpy()).max() > 0  # moved by the step


def test_a_tensorflow_checkpoint_that_cannot_be_written_leaves_no_temporary_folder(
    tmp_path, monkeypatch
):
    """Anywhere: TensorFlow's own write fails after it made its `_temp` folder."""
    from training.errors import CheckpointWriteError

    real_write = tf.train.Checkpoint.write

    def full(self, prefix, *args, **kwargs):
        if not prefix.endswith("-2"):
            return real_write(self, prefix, *args, **kwargs)
        os.makedirs(f"{prefix}_temp")
        with open(f"{prefix}_temp/part-00000-of-00001.data-00000-of-00001.tempstate1", "w"):
            pass
        raise tf.errors.ResourceExhaustedError(
            None, None, "{{function_node __wrapped__SaveV2}} /x/ckpt-2_temp/part.data; No space "
            "left on device [Op:SaveV2]",
        )  # fmt: skip

    monkeypatch.setattr(tf.train.Checkpoint, "write", full)
    trainer = _trainer(str(tmp_path / "ckpt"))
    trainer.save(1)
    with pytest.raises(CheckpointWriteError) as failed:
        trainer.save(2)
    assert str(failed.value) == (
        f"cannot write checkpoint {tmp_path / 'ckpt'}/ckpt-2 (No space left on device); the last "
        f"complete checkpoint is kept: free space and run the same command to resume"
    )
    assert sorted(os.listdir(tmp_path / "ckpt")) == [
        "checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"
    ]  # fmt: skip
