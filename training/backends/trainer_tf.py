"""The TensorFlow trainer: any `tf.distribute` strategy, `tf.train` checkpoints.

One custom step (`strategy.run`, `distribute_datasets_from_function`,
`compute_average_loss`) serves every strategy: `model.fit` fails under
MultiWorkerMirroredStrategy (keras-team/keras#20585).

Checkpoints are `tf.train.Checkpoint` files `ckpt-N.{index,data-*}` with the
state file `tf.train.latest_checkpoint` reads. A save writes the checkpoint,
flushes it to disk, then replaces the state file atomically and durably, so a
crash at any moment leaves a complete checkpoint named there. `restore` takes
the newest readable checkpoint (skipping a torn one with one line), and a new
trainer first removes what killed saves left behind.
"""

import contextlib
import os
import re
import shutil
import tempfile
from typing import Any

import numpy as np
import tensorflow as tf

from apputil.files import fsync_directory, fsync_file, remove_partials, write_atomically
from training.config import check_batch_size
from training.errors import CheckpointWriteError
from training.tasks.catalog import TrainingBatches
from training.tasks.objectives import per_example_correct, per_example_loss

KEEP = 3
STATE = "checkpoint"  # the state file of tf.train.latest_checkpoint
_CHECKPOINT = re.compile(r"^ckpt-(\d+)\.index$")
# Left by killed saves: TF's sharded-save folder `ckpt-N_temp/`, its atomic-write
# temporaries `checkpoint.tmp<hex>`, and `tmp*.tmp` files of older versions of this code.
_LEFTOVER = re.compile(r"^(ckpt-\d+_temp|.+\.tmp[0-9a-f]{32}|tmp\w*\.tmp)$")


def training_dataset(batches, start_step=0, num_replicas=1, replica_ids=(0,)):
    """`TrainingBatches` from `start_step` on as an endless `tf.data.Dataset`.

    Args:
        batches: A `training.tasks.catalog.TrainingBatches`.
        start_step: The global step of the first batch (resuming).
        num_replicas: Replicas the global batch is split over.
        replica_ids: The replicas this pipeline feeds; it yields their
            `(B / num_replicas)`-row slices of each global batch in order.
    """
    per_replica = batches.batch_size // num_replicas
    x0, y0 = batches(start_step)
    replica_ids = tf.constant(list(replica_ids), tf.int32)

    def global_batch(step):
        x, y = tf.numpy_function(
            lambda s: batches(int(s)), [step], [tf.as_dtype(x0.dtype), tf.as_dtype(y0.dtype)]
        )
        x.set_shape(x0.shape)
        y.set_shape(y0.shape)
        # Rows of the replicas this pipeline feeds, one slice per replica.
        rows = tf.reshape(replica_ids[:, None] * per_replica + tf.range(per_replica)[None, :], [-1])
        shape_x = tf.concat([[len(replica_ids), per_replica], tf.shape(x)[1:]], 0)
        shape_y = tf.concat([[len(replica_ids), per_replica], tf.shape(y)[1:]], 0)
        return (
            tf.reshape(tf.gather(x, rows), shape_x),
            tf.reshape(tf.gather(y, rows), shape_y),
        )

    ds = tf.data.Dataset.range(start_step, np.iinfo(np.int64).max)
    ds = ds.map(global_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.unbatch()  # one element per replica slice
    return ds.prefetch(tf.data.AUTOTUNE)


def _replica_ids(context, replicas):
    per_pipeline = replicas // context.num_input_pipelines
    first = context.input_pipeline_id * per_pipeline
    return tuple(range(first, first + per_pipeline))


class TFTrainer:
    """Trains under the `tf.distribute.Strategy` of a
    `training.backends.strategies.TensorFlowBackend` (see `training.backends.backend`)."""

    def __init__(
        self,
        task,
        build,
        inputs,
        targets,
        *,
        backend,
        batch_size,
        seed,
        checkpoint_dir=None,
        jit_compile=False,
    ):
        self.task, self.strategy = task, backend.strategy
        strategy = self.strategy
        self.replicas = backend.replicas
        check_batch_size(batch_size, self.replicas)
        self.batch_size, self.jit_compile = batch_size, jit_compile
        self.batches = TrainingBatches(task, inputs, targets, batch_size, seed)
        self.strategy_name, self.chief = backend.strategy_name, backend.chief
        self.label, self.distributed = backend.label, backend.distributed
        with strategy.scope():
            self.model, self.optimizer = build()
            self.optimizer.build(self.model.trainable_variables)
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer)
        # `write` saves what is tracked: create the counter `save` would add, so that
        # checkpoints of either kind (older runs used `CheckpointManager.save`) restore
        # with every object matched.
        self.checkpoint.save_counter  # noqa: B018
        self.checkpoint_dir = checkpoint_dir
        self._save_dir = None
        if checkpoint_dir is not None:
            # Every worker saves (the save may synchronize); only the chief keeps its copy.
            self._save_dir = checkpoint_dir
            if not self.chief:
                self._save_dir = os.path.join(tempfile.mkdtemp(), self.label)
            else:
                remove_leftovers(checkpoint_dir)
        self._train_step: Any = None
        self._iterator: Any = None
        self._predict: Any = None

    def restore(self):
        """Loads the newest readable checkpoint (an unreadable one falls back to the one before)."""
        for path in reversed(checkpoint_paths(self.checkpoint_dir)):
            try:
                _read_all(path)
            except (tf.errors.OpError, IndexError, ValueError, OSError) as error:
                reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
                print(f"skipping unreadable checkpoint {path}: {reason}")
                continue
            self.checkpoint.restore(path).assert_existing_objects_matched()
            return int(self.optimizer.iterations.numpy()), path
        return int(self.optimizer.iterations.numpy()), None

    def save(self, step):
        if self._save_dir is None:
            return
        directory = self._save_dir
        os.makedirs(directory, exist_ok=True)
        prefix = os.path.join(directory, f"ckpt-{step}")
        try:
            path = self.checkpoint.write(prefix)
            _fsync_checkpoint(path)
        except (tf.errors.OpError, OSError) as error:  # TensorFlow's I/O errors are no OSError
            _remove_partial(prefix)
            raise CheckpointWriteError(prefix, _reason(error)) from None
        # Older ones stay up to KEEP; newer ones are those restore skipped as unreadable.
        older = [p for p in checkpoint_paths(directory) if _step(p) < step]
        kept = older[-(KEEP - 1) :] + [path]
        names = [os.path.basename(p) for p in kept]
        state = f'model_checkpoint_path: "{names[-1]}"\n' + "".join(
            f'all_model_checkpoint_paths: "{name}"\n' for name in names
        )
        write_atomically(os.path.join(directory, STATE), state)  # fsyncs file and folder
        for old in checkpoint_paths(directory):
            if old not in kept:
                _remove_checkpoint(old)

    def step(self):
        if self._train_step is None:
            self._build_step()
        loss, accuracy = self._train_step(self._iterator)
        return float(loss), float(accuracy)

    def predict(self, x):
        if self._predict is None:
            self._predict = tf.function(lambda x: self.model(x, training=False))
        return self._predict(tf.constant(x))

    def save_model(self, path):
        self.model.save(path)

    def _build_step(self):
        model, optimizer, strategy = self.model, self.optimizer, self.strategy
        spec, batch_size, replicas = self.task.spec, self.batch_size, self.replicas
        start_step = int(optimizer.iterations.numpy())

        def dataset_fn(context):
            return training_dataset(
                self.batches, start_step, replicas, _replica_ids(context, replicas)
            )

        self._iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

        def step_fn(x, y):
            with tf.GradientTape() as tape:
                outputs = model(x, training=True)
                losses = per_example_loss(spec, y, outputs)
                loss = tf.nn.compute_average_loss(losses, global_batch_size=batch_size)
                if model.losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
                # The identity but for a LossScaleOptimizer (mixed_float16), whose
                # apply_gradients unscales and skips a step with non-finite gradients.
                scaled = optimizer.scale_loss(loss)
            variables = model.trainable_variables
            gradients = tape.gradient(scaled, variables)
            optimizer.apply_gradients(zip(gradients, variables, strict=True))
            return tf.reduce_sum(losses), tf.reduce_sum(per_example_correct(spec, y, outputs))

        replica_step = tf.function(step_fn, jit_compile=True) if self.jit_compile else step_fn

        @tf.function
        def train_step(iterator):
            x, y = next(iterator)
            loss_sum, correct_sum = strategy.run(replica_step, args=(x, y))
            total = strategy.reduce(tf.distribute.ReduceOp.SUM, loss_sum, axis=None)
            correct = strategy.reduce(tf.distribute.ReduceOp.SUM, correct_sum, axis=None)
            return total / batch_size, correct / batch_size

        self._train_step = train_step


def checkpoint_paths(directory):
    """Prefixes of the complete-looking checkpoints `ckpt-N` in `directory`, oldest first."""
    if directory is None or not os.path.isdir(directory):
        return []
    steps = sorted(int(m[1]) for m in map(_CHECKPOINT.match, os.listdir(directory)) if m)
    return [os.path.join(directory, f"ckpt-{step}") for step in steps]


def _step(path):
    return int(os.path.basename(path).split("-")[-1])


def remove_leftovers(directory):
    """Deletes what killed saves left in `directory`; returns the names removed."""
    if not os.path.isdir(directory):
        return []
    remove_partials(directory)
    removed = []
    for name in sorted(os.listdir(directory)):
        if _LEFTOVER.match(name):
            path = os.path.join(directory, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
            removed.append(name)
    return removed


def _read_all(path):
    """Reads every tensor of the checkpoint at `path`: raises if any part is torn."""
    reader = tf.train.load_checkpoint(path)
    for key in reader.get_variable_to_shape_map():
        reader.get_tensor(key)


def _checkpoint_files(path):
    directory, prefix = os.path.split(path)
    return [
        os.path.join(directory, name)
        for name in os.listdir(directory)
        if name == f"{prefix}.index" or name.startswith(f"{prefix}.data-")
    ]


def _fsync_checkpoint(path):
    """Flushes the files of the checkpoint at `path` and its folder (TF renames them unflushed)."""
    for name in _checkpoint_files(path):
        fsync_file(name)
    fsync_directory(os.path.dirname(path) or ".")


def _reason(error):
    """The cause in a TensorFlow I/O error: `No space left on device`, not the op and file."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(getattr(error, "message", None) or error).strip()
    text = re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:\w+\]", "", (text.splitlines() or [""])[0])
    return text.rsplit("; ", 1)[-1].strip() or type(error).__name__


def _remove_partial(prefix):
    """Deletes what a failed write of the checkpoint `prefix` left: its files, its `_temp`."""
    shutil.rmtree(f"{prefix}_temp", ignore_errors=True)
    with contextlib.suppress(OSError):
        _remove_checkpoint(prefix)


def _remove_checkpoint(path):
    for name in _checkpoint_files(path):
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)
