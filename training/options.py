"""Command-line options shared by `training.train` and `training.tune`.

`--config FILE.yaml` sets defaults from a YAML mapping whose keys are option
names (`learning_rate` or `learning-rate`); options given on the command line
override it.
"""

import argparse
import os
import sys

import yaml

from training.config import RunConfig, UsageError
from training.distribution import STRATEGIES
from training.models import MODEL_NAMES
from training.optimizers import OPTIMIZERS
from training.tasks import MNIST_DATASETS, TASK_NAMES

DEFAULTS = RunConfig()


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, not usage plus a line."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def run_parser(prog, description):
    """A parser with the options of a run: task, model, optimizer and distribution."""
    parser = OneLineParser(prog=prog, description=description)
    add_data_arguments(parser)
    add_model_arguments(parser)
    add_optimizer_arguments(parser)
    add_distribution_arguments(parser)
    return parser


def add_data_arguments(parser):
    group = parser.add_argument_group("task")
    group.add_argument("--task", default=DEFAULTS.task, choices=TASK_NAMES)
    group.add_argument(
        "--dataset",
        default=None,
        choices=MNIST_DATASETS,
        help="for the MNIST tasks: mnist (default) or fashion_mnist",
    )
    group.add_argument(
        "--timesteps",
        type=int,
        default=None,
        help="sequence length of noise-padded, digits, adding and copy tasks",
    )
    group.add_argument("--data-dir", default=None, help="TFDS data directory (or TFDS_DATA_DIR)")
    group.add_argument(
        "--seed", type=int, default=DEFAULTS.seed, help="seed of data order, noise and init"
    )


def add_model_arguments(parser):
    group = parser.add_argument_group("model")
    group.add_argument("--model", default=DEFAULTS.model, choices=MODEL_NAMES)
    group.add_argument("--units", type=int, default=DEFAULTS.units)
    group.add_argument("--epsilon", type=float, default=DEFAULTS.epsilon)
    group.add_argument("--gamma", type=float, default=DEFAULTS.gamma)
    group.add_argument(
        "--sigma-w",
        type=float,
        default=DEFAULTS.sigma_w,
        help="hidden-to-hidden init N(0, sigma_w^2/n) (paper: 0, 1, 2, 4, 8, 16)",
    )


def add_optimizer_arguments(parser):
    group = parser.add_argument_group("optimizer")
    group.add_argument("--optimizer", default=DEFAULTS.optimizer, choices=OPTIMIZERS)
    group.add_argument("--learning-rate", type=float, default=DEFAULTS.learning_rate)
    group.add_argument("--momentum", type=float, default=DEFAULTS.momentum, help="for sgd")
    group.add_argument("--clipnorm", type=float, default=None, help="per-variable clipping")
    group.add_argument(
        "--batch-size", type=int, default=DEFAULTS.batch_size, help="global batch size"
    )


def add_distribution_arguments(parser):
    group = parser.add_argument_group("distribution")
    group.add_argument("--strategy", default="auto", choices=STRATEGIES)
    group.add_argument("--tpu", default=None, help="TPU name or address for --strategy tpu")
    group.add_argument(
        "--cpu-devices",
        type=int,
        default=DEFAULTS.cpu_devices,
        help="split the CPU into this many logical devices (mirrored training on CPU)",
    )


def run_command(parser, argv, body, expected_messages=("Received an invalid value",)):
    """Parses `argv` and runs `body(args)`; bad options become one line and exit 2.

    Errors of the user's making (`UsageError`, a missing data set, an unusable
    strategy, a ValueError starting with one of `expected_messages`) print
    `PROG: error: MESSAGE`; anything else is a real fault and raises.
    """
    from training.distribution import StrategyError
    from training.loop import DivergenceError
    from training.tasks import DataError

    args = parse_with_config(parser, argv)
    try:
        body(args)
    except (UsageError, ValueError, RuntimeError) as error:
        expected = isinstance(
            error, (UsageError, DataError, StrategyError, DivergenceError)
        ) or str(error).startswith(tuple(expected_messages))
        if not expected:
            raise
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    return 0


def parse_with_config(parser, argv):
    """Parses `argv`, taking defaults from the `--config` YAML file if given."""
    parser.add_argument("--config", default=None, help="YAML file of option defaults")
    argv = sys.argv[1:] if argv is None else list(argv)
    known, _ = parser.parse_known_args(argv)
    if known.config:
        if not os.path.isfile(known.config):
            parser.error(f"argument --config: no such file {known.config!r}")
        with open(known.config) as handle:
            values = yaml.safe_load(handle) or {}
        if not isinstance(values, dict):
            parser.error(f"argument --config: {known.config} is not a mapping of options")
        dests = {action.dest for action in parser._actions}
        defaults = {}
        for key, value in values.items():
            dest = str(key).replace("-", "_")
            if dest not in dests or dest == "config":
                parser.error(f"argument --config: unknown option {key!r} in {known.config}")
            defaults[dest] = value
        parser.set_defaults(**defaults)
    return parser.parse_args(argv)
