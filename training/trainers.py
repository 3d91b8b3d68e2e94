"""Trainers: one backend's model, optimizer, batches and checkpoints behind one interface.

`make_trainer` returns a `TFTrainer` on the TensorFlow backend (any
`tf.distribute` strategy, TF checkpoints) and a `KerasTrainer` on JAX and
PyTorch (`keras.distribution` data parallelism on JAX, NumPy checkpoints).
Both see the same batches: `training.tasks.TrainingBatches`, a pure function
of `(seed, step)`.

A trainer has `model`, `optimizer`, `batch_size`, `replicas`,
`strategy_name`, `chief`, `label` and `distributed` (several processes), and:

* `restore()`: loads the last complete checkpoint; returns `(step, path)`
  (`(0, None)` when there is none);
* `step()`: trains on the next batch; returns its `(loss, accuracy)`;
* `save(step)`: writes a checkpoint (atomically: a crash leaves the previous one);
* `predict(x)`: the model's outputs for a NumPy batch (inference mode);
* `save_model(path)`: saves the model as `.keras` (uncompiled).
"""

import keras

from training import distribution
from training.trainer_keras import KerasTrainer


def make_trainer(
    task,
    build,
    inputs,
    targets,
    *,
    batch_size,
    seed,
    strategy="auto",
    tpu=None,
    checkpoint_dir=None,
    jit_compile=False,
):
    """A trainer for the current Keras backend.

    Args:
        task: A `training.tasks.Task`.
        build: Called with no arguments (under the strategy's scope or the
            distribution) to return `(model, optimizer)`.
        inputs, targets: The training examples.
        batch_size: The global batch size.
        seed: Seed of the batches.
        strategy: A `training.distribution.STRATEGIES` name, or one already
            made: a `tf.distribute.Strategy` (TensorFlow) or a
            `keras.distribution.Distribution` (JAX).
        tpu: TPU name or address (TensorFlow's `tpu` strategy).
        checkpoint_dir: Where checkpoints live (None: no checkpoints).
        jit_compile: XLA-compile the train step (JAX compiles it always).
    """
    kwargs = dict(
        batch_size=batch_size, seed=seed, checkpoint_dir=checkpoint_dir, jit_compile=jit_compile
    )
    if keras.backend.backend() == "tensorflow":
        from training.trainer_tf import TFTrainer  # imports TensorFlow: only on its backend

        if isinstance(strategy, str):
            strategy = distribution.make(strategy, tpu=tpu)
        return TFTrainer(task, build, inputs, targets, strategy=strategy, **kwargs)
    if isinstance(strategy, str):
        strategy = distribution.make(strategy)
    return KerasTrainer(task, build, inputs, targets, distribution=strategy, **kwargs)
