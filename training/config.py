"""`RunConfig`: one typed, validated description of a training run.

Built from flags (`training.train`'s `main`), a YAML file (`--config`), a
tuner trial (`training.tune`) or the reproduction suite, and passed whole to
`training.train.train_and_evaluate(config, workdir)`.
"""

import dataclasses
import math
import os


class UsageError(ValueError):
    """A bad option: reported as one line, exit status 2."""


def invalid(argument, expected, value, error=UsageError):
    """The `error` (an exception class) for `value` of `argument` (`--flag` or a Python name)."""
    return error(
        f"Received an invalid value for argument `{argument}`, expected {expected}, got {value!r}."
    )


def check(condition, option, expected, value):
    """Raises `UsageError` naming `--option` unless `condition`."""
    if not condition:
        raise invalid(f"--{option}", expected, value)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A training run: task, model, optimizer, distribution and schedule.

    The fields are `training.train`'s flags (`--sigma-w` is `sigma_w`); their
    defaults are the CLI's.
    """

    # task
    task: str = "digits"
    dataset: str | None = None
    timesteps: int | None = None
    data_dir: str | None = None
    seed: int = 0
    # model
    model: str = "antisymmetric"
    units: int = 64
    epsilon: float = 0.1
    gamma: float = 0.01
    sigma_w: float = 1.0
    # optimizer
    optimizer: str = "adam"
    learning_rate: float = 0.01
    momentum: float = 0.9
    clipnorm: float | None = None
    batch_size: int = 64
    # distribution
    strategy: str = "auto"
    tpu: str | None = None
    cpu_devices: int = 0
    # schedule
    steps: int = 2000
    checkpoint_every: int = 200
    log_every: int = 50
    eval_every: int = 0
    eval_batch_size: int = 256
    validation_fraction: float = 0.0
    jit_compile: bool = False
    diagnostics: int = 0

    @classmethod
    def from_namespace(cls, namespace, **overrides):
        """The fields present in an argparse namespace (the rest default), then `overrides`."""
        names = {field.name for field in dataclasses.fields(cls)}
        values = {k: v for k, v in vars(namespace).items() if k in names}
        return cls(**{**values, **overrides})

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return dataclasses.asdict(self)

    def validate(self):
        """Range checks the flags' types cannot express; returns `self` or raises `UsageError`."""
        for name in ("units", "batch_size", "steps", "checkpoint_every", "log_every",
                     "eval_batch_size"):  # fmt: skip
            value = getattr(self, name)
            check(_integer(value) and value > 0, _flag(name), "a positive integer", value)
        for name in ("cpu_devices", "diagnostics", "eval_every"):
            value = getattr(self, name)
            check(_integer(value) and value >= 0, _flag(name), "a non-negative integer", value)
        for name, positive in (("epsilon", True), ("gamma", False), ("sigma_w", False),
                               ("learning_rate", True)):  # fmt: skip
            value = getattr(self, name)
            ok = _real(value) and (value > 0 if positive else value >= 0)
            check(ok, _flag(name), "a positive float" if positive else "a non-negative float",
                  value)  # fmt: skip
        check(_real(self.momentum) and 0 <= self.momentum < 1, "momentum", "a float in [0, 1)",
              self.momentum)  # fmt: skip
        check(self.clipnorm is None or (_real(self.clipnorm) and self.clipnorm > 0), "clipnorm",
              "a positive float", self.clipnorm)  # fmt: skip
        check(self.timesteps is None or (_integer(self.timesteps) and self.timesteps > 0),
              "timesteps", "a positive integer", self.timesteps)  # fmt: skip
        check(_real(self.validation_fraction) and 0 <= self.validation_fraction < 1,
              "validation-fraction", "a float in [0, 1)", self.validation_fraction)  # fmt: skip
        check(self.data_dir is None or os.path.isdir(self.data_dir), "data-dir",
              "an existing TFDS data directory or a folder of .npz files",
              self.data_dir)  # fmt: skip
        return self


def _flag(name):
    return name.replace("_", "-")


def _integer(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _real(value):
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
