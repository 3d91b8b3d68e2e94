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
import json
import os
import sys

from training import options
from training.config import check
from training.hypermodels import MODEL_HYPERPARAMETERS, PAPER_GRID, SearchSpace, flag_name

TUNERS = ("random", "bayesian", "hyperband", "grid")
OBJECTIVE = "val_accuracy"


def build_parser():
    parser = options.OneLineParser(
        prog="python -m training.tune", description=__doc__.split("\n\n")[0]
    )
    options.add_data_arguments(parser)
    options.add_model_arguments(parser)
    options.add_optimizer_arguments(parser)
    options.add_distribution_arguments(parser)
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
        raise options.UsageError(
            f"Received an invalid value for argument `{flag_name(name)}`, expected {expected}, "
            f"got {text!r}."
        ) from None


def make_space(args):
    """The `SearchSpace` of `--space`, the `--*-values` flags and `--log-scale`."""
    import yaml

    values, sources = {}, {}
    if args.space:
        if not os.path.isfile(args.space):
            raise options.UsageError(
                f"Received an invalid value for argument `--space`, expected a YAML file, "
                f"got {args.space!r}."
            )
        with open(args.space) as handle:
            loaded = yaml.safe_load(handle) or {}
        if not isinstance(loaded, dict):
            raise options.UsageError(
                f"Received an invalid value for argument `--space`, expected a mapping of "
                f"hyperparameter to values, got {loaded!r}."
            )
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


def _validate_tune(args):
    options.validate(args)
    for name in ("max_trials", "steps_per_trial", "eval_batch_size", "hyperband_max_epochs"):
        value = getattr(args, name)
        check(value > 0, name.replace("_", "-"), "a positive integer", value)
    check(args.retrain_steps >= 0, "retrain-steps", "a non-negative integer", args.retrain_steps)
    check(
        0 < args.validation_fraction < 1,
        "validation-fraction",
        "a float in (0, 1)",
        args.validation_fraction,
    )
    check(
        not (args.tuner == "grid" and args.log_scale),
        "tuner",
        "random, bayesian or hyperband with --log-scale (grid needs discrete values)",
        args.tuner,
    )
    return make_space(args)


def is_worker():
    """Whether this process is a worker of a distributed search (not the chief)."""
    return "KERASTUNER_ORACLE_IP" in os.environ and "chief" not in os.environ.get(
        "KERASTUNER_TUNER_ID", ""
    )


def _tuner_classes():
    """keras-tuner's tuners, running a trial as `--steps-per-trial` loop steps."""
    import keras_tuner
    from keras_tuner.src import utils as kt_utils

    class StepsTuner:
        # Tuner.run_trial would add Keras callbacks to `model.fit`; the custom
        # loop has none, so build, train for steps and keep the weights here.
        def run_trial(self, trial, *args, **kwargs):
            hp = trial.hyperparameters
            hypermodel = self.hypermodel
            start, stop = 0, hypermodel.steps_per_trial
            if "tuner/epochs" in hp.values:  # hyperband: a round is a share of steps
                unit = max(1, hypermodel.steps_per_trial // self.oracle.max_epochs)
                start = hp.values["tuner/initial_epoch"] * unit
                stop = hp.values["tuner/epochs"] * unit
            # Hyperband's _build_hypermodel loads the weights of the trial it continues.
            model = self._try_build(hp)
            hypermodel.log(f"[{self.tuner_id}] trial {trial.trial_id} {_describe(hp.values)}")
            results = hypermodel.fit(hp, model, start_step=start, steps=stop)
            model.save_weights(self._get_checkpoint_fname(trial.trial_id))
            kt_utils.save_json(
                self._get_build_config_fname(trial.trial_id), model.get_build_config()
            )
            hypermodel.log(
                f"[{self.tuner_id}] trial {trial.trial_id} done {OBJECTIVE} "
                f"{results[OBJECTIVE]:.4f}"
            )
            return results

    return {
        "random": type("RandomSearch", (StepsTuner, keras_tuner.RandomSearch), {}),
        "bayesian": type(
            "BayesianOptimization", (StepsTuner, keras_tuner.BayesianOptimization), {}
        ),
        "hyperband": type("Hyperband", (StepsTuner, keras_tuner.Hyperband), {}),
        "grid": type("GridSearch", (StepsTuner, keras_tuner.GridSearch), {}),
    }


def _describe(values):
    return " ".join(f"{k}={v}" for k, v in values.items() if not k.startswith("tuner/"))


def make_tuner(args, space, strategy, log=print):
    """The keras-tuner tuner of `args` over `space`, resuming an existing project.

    `strategy`: the `tf.distribute.Strategy` (TensorFlow) or
    `keras.distribution.Distribution` (JAX) trials train under, or None.
    """
    import keras
    import keras_tuner

    from training import tasks
    from training.hypermodels import RNNHyperModel

    task = tasks.get_task(args.task, timesteps=args.timesteps, dataset=args.dataset)
    hypermodel = RNNHyperModel(
        task,
        args.model,
        space,
        units=args.units,
        batch_size=args.batch_size,
        steps_per_trial=args.steps_per_trial,
        seed=args.seed,
        validation_fraction=args.validation_fraction,
        momentum=args.momentum,
        clipnorm=args.clipnorm,
        strategy=strategy if strategy is not None else "default",
        data_dir=args.data_dir,
        eval_batch_size=args.eval_batch_size,
        log=log,
    )
    common = dict(
        hypermodel=hypermodel,
        objective=keras_tuner.Objective(OBJECTIVE, direction="max"),
        seed=args.seed,
        directory=args.directory,
        project_name=args.project_name or f"{args.task}-{args.model}",
        overwrite=False,  # the same command continues an interrupted search
        distribution_strategy=strategy if keras.backend.backend() == "tensorflow" else None,
    )
    tuner_class = _tuner_classes()[args.tuner]
    if args.tuner == "hyperband":
        tuner = tuner_class(max_epochs=args.hyperband_max_epochs, factor=3, **common)
        tuner.oracle.max_trials = args.max_trials  # Hyperband has no max_trials of its own
    else:
        tuner = tuner_class(max_trials=args.max_trials, **common)
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


def retrain(args, hyperparameters, log=print):
    """Trains the best configuration with `training.train` for `--retrain-steps` steps."""
    from training.config import RunConfig
    from training.train import train_and_evaluate

    values = {"epsilon": args.epsilon, "gamma": args.gamma, **hyperparameters}
    steps = args.retrain_steps
    config = RunConfig.from_namespace(
        args,
        epsilon=float(values["epsilon"]),
        gamma=float(values["gamma"]),
        sigma_w=float(values["sigma_w"]),
        optimizer=values["optimizer"],
        learning_rate=float(values["learning_rate"]),
        steps=steps,
        checkpoint_every=max(1, min(200, steps)),
        log_every=max(1, min(50, steps)),
    ).validate()
    return train_and_evaluate(
        config, args.retrain_dir or os.path.join(args.directory, "best"), log=log
    )


def run(args, space, log=print):
    """Runs (or continues) the search; returns the best-trial summary (None on a worker)."""
    import keras

    from training import distribution
    from training.trainers import check_batch_size

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        strategy = distribution.make_strategy(args.strategy, tpu=args.tpu)
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            raise options.UsageError(
                "Received an invalid value for argument `--strategy`, expected a single-worker "
                "strategy (keras-tuner runs trials on one worker: default, mirrored or tpu), "
                f"got {args.strategy!r} (a multi-worker cluster)."
            )
        replicas = strategy.num_replicas_in_sync
        name = distribution.strategy_name(strategy)
    else:
        strategy = distribution.make_keras_distribution(args.strategy)
        name, replicas = distribution.keras_distribution_shape(strategy)
    check_batch_size(args.batch_size, replicas)
    log(f"trials run on {name} ({replicas} replicas)")
    os.makedirs(args.directory, exist_ok=True)
    tuner = make_tuner(args, space, strategy, log=log)
    tuner.search(verbose=1)
    if is_worker():
        log(f"[{tuner.tuner_id}] no trials left; the chief writes best.json")
        return None

    rows = trial_rows(tuner.oracle, args.model)
    columns = list(dict.fromkeys(key for row in rows for key in row))
    partial = os.path.join(args.directory, "trials.csv.partial")
    with open(partial, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(partial, os.path.join(args.directory, "trials.csv"))
    table = format_table(rows)
    log(table)

    best_rows = [r for r in rows if r["status"] == "COMPLETED" and r["score"] is not None]
    if not best_rows:
        raise RuntimeError(f"no trial of {tuner.project_dir} completed; see its trial.json files")
    best_id = best_rows[0]["trial_id"]
    best_trial = tuner.oracle.trials[best_id]
    hyperparameters = {
        k: v for k, v in best_trial.hyperparameters.values.items() if not k.startswith("tuner/")
    }
    summary = {
        "objective": OBJECTIVE,
        "best_trial_id": best_id,
        "score": best_trial.score,
        "val_loss": best_rows[0]["val_loss"],
        "hyperparameters": hyperparameters,
        "task": args.task,
        "model": args.model,
        "units": args.units,
        "tuner": args.tuner,
        "steps_per_trial": args.steps_per_trial,
        "validation_fraction": args.validation_fraction,
        "trials": len(rows),
        "completed_trials": len(best_rows),
        "space": space.to_dict(),
        "project_dir": tuner.project_dir,
    }
    if args.retrain_steps:
        log(f"retraining trial {best_id} for {args.retrain_steps} steps")
        summary["retrained"] = retrain(args, hyperparameters, log=log)
    options.write_atomically(
        os.path.join(args.directory, "best.json"), json.dumps(summary, indent=2) + "\n"
    )
    log(
        f"best trial {best_id} {OBJECTIVE} {best_trial.score:.4f} {_describe(hyperparameters)} "
        f"-> {os.path.join(args.directory, 'best.json')}"
    )
    return summary


def main(argv=None):
    def body(args):
        space = _validate_tune(args)
        from training.distribution import split_cpu

        split_cpu(args.cpu_devices)
        run(args, space)

    return options.run_command(
        build_parser(), argv, body, ("Received an invalid value", "no trial of")
    )


if __name__ == "__main__":
    sys.exit(main())
