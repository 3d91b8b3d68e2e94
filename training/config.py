"""`RunConfig`: a typed, validated description of a training run.

A `RunConfig` is four frozen sections, one per option group: `task`
(`TaskConfig`), `model` (`ModelConfig`), `optimizer` (`OptimizerConfig`, with the
learning-rate schedule as its nested part `ScheduleConfig`) and `loop`
(`LoopConfig`: steps, periods, evaluation). How the processes and devices are set up
(`training.backends.launch_config.LaunchConfig`: the strategy, the JAX coordinator, the
CPU split) is not part of a run: the commands read it to make the backend a run trains
on; its options are listed here with the run's (`option_fields`).

Every field (`training.sections.option`) carries its command-line help, its option
group, its flat key (`sigma_w`; the flag is `--sigma-w`) and whether a resumed run
must keep it (`identity`); `training.options` builds the flags of `training.train` and
`training.tune` from them, so an option is written once. Flat keys are also
what `--config` YAML files, `config.yaml` records and `RunConfig.of(**keys)`
use. A `RunConfig` is built from flags, a YAML file, a tuner trial or the
reproduction suite, and passed whole to
`training.run.experiment.train_and_evaluate(config, workdir)`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import typing
from collections.abc import Callable

from apputil.errors import Literal, UsageError, check, invalid
from training.backends.launch_config import LaunchConfig
from training.sections import Section, key_of, option, part

__all__ = [
    "LoopConfig",
    "ModelConfig",
    "OptimizerConfig",
    "RunConfig",
    "TaskConfig",
    "UsageError",
    "ScheduleConfig",
    "check_batch_size",
    "identity_fields",
    "option_fields",
]

# The models a run can build (`training.tasks.models.build_model`); here so that the
# command line knows them without importing Keras.
MODEL_NAMES = ("antisymmetric", "gated", "ablation", "lstm")
# The Keras dtype policies a run can train under (`--dtype-policy`).
DTYPE_POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
#: `--lr-decay-factor` unless given: only the step schedule reads it.
DEFAULT_LR_DECAY_FACTOR = 0.1

# The identity settings a resumed run may change when asked (`--change-on-resume`): they
# shape no variable, so the checkpoint still fits. Under a schedule a new learning rate is
# the schedule's new peak, applied from the restored step on. The schedule's own settings
# stay: with warm-up or decay the optimizer holds no learning-rate variable, without them
# it does, so the checkpoints of one do not fit the other; and a schedule changed midway
# is no longer one schedule.
RESUME_CHANGEABLE = ("learning_rate", "clipnorm")

# The option groups of the command line, in the order `--help` lists them.
GROUPS = ("task", "model", "optimizer", "distribution", "run")


@dataclasses.dataclass(frozen=True)
class TaskConfig(Section):
    """What to learn: the task, its data and the seed of data order, noise and init."""

    name: str = option("digits", group="task", identity=True, key="task")
    dataset: str | None = option(
        None, "for the MNIST tasks: mnist (default) or fashion_mnist", group="task", identity=True
    )
    timesteps: int | None = option(
        None, "sequence length of noise-padded, digits, adding and copy tasks",
        group="task", identity=True,
    )  # fmt: skip
    data_dir: str | None = option(
        None, "TFDS data directory or folder of .npz files (default: TFDS_DATA_DIR)", group="task"
    )
    download: bool = option(
        False, "let TFDS download and prepare the data set into --data-dir if it is missing "
        "(needs the internet)", group="task",
    )  # fmt: skip
    seed: int = option(0, "seed of data order, noise and init", group="task", identity=True)

    def validate(self, argument: Callable[[str], str] = str) -> None:
        check(
            self.timesteps is None or self.timesteps > 0,
            argument("timesteps"),
            "a positive integer",
            self.timesteps,
        )
        check(
            self.data_dir is None or self.download or os.path.isdir(self.data_dir),
            argument("data_dir"),
            "an existing TFDS data directory or a folder of .npz files",
            self.data_dir,
        )


@dataclasses.dataclass(frozen=True)
class ModelConfig(Section):
    """The model `training.tasks.models.build_model` builds."""

    name: str = option("antisymmetric", group="model", identity=True, key="model")
    units: int = option(64, group="model", identity=True)
    epsilon: float = option(0.1, "step size ε", group="model", identity=True)
    gamma: float = option(0.01, "diffusion γ", group="model", identity=True)
    sigma_w: float = option(
        1.0, "hidden-to-hidden init N(0, sigma_w^2/n) (paper: 0, 1, 2, 4, 8, 16)",
        group="model", identity=True,
    )  # fmt: skip
    dtype_policy: str = option(
        "float32", "Keras dtype policy of the model; the mixed ones keep the recurrent state "
        "and the head in float32 (mixed_float16 trains with loss scaling)",
        group="model", identity=True,
    )  # fmt: skip

    def validate(self, argument: Callable[[str], str] = str) -> None:
        check(self.units > 0, argument("units"), "a positive integer", self.units)
        for name, positive in (("epsilon", True), ("gamma", False), ("sigma_w", False)):
            value = getattr(self, name)
            ok = math.isfinite(value) and (value > 0 if positive else value >= 0)
            check(
                ok,
                argument(name),
                "a positive float" if positive else "a non-negative float",
                value,
            )
        check(
            self.dtype_policy in DTYPE_POLICIES,
            argument("dtype_policy"),
            f"one of {', '.join(DTYPE_POLICIES)}",
            self.dtype_policy,
        )


@dataclasses.dataclass(frozen=True)
class ScheduleConfig(Section):
    """The learning-rate schedule (`training.run.schedules`): a warm-up, then its kind.

    Each kind reads its own settings (`SCHEDULE_SETTINGS`); another kind's
    settings must keep their defaults, since they would be ignored.
    """

    name: str = option(
        "constant", "learning-rate schedule, a function of the optimizer's step (a resumed "
        "run goes on with it): constant, cosine (to --lr-floor at --lr-decay-steps) or step "
        "(times --lr-decay-factor after each of --lr-boundaries)",
        group="optimizer", identity=True, metavar="NAME", key="lr_schedule",
    )  # fmt: skip
    warmup_steps: int = option(
        0, "any schedule: raise the learning rate linearly from 0 to --learning-rate over "
        "the first N steps", group="optimizer", identity=True, metavar="N",
    )  # fmt: skip
    floor: float = option(
        0.0, "cosine: the last learning rate, as a fraction of --learning-rate (Keras' alpha)",
        group="optimizer", identity=True, metavar="F", key="lr_floor",
    )  # fmt: skip
    decay_steps: int | None = option(
        None, "cosine: the step at which it reaches the floor and stays (default: the run's "
        "--steps; a tuner trial's --steps-per-trial); at or below --warmup-steps the rate "
        "warms up, then holds the floor",
        group="optimizer", identity=True, metavar="N", key="lr_decay_steps",
    )  # fmt: skip
    boundaries: str | None = option(
        None, "step: comma-separated steps after which the learning rate is multiplied by "
        "--lr-decay-factor", group="optimizer", identity=True, metavar="S1,S2,...",
        key="lr_boundaries",
    )  # fmt: skip
    decay_factor: float = option(
        DEFAULT_LR_DECAY_FACTOR, "step: the factor at each boundary", group="optimizer",
        identity=True, metavar="F", key="lr_decay_factor",
    )  # fmt: skip

    @property
    def varies(self) -> bool:
        """Whether the learning rate changes over the run (a schedule or a warm-up)."""
        return self.name != "constant" or self.warmup_steps > 0

    def boundary_steps(self, argument: Callable[[str], str] = str) -> tuple[int, ...]:
        """The steps of `boundaries` (empty without); raises `UsageError` if malformed."""
        if self.boundaries is None:
            return ()
        expected = (
            f"increasing step numbers after {argument('warmup_steps')} ({self.warmup_steps}), "
            f"comma-separated (e.g. 3000,5000)"
        )
        try:
            steps = tuple(int(part) for part in self.boundaries.split(","))
        except ValueError:
            raise invalid(argument("lr_boundaries"), expected, self.boundaries) from None
        ordered = all(a < b for a, b in zip((self.warmup_steps, *steps), steps, strict=False))
        check(ordered, argument("lr_boundaries"), expected, self.boundaries)
        return steps

    def validate(self, argument: Callable[[str], str] = str) -> None:
        check(
            self.name in SCHEDULE_SETTINGS,
            argument("lr_schedule"),
            f"one of {', '.join(SCHEDULE_SETTINGS)}",
            self.name,
        )
        # The settings of another kind would be ignored: a mistake to say, not to skip.
        fields = {field.name: field for field in dataclasses.fields(self)}
        for kind, names in SCHEDULE_SETTINGS.items():
            for name in () if kind == self.name else names:
                field = fields[name]
                default, value = field.default, getattr(self, name)
                check(
                    value == default,
                    argument(key_of(field)),
                    f"{_default_words(default)} (the default) unless "
                    f"{argument('lr_schedule')} {kind}",
                    value,
                )
        check(
            self.warmup_steps >= 0,
            argument("warmup_steps"),
            "a non-negative integer",
            self.warmup_steps,
        )
        check(
            math.isfinite(self.floor) and 0 <= self.floor <= 1,
            argument("lr_floor"),
            f"a float in [0, 1] (a fraction of {argument('learning_rate')})",
            self.floor,
        )
        # As for the run's own --steps (the default length): a decay that ends within the
        # warm-up is a warm-up that then holds the floor, so a run extended with its
        # recorded length is accepted wherever the run itself was.
        check(
            self.decay_steps is None or self.decay_steps > 0,
            argument("lr_decay_steps"),
            "a positive integer",
            self.decay_steps,
        )
        check(
            math.isfinite(self.decay_factor) and 0 < self.decay_factor < 1,
            argument("lr_decay_factor"),
            "a float in (0, 1)",
            self.decay_factor,
        )
        check(
            self.name != "step" or bool(self.boundaries),
            argument("lr_boundaries"),
            f"comma-separated steps with {argument('lr_schedule')} step",
            self.boundaries,
        )
        self.boundary_steps(argument)


# The schedules (`--lr-schedule`) and the settings of `ScheduleConfig` each reads besides
# the warm-up.
SCHEDULE_SETTINGS = {
    "constant": (),
    "cosine": ("floor", "decay_steps"),
    "step": ("boundaries", "decay_factor"),
}
LR_SCHEDULES = tuple(SCHEDULE_SETTINGS)


def _default_words(value: object) -> str:
    return "none" if value is None else f"{value:g}"


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(Section):
    """The optimizer, the global batch and the learning-rate schedule (`schedule`)."""

    name: str = option("adam", group="optimizer", identity=True, key="optimizer")
    learning_rate: float = option(0.01, group="optimizer", identity=True)
    momentum: float = option(0.9, "for sgd", group="optimizer", identity=True)
    clipnorm: float | None = option(
        None, "per-variable gradient clipping", group="optimizer", identity=True
    )
    batch_size: int = option(64, "global batch size", group="optimizer", identity=True)
    schedule: ScheduleConfig = part(ScheduleConfig)

    def validate(self, argument: Callable[[str], str] = str) -> None:
        check(self.batch_size > 0, argument("batch_size"), "a positive integer", self.batch_size)
        ok = math.isfinite(self.learning_rate) and self.learning_rate > 0
        check(ok, argument("learning_rate"), "a positive float", self.learning_rate)
        check(0 <= self.momentum < 1, argument("momentum"), "a float in [0, 1)", self.momentum)
        check(
            self.clipnorm is None or (math.isfinite(self.clipnorm) and self.clipnorm > 0),
            argument("clipnorm"),
            "a positive float",
            self.clipnorm,
        )
        self.schedule.validate(argument)


@dataclasses.dataclass(frozen=True)
class LoopConfig(Section):
    """How long the loop trains, how often it logs, evaluates and checkpoints."""

    steps: int = option(2000, "training steps (global batches)", group="run")
    checkpoint_every: int = option(200, group="run", metavar="N")
    log_every: int = option(50, group="run", metavar="N")
    eval_every: int = option(
        0, "evaluate every N steps (validation split if any, else test) into curve.json",
        group="run", metavar="N",
    )  # fmt: skip
    keep_best: bool = option(
        False, "test the weights of the best validation evaluation, not the last step's "
        "(needs --validation-fraction and --eval-every; the test split is read only at the "
        "end)", group="run", identity=True,
    )  # fmt: skip
    eval_batch_size: int = option(256, group="run")
    validation_fraction: float = option(
        0.0, "hold out this fraction of the training data and report val_accuracy",
        group="run", identity=True,
    )  # fmt: skip
    jit_compile: bool = option(False, "XLA-compile the train step", group="run")
    diagnostics: int = option(
        0, "log stability diagnostics every N steps (0: off)", group="run", metavar="N"
    )
    change_on_resume: str | None = option(
        None,
        "comma-separated settings a resumed run may change: "
        + ", ".join(RESUME_CHANGEABLE)
        + " (e.g. to go on from the last good checkpoint of a run that diverged)",
        group="run",
        metavar="NAMES",
    )

    def resume_changes(self) -> tuple[str, ...]:
        """The fields named by `change_on_resume`."""
        names = (self.change_on_resume or "").replace("-", "_").split(",")
        return tuple(name.strip() for name in names if name.strip())

    def validate(self, argument: Callable[[str], str] = str) -> None:
        for name in ("steps", "checkpoint_every", "log_every", "eval_batch_size"):
            value = getattr(self, name)
            check(value > 0, argument(name), "a positive integer", value)
        for name in ("diagnostics", "eval_every"):
            value = getattr(self, name)
            check(value >= 0, argument(name), "a non-negative integer", value)
        check(
            0 <= self.validation_fraction < 1,
            argument("validation_fraction"),
            "a float in [0, 1)",
            self.validation_fraction,
        )
        if self.keep_best:
            keep, fraction = argument("keep_best"), argument("validation_fraction")
            given = Literal(f"{keep} with {fraction} {self.validation_fraction}")
            check(
                self.validation_fraction > 0,
                argument("keep_best"),
                f"a validation split to select on: {fraction} above 0 (the test split is read "
                "only at the end)",
                given,
            )
            check(
                self.eval_every > 0,
                argument("eval_every"),
                f"a positive integer with {keep} (the evaluations it selects from)",
                self.eval_every,
            )
        for name in self.resume_changes():
            check(
                name in RESUME_CHANGEABLE,
                argument("change_on_resume"),
                f"names among {', '.join(RESUME_CHANGEABLE)}",
                self.change_on_resume,
            )


# The sections of a run, in the order of their option groups.
SECTIONS = {"task": TaskConfig, "model": ModelConfig, "optimizer": OptimizerConfig,
            "loop": LoopConfig}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A training run: its task, model, optimizer (with schedule) and loop.

    Built from flat keys with `RunConfig.of(units=128, steps=500)` (the flags of
    `training.train`, `--sigma-w` is `sigma_w`) or from an argparse namespace;
    read by section (`config.model.units`). `identity` fields are what a
    checkpoint was trained with: a resumed run must keep them (more `--steps`
    extend a run; logging, evaluation and checkpoint periods may change).

    Example:

    >>> config = RunConfig.of(task="adding", units=32, steps=100).validate()
    >>> config.model.units, config.loop.steps
    (32, 100)
    """

    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    loop: LoopConfig = LoopConfig()

    @classmethod
    def of(cls, **values: typing.Any) -> RunConfig:
        """The config of flat keys (`units=128`); raises `TypeError` on an unknown key."""
        unknown = set(values) - set(run_keys())
        if unknown:
            raise TypeError(f"RunConfig has no option {', '.join(sorted(unknown))}")
        sections: dict[str, typing.Any] = SECTIONS
        return cls(**{name: section.from_flat(values) for name, section in sections.items()})

    @classmethod
    def from_namespace(cls, namespace: argparse.Namespace, **overrides: typing.Any) -> RunConfig:
        """The keys present in an argparse namespace (the rest default), then `overrides`."""
        keys = set(run_keys())
        values = {k: v for k, v in vars(namespace).items() if k in keys}
        return cls.of(**{**values, **overrides})

    def replace(self, **changes: typing.Any) -> RunConfig:
        """A copy with flat keys changed (`config.replace(steps=10, units=8)`)."""
        return RunConfig.of(**{**self.to_dict(), **changes})

    def to_dict(self) -> dict:
        """Every flat key and its value (what `config.yaml` records of the config)."""
        flat: dict = {}
        for name in SECTIONS:
            flat.update(getattr(self, name).flat())
        return flat

    def resolved(self) -> RunConfig:
        """The config a run records: the cosine's length fixed (`lr_decay_steps`, default
        `steps`), so that a resumed run with more `--steps` does not stretch the decay."""
        schedule = self.optimizer.schedule
        if schedule.name == "cosine" and schedule.decay_steps is None:
            return self.replace(lr_decay_steps=self.loop.steps)
        return self

    def validate(self, argument: Callable[[str], str] = str) -> RunConfig:
        """Checks every field's type and range; returns `self` or raises `UsageError`.

        Types are checked here, not only by the flags' parsers: values also come
        from YAML files (`seed: 1.5`, `jit_compile: "false"`) and from Python.

        Args:
            argument: How an error names a setting from its key: as given (`units`,
                for Python callers), or `flag` (`--units`, for the command line).
        """
        for name in SECTIONS:
            getattr(self, name).check_types(argument)
        for name in SECTIONS:
            getattr(self, name).validate(argument)
        return self


def option_fields(launch: bool = True) -> tuple[dataclasses.Field, ...]:
    """The fields of every section (and of `LaunchConfig` with `launch`), in their order.

    Each is one option: `key_of(field)` is its flat key, `field.metadata` its
    group, help, metavar and whether it is part of a run's identity.
    """
    return tuple(field for _, field in _options(launch))


def _options(launch: bool) -> tuple[tuple[type, dataclasses.Field], ...]:
    task, model, optimizer, loop = SECTIONS.values()
    # The order of the option groups (`GROUPS`): the launch's group is "distribution".
    classes = (task, model, optimizer, *((LaunchConfig,) if launch else ()), loop)
    return tuple(option for cls in classes for option in cls.options())


def option_types() -> dict[str, object]:
    """The type of each option (flat key -> `int | None`, ...)."""
    return {key_of(f): typing.get_type_hints(cls)[f.name] for cls, f in _options(True)}


def run_keys() -> tuple[str, ...]:
    """The flat keys of a `RunConfig` (no launch settings)."""
    return tuple(key_of(field) for field in option_fields(launch=False))


def identity_fields() -> tuple[str, ...]:
    """The flat keys a resumed run must keep (marked `identity` on the field)."""
    return tuple(key_of(f) for f in option_fields(launch=False) if f.metadata["identity"])


def check_batch_size(batch_size: int, replicas: int) -> None:
    """Raises `UsageError` unless the global batch splits evenly over `replicas`."""
    check(batch_size % replicas == 0, "--batch-size", f"a multiple of the {replicas} replicas",
          batch_size)  # fmt: skip
