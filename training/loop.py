"""The training loop shared by every backend, evaluation and stability diagnostics.

A trainer (`training.trainers`) owns the backend's side: the model, the
optimizer, the batches and the checkpoints. This loop drives it step by step:
logging, TensorBoard scalars, periodic evaluation (the learning curve),
checkpoints, and a clear stop when the loss stops being finite. A checkpoint
is written only of weights that are finite and give a finite loss on the next
batch, so that the newest checkpoint is always one to resume from. SIGTERM and
SIGINT stop the run after the step in progress, with a checkpoint of it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import signal
import threading
import time
import zipfile
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

import keras_antisym
from apputil.files import atomic_path, write_atomically
from training.config import RunConfig
from training.errors import DivergenceError, Interrupted
from training.objectives import per_example_correct, per_example_loss
from training.tasks import evaluation_batches

# A loss this many times the run's first one is reported as unstable (once).
BLOWUP_FACTOR = 10.0


def train(
    trainer: Any,
    config: RunConfig,
    start_step: int,
    *,
    writer: Any,
    log: Callable[[str], object] = print,
    diagnostics: Any = None,
    curve: Any = None,
    best: Any = None,
) -> dict:
    """Runs training steps `start_step .. config.steps - 1`, checkpointing as it goes.

    Args:
        trainer: A `training.trainers` trainer (restored to `start_step`).
        config: The `training.config.RunConfig`: `steps`, `checkpoint_every`
            and `log_every` are read.
        start_step: The first step to run.
        writer: A `training.summaries.ScalarWriter`.
        log: Called with progress lines.
        diagnostics: A `Diagnostics`, or None.
        curve: A `LearningCurve`, or None: evaluated every `curve.every` steps.
        best: A `BestWeights` offered each of the curve's evaluations, or None.

    Returns:
        A summary: steps run, examples/s (excluding the first step, which
        compiles), training wall time, and the last logged loss and accuracy.

    Raises:
        DivergenceError: the loss of a step is not finite, or the weights due
            for a checkpoint are not (the run stops there; its last checkpoint
            is from before).
        Interrupted: SIGTERM or SIGINT arrived; the step in progress was
            finished and checkpointed.
    """
    steps = config.steps
    progress = _Progress(trainer.batch_size, config.log_every, steps, writer, log)
    saved = start_step
    with _stop_signals() as stop:
        for step in range(start_step + 1, steps + 1):
            if step % config.log_every == 0 or step == steps:
                # The rate this step applies (read before it: the schedule's step is the
                # optimizer's count of updates so far).
                writer.scalar("train/learning_rate", current_learning_rate(trainer), step)
            loss, accuracy = trainer.step()
            if not math.isfinite(loss):
                raise _diverged(step, f"the loss is {loss}", saved)
            progress.add(step, loss, accuracy)
            train_seconds = progress.train_seconds()
            # Read once: a signal arriving after the checkpoint's test must wait for the
            # next step, or the run would stop without a checkpoint of this one.
            stopping = bool(stop)
            with progress.paused():  # evaluation and checkpoints are not training time
                if diagnostics is not None and step % diagnostics.every == 0:
                    diagnostics(step, writer, log)
                if curve is not None and (step % curve.every == 0 or step == steps):
                    loss_now, accuracy_now = curve.record(trainer, step, train_seconds, writer, log)
                    if best is not None:
                        best.offer(trainer.model, step, accuracy_now, loss_now)
                if step % config.checkpoint_every == 0 or step == steps or stopping:
                    save_checked(trainer, step, saved)
                    saved = step
                    if trainer.chief:  # the chief writes the outputs
                        if curve is not None:
                            curve.save()
                        if best is not None:
                            best.save()
            if stopping:
                writer.flush()
                raise Interrupted(stop[0], step)
    writer.flush()
    return progress.summary()


def _diverged(step, what, saved):
    last = f"step {saved}" if saved else "none yet"
    return DivergenceError(
        f"training diverged at step {step}: {what}. The last checkpoint ({last}) is from "
        f"before it; lower --learning-rate, set --clipnorm, or lower --epsilon (docs: the "
        f"stable ranges), or resume from it with another --learning-rate and "
        f"--change-on-resume learning_rate."
    )


def save_checked(trainer: Any, step: int, saved: int = 0) -> None:
    """Checkpoints `trainer` at `step` only if its state is one to resume from.

    The model's weights must be finite and small enough that their squares
    are (|w| ≤ √max of their dtype, 1.8e19 in float32: beyond it any product of
    two weights overflows, as after a step with a huge learning rate); the
    optimizer's variables finite; and the model's mean loss on the next
    training batch finite. Raises `DivergenceError` otherwise, leaving the
    previous checkpoint (`saved`) the newest.
    """
    for variable in trainer.model.weights:
        value = keras.ops.convert_to_numpy(variable)
        limit = np.sqrt(np.finfo(value.dtype).max) if value.dtype.kind == "f" else np.inf
        if not np.all(np.abs(value) <= limit):  # NaN fails too
            raise _diverged(step, f"the weight {variable.path} is not finite or beyond {limit:.2g}",
                            saved)  # fmt: skip
    for variable in trainer.optimizer.variables:
        if not np.all(np.isfinite(keras.ops.convert_to_numpy(variable))):
            raise _diverged(step, f"the optimizer variable {variable.path} is not finite", saved)
    x, y = trainer.batches(step)
    loss = keras.ops.convert_to_numpy(per_example_loss(trainer.task.spec, y, trainer.predict(x)))
    if not np.isfinite(np.mean(loss)):
        raise _diverged(step, "its weights give a non-finite loss on the next batch", saved)
    trainer.save(step)


@contextlib.contextmanager
def _stop_signals():
    """Yields a list that SIGTERM or SIGINT fill with the signal's number.

    The handlers are installed only in the main thread (Python delivers signals
    there) and the previous ones are restored afterwards.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {}

    def handler(number, frame):
        received.append(number)

    for number in (signal.SIGTERM, signal.SIGINT):
        previous[number] = signal.signal(number, handler)
    try:
        yield received
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


def current_learning_rate(trainer) -> float:
    """The learning rate `trainer`'s optimizer applies at its next step (its schedule at
    the optimizer's step count)."""
    from keras import ops

    return float(ops.convert_to_numpy(trainer.optimizer.learning_rate))


class _Progress:
    """Windows of steps between log lines, and the clock without the pauses."""

    def __init__(self, batch_size, log_every, steps, writer, log):
        self.batch_size, self.log_every, self.steps = batch_size, log_every, steps
        self.writer, self.log = writer, log
        self.started = self.window_start = time.perf_counter()
        self.timed_from, self.timed_steps, self.pauses = None, 0, 0.0
        self.window = [0.0, 0.0, 0]  # loss sum, accuracy sum, steps
        self.first_loss, self.warned = None, False
        self.count, self.final_loss, self.final_accuracy = 0, None, None

    def add(self, step, loss, accuracy):
        self.count += 1
        if self.timed_from is None:  # the first step compiles: not timed
            self.timed_from, self.first_loss = time.perf_counter(), loss
        else:
            self.timed_steps += 1
        self.window = [self.window[0] + loss, self.window[1] + accuracy, self.window[2] + 1]
        if step % self.log_every == 0 or step == self.steps:
            self._log_window(step)

    def _log_window(self, step):
        elapsed = max(time.perf_counter() - self.window_start, 1e-9)
        loss_sum, accuracy_sum, count = self.window
        loss, accuracy = loss_sum / count, accuracy_sum / count
        rate = count * self.batch_size / elapsed
        self.log(
            f"step {step}/{self.steps} loss {loss:.4f} accuracy {accuracy:.4f} "
            f"{rate:.0f} examples/s"
        )
        for name, value in (("loss", loss), ("accuracy", accuracy),
                            ("examples_per_second", rate)):  # fmt: skip
            self.writer.scalar(f"train/{name}", value, step)
        if not self.warned and loss > BLOWUP_FACTOR * max(self.first_loss, 1e-3):
            self.warned = True
            self.log(
                f"warning: the loss grew from {self.first_loss:.4g} to {loss:.4g} by step "
                f"{step}: training is unstable; lower --learning-rate, set --clipnorm, or "
                f"lower --epsilon (see the README's stable ranges)"
            )
        self.final_loss, self.final_accuracy = loss, accuracy
        self.window, self.window_start = [0.0, 0.0, 0], time.perf_counter()

    @contextlib.contextmanager
    def paused(self):
        start = time.perf_counter()
        try:
            yield
        finally:
            pause = time.perf_counter() - start
            self.pauses += pause
            self.window_start += pause

    def train_seconds(self):
        return time.perf_counter() - self.started - self.pauses

    def summary(self):
        rate = None
        if self.timed_steps:
            timed = time.perf_counter() - self.timed_from - self.pauses
            rate = self.timed_steps * self.batch_size / timed
        return {
            "steps": self.count,
            "examples_per_second": rate,
            "wall_time_seconds": self.train_seconds(),
            "final_loss": self.final_loss,
            "final_accuracy": self.final_accuracy,
        }


def evaluate(
    predict: Callable, task: Any, inputs: Any, targets: Any, batch_size: int, seed: int
) -> tuple[float, float]:
    """Mean loss and accuracy of `predict` (batch -> outputs) over every example of a split."""
    loss, correct = 0.0, 0.0
    for x, y in evaluation_batches(task, inputs, targets, batch_size, seed):
        outputs = predict(x)
        losses = per_example_loss(task.spec, y, outputs)
        hits = per_example_correct(task.spec, y, outputs)
        loss += float(np.sum(keras.ops.convert_to_numpy(losses)))
        correct += float(np.sum(keras.ops.convert_to_numpy(hits)))
    count = len(targets)
    return loss / count, correct / count


class LearningCurve:
    """Accuracy on an evaluation split every `every` steps, against steps and seconds.

    Kept in `path` (JSON, written atomically with the checkpoints); a resumed
    run drops the points after its checkpoint and continues the clock from
    the last point it keeps.

    Args:
        path: The JSON file.
        every: Evaluation period in steps.
        split: The split's name ("validation" or "test").
        examples: `(inputs, targets)` of the split.
        task, batch_size, seed: As for `evaluate`.
    """

    def __init__(self, path, every, split, examples, task, batch_size, seed):
        self.path, self.every, self.split = path, every, split
        self.examples, self.task = examples, task
        self.batch_size, self.seed = batch_size, seed
        self.points = []
        self.seconds_before = 0.0

    def resume(self, start_step):
        """Keeps the points up to `start_step` (the restored checkpoint)."""
        if os.path.isfile(self.path):
            with open(self.path) as handle:
                points = json.load(handle).get("points", [])
            self.points = [p for p in points if p["step"] <= start_step]
        self.seconds_before = self.points[-1]["train_seconds"] if self.points else 0.0

    def record(self, trainer, step, train_seconds, writer, log):
        loss, accuracy = evaluate(
            trainer.predict, self.task, *self.examples, self.batch_size, self.seed
        )
        point = {
            "step": int(step),
            "train_seconds": self.seconds_before + train_seconds,
            f"{self.split}_accuracy": accuracy,
            f"{self.split}_loss": loss,
        }
        self.points = [p for p in self.points if p["step"] < step] + [point]
        writer.scalar(f"{self.split}/accuracy", accuracy, step)
        writer.scalar(f"{self.split}/loss", loss, step)
        log(f"step {step} {self.split}_accuracy {accuracy:.4f} {self.split}_loss {loss:.4f}")
        return loss, accuracy

    def save(self):
        body = {"split": self.split, "every": self.every, "points": self.points}
        write_atomically(self.path, json.dumps(body, indent=1) + "\n")


class BestWeights:
    """The weights of a run's best evaluation on its validation split (`--keep-best`).

    Each evaluation of the learning curve is offered; the one of the highest
    accuracy (the earliest of equal ones) is kept in memory, and written to
    `path` with each checkpoint, after it and like the curve (atomically and
    flushed: a `.npz` of the step, accuracy, loss and weights). So the file
    holds the best of the evaluations up to the newest checkpoint, which is
    where a resumed run goes on from.
    """

    def __init__(self, path):
        self.path = path
        self.step = self.accuracy = self.loss = self.weights = None
        self._unsaved = False

    def resume(self, start_step, log=print):
        """Reads the kept weights, unless they are newer than the restored step `start_step`
        (an older checkpoint was restored): their evaluation is dropped from the curve too."""
        if not os.path.isfile(self.path):
            return
        try:
            with np.load(self.path) as arrays:
                step = int(arrays["step"])
                accuracy, loss = float(arrays["accuracy"]), float(arrays["loss"])
                count = sum(name.startswith("weights/") for name in arrays.files)
                weights = [arrays[f"weights/{index}"] for index in range(count)]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
            log(f"ignoring unreadable best weights {self.path}: {error}")
            return
        if step > start_step:
            log(f"ignoring the best weights of step {step}: the run resumes from step "
                f"{start_step}")  # fmt: skip
            return
        self.step, self.accuracy, self.loss, self.weights = step, accuracy, loss, weights

    def offer(self, model, step, accuracy, loss):
        """Keeps `model`'s weights if `accuracy` beats the best so far."""
        if self.accuracy is not None and not accuracy > self.accuracy:
            return
        self.step, self.accuracy, self.loss = int(step), float(accuracy), float(loss)
        self.weights = [np.array(weight) for weight in model.get_weights()]
        self._unsaved = True

    def save(self):
        """Writes the best weights if they changed since the last save."""
        if not self._unsaved:
            return
        arrays = {f"weights/{index}": weight for index, weight in enumerate(self.weights)}
        arrays.update(step=np.int64(self.step), accuracy=np.float64(self.accuracy),
                      loss=np.float64(self.loss))  # fmt: skip
        with atomic_path(self.path) as partial, open(partial, "wb") as handle:
            np.savez(handle, **arrays)
        self._unsaved = False


class Diagnostics:
    """Stability diagnostics every `every` steps (`keras_antisym.StabilityDiagnostics`).

    Evaluated on a fixed probe of `probe_size` sequences (of the validation
    split when there is one, else of the test split): the Euler
    margin, the eigenvalues of `W - Wᵀ - γI`, the end-to-end Jacobian's
    eigenvalue magnitudes and singular values, and per-layer gradient norms;
    logged as one line, to TensorBoard (`stability/...`) and kept in `latest`.
    """

    def __init__(self, model, task, inputs, targets, every, probe_size=4):
        self.every = every
        count = min(probe_size, len(targets))
        x, y = task.make_batch(inputs[:count], targets[:count], (0, 0))
        probe = (np.asarray(x), np.asarray(y))
        self.callback = keras_antisym.StabilityDiagnostics(
            every, probe_data=probe, loss_fn=functools.partial(per_example_loss, task.spec)
        )
        self.callback.set_model(model)
        self.callback.on_train_begin()
        self.latest = {}

    def __call__(self, step, writer, log):
        self.latest = self.callback.compute()
        for name, value in self.latest.items():
            writer.scalar(name, value, step)
        shown = {
            k.split("/", 1)[1]: v
            for k, v in self.latest.items()
            if k.endswith(("euler_margin", "e2e_eig_abs_mean"))
        }
        log(f"step {step} diagnostics " + " ".join(f"{k}={v:.4g}" for k, v in shown.items()))
