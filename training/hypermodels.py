"""keras-tuner hypermodels of the training models, over a `training.space.SearchSpace`.

`RNNHyperModel` builds the models of `training.models` and trains a trial with
the custom loop of `training.loop` on the training split, scoring it on a
validation split carved out of the training data.
"""

from __future__ import annotations

import math

import keras_tuner

from apputil.errors import invalid
from training import loop, schedules
from training.config import MODEL_NAMES
from training.errors import DivergenceError
from training.models import build_model
from training.optimizers import make_optimizer
from training.summaries import ScalarWriter
from training.trainers import make_trainer


class RNNHyperModel(keras_tuner.HyperModel):
    """A `training.models` model with its hyperparameters drawn from a `SearchSpace`.

    `build(hp)` declares the space and returns the uncompiled model;
    `fit(hp, model, ...)` trains it with `training.loop.train` (the optimizer
    `hp["optimizer"]` at `hp["learning_rate"]`, under the run's learning-rate
    schedule), reports to keras-tuner's
    callbacks as one epoch, and returns `{"val_accuracy", "val_loss"}` on the
    validation split.

    Args:
        task: A `training.tasks.Task`.
        config: The `training.config.RunConfig` every trial shares: `model`,
            `units`, `batch_size`, `seed` (the same in every trial, so trials
            differ only in their hyperparameters), `validation_fraction`,
            `momentum`, `clipnorm`, the schedule's settings (`lr_schedule`, ...),
            `dtype_policy`, `data_dir` and `eval_batch_size`.
        space: A `SearchSpace`.
        steps_per_trial: Training steps of a full trial.
        rounds: Hyperband's `max_epochs`: an epoch it asks for is
            `steps_per_trial // rounds` steps.
        strategy: What a trial trains under: a `training.distribution.STRATEGIES`
            name, a `tf.distribute.Strategy` or a `keras.distribution.Distribution`.
        log: Called with progress lines.
    """

    def __init__(self, task, config, space, steps_per_trial=100, rounds=1, strategy="default",
                 log=print):  # fmt: skip
        if config.model not in MODEL_NAMES:
            raise invalid("model", f"one of {', '.join(MODEL_NAMES)}", config.model)
        if not 0 < config.validation_fraction < 1:
            raise invalid("validation_fraction", "a float in (0, 1)", config.validation_fraction)
        super().__init__(name=f"{config.model}_{task.spec.name}", tunable=True)
        self.task, self.config, self.space = task, config, space
        self.steps_per_trial, self.rounds = steps_per_trial, rounds
        self.strategy, self.log = strategy, log
        self._data = None

    def data(self):
        """`((train_x, train_y), (val_x, val_y))`, loaded once (the chief never needs it)."""
        if self._data is None:
            config = self.config
            self._data = tuple(
                self.task.examples(split, config.data_dir, config.validation_fraction)
                for split in ("train", "validation")
            )
        return self._data

    def build(self, hp):
        values = self.space.declare(hp, self.config.model)
        return build_model(
            self.task.spec,
            self.config.model,
            units=self.config.units,
            epsilon=values.get("epsilon", 0.01),
            gamma=values.get("gamma", 0.01),
            sigma_w=values["sigma_w"],
            seed=self.config.seed,
            dtype_policy=self.config.dtype_policy,
        )

    def fit(self, hp, model, *args, epochs=None, initial_epoch=0, callbacks=(), **kwargs):
        """Trains the trial's steps; returns (and reports to `callbacks`) validation metrics.

        Without `epochs` a trial is `steps_per_trial` steps; Hyperband's
        `epochs`/`initial_epoch` are rounds of `steps_per_trial // rounds`
        steps. A trial whose loss stops being finite scores 0.
        """
        unit = max(1, self.steps_per_trial // self.rounds)
        start, stop = (initial_epoch * unit, epochs * unit) if epochs else (0, self.steps_per_trial)
        config = self.config.replace(steps=stop, checkpoint_every=stop,
                                     log_every=max(1, stop - start))  # fmt: skip
        (train_x, train_y), (val_x, val_y) = self.data()

        def build():
            # The run's schedule at the trial's rate, over a full trial (Hyperband's rounds
            # go on along it: the optimizer starts at the round's first step).
            rate = schedules.learning_rate(config, hp["learning_rate"], self.steps_per_trial)
            optimizer = make_optimizer(
                hp["optimizer"], rate, config.momentum, config.clipnorm, config.dtype_policy
            )
            return model, optimizer

        trainer = make_trainer(self.task, build, train_x, train_y, batch_size=config.batch_size,
                               seed=config.seed, strategy=self.strategy)  # fmt: skip
        trainer.optimizer.iterations.assign(start)
        for callback in callbacks:
            callback.set_model(model)
        try:
            loop.train(trainer, config, start, writer=ScalarWriter(None), log=self.log)
            val_loss, val_accuracy = loop.evaluate(
                trainer.predict, self.task, val_x, val_y, config.eval_batch_size, config.seed
            )
        except DivergenceError as error:
            self.log(f"trial diverged: {error}")
            val_loss, val_accuracy = float("inf"), 0.0
        if not math.isfinite(val_loss):  # keep the trial's metrics JSON-safe
            val_loss = float("inf")
        logs = {"val_accuracy": float(val_accuracy), "val_loss": float(val_loss)}
        for callback in callbacks:  # keras-tuner's: it saves the weights of the best epoch
            callback.on_epoch_end(max(0, (epochs or 1) - 1), logs)
        return logs
