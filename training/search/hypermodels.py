"""keras-tuner hypermodels of the training models, over a `training.search.space.SearchSpace`.

`RNNHyperModel` builds a trial's model and trainer as any run is built
(`training.run.experiment.model_of`, `build_trainer`, with the trial's
hyperparameters in the config: `trial_config`), trains it as a
`training.run.loop.Run` on the training split, and scores it on a validation
split carved out of the training data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import keras_tuner

from apputil.errors import invalid
from training.backends import select
from training.backends.backend import Backend
from training.config import MODEL_NAMES, RunConfig
from training.errors import DivergenceError
from training.run import loop
from training.run.callbacks import Checkpoints
from training.run.experiment import build_trainer, model_of


def trial_config(config: RunConfig, hyperparameters: dict[str, Any]) -> RunConfig:
    """`config` with a trial's hyperparameters (`optimizer`, `learning_rate`, `sigma_w`,
    `epsilon`, `gamma`, as far as the trial has them)."""
    kinds = {"optimizer": str, "learning_rate": float, "sigma_w": float, "epsilon": float,
             "gamma": float}  # fmt: skip
    return config.replace(
        **{
            name: kind(hyperparameters[name])
            for name, kind in kinds.items()
            if name in hyperparameters
        }  # fmt: skip
    )


class RNNHyperModel(keras_tuner.HyperModel):
    """A `training.tasks.models` model with its hyperparameters drawn from a `SearchSpace`.

    `build(hp)` declares the space and returns the uncompiled model;
    `fit(hp, model, ...)` trains it as a `training.run.loop.Run` (the optimizer
    `hp["optimizer"]` at `hp["learning_rate"]`, under the run's learning-rate
    schedule), reports to keras-tuner's callbacks as one epoch, and returns
    `{"val_accuracy", "val_loss"}` on the validation split. Settings the
    space does not search (ε and γ of the LSTM) are the config's.

    Args:
        task: A `training.tasks.catalog.Task`.
        config: The `training.config.RunConfig` every trial shares: its model,
            batch size and seed (the same in every trial, so trials differ only
            in their hyperparameters), validation split, momentum, clipnorm,
            schedule, dtype policy, data folder and evaluation batch size.
        space: A `SearchSpace`.
        steps_per_trial: Training steps of a full trial.
        rounds: Hyperband's `max_epochs`: an epoch it asks for is
            `steps_per_trial // rounds` steps.
        backend: What trials train on (default: `training.backends.select.start()`,
            made at the first trial).
        log: Called with progress lines.
    """

    def __init__(
        self,
        task: Any,
        config: RunConfig,
        space: Any,
        steps_per_trial: int = 100,
        rounds: int = 1,
        backend: Backend | None = None,
        log: Callable[[str], object] = print,
    ):
        if config.model.name not in MODEL_NAMES:
            raise invalid("model", f"one of {', '.join(MODEL_NAMES)}", config.model.name)
        fraction = config.loop.validation_fraction
        if not 0 < fraction < 1:
            raise invalid("validation_fraction", "a float in (0, 1)", fraction)
        super().__init__(name=f"{config.model.name}_{task.spec.name}", tunable=True)
        self.task, self.config, self.space, self.backend = task, config, space, backend
        self.steps_per_trial, self.rounds = steps_per_trial, rounds
        self.log = log
        self._data: tuple[Any, Any] | None = None

    def data(self) -> tuple[Any, Any]:
        """`((train_x, train_y), (val_x, val_y))`, loaded once (the chief never needs it)."""
        if self._data is None:
            data_dir = self.config.task.data_dir
            fraction = self.config.loop.validation_fraction
            train, validation = (self.task.examples(split, data_dir, fraction)
                                 for split in ("train", "validation"))  # fmt: skip
            self._data = (train, validation)
        return self._data

    def build(self, hp):
        values = self.space.declare(hp, self.config.model.name)
        return model_of(trial_config(self.config, values), self.task)

    def fit(self, hp, model, *args, epochs=None, initial_epoch=0, callbacks=(), **kwargs):
        """Trains the trial's steps; returns (and reports to `callbacks`) validation metrics.

        Without `epochs` a trial is `steps_per_trial` steps; Hyperband's
        `epochs`/`initial_epoch` are rounds of `steps_per_trial // rounds`
        steps. A trial whose loss stops being finite scores 0.
        """
        unit = max(1, self.steps_per_trial // self.rounds)
        start, stop = (initial_epoch * unit, epochs * unit) if epochs else (0, self.steps_per_trial)
        config = trial_config(self.config, hp.values).replace(
            steps=stop, checkpoint_every=stop, log_every=max(1, stop - start)
        )
        train, (val_x, val_y) = self.data()
        # The run's schedule at the trial's rate, over a full trial (Hyperband's rounds go on
        # along it: the optimizer starts at the round's first step).
        if self.backend is None:
            self.backend = select.start()
        trainer = build_trainer(config, self.task, train, self.backend, model=model,
                                schedule_steps=self.steps_per_trial)  # fmt: skip
        trainer.optimizer.iterations.assign(start)
        for callback in callbacks:
            callback.set_model(model)
        try:
            run = loop.Run(config, trainer, log=self.log, start_step=start,
                           callbacks=[Checkpoints(stop)])  # fmt: skip
            run.train()
            val_loss, val_accuracy = loop.evaluate(
                trainer.predict, self.task, val_x, val_y, config.loop.eval_batch_size,
                config.task.seed,
            )  # fmt: skip
        except DivergenceError as error:
            self.log(f"trial diverged: {error}")
            val_loss, val_accuracy = float("inf"), 0.0
        if not math.isfinite(val_loss):  # keep the trial's metrics JSON-safe
            val_loss = float("inf")
        logs = {"val_accuracy": float(val_accuracy), "val_loss": float(val_loss)}
        for callback in callbacks:  # keras-tuner's: it saves the weights of the best epoch
            callback.on_epoch_end(max(0, (epochs or 1) - 1), logs)
        return logs
