"""The search space of `training.tune`: the paper's grids, or custom ones.

The paper (Chang et al., ICLR 2019, §5) picks ε ∈ {0.01, 0.1, 1}, γ ∈ {0.001,
0.01, 0.1, 1}, the learning rate ∈ {0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1}, σ_w ∈
{0, 1, 2, 4, 8, 16} and SGD with momentum or Adagrad by search. A
`SearchSpace` holds those grids (or custom ones) and declares them as
keras-tuner `hp.Choice`s, or, with `log_scale`, as continuous ranges over each
grid's min..max. Nothing here imports keras-tuner or Keras.
"""

from __future__ import annotations

import math

from apputil.errors import invalid
from training.tasks.optimizers import OPTIMIZERS

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
