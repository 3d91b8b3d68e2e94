"""Reproduce the paper's experiments with the project's own training CLI, and report them.

    python -m training.reproduce --data-dir ../shared/data/tfds            # the whole suite
    python -m training.reproduce --only noise_padded_fashion_mnist --budget 0.1
    python -m training.reproduce --report-only                             # tables and plots

Each run of the suite is one `python -m training.train --config ...` command
(a config of `training/configs/` plus the suite's overrides) in its own folder
of `--runs-dir`. The suite is resumable: a finished run is not redone, an
interrupted one resumes from its checkpoint (`training.train` does that), and
`--time-limit` stops every run at a deadline so the next call goes on.
`--budget` scales every run's steps (`--steps` sets them all). The search
stage runs `training.tune` over ε × γ for the noise-padded heatmap.

The report (`docs/reproduction.md`, `docs/reproduction/results.json` and PNG
learning curves, see `training.report`) is written from whatever the runs
folder holds, finished or not, with each run's hardware and command.
"""

import argparse
import dataclasses
import os
import shlex
import subprocess
import sys
import time

from training.config import invalid

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
MOCK_EXAMPLES = 64  # per split, for --mock-data


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of the suite.

    Attributes:
        name: Folder of the run under `--runs-dir` (and its id in the report).
        table: The report table it belongs to.
        config: YAML file in `training/configs/`.
        steps: Training steps at `--budget 1`.
        paper: The paper's test accuracy for this row (%), or None.
        data: The data set it needs ("mnist", "fashion_mnist", "cifar10").
        overrides: Options that replace the config's (dataset, timesteps, ...).
    """

    name: str
    table: str
    config: str
    steps: int
    paper: float | None
    data: str
    overrides: tuple = ()

    def options(self):
        """The config's options with the overrides applied (YAML keys)."""
        import yaml

        with open(os.path.join(CONFIGS, self.config)) as handle:
            values = yaml.safe_load(handle)
        values.update(dict(self.overrides))
        return values


def _mnist_rows():
    rows = []
    for task, paper in (
        ("pixel_mnist", (98.0, 98.8, 97.3)),
        ("permuted_mnist", (95.8, 93.1, 92.6)),
    ):
        for dataset in ("mnist", "fashion_mnist"):
            for model, number in zip(("antisymmetric", "gated", "lstm"), paper, strict=True):
                prefix = task if dataset == "mnist" else task.replace("mnist", "fashion_mnist")
                rows.append(
                    Run(
                        f"{prefix}_{model}",
                        f"{task} ({dataset})",
                        f"{task}_{model}.yaml",
                        steps=6000,
                        paper=number if dataset == "mnist" else None,
                        data=dataset,
                        overrides=(("dataset", dataset),),
                    )
                )
    return rows


def _noise_padded_rows():
    paper = {"antisymmetric": 48.3, "gated": 54.7, "ablation": 46.2, "lstm": 11.6}
    rows = [
        Run(
            f"noise_padded_fashion_mnist_{model}",
            "noise_padded (fashion_mnist, T=1000)",
            f"noise_padded_fashion_mnist_{model}.yaml",
            steps=6000,
            paper=None,
            data="fashion_mnist",
        )
        for model in paper
    ]
    for timesteps in (100, 300):
        rows += [
            Run(
                f"noise_padded_fashion_mnist_t{timesteps}_{model}",
                "length (fashion_mnist)",
                f"noise_padded_fashion_mnist_{model}.yaml",
                steps=3000,
                paper=None,
                data="fashion_mnist",
                overrides=(("timesteps", timesteps),),
            )
            for model in ("antisymmetric", "gated", "lstm")
        ]
    for name in ("pixel_cifar10", "noise_padded_cifar10"):
        rows += [
            Run(
                f"{name}_{model}",
                name,
                f"{name}_{model}.yaml",
                steps=10000,
                paper={
                    "pixel_cifar10": {
                        "antisymmetric": 58.7,
                        "gated": 62.2,
                        "ablation": 54.6,
                        "lstm": 59.7,
                    }
                }.get(name, paper)[model],
                data="cifar10",
            )
            for model in paper
        ]
    return rows


def _sensitivity_rows():
    """Neighbours of the chosen configs, in their task's table: the evidence behind each
    choice, and the LSTM at another learning rate (its own tuning)."""
    noise, pixel = "noise_padded (fashion_mnist, T=1000)", "pixel_mnist (mnist)"
    return [
        Run("np_gated_eps0.01_gamma0.1", noise, "noise_padded_fashion_mnist_gated.yaml", 6000,
            None, "fashion_mnist", (("gamma", 0.1),)),
        Run("np_gated_eps0.1_gamma1", noise, "noise_padded_fashion_mnist_gated.yaml", 6000,
            None, "fashion_mnist", (("epsilon", 0.1),)),
        Run("np_lstm_lr0.0005", noise, "noise_padded_fashion_mnist_lstm.yaml", 6000,
            None, "fashion_mnist", (("learning_rate", 0.0005),)),
        Run("pixel_mnist_antisymmetric_eps0.01", pixel, "pixel_mnist_antisymmetric.yaml", 6000,
            None, "mnist", (("epsilon", 0.01),)),
        Run("pixel_mnist_lstm_lr0.002", pixel, "pixel_mnist_lstm.yaml", 6000,
            None, "mnist", (("learning_rate", 0.002),)),
        Run("pixel_fashion_mnist_lstm_lr0.002", "pixel_mnist (fashion_mnist)",
            "pixel_mnist_lstm.yaml", 6000, None, "fashion_mnist",
            (("dataset", "fashion_mnist"), ("learning_rate", 0.002))),
    ]  # fmt: skip


def _smoke_rows():
    return [
        Run(
            f"smoke_digits_{model}",
            "smoke (digits)",
            f"pixel_mnist_{model}.yaml",
            steps=40,
            paper=None,
            data="digits",
            overrides=(("task", "digits"), ("units", 16), ("batch_size", 32)),
        )
        for model in ("antisymmetric", "lstm")
    ] + [
        Run(
            "smoke_noise_padded_cifar10_gated",
            "smoke (mock cifar10)",
            "noise_padded_cifar10_gated.yaml",
            steps=4,
            paper=54.7,
            data="cifar10",
            overrides=(("units", 8), ("batch_size", 16), ("timesteps", 40)),
        ),
        Run(
            "smoke_pixel_cifar10_antisymmetric",
            "smoke (mock cifar10)",
            "pixel_cifar10_antisymmetric.yaml",
            steps=2,
            paper=58.7,
            data="cifar10",
            overrides=(("units", 8), ("batch_size", 16)),
        ),
    ]


SUITES = {
    "paper": _mnist_rows() + _noise_padded_rows() + _sensitivity_rows(),
    "smoke": _smoke_rows(),
}

# The targets: (what, table, models that count, threshold, rival model, lead).
TARGETS = (
    ("noise-padded Fashion-MNIST T=1000: better antisymmetric model",
     "noise_padded (fashion_mnist, T=1000)", ("antisymmetric", "gated"), 0.80, "lstm", 0.30),
    ("pixel MNIST (5,000/1,000 subset)", "pixel_mnist (mnist)", ("antisymmetric", "gated"),
     0.95, "lstm", 0.0),
    ("pixel Fashion-MNIST", "pixel_mnist (fashion_mnist)", ("antisymmetric", "gated"), 0.85,
     "lstm", 0.0),
)  # fmt: skip

# The ε × γ search behind the noise-padded configs (the report's heatmap).
SEARCH = {
    "name": "noise_padded_fashion_mnist_gated",
    "argv": [
        "--task", "noise_padded_mnist", "--dataset", "fashion_mnist", "--timesteps", "1000",
        "--model", "gated", "--units", "128", "--batch-size", "128", "--tuner", "grid",
        "--epsilon-values", "0.01,0.1,1", "--gamma-values", "0.001,0.01,0.1,1",
        "--sigma-w-values", "8", "--optimizer-values", "adam", "--learning-rate-values",
        "0.002", "--clipnorm", "1.0", "--max-trials", "12", "--steps-per-trial", "400",
        "--validation-fraction", "0.1",
    ],
}  # fmt: skip


def train_argv(run, steps, runs_dir, data_dir):
    """The `training.train` arguments of `run` at `steps` steps."""
    argv = ["--config", os.path.relpath(os.path.join(CONFIGS, run.config))]
    for key, value in run.overrides:
        argv += [f"--{key.replace('_', '-')}", str(value)]
    every = max(1, steps // 20)
    argv += [
        "--steps", str(steps),
        "--eval-every", str(every),
        "--checkpoint-every", str(every),
        "--log-every", str(every),
        "--output-dir", os.path.join(runs_dir, run.name),
    ]  # fmt: skip
    if data_dir and run.data != "digits":
        argv += ["--data-dir", data_dir]
    return argv


def data_available(run, data_dir):
    """Whether `run`'s data set can be read from `data_dir` (TFDS or .npz)."""
    if run.data == "digits":
        return True
    if not data_dir:
        return False
    return os.path.isdir(os.path.join(data_dir, run.data)) or os.path.isfile(
        os.path.join(data_dir, f"{run.data}.npz")
    )


def finished(run_dir, steps):
    import json

    path = os.path.join(run_dir, "metrics.json")
    if not os.path.isfile(path):
        return False
    with open(path) as handle:
        return json.load(handle).get("steps", 0) >= steps


def select(suite, only):
    """The suite's runs named by `only`: an exact name picks that run alone, any other
    pattern every run whose name contains it."""
    runs = SUITES[suite]
    if not only:
        return runs
    names = {run.name for run in runs}
    chosen = set()
    for pattern in only:
        chosen |= {pattern} if pattern in names else {r.name for r in runs if pattern in r.name}
    return [run for run in runs if run.name in chosen]


def execute(runs, args, log=print):
    """Runs what is not finished: `--parallel` at once, stopped at `--time-limit`."""
    deadline = time.monotonic() + args.time_limit if args.time_limit else None
    pending = []
    for run in runs:
        steps = args.steps or max(1, round(run.steps * args.budget))
        run_dir = os.path.join(args.runs_dir, run.name)
        if finished(run_dir, steps):
            log(f"{run.name}: finished, kept")
        elif not (args.mock_data or data_available(run, args.data_dir)):
            log(f"{run.name}: no {run.data} data in --data-dir, not run here")
        else:
            pending.append((run, train_argv(run, steps, args.runs_dir, args.data_dir)))
    if args.mock_data:  # in this process: TFDS's mock data patches it
        import tensorflow_datasets as tfds

        from training import train

        with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
            for run, argv in pending:
                log(f"{run.name}: python -m training.train {shlex.join(argv)}")
                train.main(argv)
        return
    running = []
    os.makedirs(args.runs_dir, exist_ok=True)
    while pending or running:
        while pending and len(running) < args.parallel:
            run, argv = pending.pop(0)
            log(f"{run.name}: python -m training.train {shlex.join(argv)}")
            handle = open(os.path.join(args.runs_dir, f"{run.name}.log"), "a")
            process = subprocess.Popen(
                [sys.executable, "-m", "training.train", *argv],
                stdout=handle,
                stderr=subprocess.STDOUT,
            )
            running.append((run, process, handle))
        time.sleep(1)
        for item in list(running):
            run, process, handle = item
            if process.poll() is not None:
                handle.close()
                running.remove(item)
                log(f"{run.name}: exit {process.returncode}")
        if deadline is not None and time.monotonic() > deadline:
            for run, process, handle in running:
                process.kill()  # resumes from its checkpoint next time
                process.wait()
                handle.close()
                log(f"{run.name}: stopped at --time-limit")
            return


def search(args, log=print):
    """The ε × γ grid search of `SEARCH` with `training.tune` (resumes when rerun)."""
    from training import tune

    argv = [
        *SEARCH["argv"],
        "--directory",
        os.path.join(args.runs_dir, "search"),
        "--project-name",
        SEARCH["name"],
    ]
    if args.data_dir:
        argv += ["--data-dir", args.data_dir]
    log(f"search: python -m training.tune {shlex.join(argv)}")
    return tune.main(argv)


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m training.reproduce", description=__doc__)
    parser.add_argument("--suite", default="paper", choices=sorted(SUITES))
    parser.add_argument(
        "--only", nargs="*", default=None, help="run names (exact), or parts of names"
    )
    parser.add_argument("--budget", type=float, default=1.0, help="scale of every run's steps")
    parser.add_argument("--steps", type=int, default=None, help="steps of every run")
    parser.add_argument("--runs-dir", default=os.path.join("runs", "reproduce"))
    parser.add_argument("--data-dir", default=os.environ.get("TFDS_DATA_DIR"))
    parser.add_argument("--parallel", type=int, default=1, help="runs at once")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds, then stop")
    parser.add_argument("--search", action="store_true", help="also run the ε × γ search")
    parser.add_argument("--mock-data", action="store_true", help="TFDS mock data (tests)")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--report-dir", default="docs", help="where reproduction.md goes")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    for name, value, ok, expected in (
        ("--budget", args.budget, args.budget > 0, "a positive float"),
        ("--steps", args.steps, args.steps is None or args.steps > 0, "a positive integer"),
        ("--parallel", args.parallel, args.parallel > 0, "a positive integer"),
        ("--time-limit", args.time_limit, not args.time_limit or args.time_limit > 0,
         "a positive number of seconds"),
    ):  # fmt: skip
        if not ok:
            parser.exit(2, f"{parser.prog}: error: {invalid(name, expected, value)}\n")
    from training import report

    runs = select(args.suite, args.only)
    if not args.report_only:
        execute(runs, args)
        if args.search:
            search(args)
    path = report.write(
        SUITES[args.suite],
        args.runs_dir,
        args.report_dir,
        targets=TARGETS if args.suite == "paper" else (),
        search_csv=os.path.join(args.runs_dir, "search", "trials.csv"),
        data_dir=args.data_dir,
    )
    print(f"report -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
