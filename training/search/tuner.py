"""The search behind `training.tune`: keras-tuner's tuners over `RNNHyperModel` trials.

`run(config)` runs (or continues) the search of a `training.tune.SearchConfig`,
writes `trials.csv` and `best.json` to its directory and, if asked, retrains
the best configuration with `training.run.experiment.train_and_evaluate`.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Callable
from typing import Any

import keras_tuner

from apputil import signals
from apputil.files import write_atomically
from training.backends import select
from training.backends.backend import Backend
from training.config import RunConfig, check_batch_size
from training.errors import Interrupted, SearchError, SearchInterrupted
from training.run.experiment import train_and_evaluate
from training.run.identity import check_unchanged
from training.search.hypermodels import RNNHyperModel, trial_config
from training.search.space import MODEL_HYPERPARAMETERS, OBJECTIVE, flag_name
from training.sections import flag
from training.tasks import catalog


def is_worker() -> bool:
    """Whether this process is a worker of a distributed search (not the chief)."""
    return "KERASTUNER_ORACLE_IP" in os.environ and "chief" not in os.environ.get(
        "KERASTUNER_TUNER_ID", ""
    )


def _tuner_classes():
    """keras-tuner's tuners, logging each trial's hyperparameters as it starts."""

    class Logged:
        hypermodel: Any  # keras-tuner's, on the tuner this is mixed into
        tuner_id: str

        def run_trial(self, trial, *args, **kwargs):
            # A stop that came after the previous trial's last step (its loop had ended)
            # ends the search here, once keras-tuner has recorded that trial.
            signals.check()
            values = _describe(trial.hyperparameters.values)
            self.hypermodel.log(f"[{self.tuner_id}] trial {trial.trial_id} {values}")
            try:
                tuner: Any = super()  # the keras-tuner tuner's own
                results = tuner.run_trial(trial, *args, **kwargs)  # one per execution
            except Interrupted as stopped:  # the trial's loop finished its step in progress
                raise SearchInterrupted(
                    stopped.signal_number, f"in trial {trial.trial_id} at step {stopped.step}"
                ) from None
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


def make_tuner(config: Any, backend: Backend, log: Callable[[str], object] = print) -> Any:
    """The keras-tuner tuner of a `SearchConfig`, resuming an existing project; its trials
    train on `backend`."""
    run = config.run
    task = catalog.get_task(run.task.name, timesteps=run.task.timesteps, dataset=run.task.dataset)
    hyperband = config.tuner == "hyperband"
    hypermodel = RNNHyperModel(
        task,
        run,
        config.space,
        steps_per_trial=config.steps_per_trial,
        rounds=config.hyperband_max_epochs if hyperband else 1,
        backend=backend,
        log=log,
    )
    common = dict(
        hypermodel=hypermodel,
        objective=keras_tuner.Objective(OBJECTIVE, direction="max"),
        # keras-tuner takes a seed of 0 for "none" and draws a random one: shift it by one.
        seed=run.task.seed + 1,
        directory=os.path.dirname(config.project_dir),
        project_name=os.path.basename(config.project_dir),
        overwrite=False,  # the same command continues an interrupted search
        distribution_strategy=backend.tuner_strategy(),
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


def retrain(
    config: Any,
    hyperparameters: dict[str, Any],
    backend: Backend | None = None,
    log: Callable[[str], object] = print,
) -> dict:
    """Trains the best configuration as a run of `retrain_steps` steps (on `backend`)."""
    steps = config.retrain_steps
    best = (
        trial_config(config.run, hyperparameters)
        .replace(
            steps=steps, checkpoint_every=max(1, min(200, steps)), log_every=max(1, min(50, steps))
        )
        .validate(flag)
    )
    workdir = config.retrain_dir or os.path.join(config.project_dir, "best")
    return train_and_evaluate(best, workdir, log=log, backend=backend)


def write_trials(rows, path):
    """`rows` as CSV at `path` (atomically)."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    write_atomically(path, text.getvalue())


def run(
    config: Any, backend: Backend | None = None, log: Callable[[str], object] = print
) -> dict | None:
    """Runs (or continues) the search on `backend` (default: the current Keras backend with
    the strategy "auto"); returns the best-trial summary (None on a worker)."""
    backend = backend if backend is not None else select.start()
    backend.tuner_strategy()  # refuses a multi-worker cluster before anything else
    check_batch_size(config.run.optimizer.batch_size, backend.replicas)
    log(f"trials run on {backend.strategy_name} ({backend.replicas} replicas)")
    check_same_search(config)
    tuner = make_tuner(config, backend, log=log)
    tuner.search(verbose=0)  # each trial logs its own lines
    if is_worker():
        log(f"[{tuner.tuner_id}] no trials left; the chief writes best.json")
        return None
    rows = trial_rows(tuner.oracle, config.run.model.name)
    write_trials(rows, os.path.join(config.project_dir, "trials.csv"))
    log(format_table(rows))
    summary = best_summary(config, tuner, rows)
    if config.retrain_steps:
        log(f"retraining trial {summary['best_trial_id']} for {config.retrain_steps} steps")
        summary["retrained"] = retrain(config, summary["hyperparameters"], backend, log=log)
    path = os.path.join(config.project_dir, "best.json")
    write_atomically(path, json.dumps(summary, indent=2) + "\n")
    log(
        f"best trial {summary['best_trial_id']} {OBJECTIVE} {summary['score']:.4f} "
        f"{_describe(summary['hyperparameters'])} -> {path}"
    )
    return summary


SEARCH_RECORD = "search.json"
_RUN_DEFAULTS = {f"run.{key}": value for key, value in RunConfig().to_dict().items()}


def check_same_search(config: Any) -> None:
    """Records what a new search is, and refuses to continue another one in its project.

    A rerun in the same project continues the search (its finished trials are
    kept) only if the trials would be the same ones: the same run settings,
    search space, tuner and trial budget. More `--max-trials` extend it.
    """
    path = os.path.join(config.project_dir, SEARCH_RECORD)
    identity = json.loads(json.dumps(config.identity()))  # as read back: tuples are lists
    if os.path.isfile(path):
        with open(path) as handle:
            before = json.load(handle)
        # A run setting newer than the record ran at its default (defaults keep the
        # behaviour from before the setting existed).
        check_unchanged(
            _flatten(before), _flatten(identity), path=path, flag=_search_flag,
            hint=lambda key, value: "a rerun continues the search of its project; start "
            "another with another --project-name or --directory",
            default=lambda key: _RUN_DEFAULTS.get(key),
        )  # fmt: skip
        return
    os.makedirs(config.project_dir, exist_ok=True)
    if not is_worker():
        write_atomically(path, json.dumps(identity, indent=2, sort_keys=True) + "\n")


def _search_flag(key):
    """The flag behind a key of `search.json` ("run.units" -> "--units")."""
    group, _, name = key.partition(".")
    if group == "space":
        return "--log-scale" if name == "log_scale" else flag_name(name)
    return "--" + (name or group).replace("_", "-")


def _flatten(tree, prefix=""):
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat = {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else key))
    return flat


def best_summary(config, tuner, rows):
    """`best.json`'s content: the best completed trial and what the search was."""
    completed = [r for r in rows if r["status"] == "COMPLETED" and r["score"] is not None]
    if not completed:
        raise SearchError(f"no trial of {tuner.project_dir} completed; see its trial.json files")
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
        "task": run.task.name,
        "model": run.model.name,
        "units": run.model.units,
        "tuner": config.tuner,
        "steps_per_trial": config.steps_per_trial,
        "validation_fraction": run.loop.validation_fraction,
        "trials": len(rows),
        "completed_trials": len(completed),
        "space": config.space.to_dict(),
        "project_dir": tuner.project_dir,
    }
