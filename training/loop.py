"""The custom training loop shared by every strategy, and evaluation."""

import time

import numpy as np
import tensorflow as tf

from training.objectives import per_example_correct, per_example_loss
from training.tasks import evaluation_dataset, training_dataset


def _replica_ids(context, replicas):
    per_pipeline = replicas // context.num_input_pipelines
    first = context.input_pipeline_id * per_pipeline
    return tuple(range(first, first + per_pipeline))


def train(
    model,
    optimizer,
    strategy,
    task,
    inputs,
    targets,
    batch_size,
    seed,
    start_step,
    steps,
    manager,
    checkpoint_every,
    log_every,
    writer,
    jit_compile=False,
    log=print,
    diagnostics=None,
):
    """Runs training steps `start_step .. steps - 1`, checkpointing as it goes.

    Returns a summary: steps run, examples/s (excluding the first, tracing,
    step), wall time, and the last logged loss and accuracy.
    """
    spec = task.spec
    replicas = strategy.num_replicas_in_sync

    def dataset_fn(context):
        return training_dataset(
            task,
            inputs,
            targets,
            batch_size,
            seed,
            start_step=start_step,
            num_replicas=replicas,
            replica_ids=_replica_ids(context, replicas),
        )

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

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

    @tf.function(jit_compile=jit_compile)
    def replica_step(x, y):
        return step_fn(x, y)

    @tf.function
    def train_step(iterator):
        x, y = next(iterator)
        loss_sum, correct_sum = strategy.run(replica_step if jit_compile else step_fn, args=(x, y))
        total = strategy.reduce(tf.distribute.ReduceOp.SUM, loss_sum, axis=None)
        correct = strategy.reduce(tf.distribute.ReduceOp.SUM, correct_sum, axis=None)
        return total / batch_size, correct / batch_size

    summary = {
        "steps": 0,
        "examples_per_second": 0.0,
        "wall_time_seconds": 0.0,
        "final_loss": None,
        "final_accuracy": None,
    }
    started = time.perf_counter()
    timed_from, timed_steps = None, 0
    window_loss, window_correct, window_count = 0.0, 0.0, 0
    window_start = time.perf_counter()
    step = start_step
    while step < steps:
        loss, accuracy = train_step(iterator)
        step += 1
        summary["steps"] += 1
        if timed_from is None:  # the first step traces the graph: not timed
            timed_from = time.perf_counter()
        else:
            timed_steps += 1
        window_loss += float(loss)
        window_correct += float(accuracy)
        window_count += 1
        if step % log_every == 0 or step == steps:
            elapsed = max(time.perf_counter() - window_start, 1e-9)
            mean_loss = window_loss / window_count
            mean_accuracy = window_correct / window_count
            rate = window_count * batch_size / elapsed
            log(
                f"step {step}/{steps} loss {mean_loss:.4f} accuracy {mean_accuracy:.4f} "
                f"{rate:.0f} examples/s"
            )
            with writer.as_default():
                tf.summary.scalar("train/loss", mean_loss, step=step)
                tf.summary.scalar("train/accuracy", mean_accuracy, step=step)
                tf.summary.scalar("train/examples_per_second", rate, step=step)
            summary["final_loss"], summary["final_accuracy"] = mean_loss, mean_accuracy
            window_loss, window_correct, window_count = 0.0, 0.0, 0
            window_start = time.perf_counter()
        if diagnostics is not None and step % diagnostics.every == 0:
            diagnostics(step, writer, log)
        if step % checkpoint_every == 0 or step == steps:
            manager.save(checkpoint_number=step)
    if timed_steps:
        summary["examples_per_second"] = (
            timed_steps * batch_size / (time.perf_counter() - timed_from)
        )
    summary["wall_time_seconds"] = time.perf_counter() - started
    writer.flush()
    return summary


def evaluate(model, task, inputs, targets, batch_size, seed):
    """Mean loss and accuracy of `model` over every example of a split."""
    spec = task.spec

    @tf.function
    def sums(x, y):
        outputs = model(x, training=False)
        return (
            tf.reduce_sum(per_example_loss(spec, y, outputs)),
            tf.reduce_sum(per_example_correct(spec, y, outputs)),
        )

    loss, correct = 0.0, 0.0
    for x, y in evaluation_dataset(task, inputs, targets, batch_size, seed):
        batch_loss, batch_correct = sums(x, y)
        loss += float(batch_loss)
        correct += float(batch_correct)
    count = len(targets)
    return loss / count, correct / count


class Diagnostics:
    """Stability diagnostics every `every` steps (`keras_antisym.StabilityDiagnostics`).

    Evaluated on a fixed probe of `probe_size` test sequences: the Euler
    margin, the eigenvalues of `W - Wᵀ - γI`, the end-to-end Jacobian's
    eigenvalue magnitudes and singular values, and per-layer gradient norms;
    logged as one line, to TensorBoard (`stability/...`) and kept in `latest`.
    """

    def __init__(self, model, task, inputs, targets, every, probe_size=4):
        import keras

        import keras_antisym

        self.every = every
        count = min(probe_size, len(targets))
        x, y = task.make_batch(inputs[:count], targets[:count], tf.constant([0, 0]))
        probe = (np.asarray(x), np.asarray(y))
        self.callback = keras_antisym.StabilityDiagnostics(every, probe_data=probe)
        self.callback.set_model(model)
        # The callback reads the loss from the model for its gradient norms.
        model.loss = (
            keras.losses.MeanSquaredError()
            if task.spec.head == "regression"
            else keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
        self.callback.on_train_begin()
        self.latest = {}

    def __call__(self, step, writer, log):
        self.latest = self.callback.compute()
        with writer.as_default():
            for name, value in self.latest.items():
                tf.summary.scalar(name, value, step=step)
        shown = {
            k.split("/", 1)[1]: v
            for k, v in self.latest.items()
            if k.endswith(("euler_margin", "e2e_eig_abs_mean"))
        }
        log(f"step {step} diagnostics " + " ".join(f"{k}={v:.4g}" for k, v in shown.items()))
