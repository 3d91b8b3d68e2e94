"""One training run: `train_and_evaluate(config, workdir)`, from a `RunConfig` to its metrics.

The command line is `training.train`; `training.tune` (retraining the best
trial) and the reproduction suite call this directly. Everything lands in
`workdir` (default `runs/<task>-<model>`): `config.yaml` (the resolved
`training.config.RunConfig`), `checkpoints/` (atomic: the index moves only
after a save is complete), `logs/` (TensorBoard), `curve.json` (with
`eval_every`), `best.npz` (with `keep_best`), `metrics.json` and
`model.keras`. Running the same config again resumes from the last checkpoint.

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

import keras_antisym
from apputil.errors import UsageError, check, invalid
from apputil.files import FolderLock, atomic_path, write_atomically
from apputil.quiet import native_stderr_silenced
from training import distribution, loop, schedules, tasks
from training.config import RunConfig, identity_fields
from training.errors import RunLockedError
from training.models import build_model
from training.optimizers import make_optimizer
from training.summaries import ScalarWriter
from training.trainers import make_trainer


def weights_fingerprint(model: keras.Model) -> str:
    """SHA-256 of all weights' bytes: equal on workers that hold equal weights."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(weight.tobytes())
    return digest.hexdigest()


# What a refusal to resume adds for a setting the user may not have given.
_RESUME_HINTS = {
    "lr_decay_steps": "the cosine schedule decays over the run's first --steps; give "
    "--lr-decay-steps {before} to go on at its floor, or start a new run with another "
    "--output-dir",
}


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
    changed = {}
    for key in identity_fields():
        if key in before and before[key] != config.get(key):
            if key in allowed:
                changed[key] = (before[key], config.get(key))
                continue
            hint = _RESUME_HINTS.get(
                key, "a resumed run keeps its settings; start a new one with another --output-dir"
            ).format(before=before[key])
            expected = f"{before[key]!r} as in {path} ({hint})"
            raise invalid(f"--{key.replace('_', '-')}", expected, config.get(key))
    return changed


def _describe_device():
    """One line: the backend, then the machine it computes on, alike for every backend
    ("jax on 1 x NVIDIA H100 80GB HBM3 (gpu)", "torch on cpu"): the report compares runs
    by machine."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        found = [(d.device_kind, d.platform) for d in jax.devices() if d.platform != "cpu"]
    elif backend == "torch":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        found = [(torch.cuda.get_device_name(i), "gpu") for i in range(count)]
    else:
        import tensorflow as tf  # present: this is the TensorFlow backend

        found = [
            (tf.config.experimental.get_device_details(gpu).get("device_name", "GPU"), "gpu")
            for gpu in tf.config.list_physical_devices("GPU")
        ]
    if not found:
        return f"{backend} on cpu"
    name, platform = found[0]
    return f"{backend} on {len(found)} x {name} ({platform})"


def _versions():
    versions = {
        "keras_antisym_version": keras_antisym.__version__,
        "keras_version": keras.__version__,
        "backend": keras.backend.backend(),
    }
    module = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}[versions["backend"]]
    versions[f"{module}_version"] = str(__import__(module).__version__)
    return versions


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
    def load(cls, task, config):
        fraction = config.validation_fraction
        return cls(
            task.examples("train", config.data_dir, fraction),
            task.examples("validation", config.data_dir, fraction) if fraction else None,
            lambda: task.examples("test", config.data_dir),
        )


# The weights of the best validation evaluation (`keep_best`), in the run's folder.
BEST_WEIGHTS = "best.npz"


def default_workdir(config: RunConfig) -> str:
    return os.path.join("runs", f"{config.task}-{config.model}")


def train_and_evaluate(
    config: RunConfig, workdir: str | None = None, log: typing.Callable[[str], object] = print
) -> dict:
    """Trains as `config` (a validated `RunConfig`) says; returns the metrics.

    Everything is written to `workdir` (default `runs/<task>-<model>`): the
    outputs listed in the module doc. Rerunning resumes from its checkpoint.
    """
    config = config.resolved()
    task = tasks.get_task(config.task, timesteps=config.timesteps, dataset=config.dataset)
    if config.download and task.dataset is not None:
        log(f"data set {task.dataset} in {tasks.prepare(task.dataset, config.data_dir)}")
    with native_stderr_silenced():  # TensorFlow's device probing prints absl lines
        strategy = distribution.make(config.strategy, tpu=config.tpu)  # before other TF ops
        device = _describe_device()
    workdir = workdir or default_workdir(config)
    os.makedirs(workdir, exist_ok=True)
    lock = FolderLock(workdir)
    if distribution.chief_process(strategy) and not lock.acquire():
        raise RunLockedError(
            f"{workdir} is in use by process {lock.holder()}: another run trains there "
            f"(wait for it to end, or give another --output-dir)"
        )
    try:
        return _train_locked(config, task, strategy, device, workdir, log)
    finally:
        lock.release()


def _train_locked(config, task, strategy, device, workdir, log):
    log(f"training on {device}")
    splits = Splits.load(task, config)
    trainer = _make_trainer(task, config, splits, strategy, workdir)
    record = _run_record(config, task, trainer, splits, workdir, device)
    start_step = _restore(trainer, config, record, workdir, log)
    writer = ScalarWriter(os.path.join(workdir, "logs") if trainer.chief else None)
    diagnostics = None
    if config.diagnostics:  # probed on the split the curve evaluates
        probe = splits.validation if splits.validation is not None else splits.test
        diagnostics = loop.Diagnostics(trainer.model, task, *probe, config.diagnostics)
    curve = _learning_curve(config, task, splits, workdir, start_step)
    best = None
    if config.keep_best:
        best = loop.BestWeights(os.path.join(workdir, BEST_WEIGHTS))
        best.resume(start_step, log)
    history = loop.train(
        trainer, config, start_step, writer=writer, log=log, diagnostics=diagnostics,
        curve=curve, best=best,
    )  # fmt: skip
    selection = _select(trainer, best, start_step + history["steps"], log)
    metrics = _final_metrics(config, trainer, task, splits, history, start_step, record)
    metrics.update(selection)
    if not history["steps"]:  # a finished run run again: its training numbers stay
        metrics.update(_previous_training_metrics(workdir, metrics["steps"]))
    if curve is not None and curve.points:
        metrics["train_seconds"] = curve.points[-1]["train_seconds"]
    if diagnostics is not None:
        metrics["diagnostics"] = diagnostics.latest
    writer.scalar("test/accuracy", metrics["test_accuracy"], metrics["steps"])
    writer.scalar("test/loss", metrics["test_loss"], metrics["steps"])
    writer.close()
    if trainer.chief:
        if "test_examples" not in record:  # the test split was first read now
            record["test_examples"] = int(len(splits.test[1]))
            _write_record(workdir, record)
        with atomic_path(os.path.join(workdir, "model.keras")) as partial:
            trainer.save_model(partial)
        text = json.dumps(metrics, indent=2) + "\n"
        write_atomically(os.path.join(workdir, "metrics.json"), text)
    _log_result(trainer, metrics, workdir, log)
    return metrics


def _select(trainer, best, steps, log):
    """Puts the selected weights in the model: the best evaluation's with `keep_best`."""
    if best is None or best.weights is None:
        if best is not None:
            log(f"no best weights kept in {best.path}: testing the last step's")
        return {"selected_step": steps, "selected_on": "last"}
    trainer.model.set_weights(best.weights)
    log(f"testing the weights of step {best.step} (validation_accuracy {best.accuracy:.4f})")
    return {"selected_step": best.step, "selected_on": "validation"}


def _make_trainer(task, config, splits, strategy, workdir):
    def build():
        keras.utils.set_random_seed(config.seed)
        model = build_model(
            task.spec, config.model, units=config.units, epsilon=config.epsilon,
            gamma=config.gamma, sigma_w=config.sigma_w, seed=config.seed,
            dtype_policy=config.dtype_policy,
        )  # fmt: skip
        optimizer = make_optimizer(
            config.optimizer, schedules.learning_rate(config), config.momentum,
            config.clipnorm, config.dtype_policy,
        )  # fmt: skip
        return model, optimizer

    return make_trainer(
        task,
        build,
        *splits.train,
        batch_size=config.batch_size,
        seed=config.seed,
        strategy=strategy,
        checkpoint_dir=os.path.join(workdir, "checkpoints"),
        jit_compile=config.jit_compile,
    )


def _run_record(config, task, trainer, splits, workdir, device):
    """What `config.yaml` records: the config, the task's shape, where and how it ran."""
    spec = task.spec
    record = {
        **config.to_dict(),
        "output_dir": workdir,
        "task_params": spec.params,
        "timesteps": spec.timesteps,
        "dataset": spec.params.get("dataset", config.dataset),
        "features": spec.features,
        "strategy_class": trainer.strategy_name,
        "replicas": trainer.replicas,
        "device": device,
        "train_examples": int(len(splits.train[1])),
        **_versions(),
    }
    if not config.keep_best:  # with it, the test split is read only after training
        record["test_examples"] = int(len(splits.test[1]))
    return record


def _restore(trainer, config, record, workdir, log):
    """Restores the last checkpoint (checking it may resume), writes `config.yaml`."""
    checkpoints = os.path.join(workdir, "checkpoints")
    changed = {}
    if os.path.isdir(checkpoints) and os.listdir(checkpoints):
        path = os.path.join(workdir, "config.yaml")
        changed = check_resumable(path, record, config.resume_changes())
    start_step, restored = trainer.restore()
    if restored and changed:
        # The checkpoint restored the optimizer's old values: the new ones apply from here.
        # A schedule holds no rate to restore: it was built with the new peak.
        if "learning_rate" in changed and not config.has_schedule():
            trainer.optimizer.learning_rate = config.learning_rate
        if "clipnorm" in changed:
            trainer.optimizer.clipnorm = config.clipnorm
        for name, (before, now) in changed.items():
            log(f"resuming with {name} {now} (was {before})")
    changes = _previous_record(workdir).get("resume_changes", []) if restored else []
    if restored and changed:
        changes.append({"step": start_step, **{name: now for name, (_, now) in changed.items()}})
    if changes:
        record["resume_changes"] = changes
    if restored:
        check(
            config.steps >= start_step,
            "--steps",
            f"at least the {start_step} steps the run in {workdir} has trained",
            config.steps,
        )
        log(f"resumed from {restored} at step {start_step}")
    if trainer.chief:
        _write_record(workdir, record)
    return start_step


def _write_record(workdir, record):
    write_atomically(os.path.join(workdir, "config.yaml"), yaml.safe_dump(record, sort_keys=True))


def _previous_record(workdir):
    path = os.path.join(workdir, "config.yaml")
    if not os.path.isfile(path):
        return {}
    with open(path) as handle:
        return yaml.safe_load(handle) or {}


def _learning_curve(config, task, splits, workdir, start_step):
    if not config.eval_every:
        return None
    validation = splits.validation is not None
    curve = loop.LearningCurve(
        os.path.join(workdir, "curve.json"),
        config.eval_every,
        "validation" if validation else "test",
        splits.validation if validation else splits.test,
        task,
        config.eval_batch_size,
        config.seed,
    )
    curve.resume(start_step)
    return curve


def _final_metrics(config, trainer, task, splits, history, start_step, record):
    def evaluate(split):
        return loop.evaluate(trainer.predict, task, *split, config.eval_batch_size, config.seed)

    test_loss, test_accuracy = evaluate(splits.test)
    metrics = {
        "weights_sha256": weights_fingerprint(trainer.model),
        "task": config.task,
        "model": config.model,
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


def _previous_training_metrics(workdir, steps):
    """The last loss, accuracy and seconds of the run's `metrics.json` at `steps` steps."""
    path = os.path.join(workdir, "metrics.json")
    try:
        with open(path) as handle:
            previous = json.load(handle)
    except (OSError, ValueError):
        return {}
    if previous.get("steps") != steps:
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
