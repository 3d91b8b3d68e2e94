"""The JAX and PyTorch trainer: Keras' own train step, NumPy checkpoints.

The model is compiled with the task's loss and accuracy (`training.tasks.objectives`)
and trained with `train_on_batch` on `TrainingBatches`, computed ahead in
threads (NumPy's generators release the GIL). On JAX a
`keras.distribution.DataParallel` splits each global batch over the devices.
Checkpoints are `.npz` files of the model's and the optimizer's variables,
written to a temporary file and renamed; `checkpoint.json` then names the
newest, so a crash at any moment leaves a complete one.
"""

import collections
import concurrent.futures
import json
import os
import zipfile

import keras
import numpy as np

from apputil.files import atomic_path, remove_partials, write_atomically
from training.config import check_batch_size
from training.errors import CheckpointWriteError
from training.tasks.catalog import TrainingBatches
from training.tasks.objectives import per_example_correct, per_example_loss

INDEX = "checkpoint.json"
KEEP = 3


class KerasTrainer:
    """Trains with `model.train_on_batch` (see `training.backends.backend`).

    `backend` is a `training.backends.distributions.JaxBackend` or `TorchBackend`: its
    distribution splits each batch, its cluster is the processes this one trains with.
    """

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
        prefetch=4,
    ):
        del jit_compile  # JAX always compiles the step; PyTorch runs eagerly.
        self.task, self.batch_size = task, batch_size
        self.backend, self.distribution = backend, backend.strategy
        self.strategy_name, self.replicas = backend.strategy_name, backend.replicas
        check_batch_size(batch_size, self.replicas)
        self.chief, self.label, self.distributed = backend.chief, backend.label, backend.distributed
        self.batches = TrainingBatches(task, inputs, targets, batch_size, seed)
        # Each process feeds its own rows of every global batch (the whole batch on one).
        self._rows = backend.process_rows(batch_size)
        self._collective = backend.cluster.losses
        self.checkpoint_dir = checkpoint_dir
        keras.distribution.set_distribution(self.distribution)
        spec = task.spec
        self.model, self.optimizer = build()
        self.model.compile(
            optimizer=self.optimizer,
            loss=lambda y, outputs: per_example_loss(spec, y, outputs),
            metrics=[
                keras.metrics.MeanMetricWrapper(
                    lambda y, outputs: per_example_correct(spec, y, outputs), name="accuracy"
                )
            ],
        )
        self.optimizer.build(self.model.trainable_variables)
        self._pool = concurrent.futures.ThreadPoolExecutor(prefetch)
        self._prefetch = prefetch
        self._pending: collections.deque = collections.deque()
        self._next_step = None

    def restore(self):
        """Loads the newest readable checkpoint (an unreadable one falls back to the one before)."""
        for path in reversed(self._checkpoints()):
            try:
                with np.load(path) as arrays:
                    values = {key: arrays[key] for key in arrays.files}
                pairs = [
                    (variable, values[f"{prefix}/{index}"])
                    for prefix, variables in self._variables().items()
                    for index, variable in enumerate(variables)
                ]
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
                print(f"skipping unreadable checkpoint {path}: {error}")
                continue
            for variable, value in pairs:
                variable.assign(value)
            return self._restored(path)
        return self._restored(None)

    def _restored(self, path):
        step = int(keras.ops.convert_to_numpy(self.optimizer.iterations))
        # Every process must go on from the same step: they read the chief's checkpoints.
        self.backend.cluster.agree(
            step, "the restored step",
            "every process must read the chief's checkpoints: give them a shared --output-dir "
            "or copy the chief's checkpoints/ to each",
        )  # fmt: skip
        return step, path

    def save(self, step):
        if self.checkpoint_dir is None or not self.chief:
            return
        os.makedirs(self.checkpoint_dir, exist_ok=True)
        remove_partials(self.checkpoint_dir)  # left by a save that was killed
        arrays = {
            f"{prefix}/{index}": keras.ops.convert_to_numpy(variable)
            for prefix, variables in self._variables().items()
            for index, variable in enumerate(variables)
        }
        name = f"ckpt-{step}.npz"
        try:
            with atomic_path(os.path.join(self.checkpoint_dir, name)) as partial:
                with open(partial, "wb") as handle:
                    np.savez(handle, **arrays)
        except OSError as error:  # the partial file is gone; the last checkpoint stays
            path = os.path.join(self.checkpoint_dir, name)
            raise CheckpointWriteError(path, error.strerror or str(error)) from None
        index = self._index()
        kept = [n for n in index.get("all", []) if n != name] + [name]
        write_atomically(
            os.path.join(self.checkpoint_dir, INDEX),
            json.dumps({"latest": name, "all": kept[-KEEP:]}) + "\n",
        )
        for old in kept[:-KEEP]:
            try:
                os.remove(os.path.join(self.checkpoint_dir, old))
            except FileNotFoundError:
                pass

    def step(self):
        if self._next_step is None:
            self._next_step = int(keras.ops.convert_to_numpy(self.optimizer.iterations))
        while len(self._pending) < self._prefetch:
            upcoming = self._next_step + len(self._pending)
            self._pending.append(self._pool.submit(self._batch, upcoming))
        x, y = self._pending.popleft().result()
        self._next_step += 1
        with self._collective():
            self.model.reset_metrics()  # a reset of distributed metrics is a collective too
            logs = self.model.train_on_batch(x, y, return_dict=True)
            return float(logs["loss"]), float(logs["accuracy"])

    def _batch(self, step):
        x, y = self.batches(step)
        if self._rows is None:
            return x, y
        return x[self._rows], y[self._rows]

    def predict(self, x):
        with self._collective():
            return self.model.predict_on_batch(x)

    def save_model(self, path):
        """Saves the model as `.keras`, without the compiled task loss (as on TensorFlow)."""
        # The copy lives on this process alone: under the distribution its variables would
        # span every process, and only the chief saves.
        keras.distribution.set_distribution(None)
        try:
            clone = type(self.model).from_config(self.model.get_config())
            clone.set_weights(self.model.get_weights())
            clone.save(path)
        finally:
            keras.distribution.set_distribution(self.distribution)

    def _variables(self):
        return {"model": self.model.weights, "optimizer": self.optimizer.variables}

    def _index(self):
        path = os.path.join(self.checkpoint_dir, INDEX)
        if not os.path.isfile(path):
            return {}
        with open(path) as handle:
            return json.load(handle)

    def _checkpoints(self):
        """Paths of the kept checkpoints, oldest first."""
        if self.checkpoint_dir is None:
            return []
        return [os.path.join(self.checkpoint_dir, name) for name in self._index().get("all", [])]
