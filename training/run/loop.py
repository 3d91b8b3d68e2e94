"""The training loop shared by every backend: a `Run`, its callbacks, and evaluation.

A trainer (`training.backends.backend`) owns the backend's side: the model,
the optimizer, the batches and the checkpoints. A `Run` drives it step by
step: logging, TensorBoard scalars, and a clear stop when the loss stops being
finite; the rest is done by its callbacks (`training.run.callbacks`): the
learning curve, the best weights, stability diagnostics and checkpoints. A
checkpoint is written only of weights that are finite and give a finite loss
on the next batch, so that the newest checkpoint is always one to resume
from. SIGTERM and SIGINT stop the run after the step in progress, with a
checkpoint of it.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np

from apputil import signals
from training.config import RunConfig
from training.errors import DivergenceError, Interrupted
from training.run.summaries import ScalarWriter
from training.tasks.catalog import evaluation_batches
from training.tasks.objectives import per_example_correct, per_example_loss

# A loss this many times the run's first one is reported as unstable (once).
BLOWUP_FACTOR = 10.0


class Callback:
    """What a `Run` tells the objects that watch it; each method does nothing by default.

    The run calls, in this order: `on_train_begin()` once (after the restore:
    `self.run.start_step` is the first step's predecessor); `on_step_end(step,
    logs)` after each step, in the order of the callbacks, where `logs` holds the
    step's `loss` and `accuracy`, `train_seconds` (training time so far),
    `last` (the run's last step) and `stopping` (a signal arrived), and where a
    callback may add what later ones read (an evaluation's accuracy, or
    `checkpoint: True` once a checkpoint of the step is written); then, on the
    process that writes the outputs and only after a checkpoint, `on_checkpoint
    (step)`, where files that must agree with the checkpoint are written; and
    `on_train_end(summary)` after the last step, where a callback may put
    weights in the model (they are what the run tests) and add to the summary.
    """

    run: Run

    def set_run(self, run: Run) -> None:
        self.run = run

    def on_train_begin(self) -> None:
        pass

    def on_step_end(self, step: int, logs: dict[str, Any]) -> None:
        pass

    def on_checkpoint(self, step: int) -> None:
        pass

    def on_train_end(self, summary: dict[str, Any]) -> None:
        pass


class Run:
    """One run assembled: its config, trainer, writer, logger and callbacks.

    Args:
        config: The `training.config.RunConfig`: its loop's `steps` and
            `log_every` are read here.
        trainer: A trainer (`training.backends.backend`), restored to `start_step`.
        writer: A `training.run.summaries.ScalarWriter` (default: one that writes nothing).
        log: Called with progress lines.
        callbacks: `Callback`s, called in this order.
        start_step: The step the trainer was restored to (0: a new run).
        clock: Seconds of a monotonic clock (default `time.perf_counter`): what the
            log's rates and the summary's times are measured with.

    `saved_step` is the step of the newest checkpoint (`start_step` until a
    callback writes one), named in the error of a run that diverges.
    """

    def __init__(
        self,
        config: RunConfig,
        trainer: Any,
        *,
        writer: ScalarWriter | None = None,
        log: Callable[[str], object] = print,
        callbacks: Sequence[Callback] = (),
        start_step: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.config, self.trainer, self.clock = config, trainer, clock
        self.writer = writer if writer is not None else ScalarWriter(None)
        self.log, self.callbacks = log, tuple(callbacks)
        self.start_step = self.saved_step = start_step
        for callback in self.callbacks:
            callback.set_run(self)

    def diverged(self, step: int, what: str) -> DivergenceError:
        """The error of a run whose step `step` went wrong (`what`)."""
        return _diverged(step, what, self.saved_step)

    def train(self) -> dict[str, Any]:
        """Runs steps `start_step + 1 .. config.loop.steps`; returns a summary.

        Returns:
            Steps run, examples/s (excluding the first step, which compiles),
            training wall time, the last logged loss and accuracy, and what the
            callbacks added at the end.

        Raises:
            DivergenceError: the loss of a step is not finite, or (raised by a
                checkpoint callback) the weights due for a checkpoint are not.
            Interrupted: SIGTERM or SIGINT arrived; the step in progress was
                finished (and checkpointed, by a checkpoint callback).
        """
        trainer, writer, loop = self.trainer, self.writer, self.config.loop
        steps = loop.steps
        for callback in self.callbacks:
            callback.on_train_begin()
        progress = _Progress(trainer.batch_size, loop.log_every, steps, writer, self.log,
                             self.clock)  # fmt: skip
        with signals.recording() as stop:
            for step in range(self.start_step + 1, steps + 1):
                if step % loop.log_every == 0 or step == steps:
                    # The rate this step applies (read before it: the schedule's step is the
                    # optimizer's count of updates so far).
                    writer.scalar("train/learning_rate", current_learning_rate(trainer), step)
                loss, accuracy = trainer.step()
                if not math.isfinite(loss):
                    raise self.diverged(step, f"the loss is {loss}")
                progress.add(step, loss, accuracy)
                # Read once: a signal arriving after the checkpoint's test must wait for the
                # next step, or the run would stop without a checkpoint of this one.
                stopping = bool(stop)
                logs = {
                    "loss": loss, "accuracy": accuracy, "last": step == steps,
                    "stopping": stopping, "train_seconds": progress.train_seconds(),
                }  # fmt: skip
                with progress.paused():  # evaluation and checkpoints are not training time
                    for callback in self.callbacks:
                        callback.on_step_end(step, logs)
                    if logs.get("checkpoint") and trainer.chief:  # the chief writes the outputs
                        for callback in self.callbacks:
                            callback.on_checkpoint(step)
                if stopping:
                    writer.flush()
                    raise Interrupted(stop[0], step)
        writer.flush()
        summary = progress.summary()
        for callback in self.callbacks:
            callback.on_train_end(summary)
        return summary


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


def current_learning_rate(trainer) -> float:
    """The learning rate `trainer`'s optimizer applies at its next step (its schedule at
    the optimizer's step count)."""
    from keras import ops

    return float(ops.convert_to_numpy(trainer.optimizer.learning_rate))


class _Progress:
    """Windows of steps between log lines, and the clock without the pauses."""

    def __init__(self, batch_size, log_every, steps, writer, log, clock):
        self.batch_size, self.log_every, self.steps = batch_size, log_every, steps
        self.writer, self.log, self.clock = writer, log, clock
        self.started = self.window_start = clock()
        self.timed_from, self.timed_steps, self.pauses = None, 0, 0.0
        self.window = [0.0, 0.0, 0]  # loss sum, accuracy sum, steps
        self.first_loss, self.warned = None, False
        self.count, self.final_loss, self.final_accuracy = 0, None, None

    def add(self, step, loss, accuracy):
        self.count += 1
        if self.timed_from is None:  # the first step compiles: not timed
            self.timed_from, self.first_loss = self.clock(), loss
        else:
            self.timed_steps += 1
        self.window = [self.window[0] + loss, self.window[1] + accuracy, self.window[2] + 1]
        if step % self.log_every == 0 or step == self.steps:
            self._log_window(step)

    def _log_window(self, step):
        elapsed = max(self.clock() - self.window_start, 1e-9)
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
        first = self.first_loss if self.first_loss is not None else loss
        if not self.warned and loss > BLOWUP_FACTOR * max(first, 1e-3):
            self.warned = True
            self.log(
                f"warning: the loss grew from {self.first_loss:.4g} to {loss:.4g} by step "
                f"{step}: training is unstable; lower --learning-rate, set --clipnorm, or "
                f"lower --epsilon (see the README's stable ranges)"
            )
        self.final_loss, self.final_accuracy = loss, accuracy
        self.window, self.window_start = [0.0, 0.0, 0], self.clock()

    @contextlib.contextmanager
    def paused(self):
        start = self.clock()
        try:
            yield
        finally:
            pause = self.clock() - start
            self.pauses += pause
            self.window_start += pause

    def train_seconds(self):
        return self.clock() - self.started - self.pauses

    def summary(self):
        rate = None
        if self.timed_steps:
            timed = self.clock() - self.timed_from - self.pauses
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
