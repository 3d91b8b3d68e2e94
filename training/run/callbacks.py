"""The callbacks of a `training.run.loop.Run`: checkpoints, the learning curve, the best
weights and stability diagnostics, each one `training.run.loop.Callback`.

A run's folder (`training.run.rundir.RunDir`) names their files; a run
assembled by `training.run.experiment` uses them in this order: diagnostics,
curve, best weights, checkpoints (the best weights read the curve's
evaluation; a checkpoint comes after both, and their files are written with
it).
"""

from __future__ import annotations

import functools
import json
import os
import zipfile
from typing import Any

import numpy as np

import keras_antisym
from apputil.files import atomic_path, write_atomically
from training.run.loop import Callback, evaluate, save_checked
from training.tasks.objectives import per_example_loss


class Checkpoints(Callback):
    """Checkpoints the trainer every `every` steps, at the last step and when stopping.

    Each checkpoint is checked first (`training.run.loop.save_checked`): a
    run whose weights are not finite stops with `DivergenceError`, its newest
    checkpoint from before. Sets `logs["checkpoint"]` after a save.
    """

    def __init__(self, every: int):
        self.every = every

    def on_step_end(self, step: int, logs: dict[str, Any]) -> None:
        if step % self.every == 0 or logs["last"] or logs["stopping"]:
            save_checked(self.run.trainer, step, self.run.saved_step)
            self.run.saved_step = step
            logs["checkpoint"] = True


class LearningCurve(Callback):
    """Accuracy on an evaluation split every `every` steps, against steps and seconds.

    Kept in `path` (JSON, written atomically with the checkpoints); a resumed
    run drops the points after its checkpoint and continues the clock from
    the last point it keeps. Each evaluation adds `<split>_accuracy` and
    `<split>_loss` to the step's logs; at the end the summary's
    `train_seconds` is the last point's.

    Args:
        path: The JSON file.
        every: Evaluation period in steps.
        split: The split's name ("validation" or "test").
        examples: `(inputs, targets)` of the split.
        task, batch_size, seed: As for `training.run.loop.evaluate`.
    """

    def __init__(self, path, every, split, examples, task, batch_size, seed):
        self.path, self.every, self.split = path, every, split
        self.examples, self.task = examples, task
        self.batch_size, self.seed = batch_size, seed
        self.points: list[dict[str, Any]] = []
        self.seconds_before = 0.0

    def on_train_begin(self) -> None:
        self.resume(self.run.start_step)

    def resume(self, start_step: int) -> None:
        """Keeps the points up to `start_step` (the restored checkpoint)."""
        if os.path.isfile(self.path):
            with open(self.path) as handle:
                points = json.load(handle).get("points", [])
            self.points = [p for p in points if p["step"] <= start_step]
        self.seconds_before = self.points[-1]["train_seconds"] if self.points else 0.0

    def on_step_end(self, step: int, logs: dict[str, Any]) -> None:
        if step % self.every and not logs["last"]:
            return
        run = self.run
        inputs, targets = self.examples
        loss, accuracy = evaluate(
            run.trainer.predict, self.task, inputs, targets, self.batch_size, self.seed
        )
        point = {
            "step": int(step),
            "train_seconds": self.seconds_before + logs["train_seconds"],
            f"{self.split}_accuracy": accuracy,
            f"{self.split}_loss": loss,
        }
        self.points = [p for p in self.points if p["step"] < step] + [point]
        run.writer.scalar(f"{self.split}/accuracy", accuracy, step)
        run.writer.scalar(f"{self.split}/loss", loss, step)
        run.log(f"step {step} {self.split}_accuracy {accuracy:.4f} {self.split}_loss {loss:.4f}")
        logs[f"{self.split}_accuracy"], logs[f"{self.split}_loss"] = accuracy, loss

    def on_checkpoint(self, step: int) -> None:
        self.save()

    def on_train_end(self, summary: dict[str, Any]) -> None:
        if self.points:
            summary["train_seconds"] = self.points[-1]["train_seconds"]

    def save(self) -> None:
        body = {"split": self.split, "every": self.every, "points": self.points}
        write_atomically(self.path, json.dumps(body, indent=1) + "\n")


class BestWeights(Callback):
    """The weights of a run's best evaluation on its validation split (`--keep-best`).

    Each validation evaluation of the learning curve (`validation_accuracy`
    in a step's logs) is offered; the one of the highest accuracy (the
    earliest of equal ones) is kept in memory, and written to `path` with each
    checkpoint, after it and like the curve (atomically and flushed: a `.npz`
    of the step, accuracy, loss and weights). So the file holds the best of
    the evaluations up to the newest checkpoint, which is where a resumed run
    goes on from. At the end the model gets the kept weights, and the summary
    says which step they are of (`selected_step`, `selected_on`).
    """

    def __init__(self, path):
        self.path = path
        self.step: int | None = None
        self.accuracy: float | None = None
        self.loss: float | None = None
        self.weights: list[np.ndarray] | None = None
        self._unsaved = False

    def on_train_begin(self) -> None:
        self.resume(self.run.start_step, self.run.log)

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

    def on_step_end(self, step: int, logs: dict[str, Any]) -> None:
        if "validation_accuracy" in logs:
            self.offer(self.run.trainer.model, step, logs["validation_accuracy"],
                       logs["validation_loss"])  # fmt: skip

    def offer(self, model, step, accuracy, loss):
        """Keeps `model`'s weights if `accuracy` beats the best so far."""
        if self.accuracy is not None and not accuracy > self.accuracy:
            return
        self.step, self.accuracy, self.loss = int(step), float(accuracy), float(loss)
        self.weights = [np.array(weight) for weight in model.get_weights()]
        self._unsaved = True

    def on_checkpoint(self, step: int) -> None:
        self.save()

    def on_train_end(self, summary: dict[str, Any]) -> None:
        run = self.run
        if self.weights is None:
            run.log(f"no best weights kept in {self.path}: testing the last step's")
            return
        run.trainer.model.set_weights(self.weights)
        run.log(f"testing the weights of step {self.step} (validation_accuracy "
                f"{self.accuracy:.4f})")  # fmt: skip
        summary["selected_step"], summary["selected_on"] = self.step, "validation"

    def save(self):
        """Writes the best weights if they changed since the last save."""
        if not self._unsaved or self.weights is None:
            return
        arrays: dict[str, Any] = {
            f"weights/{index}": weight for index, weight in enumerate(self.weights)
        }
        arrays.update(step=np.int64(self.step or 0), accuracy=np.float64(self.accuracy),
                      loss=np.float64(self.loss))  # fmt: skip
        with atomic_path(self.path) as partial, open(partial, "wb") as handle:
            np.savez(handle, **arrays)
        self._unsaved = False


class Diagnostics(Callback):
    """Stability diagnostics every `every` steps (`keras_antisym.StabilityDiagnostics`).

    Evaluated on a fixed probe of `probe_size` sequences of `(inputs, targets)`
    (the run uses the validation split when there is one, else the test
    split): the Euler margin, the eigenvalues of `W - Wᵀ - γI`, the end-to-end
    Jacobian's eigenvalue magnitudes and singular values, and per-layer
    gradient norms; logged as one line, to TensorBoard (`stability/...`), kept
    in `latest` and, at the end, in the summary's `diagnostics`.
    """

    def __init__(self, task, inputs, targets, every, probe_size=4):
        self.every = every
        count = min(probe_size, len(targets))
        x, y = task.make_batch(inputs[:count], targets[:count], (0, 0))
        self.probe = (np.asarray(x), np.asarray(y))
        self.loss_fn = functools.partial(per_example_loss, task.spec)
        self.latest: dict[str, float] = {}

    def set_run(self, run) -> None:
        super().set_run(run)
        self.callback = keras_antisym.StabilityDiagnostics(
            self.every, probe_data=self.probe, loss_fn=self.loss_fn
        )
        self.callback.set_model(run.trainer.model)
        self.callback.on_train_begin()

    def on_step_end(self, step: int, logs: dict[str, Any]) -> None:
        if step % self.every:
            return
        self.latest = self.callback.compute()
        for name, value in self.latest.items():
            self.run.writer.scalar(name, value, step)
        shown = {
            k.split("/", 1)[1]: v
            for k, v in self.latest.items()
            if k.endswith(("euler_margin", "e2e_eig_abs_mean"))
        }
        self.run.log(
            f"step {step} diagnostics " + " ".join(f"{k}={v:.4g}" for k, v in shown.items())
        )

    def on_train_end(self, summary: dict[str, Any]) -> None:
        summary["diagnostics"] = self.latest
