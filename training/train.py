"""Train a model on a task, on any Keras backend and strategy, resuming after a crash.

    python -m training.train --task pixel_mnist --model antisymmetric --units 128 \\
        --epsilon 0.01 --gamma 0.01 --optimizer sgd --learning-rate 0.1 \\
        --batch-size 128 --steps 50000 --output-dir runs/x

`KERAS_BACKEND` picks the backend: TensorFlow trains under `tf.distribute`,
JAX under `keras.distribution` (`--strategy data_parallel`), PyTorch on one
device (`training.trainers`); all see the same batches. The output directory
receives `config.yaml` (the resolved options), `checkpoints/` (atomic: the
index moves only after a save is complete), `logs/` (TensorBoard),
`curve.json` (with `--eval-every`), `metrics.json` and `model.keras`. Running
the same command again resumes from the last checkpoint. A non-finite loss
stops the run with exit status 2.
"""

import json
import os
import sys

from training import options


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


def _validate_run(args):
    options.validate(args)
    for name in ("steps", "checkpoint_every", "log_every", "eval_batch_size"):
        value = getattr(args, name)
        options._check(value > 0, name.replace("_", "-"), "a positive integer", value)
    options._check(
        0 <= args.validation_fraction < 1,
        "validation-fraction",
        "a float in [0, 1)",
        args.validation_fraction,
    )
    options._check(args.diagnostics >= 0, "diagnostics", "a non-negative integer", args.diagnostics)
    options._check(args.eval_every >= 0, "eval-every", "a non-negative integer", args.eval_every)


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


def run(args, log=print):
    """Trains as `args` says and returns the metrics (also written to disk)."""
    import yaml

    from training import distribution, loop, tasks
    from training.models import build_model
    from training.summaries import ScalarWriter
    from training.trainers import make_trainer

    task = tasks.get_task(args.task, timesteps=args.timesteps, dataset=args.dataset)
    spec = task.spec
    strategy = distribution.make(args.strategy, tpu=args.tpu)  # before any other TF op
    output_dir = args.output_dir or os.path.join("runs", f"{args.task}-{args.model}")
    os.makedirs(output_dir, exist_ok=True)
    device = _describe_device()
    log(f"training on {device}")

    train_x, train_y = task.examples("train", args.data_dir, args.validation_fraction)
    test_x, test_y = task.examples("test", args.data_dir)
    val = (
        task.examples("validation", args.data_dir, args.validation_fraction)
        if args.validation_fraction
        else None
    )

    def build():
        import keras

        keras.utils.set_random_seed(args.seed)
        model = build_model(
            spec,
            args.model,
            units=args.units,
            epsilon=args.epsilon,
            gamma=args.gamma,
            sigma_w=args.sigma_w,
            seed=args.seed,
        )
        optimizer = options.make_optimizer(
            args.optimizer, args.learning_rate, args.momentum, args.clipnorm
        )
        return model, optimizer

    trainer = make_trainer(
        task,
        build,
        train_x,
        train_y,
        batch_size=args.batch_size,
        seed=args.seed,
        strategy=strategy,
        checkpoint_dir=os.path.join(output_dir, "checkpoints"),
        jit_compile=args.jit_compile,
    )
    model = trainer.model
    config = {k: v for k, v in vars(args).items() if k != "config"}
    config.update(
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
        check_resumable(os.path.join(output_dir, "config.yaml"), config)
        options._check(
            args.steps >= start_step,
            "steps",
            f"at least the {start_step} steps the run in {output_dir} has trained",
            args.steps,
        )
        log(f"resumed from {restored} at step {start_step}")
    if trainer.chief:
        options.write_atomically(
            os.path.join(output_dir, "config.yaml"), yaml.safe_dump(config, sort_keys=True)
        )
    writer = ScalarWriter(os.path.join(output_dir, "logs") if trainer.chief else None)
    diagnostics = None
    if args.diagnostics:
        diagnostics = loop.Diagnostics(model, task, test_x, test_y, args.diagnostics)
    curve = None
    if args.eval_every:
        split, examples = ("validation", val) if val is not None else ("test", (test_x, test_y))
        curve = loop.LearningCurve(
            os.path.join(output_dir, "curve.json"),
            args.eval_every,
            split,
            examples,
            task,
            args.eval_batch_size,
            args.seed,
        )
        curve.resume(start_step)

    history = loop.train(
        trainer,
        start_step,
        args.steps,
        checkpoint_every=args.checkpoint_every,
        log_every=args.log_every,
        writer=writer,
        log=log,
        diagnostics=diagnostics,
        curve=curve,
    )

    test_loss, test_accuracy = loop.evaluate(
        trainer.predict, task, test_x, test_y, args.eval_batch_size, args.seed
    )
    steps_done = int(start_step + history["steps"])
    metrics = {
        "weights_sha256": weights_fingerprint(model),
        "task": args.task,
        "model": args.model,
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
        "backend": config["backend"],
    }
    if diagnostics is not None:
        metrics["diagnostics"] = diagnostics.latest
    if val is not None:
        metrics["val_loss"], metrics["val_accuracy"] = loop.evaluate(
            trainer.predict, task, val[0], val[1], args.eval_batch_size, args.seed
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
        _validate_run(args)
        from training.distribution import split_cpu

        split_cpu(args.cpu_devices)
        run(args)

    return options.run_command(build_parser(), argv, body)


if __name__ == "__main__":
    sys.exit(main())
