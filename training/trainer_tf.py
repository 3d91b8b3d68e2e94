"""The TensorFlow trainer: any `tf.distribute` strategy, `tf.train` checkpoints.

One custom step (`strategy.run`, `distribute_datasets_from_function`,
`compute_average_loss`) serves every strategy: `model.fit` fails under
MultiWorkerMirroredStrategy (keras-team/keras#20585).
"""

import os
import tempfile

import numpy as np
import tensorflow as tf

from training import distribution
from training.objectives import per_example_correct, per_example_loss
from training.tasks import TrainingBatches
from training.trainers import check_batch_size


def training_dataset(batches, start_step=0, num_replicas=1, replica_ids=(0,)):
    """`TrainingBatches` from `start_step` on as an endless `tf.data.Dataset`.

    Args:
        batches: A `training.tasks.TrainingBatches`.
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
    """Trains under a `tf.distribute.Strategy` (see `training.trainers`)."""

    def __init__(
        self,
        task,
        build,
        inputs,
        targets,
        *,
        strategy,
        batch_size,
        seed,
        checkpoint_dir=None,
        jit_compile=False,
    ):
        self.task, self.strategy = task, strategy
        self.replicas = strategy.num_replicas_in_sync
        check_batch_size(batch_size, self.replicas)
        self.batch_size, self.jit_compile = batch_size, jit_compile
        self.batches = TrainingBatches(task, inputs, targets, batch_size, seed)
        self.strategy_name = distribution.strategy_name(strategy)
        self.chief = distribution.is_chief(strategy)
        self.label = distribution.task_label(strategy)
        with strategy.scope():
            self.model, self.optimizer = build()
            self.optimizer.build(self.model.trainable_variables)
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer)
        self.checkpoint_dir = checkpoint_dir
        self.manager = None
        if checkpoint_dir is not None:
            # Every worker saves (the save may synchronize); only the chief keeps its copy.
            own_dir = checkpoint_dir
            if not self.chief:
                own_dir = os.path.join(tempfile.mkdtemp(), self.label)
            self.manager = tf.train.CheckpointManager(self.checkpoint, own_dir, max_to_keep=3)
        self._train_step, self._iterator, self._predict = None, None, None

    def restore(self):
        if self.checkpoint_dir is None:
            return int(self.optimizer.iterations.numpy()), None
        path = tf.train.latest_checkpoint(self.checkpoint_dir)
        if path:
            self.checkpoint.restore(path).assert_existing_objects_matched()
        return int(self.optimizer.iterations.numpy()), path

    def save(self, step):
        if self.manager is not None:
            self.manager.save(checkpoint_number=step)

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
            variables = model.trainable_variables
            gradients = tape.gradient(loss, variables)
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
