"""Train a model on a task, on any Keras backend and strategy, resuming after a crash.

    python -m training.train --task pixel_mnist --model antisymmetric --units 128 \\
        --epsilon 0.01 --gamma 0.01 --optimizer sgd --learning-rate 0.1 \\
        --batch-size 128 --steps 50000 --output-dir runs/x

`KERAS_BACKEND` picks the backend: TensorFlow trains under `tf.distribute`,
JAX under `keras.distribution` (`--strategy data_parallel`), PyTorch on one
device (`training.trainers`); all see the same batches. The output directory
receives `config.yaml` (the resolved `training.config.RunConfig`), `checkpoints/` (atomic: the
index moves only after a save is complete), `logs/` (TensorBoard),
`curve.json` (with `--eval-every`), `metrics.json` and `model.keras`. Running
the same command again resumes from the last checkpoint. A non-finite loss
stops the run with exit status 2.
"""

import json
import os
import sys

from training import options
from training.config import check


def build_parser():
    parser = options.OneLineParser(
        prog="python -m training.train", description=__doc__.split("\n\n")[0]
    )
    options.add_data_arguments(parser)
    options.add_model_arguments(parser)
    options.add_optimizer_arguments(parser)
    options.add_distribution_arguments(parser)
    group = parser.add_argument_group("run")
    group.add_argument("--steps", type=int, default=2000, help="training steps (global batches)")
    group.add_argument("--output-dir", default=None, help="default: runs/<task>-<model>")
    group.add_argument("--checkpoint-every", type=int, default=200)
    group.add_argument("--log-every", type=int, default=50)
    group.add_argument("--eval-batch-size", type=int, default=256)
    group.add_argument(
        "--validation-fraction",
        type=float,
        default=0.0,
        help="hold out this fraction of the training data and report val_accuracy",
    )
    group.add_argument(
        "--eval-every",
        type=int,
        default=0,
        metavar="N",
        help="evaluate every N steps (validation split if any, else test) into curve.json",
    )
    group.add_argument("--jit-compile", action="store_true", help="XLA-compile the train step")
    group.add_argument(
        "--diagnostics",
        type=int,
        default=0,
        metavar="N",
        help="log stability diagnostics every N steps (0: off)",
    )
    return parser


def weights_fingerprint(model):
    """SHA-256 of all weights' bytes: equal on workers that hold equal weights."""
    import hashlib

    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(weight.tobytes())
    return digest.hexdigest()


# What a checkpoint was trained with: a resumed run must keep these (more --steps extend it;
# logging, evaluation and checkpoint periods may change).
RUN_IDENTITY = (
    "task", "dataset", "timesteps", "model", "units", "epsilon", "gamma", "sigma_w",
    "optimizer", "learning_rate", "momentum", "clipnorm", "batch_size", "seed",
    "validation_fraction",
)  # fmt: skip


def check_resumable(path, config):
    """Refuses (one line, nothing rewritten) to resume a run with other settings."""
    import yaml

    if not os.path.isfile(path):
        return
    with open(path) as handle:
        before = yaml.safe_load(handle) or {}
    for key in RUN_IDENTITY:
        if key in before and before[key] != config.get(key):
            raise options.UsageError(
                f"Received an invalid value for argument `--{key.replace('_', '-')}`, expected "
                f"{before[key]!r} as in {path} (a resumed run keeps its settings; start a new "
                f"one with another --output-dir), got {config.get(key)!r}."
            )


def _describe_device():
    """One line: the backend and the devices it computes on."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        devices = jax.devices()
        return f"jax on {len(devices)} x {devices[0].device_kind} ({devices[0].platform})"
    if backend == "torch":
        import torch

        if torch.cuda.is_available():
            return f"torch on {torch.cuda.get_device_name(0)} (cuda)"
        return "torch on cpu"
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return f"tensorflow on {len(gpus)} GPU(s)" if gpus else "tensorflow on cpu"


def _versions():
    import keras

    import keras_antisym

    versions = {
        "keras_antisym_version": keras_antisym.__version__,
        "keras_version": keras.__version__,
        "backend": keras.backend.backend(),
    }
    module = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}[versions["backend"]]
    versions[f"{module}_version"] = str(__import__(module).__version__)
    return versions


def train_and_evaluate(config, workdir=None, log=print):
    """Trains as `config` (a validated `RunConfig`) says; returns the metrics.

    Everything is written to `workdir` (default `runs/<task>-<model>`): the
    outputs listed in the module doc. Rerunning resumes from its checkpoint.
    """
    import yaml

    from training import distribution, loop, tasks
    from training.models import build_model
    from training.summaries import ScalarWriter
    from training.trainers import make_trainer

    task = tasks.get_task(config.task, timesteps=config.timesteps, dataset=config.dataset)
    spec = task.spec
    strategy = distribution.make(config.strategy, tpu=config.tpu)  # before any other TF op
    output_dir = workdir or os.path.join("runs", f"{config.task}-{config.model}")
    os.makedirs(output_dir, exist_ok=True)
    device = _describe_device()
    log(f"training on {device}")

    train_x, train_y = task.examples("train", config.data_dir, config.validation_fraction)
    test_x, test_y = task.examples("test", config.data_dir)
    val = (
        task.examples("validation", config.data_dir, config.validation_fraction)
        if config.validation_fraction
        else None
    )

    def build():
        import keras

        keras.utils.set_random_seed(config.seed)
        model = build_model(
            spec,
            config.model,
            units=config.units,
            epsilon=config.epsilon,
            gamma=config.gamma,
            sigma_w=config.sigma_w,
            seed=config.seed,
        )
        optimizer = options.make_optimizer(
            config.optimizer, config.learning_rate, config.momentum, config.clipnorm
        )
        return model, optimizer

    trainer = make_trainer(
        task,
        build,
        train_x,
        train_y,
        batch_size=config.batch_size,
        seed=config.seed,
        strategy=strategy,
        checkpoint_dir=os.path.join(output_dir, "checkpoints"),
        jit_compile=config.jit_compile,
    )
    model = trainer.model
    recorded = config.to_dict()
    recorded.update(
        output_dir=output_dir,
        task_params=spec.params,
        timesteps=spec.timesteps,
        features=spec.features,
        strategy_class=trainer.strategy_name,
        replicas=trainer.replicas,
        device=device,
        train_examples=int(len(train_y)),
        test_examples=int(len(test_y)),
        **_versions(),
    )
    start_step, restored = trainer.restore()
    if restored:
        check_resumable(os.path.join(output_dir, "config.yaml"), recorded)
        check(
            config.steps >= start_step,
            "steps",
            f"at least the {start_step} steps the run in {output_dir} has trained",
            config.steps,
        )
        log(f"resumed from {restored} at step {start_step}")
    if trainer.chief:
        options.write_atomically(
            os.path.join(output_dir, "config.yaml"), yaml.safe_dump(recorded, sort_keys=True)
        )
    writer = ScalarWriter(os.path.join(output_dir, "logs") if trainer.chief else None)
    diagnostics = None
    if config.diagnostics:
        diagnostics = loop.Diagnostics(model, task, test_x, test_y, config.diagnostics)
    curve = None
    if config.eval_every:
        split, examples = ("validation", val) if val is not None else ("test", (test_x, test_y))
        curve = loop.LearningCurve(
            os.path.join(output_dir, "curve.json"),
            config.eval_every,
            split,
            examples,
            task,
            config.eval_batch_size,
            config.seed,
        )
        curve.resume(start_step)

    history = loop.train(
        trainer,
        start_step,
        config.steps,
        checkpoint_every=config.checkpoint_every,
        log_every=config.log_every,
        writer=writer,
        log=log,
        diagnostics=diagnostics,
        curve=curve,
    )

    test_loss, test_accuracy = loop.evaluate(
        trainer.predict, task, test_x, test_y, config.eval_batch_size, config.seed
    )
    steps_done = int(start_step + history["steps"])
    metrics = {
        "weights_sha256": weights_fingerprint(model),
        "task": config.task,
        "model": config.model,
        "test_accuracy": test_accuracy,
        "test_loss": test_loss,
        "steps": steps_done,
        "steps_this_run": history["steps"],
        "examples_per_second": history["examples_per_second"],
        "wall_time_seconds": history["wall_time_seconds"],
        "train_seconds": (curve.points[-1]["train_seconds"] if curve and curve.points else None),
        "final_train_loss": history["final_loss"],
        "final_train_accuracy": history["final_accuracy"],
        "resumed_from_step": start_step,
        "parameters": int(model.count_params()),
        "replicas": trainer.replicas,
        "device": device,
        "backend": recorded["backend"],
    }
    if diagnostics is not None:
        metrics["diagnostics"] = diagnostics.latest
    if val is not None:
        metrics["val_loss"], metrics["val_accuracy"] = loop.evaluate(
            trainer.predict, task, val[0], val[1], config.eval_batch_size, config.seed
        )
    writer.scalar("test/accuracy", test_accuracy, metrics["steps"])
    writer.scalar("test/loss", test_loss, metrics["steps"])
    writer.close()
    if trainer.chief:
        model_path = os.path.join(output_dir, "model.keras")
        partial = os.path.join(output_dir, "model.partial.keras")
        trainer.save_model(partial)
        os.replace(partial, model_path)
        options.write_atomically(
            os.path.join(output_dir, "metrics.json"), json.dumps(metrics, indent=2) + "\n"
        )
    log(f"[{trainer.label}] weights_sha256 {metrics['weights_sha256']}")
    rate = metrics["examples_per_second"]
    shown_rate = f"{rate:.0f} examples/s" if rate else "no new steps"
    log(
        f"test_accuracy {test_accuracy:.4f} test_loss {test_loss:.4f} "
        f"steps {metrics['steps']} ({shown_rate}) -> {output_dir}"
    )
    return metrics


def main(argv=None):
    def body(args):
        from training.config import RunConfig
        from training.distribution import split_cpu

        config = RunConfig.from_namespace(args).validate()
        split_cpu(config.cpu_devices)
        train_and_evaluate(config, args.output_dir)

    return options.run_command(build_parser(), argv, body)


if __name__ == "__main__":
    sys.exit(main())
