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

from training import options
from training.models import MODEL_NAMES, build_model

PAPER_GRID = {
    "epsilon": (0.01, 0.1, 1.0),
    "gamma": (0.001, 0.01, 0.1, 1.0),
    "learning_rate": (0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0),
    "sigma_w": (0.0, 1.0, 2.0, 4.0, 8.0, 16.0),
    "optimizer": ("sgd", "adagrad"),
}
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


def _invalid(argument, expected, value):
    return options.UsageError(
        f"Received an invalid value for argument `{argument}`, expected {expected}, got {value!r}."
    )


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
            raise _invalid("--space", f"keys among {', '.join(PAPER_GRID)}", unknown[0])
        self.log_scale = bool(log_scale)
        self.values = {}
        for name, grid in PAPER_GRID.items():
            given = values.get(name, grid)
            argument = sources.get(name, flag_name(name))
            if isinstance(given, (str, int, float)):
                given = [given]
            if not given:
                raise _invalid(argument, "at least one value", list(given))
            if name == "optimizer":
                if any(value not in options.OPTIMIZERS for value in given):
                    raise _invalid(argument, f"names among {', '.join(options.OPTIMIZERS)}", given)
                self.values[name] = tuple(dict.fromkeys(given))
                continue
            check, expected = _RANGES[name]
            try:
                numbers = [float(value) for value in given]
            except (TypeError, ValueError):
                raise _invalid(argument, expected, given) from None
            if not all(math.isfinite(v) and check(v) for v in numbers):
                raise _invalid(argument, expected, given)
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
    `fit(hp, model, start_step, steps)` trains it with `training.loop.train`
    (the optimizer `hp["optimizer"]` at `hp["learning_rate"]`) and returns
    `{"val_accuracy", "val_loss"}` on the validation split.

    Args:
        task: A `training.tasks.Task`.
        model: One of `training.models.MODEL_NAMES`.
        space: A `SearchSpace`.
        units: Hidden units.
        batch_size: Global batch size.
        steps_per_trial: Training steps of a trial.
        seed: Seed of initialization and data order (the same in every trial,
            so trials differ only in their hyperparameters).
        validation_fraction: Fraction of the training data held out to score
            trials.
        momentum, clipnorm: As in `training.options.make_optimizer`.
        strategy: What a trial trains under: a `training.distribution.STRATEGIES`
            name, a `tf.distribute.Strategy` or a `keras.distribution.Distribution`.
        data_dir: TFDS data directory of the image tasks.
        eval_batch_size: Batch size of validation.
        log: Called with progress lines.
    """

    def __init__(
        self,
        task,
        model,
        space,
        units=64,
        batch_size=64,
        steps_per_trial=100,
        seed=0,
        validation_fraction=0.1,
        momentum=0.9,
        clipnorm=None,
        strategy="default",
        data_dir=None,
        eval_batch_size=256,
        log=print,
    ):
        if model not in MODEL_NAMES:
            raise ValueError(
                f"Received an invalid value for argument `model`, expected one of "
                f"{', '.join(MODEL_NAMES)}, got {model!r}."
            )
        if not 0 < validation_fraction < 1:
            raise ValueError(
                "Received an invalid value for argument `validation_fraction`, expected a "
                f"float in (0, 1), got {validation_fraction!r}."
            )
        super().__init__(name=f"{model}_{task.spec.name}", tunable=True)
        self.task = task
        self.model_name = model
        self.space = space
        self.units = units
        self.batch_size = batch_size
        self.steps_per_trial = steps_per_trial
        self.seed = seed
        self.validation_fraction = validation_fraction
        self.momentum = momentum
        self.clipnorm = clipnorm
        self.strategy = strategy
        self.data_dir = data_dir
        self.eval_batch_size = eval_batch_size
        self.log = log
        self._data = None

    def data(self):
        """`((train_x, train_y), (val_x, val_y))`, loaded once (the chief never needs it)."""
        if self._data is None:
            self._data = tuple(
                self.task.examples(split, self.data_dir, self.validation_fraction)
                for split in ("train", "validation")
            )
        return self._data

    def build(self, hp):
        values = self.space.declare(hp, self.model_name)
        return build_model(
            self.task.spec,
            self.model_name,
            units=self.units,
            epsilon=values.get("epsilon", 0.01),
            gamma=values.get("gamma", 0.01),
            sigma_w=values["sigma_w"],
            seed=self.seed,
        )

    def fit(self, hp, model, *args, start_step=0, steps=None, **kwargs):
        """Trains steps `start_step .. steps - 1`; returns validation metrics.

        Extra arguments (keras-tuner's callbacks) are ignored: the loop runs
        no Keras callbacks. A trial whose loss stops being finite scores 0.
        """
        from training import loop
        from training.summaries import ScalarWriter
        from training.trainers import make_trainer

        steps = self.steps_per_trial if steps is None else steps
        (train_x, train_y), (val_x, val_y) = self.data()

        def build():
            return model, options.make_optimizer(
                hp["optimizer"], hp["learning_rate"], self.momentum, self.clipnorm
            )

        trainer = make_trainer(
            self.task,
            build,
            train_x,
            train_y,
            batch_size=self.batch_size,
            seed=self.seed,
            strategy=self.strategy,
        )
        trainer.optimizer.iterations.assign(start_step)
        try:
            loop.train(
                trainer,
                start_step,
                steps,
                checkpoint_every=steps,
                log_every=max(1, steps - start_step),
                writer=ScalarWriter(None),
                log=self.log,
            )
        except loop.DivergenceError as error:
            self.log(f"trial diverged: {error}")
            return {"val_accuracy": 0.0, "val_loss": float("inf")}
        val_loss, val_accuracy = loop.evaluate(
            trainer.predict, self.task, val_x, val_y, self.eval_batch_size, self.seed
        )
        if not math.isfinite(val_loss):  # a diverged trial: keep its metrics JSON-safe
            val_loss = float("inf")
        return {"val_accuracy": float(val_accuracy), "val_loss": float(val_loss)}
