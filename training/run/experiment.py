"""One training run: `train_and_evaluate(config, workdir)`, from a `RunConfig` to its metrics.

The one place a run is assembled: `build_trainer` (model, optimizer and the
backend's trainer, also for a tuner trial) and `train_and_evaluate` (the
folder, the record, the restore, the callbacks, the final evaluation). The
command line is `training.train`; `training.tune` (retraining the best
trial) and the reproduction suite call this directly. Everything lands in
the run's folder (`training.run.rundir.RunDir`, default
`runs/<task>-<model>`): `config.yaml` (the resolved
`training.config.RunConfig`, and where and how it ran), `checkpoints/`
(atomic: the index moves only after a save is complete), `logs/`
(TensorBoard), `curve.json` (with `eval_every`), `best.npz` (with
`keep_best`), `metrics.json` and `model.keras`. Running the same config
again resumes from the last checkpoint.

With `keep_best` the test split is read only after the last step: the curve
evaluates the validation split, the run's final test evaluation (and
`model.keras`) use the weights of its best validation evaluation, and
`metrics.json` names that step (`selected_step`, `selected_on`).
"""

from __future__ import annotations

import hashlib
import json
import os
import typing

import keras
import yaml

from apputil.errors import UsageError, check
from apputil.files import FolderLock, atomic_path, write_atomically
from training.backends import select
from training.backends.backend import Backend
from training.config import RunConfig, identity_fields
from training.errors import RunLockedError
from training.run import loop, schedules
from training.run.callbacks import BestWeights, Checkpoints, Diagnostics, LearningCurve
from training.run.identity import check_unchanged
from training.run.loop import Callback, Run
from training.run.rundir import RunDir
from training.run.summaries import ScalarWriter
from training.sections import flag
from training.tasks import catalog
from training.tasks.models import build_model
from training.tasks.optimizers import make_optimizer


def weights_fingerprint(model: keras.Model) -> str:
    """SHA-256 of all weights' bytes: equal on workers that hold equal weights."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(weight.tobytes())
    return digest.hexdigest()


# What a refusal to resume adds for a setting the user may not have given.
_RESUME_HINTS = {
    "lr_decay_steps": "the cosine schedule decays over the run's first --steps; give "
    "--lr-decay-steps {before} to go on with the same schedule (at its floor once the decay "
    "and the warm-up are over), or start a new run with another --output-dir",
}


def _resume_hint(key: str, before: object) -> str:
    hint = _RESUME_HINTS.get(
        key, "a resumed run keeps its settings; start a new one with another --output-dir"
    )
    return hint.format(before=before)


def check_resumable(path: str, config: dict, allowed: tuple[str, ...] = ()) -> dict:
    """Refuses (one line, nothing rewritten) to resume a run with other settings.

    Called before any checkpoint is read, so that a model of another shape or
    another backend's checkpoint format fails here, not in the restore.
    `allowed` names the identity settings that may change (`--change-on-resume`).

    Returns:
        The allowed settings that changed: name -> (before, now).
    """
    if not os.path.isfile(path):
        return {}
    with open(path) as handle:
        before = yaml.safe_load(handle) or {}
    if before.get("backend", config["backend"]) != config["backend"]:
        raise UsageError(
            f"Received an invalid value for the environment variable `KERAS_BACKEND`, expected "
            f"{before['backend']!r} as in {path} (checkpoints resume on the backend that wrote "
            f"them; start a new run with another --output-dir), got {config['backend']!r}."
        )
    # A record may hold `dataset: null` for the task's default data set; its task
    # parameters name that data set.
    if before.get("dataset") is None and (before.get("task_params") or {}).get("dataset"):
        before["dataset"] = before["task_params"]["dataset"]
    now = {key: config.get(key) for key in identity_fields()}
    return check_unchanged(before, now, path=path, flag=flag, hint=_resume_hint, allowed=allowed)


class Splits:
    """`(inputs, targets)` of each split; `validation` is None without one.

    The test split is read when first used: with `keep_best`, only after training.
    """

    def __init__(self, train, validation, read_test):
        self.train, self.validation = train, validation
        self._read_test, self._test = read_test, None

    @property
    def test(self):
        if self._test is None:
            self._test = self._read_test()
        return self._test

    @classmethod
    def load(cls, task, config: RunConfig) -> Splits:
        fraction, data_dir = config.loop.validation_fraction, config.task.data_dir
        return cls(
            task.examples("train", data_dir, fraction),
            task.examples("validation", data_dir, fraction) if fraction else None,
            lambda: task.examples("test", data_dir),
        )


def model_of(config: RunConfig, task: typing.Any) -> keras.Model:
    """The (uncompiled) model `config.model` describes, for `task`."""
    model = config.model
    return build_model(
        task.spec, model.name, units=model.units, epsilon=model.epsilon, gamma=model.gamma,
        sigma_w=model.sigma_w, seed=config.task.seed, dtype_policy=model.dtype_policy,
    )  # fmt: skip


def build_trainer(
    config: RunConfig,
    task: typing.Any,
    examples: tuple[typing.Any, typing.Any],
    backend: Backend,
    *,
    checkpoint_dir: str | None = None,
    model: keras.Model | None = None,
    schedule_steps: int | None = None,
) -> typing.Any:
    """The backend's trainer of `config`'s model and optimizer on `examples` (inputs, targets).

    Args:
        config: The run (a tuner trial's has the trial's hyperparameters).
        task: A `training.tasks.catalog.Task`.
        examples: The training split.
        backend: What it trains on (`training.backends.select.start`).
        checkpoint_dir: Where checkpoints live (None: no checkpoints).
        model: A model already built (a tuner trial's), else `model_of(config, task)`.
        schedule_steps: The length of the learning-rate schedule (default: the
            run's steps).
    """
    optimizer = config.optimizer

    def build():
        built = model
        if built is None:
            keras.utils.set_random_seed(config.task.seed)
            built = model_of(config, task)
        rate = schedules.learning_rate(optimizer, schedule_steps or config.loop.steps)
        return built, make_optimizer(
            optimizer.name, rate, optimizer.momentum, optimizer.clipnorm,
            config.model.dtype_policy,
        )  # fmt: skip

    return backend.make_trainer(
        task, build, *examples, batch_size=optimizer.batch_size, seed=config.task.seed,
        checkpoint_dir=checkpoint_dir, jit_compile=config.loop.jit_compile,
    )  # fmt: skip


def train_and_evaluate(
    config: RunConfig,
    workdir: str | None = None,
    log: typing.Callable[[str], object] = print,
    backend: Backend | None = None,
) -> dict:
    """Trains as `config` (a validated `RunConfig`) says; returns the metrics.

    Everything is written to `workdir` (default `runs/<task>-<model>`): the
    outputs listed in the module doc. Rerunning resumes from its checkpoint.
    `backend` is what it trains on (default: `training.backends.select.start()`,
    the current Keras backend with the strategy "auto").
    """
    config = config.resolved()
    task = catalog.get_task(config.task.name, timesteps=config.task.timesteps,
                            dataset=config.task.dataset)  # fmt: skip
    if config.task.download and task.dataset is not None:
        log(f"data set {task.dataset} in {catalog.prepare(task.dataset, config.task.data_dir)}")
    backend = backend if backend is not None else select.start()
    rundir = RunDir(workdir) if workdir else RunDir.default(config.task.name, config.model.name)
    os.makedirs(rundir.path, exist_ok=True)
    lock = FolderLock(rundir.path)
    if backend.chief and not lock.acquire():
        raise RunLockedError(
            f"{rundir.path} is in use by process {lock.holder()}: another run trains there "
            f"(wait for it to end, or give another --output-dir)"
        )
    try:
        return _train_locked(config, task, backend, rundir, log)
    finally:
        lock.release()


def _train_locked(config, task, backend, rundir, log):
    device = backend.describe_device()
    log(f"training on {device}")
    splits = Splits.load(task, config)
    trainer = build_trainer(config, task, splits.train, backend, checkpoint_dir=rundir.checkpoints)
    record = _run_record(config, task, trainer, splits, rundir, device, backend)
    start_step = _restore(trainer, config, record, rundir, log)
    writer = ScalarWriter(rundir.logs if trainer.chief else None)
    run = Run(config, trainer, writer=writer, log=log, start_step=start_step,
              callbacks=_callbacks(config, task, splits, rundir))  # fmt: skip
    summary = run.train()
    steps = start_step + summary["steps"]
    metrics = _final_metrics(config, trainer, task, splits, summary, start_step, record)
    metrics["selected_step"] = summary.get("selected_step", steps)
    metrics["selected_on"] = summary.get("selected_on", "last")
    if not summary["steps"]:  # a finished run run again: its training numbers stay
        metrics.update(_previous_training_metrics(rundir, metrics["steps"]))
    if summary.get("train_seconds") is not None:
        metrics["train_seconds"] = summary["train_seconds"]
    if "diagnostics" in summary:
        metrics["diagnostics"] = summary["diagnostics"]
    writer.scalar("test/accuracy", metrics["test_accuracy"], metrics["steps"])
    writer.scalar("test/loss", metrics["test_loss"], metrics["steps"])
    writer.close()
    if trainer.chief:
        if "test_examples" not in record:  # the test split was first read now
            record["test_examples"] = int(len(splits.test[1]))
            _write_record(rundir, record)
        with atomic_path(rundir.model) as partial:
            trainer.save_model(partial)
        write_atomically(rundir.metrics, json.dumps(metrics, indent=2) + "\n")
    _log_result(trainer, metrics, rundir.path, log)
    return metrics


def _callbacks(config, task, splits, rundir) -> list[Callback]:
    """Diagnostics, the learning curve and the best weights as asked, then checkpoints."""
    loop_config, seed = config.loop, config.task.seed
    # Evaluations (and the diagnostics' probe) use the validation split if there is one:
    # with `keep_best` the test split is read only after training.
    split = "validation" if splits.validation is not None else "test"
    callbacks: list[Callback] = []
    if loop_config.diagnostics:
        probe = splits.validation if splits.validation is not None else splits.test
        inputs, targets = probe
        callbacks.append(Diagnostics(task, inputs, targets, loop_config.diagnostics))
    if loop_config.eval_every:
        examples = splits.validation if splits.validation is not None else splits.test
        callbacks.append(LearningCurve(rundir.curve, loop_config.eval_every, split, examples,
                                       task, loop_config.eval_batch_size, seed))  # fmt: skip
    if loop_config.keep_best:
        callbacks.append(BestWeights(rundir.best_weights))
    callbacks.append(Checkpoints(loop_config.checkpoint_every))
    return callbacks


def _run_record(config, task, trainer, splits, rundir, device, backend):
    """What `config.yaml` records: the config, the task's shape, where and how it ran."""
    spec = task.spec
    record = {
        **config.to_dict(),
        "output_dir": rundir.path,
        "task_params": spec.params,
        "timesteps": spec.timesteps,
        "dataset": spec.params.get("dataset", config.task.dataset),
        "features": spec.features,
        **backend.launch.flat(),  # how it ran: the strategy, the processes, the CPU split
        "strategy_class": trainer.strategy_name,
        "replicas": trainer.replicas,
        "device": device,
        "train_examples": int(len(splits.train[1])),
        "validation_examples": 0 if splits.validation is None else int(len(splits.validation[1])),
        **backend.versions(),
    }
    if not config.loop.keep_best:  # with it, the test split is read only after training
        record["test_examples"] = int(len(splits.test[1]))
    return record


def _restore(trainer, config, record, rundir, log):
    """Restores the last checkpoint (checking it may resume), writes `config.yaml`."""
    changed = {}
    if rundir.has_checkpoints():
        changed = check_resumable(rundir.config, record, config.loop.resume_changes())
    start_step, restored = trainer.restore()
    optimizer = config.optimizer
    if restored and changed:
        # The checkpoint restored the optimizer's old values: the new ones apply from here.
        # A schedule holds no rate to restore: it was built with the new peak.
        if "learning_rate" in changed and not optimizer.schedule.varies:
            trainer.optimizer.learning_rate = optimizer.learning_rate
        if "clipnorm" in changed:
            trainer.optimizer.clipnorm = optimizer.clipnorm
        for name, (before, now) in changed.items():
            log(f"resuming with {name} {now} (was {before})")
    changes = rundir.read_config().get("resume_changes", []) if restored else []
    if restored and changed:
        changes.append({"step": start_step, **{name: now for name, (_, now) in changed.items()}})
    if changes:
        record["resume_changes"] = changes
    if restored:
        check(
            config.loop.steps >= start_step,
            "--steps",
            f"at least the {start_step} steps the run in {rundir.path} has trained",
            config.loop.steps,
        )
        log(f"resumed from {restored} at step {start_step}")
    if trainer.chief:
        _write_record(rundir, record)
    return start_step


def _write_record(rundir, record):
    write_atomically(rundir.config, yaml.safe_dump(record, sort_keys=True))


def _final_metrics(config, trainer, task, splits, history, start_step, record):
    def evaluate(split):
        inputs, targets = split
        return loop.evaluate(trainer.predict, task, inputs, targets, config.loop.eval_batch_size,
                             config.task.seed)  # fmt: skip

    test_loss, test_accuracy = evaluate(splits.test)
    metrics = {
        "weights_sha256": weights_fingerprint(trainer.model),
        "task": config.task.name,
        "model": config.model.name,
        "test_accuracy": test_accuracy,
        "test_loss": test_loss,
        "steps": int(start_step + history["steps"]),
        "steps_this_run": history["steps"],
        "examples_per_second": history["examples_per_second"],
        "wall_time_seconds": history["wall_time_seconds"],
        "train_seconds": None,
        "final_train_loss": history["final_loss"],
        "final_train_accuracy": history["final_accuracy"],
        "resumed_from_step": start_step,
        "parameters": int(trainer.model.count_params()),
        "replicas": trainer.replicas,
        "device": record["device"],
        "backend": record["backend"],
    }
    if splits.validation is not None:
        metrics["val_loss"], metrics["val_accuracy"] = evaluate(splits.validation)
    return metrics


def _previous_training_metrics(rundir, steps):
    """The last loss, accuracy and seconds of the run's `metrics.json` at `steps` steps."""
    previous = rundir.read_metrics()
    if previous is None or previous.get("steps") != steps:
        return {}
    keys = ("final_train_loss", "final_train_accuracy", "train_seconds")
    return {key: previous[key] for key in keys if previous.get(key) is not None}


def _log_result(trainer, metrics, workdir, log):
    if trainer.distributed:  # workers compare these lines: equal weights everywhere
        log(f"[{trainer.label}] weights_sha256 {metrics['weights_sha256']}")
    rate = metrics["examples_per_second"]
    shown_rate = f"{rate:.0f} examples/s" if rate else "no new steps"
    log(
        f"test_accuracy {metrics['test_accuracy']:.4f} test_loss {metrics['test_loss']:.4f} "
        f"steps {metrics['steps']} ({shown_rate}) -> {workdir}"
    )
