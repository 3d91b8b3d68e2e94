"""keras-tuner hypermodels of the training models, over the paper's search grids.

The paper (Chang et al., ICLR 2019, §5) picks ε ∈ {0.01, 0.1, 1}, γ ∈ {0.001,
0.01, 0.1, 1}, the learning rate ∈ {0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1}, σ_w ∈
{0, 1, 2, 4, 8, 16} and SGD with momentum or Adagrad by search. A
`SearchSpace` holds those grids (or custom ones) and declares them as
`hp.Choice`s, or, with `log_scale`, as continuous ranges over each grid's
min..max. `RNNHyperModel` builds the models of `training.models` and trains a
trial with the custom loop of `training.loop` on the training split, scoring
it on a validation split carved out of the training data.
"""

import math

import keras_tuner

from training.config import invalid
from training.models import MODEL_NAMES, build_model
from training.optimizers import OPTIMIZERS, make_optimizer

PAPER_GRID = {
    "epsilon": (0.01, 0.1, 1.0),
    "gamma": (0.001, 0.01, 0.1, 1.0),
    "learning_rate": (0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0),
    "sigma_w": (0.0, 1.0, 2.0, 4.0, 8.0, 16.0),
    "optimizer": ("sgd", "adagrad"),
}
OBJECTIVE = "val_accuracy"
# Which hyperparameters each model has (the LSTM has no ε or γ).
MODEL_HYPERPARAMETERS = {
    "antisymmetric": ("epsilon", "gamma", "learning_rate", "sigma_w", "optimizer"),
    "gated": ("epsilon", "gamma", "learning_rate", "sigma_w", "optimizer"),
    "ablation": ("epsilon", "gamma", "learning_rate", "sigma_w", "optimizer"),
    "lstm": ("learning_rate", "sigma_w", "optimizer"),
}
# (check, expected) per numeric hyperparameter.
_RANGES = {
    "epsilon": (lambda v: v > 0, "positive floats"),
    "gamma": (lambda v: v >= 0, "non-negative floats"),
    "learning_rate": (lambda v: v > 0, "positive floats"),
    "sigma_w": (lambda v: v >= 0, "non-negative floats"),
}


def flag_name(name):
    """The command-line flag that sets the values of hyperparameter `name`."""
    return f"--{name.replace('_', '-')}-values"


class SearchSpace:
    """The values of each hyperparameter to search over.

    Args:
        values: Mapping of hyperparameter name (`PAPER_GRID`'s keys) to a
            sequence of values; missing names take the paper's grid.
        log_scale: Declare each numeric hyperparameter as a continuous range
            over its values' min..max (log-uniform when min > 0, uniform when
            it is 0) instead of a choice among them.
        sources: Mapping of name to the argument that gave its values (for
            error messages); defaults to the name's flag.
    """

    def __init__(self, values=None, log_scale=False, sources=None):
        values = dict(values or {})
        sources = dict(sources or {})
        unknown = sorted(set(values) - set(PAPER_GRID))
        if unknown:
            raise invalid("--space", f"keys among {', '.join(PAPER_GRID)}", unknown[0])
        self.log_scale = bool(log_scale)
        self.values = {}
        for name, grid in PAPER_GRID.items():
            given = values.get(name, grid)
            argument = sources.get(name, flag_name(name))
            if isinstance(given, (str, int, float)):
                given = [given]
            if not given:
                raise invalid(argument, "at least one value", list(given))
            if name == "optimizer":
                if any(value not in OPTIMIZERS for value in given):
                    raise invalid(argument, f"names among {', '.join(OPTIMIZERS)}", given)
                self.values[name] = tuple(dict.fromkeys(given))
                continue
            check, expected = _RANGES[name]
            try:
                numbers = [float(value) for value in given]
            except (TypeError, ValueError):
                raise invalid(argument, expected, given) from None
            if not all(math.isfinite(v) and check(v) for v in numbers):
                raise invalid(argument, expected, given)
            self.values[name] = tuple(sorted(dict.fromkeys(numbers)))

    def declare(self, hp, model):
        """Declares the hyperparameters of `model` on `hp`; returns their values."""
        chosen = {}
        for name in MODEL_HYPERPARAMETERS[model]:
            values = self.values[name]
            if len(values) == 1:
                chosen[name] = hp.Fixed(name, values[0])
            elif name == "optimizer" or not self.log_scale:
                chosen[name] = hp.Choice(name, list(values))
            else:
                low, high = values[0], values[-1]
                chosen[name] = hp.Float(name, low, high, sampling="log" if low > 0 else "linear")
        return chosen

    def contains(self, name, value):
        """Whether `value` of hyperparameter `name` lies in this space."""
        values = self.values[name]
        if name == "optimizer" or not self.log_scale or len(values) == 1:
            return value in values
        return values[0] <= value <= values[-1]

    def to_dict(self):
        return {"log_scale": self.log_scale, **{k: list(v) for k, v in self.values.items()}}


class RNNHyperModel(keras_tuner.HyperModel):
    """A `training.models` model with its hyperparameters drawn from a `SearchSpace`.

    `build(hp)` declares the space and returns the uncompiled model;
    `fit(hp, model, ...)` trains it with `training.loop.train` (the optimizer
    `hp["optimizer"]` at `hp["learning_rate"]`), reports to keras-tuner's
    callbacks as one epoch, and returns `{"val_accuracy", "val_loss"}` on the
    validation split.

    Args:
        task: A `training.tasks.Task`.
        config: The `training.config.RunConfig` every trial shares: `model`,
            `units`, `batch_size`, `seed` (the same in every trial, so trials
            differ only in their hyperparameters), `validation_fraction`,
            `momentum`, `clipnorm`, `data_dir` and `eval_batch_size`.
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
        )

    def fit(self, hp, model, *args, epochs=None, initial_epoch=0, callbacks=(), **kwargs):
        """Trains the trial's steps; returns (and reports to `callbacks`) validation metrics.

        Without `epochs` a trial is `steps_per_trial` steps; Hyperband's
        `epochs`/`initial_epoch` are rounds of `steps_per_trial // rounds`
        steps. A trial whose loss stops being finite scores 0.
        """
        from training import loop
        from training.summaries import ScalarWriter
        from training.trainers import make_trainer

        unit = max(1, self.steps_per_trial // self.rounds)
        start, stop = (initial_epoch * unit, epochs * unit) if epochs else (0, self.steps_per_trial)
        config = self.config.replace(steps=stop, checkpoint_every=stop,
                                     log_every=max(1, stop - start))  # fmt: skip
        (train_x, train_y), (val_x, val_y) = self.data()

        def build():
            optimizer = make_optimizer(
                hp["optimizer"], hp["learning_rate"], config.momentum, config.clipnorm
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
        except loop.DivergenceError as error:
            self.log(f"trial diverged: {error}")
            val_loss, val_accuracy = float("inf"), 0.0
        if not math.isfinite(val_loss):  # keep the trial's metrics JSON-safe
            val_loss = float("inf")
        logs = {"val_accuracy": float(val_accuracy), "val_loss": float(val_loss)}
        for callback in callbacks:  # keras-tuner's: it saves the weights of the best epoch
            callback.on_epoch_end(max(0, (epochs or 1) - 1), logs)
        return logs
