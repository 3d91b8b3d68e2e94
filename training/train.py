"""Train a model on a task, on any `tf.distribute` strategy, resuming after a crash.

    python -m training.train --task pixel_mnist --model antisymmetric --units 128 \\
        --epsilon 0.01 --gamma 0.01 --optimizer sgd --learning-rate 0.1 \\
        --batch-size 128 --steps 50000 --output-dir runs/x

One custom training loop (`strategy.run`, `distribute_datasets_from_function`,
`compute_average_loss`) serves every strategy: `model.fit` fails under
MultiWorkerMirroredStrategy (keras-team/keras#20585). The output directory
receives `config.yaml` (the resolved options), `checkpoints/` (atomic: the
`checkpoint` index moves only after a save is complete), `logs/` (TensorBoard),
`metrics.json` and `model.keras`. Running the same command again resumes from
the last checkpoint.
"""

import json
import os
import sys
import tempfile

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


def weights_fingerprint(model):
    """SHA-256 of all weights' bytes: equal on workers that hold equal weights."""
    import hashlib

    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(weight.tobytes())
    return digest.hexdigest()


def run(args, log=print):
    """Trains as `args` says and returns the metrics (also written to disk)."""
    import keras
    import tensorflow as tf
    import yaml

    import keras_antisym
    from training import distribution, loop, tasks
    from training.models import build_model

    task = tasks.get_task(args.task, timesteps=args.timesteps, dataset=args.dataset)
    spec = task.spec
    strategy = distribution.make_strategy(args.strategy, tpu=args.tpu)
    replicas = strategy.num_replicas_in_sync
    options._check(
        args.batch_size % replicas == 0,
        "batch-size",
        f"a multiple of the {replicas} replicas",
        args.batch_size,
    )
    chief = distribution.is_chief(strategy)
    output_dir = args.output_dir or os.path.join("runs", f"{args.task}-{args.model}")
    os.makedirs(output_dir, exist_ok=True)

    train_x, train_y = task.examples("train", args.data_dir, args.validation_fraction)
    test_x, test_y = task.examples("test", args.data_dir)
    val = (
        task.examples("validation", args.data_dir, args.validation_fraction)
        if args.validation_fraction
        else None
    )

    config = {k: v for k, v in vars(args).items() if k != "config"}
    config.update(
        output_dir=output_dir,
        task_params=spec.params,
        timesteps=spec.timesteps,
        features=spec.features,
        strategy_class=distribution.strategy_name(strategy),
        replicas=replicas,
        train_examples=int(len(train_y)),
        test_examples=int(len(test_y)),
        keras_antisym_version=keras_antisym.__version__,
        keras_version=keras.__version__,
        tensorflow_version=tf.__version__,
    )
    if chief:
        options.write_atomically(
            os.path.join(output_dir, "config.yaml"), yaml.safe_dump(config, sort_keys=True)
        )

    keras.utils.set_random_seed(args.seed)
    with strategy.scope():
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
        optimizer.build(model.trainable_variables)

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    # Every worker saves (the save may synchronize); only the chief keeps its copy.
    checkpoint_dir = os.path.join(output_dir, "checkpoints")
    if not chief:
        checkpoint_dir = os.path.join(tempfile.mkdtemp(), distribution.task_label(strategy))
    manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=3)
    restore_from = tf.train.latest_checkpoint(os.path.join(output_dir, "checkpoints"))
    if restore_from:
        checkpoint.restore(restore_from).assert_existing_objects_matched()
    start_step = int(optimizer.iterations.numpy())
    if restore_from:
        log(f"resumed from {restore_from} at step {start_step}")

    writer = (
        tf.summary.create_file_writer(os.path.join(output_dir, "logs"))
        if chief
        else tf.summary.create_noop_writer()
    )
    diagnostics = None
    if args.diagnostics:
        diagnostics = loop.Diagnostics(model, task, test_x, test_y, args.diagnostics)

    history = loop.train(
        model=model,
        optimizer=optimizer,
        strategy=strategy,
        task=task,
        inputs=train_x,
        targets=train_y,
        batch_size=args.batch_size,
        seed=args.seed,
        start_step=start_step,
        steps=args.steps,
        manager=manager,
        checkpoint_every=args.checkpoint_every,
        log_every=args.log_every,
        writer=writer,
        jit_compile=args.jit_compile,
        log=log,
        diagnostics=diagnostics,
    )

    test_loss, test_accuracy = loop.evaluate(
        model, task, test_x, test_y, args.eval_batch_size, args.seed
    )
    metrics = {
        "weights_sha256": weights_fingerprint(model),
        "task": args.task,
        "model": args.model,
        "test_accuracy": test_accuracy,
        "test_loss": test_loss,
        "steps": int(optimizer.iterations.numpy()),
        "steps_this_run": history["steps"],
        "examples_per_second": history["examples_per_second"],
        "wall_time_seconds": history["wall_time_seconds"],
        "final_train_loss": history["final_loss"],
        "final_train_accuracy": history["final_accuracy"],
        "resumed_from_step": start_step,
        "parameters": int(model.count_params()),
        "replicas": replicas,
    }
    if diagnostics is not None:
        metrics["diagnostics"] = diagnostics.latest
    if val is not None:
        metrics["val_loss"], metrics["val_accuracy"] = loop.evaluate(
            model, task, val[0], val[1], args.eval_batch_size, args.seed
        )
    with writer.as_default():
        tf.summary.scalar("test/accuracy", test_accuracy, step=metrics["steps"])
        tf.summary.scalar("test/loss", test_loss, step=metrics["steps"])
    writer.flush()
    if chief:
        model_path = os.path.join(output_dir, "model.keras")
        partial = os.path.join(output_dir, "model.partial.keras")
        model.save(partial)
        os.replace(partial, model_path)
        options.write_atomically(
            os.path.join(output_dir, "metrics.json"), json.dumps(metrics, indent=2) + "\n"
        )
    log(f"[{distribution.task_label(strategy)}] weights_sha256 {metrics['weights_sha256']}")
    log(
        f"test_accuracy {test_accuracy:.4f} test_loss {test_loss:.4f} "
        f"steps {metrics['steps']} ({metrics['examples_per_second']:.0f} examples/s) "
        f"-> {output_dir}"
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
