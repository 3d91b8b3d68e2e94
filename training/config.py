"""`RunConfig`: one typed, validated description of a training run; the source of its options.

Every field carries its command-line help, its option group and whether a
resumed run must keep it (`identity`); `training.options` builds the flags of
`training.train` and `training.tune` from them, so an option is written once.
A `RunConfig` is built from flags, a YAML file (`--config`), a tuner trial
(`training.tune`) or the reproduction suite, and passed whole to
`training.experiment.train_and_evaluate(config, workdir)`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing

from apputil.errors import Literal, UsageError, check, invalid

__all__ = ["RunConfig", "UsageError", "check_batch_size", "check_types", "flag", "identity_fields"]

# The models a run can build (`training.models.build_model`); here so that the
# command line knows them without importing Keras.
MODEL_NAMES = ("antisymmetric", "gated", "ablation", "lstm")
# The Keras dtype policies a run can train under (`--dtype-policy`).
DTYPE_POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
# The learning-rate schedules (`--lr-schedule`; built by `training.schedules`).
LR_SCHEDULES = ("constant", "cosine", "step")
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


def _option(default, help=None, *, group, identity=False, metavar=None):
    """A field with what the command line and resume checks need to know of it."""
    metadata = {"group": group, "help": help, "identity": identity, "metavar": metavar}
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A training run: task, model, optimizer, distribution and schedule.

    The fields are `training.train`'s flags (`--sigma-w` is `sigma_w`) with
    their defaults; `identity` fields are what a checkpoint was trained with:
    a resumed run must keep them (more `--steps` extend a run; logging,
    evaluation and checkpoint periods may change).
    """

    # task
    task: str = _option("digits", group="task", identity=True)
    dataset: str | None = _option(
        None, "for the MNIST tasks: mnist (default) or fashion_mnist", group="task", identity=True
    )
    timesteps: int | None = _option(
        None, "sequence length of noise-padded, digits, adding and copy tasks",
        group="task", identity=True,
    )  # fmt: skip
    data_dir: str | None = _option(
        None, "TFDS data directory or folder of .npz files (default: TFDS_DATA_DIR)", group="task"
    )
    download: bool = _option(
        False, "let TFDS download and prepare the data set into --data-dir if it is missing "
        "(needs the internet)", group="task",
    )  # fmt: skip
    seed: int = _option(0, "seed of data order, noise and init", group="task", identity=True)
    # model
    model: str = _option("antisymmetric", group="model", identity=True)
    units: int = _option(64, group="model", identity=True)
    epsilon: float = _option(0.1, "step size ε", group="model", identity=True)
    gamma: float = _option(0.01, "diffusion γ", group="model", identity=True)
    sigma_w: float = _option(
        1.0, "hidden-to-hidden init N(0, sigma_w^2/n) (paper: 0, 1, 2, 4, 8, 16)",
        group="model", identity=True,
    )  # fmt: skip
    dtype_policy: str = _option(
        "float32", "Keras dtype policy of the model; the mixed ones keep the recurrent state "
        "and the head in float32 (mixed_float16 trains with loss scaling)",
        group="model", identity=True,
    )  # fmt: skip
    # optimizer
    optimizer: str = _option("adam", group="optimizer", identity=True)
    learning_rate: float = _option(0.01, group="optimizer", identity=True)
    momentum: float = _option(0.9, "for sgd", group="optimizer", identity=True)
    clipnorm: float | None = _option(
        None, "per-variable gradient clipping", group="optimizer", identity=True
    )
    batch_size: int = _option(64, "global batch size", group="optimizer", identity=True)
    lr_schedule: str = _option(
        "constant", "learning-rate schedule, a function of the optimizer's step (a resumed "
        "run goes on with it): constant, cosine (to --lr-floor at --lr-decay-steps) or step "
        "(times --lr-decay-factor after each of --lr-boundaries)",
        group="optimizer", identity=True, metavar="NAME",
    )  # fmt: skip
    warmup_steps: int = _option(
        0, "any schedule: raise the learning rate linearly from 0 to --learning-rate over "
        "the first N steps", group="optimizer", identity=True, metavar="N",
    )  # fmt: skip
    lr_floor: float = _option(
        0.0, "cosine: the last learning rate, as a fraction of --learning-rate (Keras' alpha)",
        group="optimizer", identity=True, metavar="F",
    )  # fmt: skip
    lr_decay_steps: int | None = _option(
        None, "cosine: the step at which it reaches the floor and stays (default: the run's "
        "--steps; a tuner trial's --steps-per-trial)",
        group="optimizer", identity=True, metavar="N",
    )  # fmt: skip
    lr_boundaries: str | None = _option(
        None, "step: comma-separated steps after which the learning rate is multiplied by "
        "--lr-decay-factor", group="optimizer", identity=True, metavar="S1,S2,...",
    )  # fmt: skip
    lr_decay_factor: float = _option(
        DEFAULT_LR_DECAY_FACTOR, "step: the factor at each boundary", group="optimizer",
        identity=True, metavar="F",
    )  # fmt: skip
    # distribution
    strategy: str = _option("auto", group="distribution")
    tpu: str | None = _option(None, "TPU name or address for --strategy tpu", group="distribution")
    cpu_devices: int = _option(
        0, "split the CPU into this many logical devices (mirrored training on CPU)",
        group="distribution",
    )  # fmt: skip
    coordinator: str | None = _option(
        None, "JAX on several processes: HOST:PORT of process 0's coordinator, the same on "
        "every process, or auto on a TPU pod slice, Slurm or MPI (default: the first of "
        "KERAS_DISTRIBUTION_JOB_ADDRESSES)", group="distribution", metavar="HOST:PORT",
    )  # fmt: skip
    num_processes: int | None = _option(
        None, "JAX: how many processes train together (default: "
        "KERAS_DISTRIBUTION_NUM_PROCESSES)", group="distribution", metavar="N",
    )  # fmt: skip
    process_id: int | None = _option(
        None, "JAX: this process, 0 to N-1; process 0 runs the coordinator and writes the "
        "outputs (default: KERAS_DISTRIBUTION_PROCESS_ID)", group="distribution", metavar="I",
    )  # fmt: skip
    connect_timeout: int = _option(
        120, "JAX: seconds a process waits for all the others to connect", group="distribution",
        metavar="S",
    )  # fmt: skip
    heartbeat_timeout: int = _option(
        30, "JAX: seconds without a heartbeat after which a process counts as lost and the "
        "others stop", group="distribution", metavar="S",
    )  # fmt: skip
    # schedule
    steps: int = _option(2000, "training steps (global batches)", group="run")
    checkpoint_every: int = _option(200, group="run", metavar="N")
    log_every: int = _option(50, group="run", metavar="N")
    eval_every: int = _option(
        0, "evaluate every N steps (validation split if any, else test) into curve.json",
        group="run", metavar="N",
    )  # fmt: skip
    keep_best: bool = _option(
        False, "test the weights of the best validation evaluation, not the last step's "
        "(needs --validation-fraction and --eval-every; the test split is read only at the "
        "end)", group="run", identity=True,
    )  # fmt: skip
    eval_batch_size: int = _option(256, group="run")
    validation_fraction: float = _option(
        0.0, "hold out this fraction of the training data and report val_accuracy",
        group="run", identity=True,
    )  # fmt: skip
    jit_compile: bool = _option(False, "XLA-compile the train step", group="run")
    diagnostics: int = _option(
        0, "log stability diagnostics every N steps (0: off)", group="run", metavar="N"
    )
    change_on_resume: str | None = _option(
        None,
        "comma-separated settings a resumed run may change: "
        + ", ".join(RESUME_CHANGEABLE)
        + " (e.g. to go on from the last good checkpoint of a run that diverged)",
        group="run",
        metavar="NAMES",
    )

    @classmethod
    def from_namespace(cls, namespace, **overrides) -> RunConfig:
        """The fields present in an argparse namespace (the rest default), then `overrides`."""
        names = {field.name for field in dataclasses.fields(cls)}
        values = {k: v for k, v in vars(namespace).items() if k in names}
        return cls(**{**values, **overrides})

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def resolved(self) -> RunConfig:
        """The config a run records: the cosine's length fixed (`lr_decay_steps`, default
        `steps`), so that a resumed run with more `--steps` does not stretch the decay."""
        if self.lr_schedule == "cosine" and self.lr_decay_steps is None:
            return self.replace(lr_decay_steps=self.steps)
        return self

    def has_schedule(self) -> bool:
        """Whether the learning rate changes over the run (a schedule or a warm-up)."""
        return self.lr_schedule != "constant" or self.warmup_steps > 0

    def boundaries(self) -> tuple[int, ...]:
        """The steps of `lr_boundaries` (empty without); raises `UsageError` if malformed."""
        if self.lr_boundaries is None:
            return ()
        expected = (
            f"increasing step numbers after --warmup-steps ({self.warmup_steps}), "
            f"comma-separated (e.g. 3000,5000)"
        )
        try:
            steps = tuple(int(part) for part in self.lr_boundaries.split(","))
        except ValueError:
            raise invalid("--lr-boundaries", expected, self.lr_boundaries) from None
        ordered = all(a < b for a, b in zip((self.warmup_steps, *steps), steps, strict=False))
        check(ordered, "--lr-boundaries", expected, self.lr_boundaries)
        return steps

    def resume_changes(self) -> tuple[str, ...]:
        """The fields named by `change_on_resume`."""
        names = (self.change_on_resume or "").replace("-", "_").split(",")
        return tuple(name.strip() for name in names if name.strip())

    def validate(self) -> RunConfig:
        """Checks every field's type and range; returns `self` or raises `UsageError`.

        Types are checked here, not only by the flags' parsers: values also come
        from YAML files (`seed: 1.5`, `jit_compile: "false"`) and from Python.
        """
        check_types(self)
        for name in ("units", "batch_size", "steps", "checkpoint_every", "log_every",
                     "eval_batch_size"):  # fmt: skip
            value = getattr(self, name)
            check(value > 0, flag(name), "a positive integer", value)
        for name in ("cpu_devices", "diagnostics", "eval_every"):
            value = getattr(self, name)
            check(value >= 0, flag(name), "a non-negative integer", value)
        for name, positive in (("epsilon", True), ("gamma", False), ("sigma_w", False),
                               ("learning_rate", True)):  # fmt: skip
            value = getattr(self, name)
            ok = math.isfinite(value) and (value > 0 if positive else value >= 0)
            check(ok, flag(name), "a positive float" if positive else "a non-negative float",
                  value)  # fmt: skip
        check(self.dtype_policy in DTYPE_POLICIES, "--dtype-policy",
              f"one of {', '.join(DTYPE_POLICIES)}", self.dtype_policy)  # fmt: skip
        for name in ("connect_timeout", "heartbeat_timeout"):
            value = getattr(self, name)
            check(value > 0, flag(name), "a positive integer", value)
        check(self.num_processes is None or self.num_processes > 0, "--num-processes",
              "a positive integer", self.num_processes)  # fmt: skip
        check(self.process_id is None or 0 <= self.process_id < (self.num_processes or 2**31),
              "--process-id", f"an integer in [0, {self.num_processes or 'N'})",
              self.process_id)  # fmt: skip
        check(self.coordinator is None or _is_address(self.coordinator), "--coordinator",
              "HOST:PORT (a port in 1..65535) or auto", self.coordinator)  # fmt: skip
        check(0 <= self.momentum < 1, "--momentum", "a float in [0, 1)", self.momentum)
        check(self.clipnorm is None or (math.isfinite(self.clipnorm) and self.clipnorm > 0),
              "--clipnorm", "a positive float", self.clipnorm)  # fmt: skip
        check(self.timesteps is None or self.timesteps > 0, "--timesteps", "a positive integer",
              self.timesteps)  # fmt: skip
        check(0 <= self.validation_fraction < 1, "--validation-fraction", "a float in [0, 1)",
              self.validation_fraction)  # fmt: skip
        self._validate_schedule()
        if self.keep_best:
            given = Literal(f"--keep-best with --validation-fraction {self.validation_fraction}")
            check(self.validation_fraction > 0, "--keep-best",
                  "a validation split to select on: --validation-fraction above 0 (the "
                  "test split is read only at the end)", given)  # fmt: skip
            check(self.eval_every > 0, "--eval-every",
                  "a positive integer with --keep-best (the evaluations it selects from)",
                  self.eval_every)  # fmt: skip
        for name in self.resume_changes():
            check(name in RESUME_CHANGEABLE, "--change-on-resume",
                  f"names among {', '.join(RESUME_CHANGEABLE)}", self.change_on_resume)  # fmt: skip
        check(self.data_dir is None or self.download or os.path.isdir(self.data_dir),
              "--data-dir", "an existing TFDS data directory or a folder of .npz files",
              self.data_dir)  # fmt: skip
        return self

    def _validate_schedule(self) -> None:
        schedule = self.lr_schedule
        check(schedule in LR_SCHEDULES, "--lr-schedule", f"one of {', '.join(LR_SCHEDULES)}",
              schedule)  # fmt: skip
        check(self.warmup_steps >= 0, "--warmup-steps", "a non-negative integer",
              self.warmup_steps)  # fmt: skip
        # The settings of another schedule would be ignored: a mistake to say, not to skip.
        cosine, step = schedule == "cosine", schedule == "step"
        check(math.isfinite(self.lr_floor) and 0 <= self.lr_floor <= 1, "--lr-floor",
              "a float in [0, 1] (a fraction of --learning-rate)", self.lr_floor)  # fmt: skip
        check(cosine or self.lr_floor == 0, "--lr-floor", "0 unless --lr-schedule cosine",
              self.lr_floor)  # fmt: skip
        if self.lr_decay_steps is not None:
            check(cosine, "--lr-decay-steps", "none unless --lr-schedule cosine",
                  self.lr_decay_steps)  # fmt: skip
            check(self.lr_decay_steps > self.warmup_steps, "--lr-decay-steps",
                  f"an integer above --warmup-steps ({self.warmup_steps})",
                  self.lr_decay_steps)  # fmt: skip
        check(math.isfinite(self.lr_decay_factor) and 0 < self.lr_decay_factor < 1,
              "--lr-decay-factor", "a float in (0, 1)", self.lr_decay_factor)  # fmt: skip
        check(step or self.lr_decay_factor == DEFAULT_LR_DECAY_FACTOR, "--lr-decay-factor",
              f"{DEFAULT_LR_DECAY_FACTOR} (the default) unless --lr-schedule step",
              self.lr_decay_factor)  # fmt: skip
        check(step or self.lr_boundaries is None, "--lr-boundaries",
              "none unless --lr-schedule step", self.lr_boundaries)  # fmt: skip
        check(not step or self.lr_boundaries, "--lr-boundaries",
              "comma-separated steps with --lr-schedule step", self.lr_boundaries)  # fmt: skip
        self.boundaries()


def _is_address(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return text == "auto" or (bool(host) and port.isdigit() and 0 < int(port) < 65536)


def flag(name: str) -> str:
    """The command-line flag of a field: `sigma_w` -> `--sigma-w`."""
    return "--" + name.replace("_", "-")


def identity_fields() -> tuple[str, ...]:
    """The fields a resumed run must keep (marked `identity` on the field)."""
    return tuple(f.name for f in dataclasses.fields(RunConfig) if f.metadata["identity"])


def check_types(config: object, skip: tuple[str, ...] = ()) -> None:
    """Raises `UsageError` naming the flag of the first field of a dataclass of a wrong type."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):  # type: ignore[arg-type]
        if field.name in skip:
            continue
        value, expected = getattr(config, field.name), hints[field.name]
        if not _is_instance(value, expected):
            raise invalid(flag(field.name), _type_words(expected), value)


def check_batch_size(batch_size: int, replicas: int) -> None:
    """Raises `UsageError` unless the global batch splits evenly over `replicas`."""
    check(batch_size % replicas == 0, "--batch-size", f"a multiple of the {replicas} replicas",
          batch_size)  # fmt: skip


def _is_instance(value, expected) -> bool:
    """`isinstance` for the field types used here (bool is no int; an int is a float)."""
    if isinstance(expected, types.UnionType):
        return any(_is_instance(value, arm) for arm in typing.get_args(expected))
    if expected is type(None):
        return value is None
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, expected)


def _type_words(expected) -> str:
    words = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    if isinstance(expected, types.UnionType):
        arms = typing.get_args(expected)
        said = " or ".join(words[a] for a in arms if a is not type(None))
        return said + " (or null)" if type(None) in arms else said
    return words[expected]
