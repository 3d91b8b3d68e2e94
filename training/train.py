"""Train a model on a task, on any Keras backend and strategy, resuming after a crash.

    python -m training.train --task pixel_mnist --model antisymmetric --units 128 \\
        --epsilon 0.01 --gamma 0.01 --optimizer sgd --learning-rate 0.1 \\
        --batch-size 128 --steps 50000 --output-dir runs/x

`KERAS_BACKEND` picks the backend: TensorFlow trains under `tf.distribute`,
JAX under `keras.distribution` (`--strategy data_parallel`), PyTorch on one
device (`training.backends`); all see the same batches. On JAX one run spans several
processes or hosts with `--coordinator HOST:PORT --num-processes N --process-id I` (or
`training.launch` on one machine; see docs/training.md). The output directory
receives `config.yaml`, `checkpoints/`, `logs/` (TensorBoard), `curve.json`
(with `--eval-every`), `metrics.json` and `model.keras` (see
`training.run.experiment`). Running the same command again resumes from the last
checkpoint. Exit status 2: a usage error, missing data or a diverged run
(non-finite loss); 1: a failure of the machine (files, disk); 128 + its number: stopped
by SIGTERM or SIGINT, at any moment (one line; in training, after checkpointing the step
in progress).
"""

from __future__ import annotations

from apputil import cli, quiet, signals
from training import options
from training.backends.cluster import Cluster
from training.backends.launch_config import LaunchConfig
from training.config import RunConfig
from training.errors import EXPECTED, RunStopped
from training.sections import flag


def build_parser() -> cli.OneLineParser:
    parser = options.run_parser("python -m training.train", __doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", default=None, help="default: runs/<task>-<model>")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status."""
    parser = build_parser()
    args = options.parse_with_config(parser, argv)

    cluster = Cluster(parser.prog)

    def body():
        config = RunConfig.from_namespace(args).validate(flag)
        launch = LaunchConfig.from_namespace(args).validate(flag)
        # From here a signal ends the run with one line, at start-up too, where Python's own
        # KeyboardInterrupt can be lost in a finalizer (the block keeps it; the training
        # loop then stops after its first step, checkpointed).
        with signals.raising(RunStopped):
            quiet.import_keras()
            # Keras (and TensorFlow on its backend) load only now: `--help` and usage errors
            # answer without them, in a fraction of a second.
            from training.backends import select
            from training.run import experiment

            # A lost peer fails the next JAX call wherever it is: one line, not its trace.
            with cluster.losses(tuple(EXPECTED)):
                backend = select.start(launch, cluster)
                experiment.train_and_evaluate(config, args.output_dir, backend=backend)

    return cluster.finish(cli.run(parser.prog, body, EXPECTED))


if __name__ == "__main__":
    cli.execute(main)
