"""Search ε, γ, learning rate, σ_w and the optimizer with keras-tuner.

    python -m training.tune --task pixel_mnist --model antisymmetric --units 128 \\
        --tuner random --max-trials 50 --steps-per-trial 2000 \\
        --directory tuning/pixel_mnist --project-name antisymmetric

The search space defaults to the paper's grids (see `training.search.hypermodels`);
`--epsilon-values 0.01,0.1` etc. or `--space FILE.yaml` narrow it, and
`--log-scale` makes the numeric ones continuous ranges. Each trial trains
`--steps-per-trial` steps with `training.run.loop` and is scored by `val_accuracy`
on `--validation-fraction` of the training data (never the test split). At the
end `best.json` and `trials.csv` (every trial, best first) land in
`--directory`, and `--retrain-steps N` retrains the best configuration with
`training.train`. Running the same command again continues an interrupted
search, keeping its finished trials. With `KERASTUNER_TUNER_ID`,
`KERASTUNER_ORACLE_IP` and `KERASTUNER_ORACLE_PORT` set, one chief process
serves the search to many worker processes (see docs/tuning.md).
"""

from __future__ import annotations

import dataclasses
import os

from apputil import cli, quiet, signals
from apputil.cli import OneLineParser
from apputil.errors import check, invalid
from training import options
from training.backends.launch_config import LaunchConfig
from training.config import RunConfig, identity_fields
from training.errors import EXPECTED, SearchInterrupted
from training.search.space import PAPER_GRID, SearchSpace, flag_name
from training.sections import check_types, flag

TUNERS = ("random", "bayesian", "hyperband", "grid")


def build_parser() -> OneLineParser:
    parser = options.run_parser(
        "python -m training.tune",
        __doc__.split("\n\n")[0],
        groups=("task", "model", "optimizer", "distribution"),
        extra=("validation_fraction", "eval_batch_size"),
        defaults={"validation_fraction": 0.1},
    )
    group = parser.add_argument_group(
        "search space (default: the paper's grids; overrides --epsilon, --gamma, "
        "--sigma-w, --optimizer, --learning-rate)"
    )
    for name, grid in PAPER_GRID.items():
        group.add_argument(
            flag_name(name),
            default=None,
            metavar="V1,V2,...",
            help=f"default: {','.join(str(v) for v in grid)}",
        )
    group.add_argument(
        "--space", default=None, help="YAML mapping of hyperparameter name to a list of values"
    )
    group.add_argument(
        "--log-scale",
        action="store_true",
        help="continuous ranges over each grid's min..max (log-uniform when min > 0)",
    )
    group = parser.add_argument_group("search")
    default = {f.name: f.default for f in dataclasses.fields(SearchConfig)}
    group.add_argument("--tuner", default=default["tuner"], choices=TUNERS)
    group.add_argument("--max-trials", type=int, default=default["max_trials"])
    group.add_argument("--steps-per-trial", type=int, default=default["steps_per_trial"])
    group.add_argument(
        "--hyperband-max-epochs",
        type=int,
        default=default["hyperband_max_epochs"],
        help="hyperband: a full-budget trial is this many rounds of --steps-per-trial steps",
    )
    group.add_argument(
        "--directory", default=default["directory"], help="where best.json and trials land"
    )
    group.add_argument("--project-name", default=None, help="default: <task>-<model>")
    group.add_argument(
        "--retrain-steps",
        type=int,
        default=default["retrain_steps"],
        help="retrain the best configuration this many steps with training.train (0: off)",
    )
    group.add_argument("--retrain-dir", default=None, help="default: <directory>/best")
    return parser


def _parse_values(text, name):
    values = [item.strip() for item in text.split(",") if item.strip()]
    if name == "optimizer":
        return values
    try:
        return [float(item) for item in values]
    except ValueError:
        expected = "non-negative floats" if name in ("gamma", "sigma_w") else "positive floats"
        raise invalid(flag_name(name), expected, text) from None


def make_space(args):
    """The `SearchSpace` of `--space`, the `--*-values` flags and `--log-scale`."""
    values, sources = {}, {}
    if args.space:
        loaded = options.read_yaml_mapping(args.space, "--space")
        for key, value in loaded.items():
            name = str(key).replace("-", "_")
            values[name] = value
            sources[name] = f"--space ({key})"
    for name in PAPER_GRID:
        text = getattr(args, f"{name}_values")
        if text is not None:
            values[name] = _parse_values(text, name)
            sources[name] = flag_name(name)
    return SearchSpace(values, log_scale=args.log_scale, sources=sources)


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """A search: the `RunConfig` every trial shares, the space and the tuner's budget."""

    run: RunConfig
    space: SearchSpace
    launch: LaunchConfig = LaunchConfig()
    tuner: str = "random"
    max_trials: int = 20
    steps_per_trial: int = 500
    hyperband_max_epochs: int = 3
    directory: str = os.path.join("runs", "tuning")
    project_name: str | None = None
    retrain_steps: int = 0
    retrain_dir: str | None = None

    @classmethod
    def from_namespace(cls, args):
        names = {field.name for field in dataclasses.fields(cls)} - {"run", "space", "launch"}
        values = {name: getattr(args, name) for name in names}
        return cls(
            run=RunConfig.from_namespace(args), space=make_space(args),
            launch=LaunchConfig.from_namespace(args), **values,
        )  # fmt: skip

    @property
    def project_dir(self) -> str:
        """keras-tuner's project folder: trials, `search.json`, `trials.csv`, `best.json`."""
        return os.path.join(
            self.directory, self.project_name or f"{self.run.task.name}-{self.run.model.name}"
        )

    def identity(self) -> dict:
        """What a search's trials depend on: a rerun continues only a search of the same."""
        run = self.run.to_dict()
        return {
            "run": {name: run[name] for name in identity_fields()},
            "space": self.space.to_dict(),
            "tuner": self.tuner,
            "steps_per_trial": self.steps_per_trial,
            "hyperband_max_epochs": self.hyperband_max_epochs,
        }

    def validate(self):
        """Checks the flags' types and ranges; returns `self` or raises `UsageError`."""
        self.run.validate(flag)
        self.launch.validate(flag)
        check_types(self, skip=("run", "space", "launch"))
        for name in ("max_trials", "steps_per_trial", "hyperband_max_epochs"):
            value = getattr(self, name)
            check(value > 0, flag(name), "a positive integer", value)
        check(self.retrain_steps >= 0, "--retrain-steps", "a non-negative integer",
              self.retrain_steps)  # fmt: skip
        fraction = self.run.loop.validation_fraction
        check(0 < fraction < 1, "--validation-fraction", "a float in (0, 1)", fraction)
        check(
            not (self.tuner == "grid" and self.space.log_scale),
            "--tuner",
            "random, bayesian or hyperband with --log-scale (grid needs discrete values)",
            self.tuner,
        )
        return self


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status."""
    parser = build_parser()
    args = options.parse_with_config(parser, argv)

    def body():
        config = SearchConfig.from_namespace(args).validate()
        # From here a signal ends the search with one line (a trial's training loop
        # finishes its step in progress first); keras-tuner keeps the finished trials.
        with signals.raising(lambda number: SearchInterrupted(number, "outside a trial")):
            quiet.import_keras()
            # Keras, keras-tuner and TensorFlow load only now: `--help` and usage errors
            # answer without them.
            from training.backends import select
            from training.search import tuner

            tuner.run(config, select.start(config.launch))

    return cli.run(parser.prog, body, EXPECTED)


if __name__ == "__main__":
    cli.execute(main)
