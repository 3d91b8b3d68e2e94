"""Search ε, γ, learning rate, σ_w and the optimizer with keras-tuner.

    python -m training.tune --task pixel_mnist --model antisymmetric --units 128 \\
        --tuner random --max-trials 50 --steps-per-trial 2000 \\
        --directory tuning/pixel_mnist --project-name antisymmetric

The search space defaults to the paper's grids (see `training.hypermodels`);
`--epsilon-values 0.01,0.1` etc. or `--space FILE.yaml` narrow it, and
`--log-scale` makes the numeric ones continuous ranges. Each trial trains
`--steps-per-trial` steps with `training.loop` and is scored by `val_accuracy`
on `--validation-fraction` of the training data (never the test split). At the
end `best.json` and `trials.csv` (every trial, best first) land in
`--directory`, and `--retrain-steps N` retrains the best configuration with
`training.train`. Running the same command again continues an interrupted
search, keeping its finished trials. With `KERASTUNER_TUNER_ID`,
`KERASTUNER_ORACLE_IP` and `KERASTUNER_ORACLE_PORT` set, one chief process
serves the search to many worker processes (see docs/tuning.md).
"""

import csv
import dataclasses
import io
import json
import os
import sys

from training import options
from training.config import RunConfig, check, invalid
from training.files import write_atomically
from training.hypermodels import (
    MODEL_HYPERPARAMETERS,
    OBJECTIVE,
    PAPER_GRID,
    SearchSpace,
    flag_name,
)

TUNERS = ("random", "bayesian", "hyperband", "grid")


def build_parser():
    parser = options.run_parser("python -m training.tune", __doc__.split("\n\n")[0])
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
    group.add_argument("--tuner", default="random", choices=TUNERS)
    group.add_argument("--max-trials", type=int, default=20)
    group.add_argument("--steps-per-trial", type=int, default=500)
    group.add_argument(
        "--hyperband-max-epochs",
        type=int,
        default=3,
        help="hyperband: a full-budget trial is this many rounds of --steps-per-trial steps",
    )
    group.add_argument("--directory", default="tuning", help="where best.json and trials land")
    group.add_argument("--project-name", default=None, help="default: <task>-<model>")
    group.add_argument("--validation-fraction", type=float, default=0.1)
    group.add_argument("--eval-batch-size", type=int, default=256)
    group.add_argument(
        "--retrain-steps",
        type=int,
        default=0,
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
    import yaml

    values, sources = {}, {}
    if args.space:
        if not os.path.isfile(args.space):
            raise invalid("--space", "a YAML file", args.space)
        with open(args.space) as handle:
            loaded = yaml.safe_load(handle) or {}
        if not isinstance(loaded, dict):
            raise invalid("--space", "a mapping of hyperparameter to values", loaded)
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
    tuner: str = "random"
    max_trials: int = 20
    steps_per_trial: int = 500
    hyperband_max_epochs: int = 3
    directory: str = "tuning"
    project_name: str | None = None
    retrain_steps: int = 0
    retrain_dir: str | None = None

    @classmethod
    def from_namespace(cls, args):
        names = {field.name for field in dataclasses.fields(cls)} - {"run", "space"}
        values = {name: getattr(args, name) for name in names}
        return cls(run=RunConfig.from_namespace(args), space=make_space(args), **values)

    def validate(self):
        """Checks the flags' ranges; returns `self` or raises `UsageError`."""
        self.run.validate()
        for name in ("max_trials", "steps_per_trial", "hyperband_max_epochs"):
            value = getattr(self, name)
            check(value > 0, name.replace("_", "-"), "a positive integer", value)
        check(self.retrain_steps >= 0, "retrain-steps", "a non-negative integer",
              self.retrain_steps)  # fmt: skip
        fraction = self.run.validation_fraction
        check(0 < fraction < 1, "validation-fraction", "a float in (0, 1)", fraction)
        check(
            not (self.tuner == "grid" and self.space.log_scale),
            "tuner",
            "random, bayesian or hyperband with --log-scale (grid needs discrete values)",
            self.tuner,
        )
        return self


def is_worker():
    """Whether this process is a worker of a distributed search (not the chief)."""
    return "KERASTUNER_ORACLE_IP" in os.environ and "chief" not in os.environ.get(
        "KERASTUNER_TUNER_ID", ""
    )


def _tuner_classes():
    """keras-tuner's tuners, logging each trial's hyperparameters as it starts."""
    import keras_tuner

    class Logged:
        def run_trial(self, trial, *args, **kwargs):
            values = _describe(trial.hyperparameters.values)
            self.hypermodel.log(f"[{self.tuner_id}] trial {trial.trial_id} {values}")
            results = super().run_trial(trial, *args, **kwargs)  # one per execution
            score = sum(result[OBJECTIVE] for result in results) / len(results)
            self.hypermodel.log(
                f"[{self.tuner_id}] trial {trial.trial_id} done {OBJECTIVE} {score:.4f}"
            )
            return results

    return {
        name: type(base.__name__, (Logged, base), {})
        for name, base in (
            ("random", keras_tuner.RandomSearch),
            ("bayesian", keras_tuner.BayesianOptimization),
            ("hyperband", keras_tuner.Hyperband),
            ("grid", keras_tuner.GridSearch),
        )
    }


def _describe(values):
    return " ".join(f"{k}={v}" for k, v in values.items() if not k.startswith("tuner/"))


def make_tuner(config, strategy, log=print):
    """The keras-tuner tuner of a `SearchConfig`, resuming an existing project.

    `strategy`: the `tf.distribute.Strategy` (TensorFlow) or
    `keras.distribution.Distribution` (JAX) trials train under, or None.
    """
    import keras
    import keras_tuner

    from training import tasks
    from training.hypermodels import RNNHyperModel

    run = config.run
    task = tasks.get_task(run.task, timesteps=run.timesteps, dataset=run.dataset)
    hyperband = config.tuner == "hyperband"
    hypermodel = RNNHyperModel(
        task,
        run,
        config.space,
        steps_per_trial=config.steps_per_trial,
        rounds=config.hyperband_max_epochs if hyperband else 1,
        strategy=strategy if strategy is not None else "default",
        log=log,
    )
    common = dict(
        hypermodel=hypermodel,
        objective=keras_tuner.Objective(OBJECTIVE, direction="max"),
        seed=run.seed,
        directory=config.directory,
        project_name=config.project_name or f"{run.task}-{run.model}",
        overwrite=False,  # the same command continues an interrupted search
        distribution_strategy=strategy if keras.backend.backend() == "tensorflow" else None,
    )
    tuner_class = _tuner_classes()[config.tuner]
    if hyperband:
        tuner = tuner_class(max_epochs=config.hyperband_max_epochs, factor=3, **common)
        tuner.oracle.max_trials = config.max_trials  # Hyperband has no max_trials of its own
    else:
        tuner = tuner_class(max_trials=config.max_trials, **common)
    return tuner


def trial_rows(oracle, model):
    """One dict per trial, completed ones best first, then the rest by id."""
    names = MODEL_HYPERPARAMETERS[model]
    rows = []
    for trial in oracle.trials.values():
        values = trial.hyperparameters.values
        metrics = trial.metrics
        row = {
            "trial_id": trial.trial_id,
            "status": trial.status,
            "score": trial.score,
            "val_loss": (
                metrics.get_last_value("val_loss") if metrics.exists("val_loss") else None
            ),
        }
        row.update({name: values.get(name) for name in names})
        if "tuner/epochs" in values:
            row["rounds"] = values["tuner/epochs"]
        rows.append(row)
    done = [r for r in rows if r["status"] == "COMPLETED" and r["score"] is not None]
    done.sort(key=lambda r: (-r["score"], r["trial_id"]))
    rest = sorted((r for r in rows if r not in done), key=lambda r: r["trial_id"])
    return done + rest


def format_table(rows):
    """`rows` as an aligned text table."""
    if not rows:
        return "(no trials)"
    columns = list(dict.fromkeys(key for row in rows for key in row))

    def cell(value):
        if isinstance(value, float):
            return f"{value:.4g}"
        return "" if value is None else str(value)

    cells = [columns] + [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)) for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def retrain(config, hyperparameters, log=print):
    """Trains the best configuration with `training.train` for `retrain_steps` steps."""
    from training.train import train_and_evaluate

    run = config.run
    values = {"epsilon": run.epsilon, "gamma": run.gamma, **hyperparameters}
    steps = config.retrain_steps
    best = run.replace(
        epsilon=float(values["epsilon"]),
        gamma=float(values["gamma"]),
        sigma_w=float(values["sigma_w"]),
        optimizer=values["optimizer"],
        learning_rate=float(values["learning_rate"]),
        steps=steps,
        checkpoint_every=max(1, min(200, steps)),
        log_every=max(1, min(50, steps)),
    ).validate()
    workdir = config.retrain_dir or os.path.join(config.directory, "best")
    return train_and_evaluate(best, workdir, log=log)


def trial_distribution(run):
    """What trials train under (a TF strategy or a Keras distribution), its name, replicas."""
    import keras

    from training import distribution

    if keras.backend.backend() != "tensorflow":
        strategy = distribution.make_keras_distribution(run.strategy)
        return (strategy, *distribution.keras_distribution_shape(strategy))
    import tensorflow as tf

    strategy = distribution.make_strategy(run.strategy, tpu=run.tpu)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        raise invalid(
            "--strategy",
            "a single-worker strategy (keras-tuner runs trials on one worker: default, "
            "mirrored or tpu)",
            f"{run.strategy} (a multi-worker cluster)",
        )
    return strategy, distribution.strategy_name(strategy), strategy.num_replicas_in_sync


def write_trials(rows, path):
    """`rows` as CSV at `path` (atomically)."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    write_atomically(path, text.getvalue())


def run(config, log=print):
    """Runs (or continues) the search; returns the best-trial summary (None on a worker)."""
    from training.trainers import check_batch_size

    strategy, name, replicas = trial_distribution(config.run)
    check_batch_size(config.run.batch_size, replicas)
    log(f"trials run on {name} ({replicas} replicas)")
    os.makedirs(config.directory, exist_ok=True)
    tuner = make_tuner(config, strategy, log=log)
    tuner.search(verbose=0)  # each trial logs its own lines
    if is_worker():
        log(f"[{tuner.tuner_id}] no trials left; the chief writes best.json")
        return None
    rows = trial_rows(tuner.oracle, config.run.model)
    write_trials(rows, os.path.join(config.directory, "trials.csv"))
    log(format_table(rows))
    summary = best_summary(config, tuner, rows)
    if config.retrain_steps:
        log(f"retraining trial {summary['best_trial_id']} for {config.retrain_steps} steps")
        summary["retrained"] = retrain(config, summary["hyperparameters"], log=log)
    path = os.path.join(config.directory, "best.json")
    write_atomically(path, json.dumps(summary, indent=2) + "\n")
    log(
        f"best trial {summary['best_trial_id']} {OBJECTIVE} {summary['score']:.4f} "
        f"{_describe(summary['hyperparameters'])} -> {path}"
    )
    return summary


def best_summary(config, tuner, rows):
    """`best.json`'s content: the best completed trial and what the search was."""
    completed = [r for r in rows if r["status"] == "COMPLETED" and r["score"] is not None]
    if not completed:
        raise RuntimeError(f"no trial of {tuner.project_dir} completed; see its trial.json files")
    best = tuner.oracle.trials[completed[0]["trial_id"]]
    run = config.run
    return {
        "objective": OBJECTIVE,
        "best_trial_id": best.trial_id,
        "score": best.score,
        "val_loss": completed[0]["val_loss"],
        "hyperparameters": {
            k: v for k, v in best.hyperparameters.values.items() if not k.startswith("tuner/")
        },
        "task": run.task,
        "model": run.model,
        "units": run.units,
        "tuner": config.tuner,
        "steps_per_trial": config.steps_per_trial,
        "validation_fraction": run.validation_fraction,
        "trials": len(rows),
        "completed_trials": len(completed),
        "space": config.space.to_dict(),
        "project_dir": tuner.project_dir,
    }


def main(argv=None):
    def body(args):
        from training.distribution import split_cpu

        config = SearchConfig.from_namespace(args).validate()
        split_cpu(config.run.cpu_devices)
        run(config)

    return options.run_command(
        build_parser(), argv, body, ("Received an invalid value", "no trial of")
    )


if __name__ == "__main__":
    sys.exit(main())
