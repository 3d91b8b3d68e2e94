"""Reproduce the paper's experiments with the project's own training CLI, and report them.

    python -m training.reproduce --data-dir ../shared/data/tfds            # the whole suite
    python -m training.reproduce --only noise_padded_fashion_mnist --budget 0.1
    python -m training.reproduce --report-only                             # tables and plots

Each run of the suite is one `python -m training.train --config ...` command
(a config of `training/paper/configs/` plus the suite's overrides) in its own folder
of `--runs-dir`. The suite is resumable: a finished run is not redone, an
interrupted one resumes from its checkpoint (`training.train` does that), and
`--time-limit` stops every run at a deadline so the next call goes on. SIGTERM or
SIGINT (Ctrl-C) stops every run in progress the same way, each checkpointing its
step, and the suite with one line (exit 128 + the signal's number); runs of a suite
killed outright get SIGTERM from the kernel and checkpoint too.
`--budget` scales every run's steps (`--steps` sets them all). `--search`
also runs the searches behind the configs with `training.tune`
(`training.paper.suite.SEARCHES`: ε × γ for each antisymmetric model, the learning
rate for the LSTM, and on the real MNIST the paper's optimizers against the configs'
Adam; `--only search_noise_padded_antisymmetric --search` runs one search and no
training run), the report's heatmaps and tables.

The report (`docs/reproduction.md`, `docs/reproduction/results.json` and PNG
learning curves, see `training.paper.report`) is written from whatever the runs
folder holds, finished or not, with each run's hardware and command.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

from apputil import cli, signals
from apputil.errors import invalid
from apputil.processes import exit_status, parent_death_hook, stop_all
from training import train, tune
from training.errors import EXPECTED, SuiteInterrupted
from training.paper import report
from training.paper.suite import (
    SEARCHES,
    SEED_TARGETS,
    SUITES,
    TARGETS,
    data_available,
    differences_text,
    named,
    select_searches,
    train_argv,
)
from training.run.rundir import RunDir

MOCK_EXAMPLES = 64  # per split, for --mock-data
#: Seconds between two looks at the runs in progress (and at a stop signal).
POLL_SECONDS = 1.0
#: Seconds a stopped run has to checkpoint its step and exit before it is killed: a step of
#: the slowest row on a CPU (a few seconds) and the checkpoint, with room for a loaded machine.
STOP_GRACE_SECONDS = 120.0


def finished(run_dir, steps):
    return RunDir(run_dir).finished(steps)


def select(suite, only):
    """The suite's runs named by `only` (`training.paper.suite.named`)."""
    return named(SUITES[suite], only)


def execute(runs, args, log=print):
    """Runs what is not finished: `--parallel` at once, stopped at `--time-limit`.

    Each run is a `training.train` process in a session of its own: a stop
    signal (SIGTERM, or SIGINT from a terminal) reaches it once, from here, and
    is passed on, so every run checkpoints its step and the suite ends with one
    line (`SuiteInterrupted`); a suite killed outright stops its runs with SIGTERM
    too. `--time-limit` stops them the same way, a checkpoint each.
    """
    deadline = time.monotonic() + args.time_limit if args.time_limit else None
    pending = []
    for run in runs:
        steps = args.steps or max(1, round(run.steps * args.budget))
        run_dir = os.path.join(args.runs_dir, run.name)
        differences = run.other_settings(RunDir(run_dir).read_config())
        if differences:  # `training.train` would refuse to resume it, and rightly
            shown = differences_text(differences)
            log(f"{run.name}: recorded with other settings ({shown}), kept: move its folder "
                f"away to run the suite's")  # fmt: skip
        elif finished(run_dir, steps):
            log(f"{run.name}: finished, kept")
        elif not (args.mock_data or data_available(run, args.data_dir)):
            log(f"{run.name}: no {run.data} data in --data-dir, not run")
        else:
            pending.append((run, train_argv(run, steps, args.runs_dir, args.data_dir)))
    if args.mock_data:  # in this process: TFDS's mock data patches it
        import tensorflow_datasets as tfds  # imports TensorFlow: only for mock data

        with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
            for run, argv in pending:
                log(f"{run.name}: python -m training.train {shlex.join(argv)}")
                _raise_if_stopped(train.main(argv))
        return
    running: list = []
    os.makedirs(args.runs_dir, exist_ok=True)
    die_with_suite = parent_death_hook(signal.SIGTERM)
    with signals.recording() as received:
        while (pending or running) and not received:
            while pending and len(running) < args.parallel:
                run, argv = pending.pop(0)
                log(f"{run.name}: python -m training.train {shlex.join(argv)}")
                handle = open(os.path.join(args.runs_dir, f"{run.name}.log"), "a")
                process = subprocess.Popen(
                    [sys.executable, "-m", "training.train", *argv],
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_suite,
                )
                running.append((run, process, handle))
            time.sleep(POLL_SECONDS)
            for item in list(running):
                run, process, handle = item
                if process.poll() is not None:
                    handle.close()
                    running.remove(item)
                    log(f"{run.name}: exit {process.returncode}")
            if deadline is not None and time.monotonic() > deadline and not received:
                _stop(running, signal.SIGTERM, log, "stopped at --time-limit")
                return
        if received:
            number = received[0]
            _stop(running, number, log, f"stopped by {signal.Signals(number).name}")
            raise SuiteInterrupted(number)


def _stop(running, number, log, why):
    """Signal `number` to each run in progress (it checkpoints its step), `why` logged."""
    stop_all([process for _, process, _ in running], number, STOP_GRACE_SECONDS)
    for run, process, handle in running:
        handle.close()
        log(f"{run.name}: {why} (exit {exit_status(process.returncode)})")


def _stopped_by(status):
    """Whether exit `status` says a stop signal ended the command (128 + its number)."""
    return status - 128 in signals.STOP_SIGNALS


def _raise_if_stopped(status):
    """A command of the suite's that a stop signal ended stops the suite."""
    if _stopped_by(status):
        raise SuiteInterrupted(status - 128)
    return status


def search(args, log=print):
    """Runs the `SEARCHES` that `--only` names (all without it) with `training.tune`.

    Each resumes where it stopped when rerun; one that fails does not keep the
    next from running, a stop signal ends them all (`SuiteInterrupted`).
    Returns the first non-zero exit status, or 0.
    """
    status = 0
    for each in select_searches(args.only):
        argv = [*each.argv, "--directory", os.path.join(args.runs_dir, "search")]
        argv += ["--project-name", each.name]
        if args.data_dir:
            argv += ["--data-dir", args.data_dir]
        log(f"search {each.name}: python -m training.tune {shlex.join(argv)}")
        code = _raise_if_stopped(tune.main(argv))
        if code:
            log(f"search {each.name}: exit {code}")
        status = status or code
    return status


def build_parser():
    parser = cli.OneLineParser(prog="python -m training.reproduce", description=__doc__)
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
    parser.add_argument(
        "--search",
        action="store_true",
        help="also run the searches behind the configs (`--only` picks them too)",
    )
    parser.add_argument("--mock-data", action="store_true", help="TFDS mock data (tests)")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument(
        "--report-dir",
        default=None,
        help="where reproduction.md and its figures go (default: <runs-dir>/report; "
        "the committed report is written with --report-dir docs)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
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
            return cli.fail(parser.prog, invalid(name, expected, value))
    runs = select(args.suite, args.only)
    status = 0
    if not args.report_only:

        def body():
            execute(runs, args)
            return search(args) if args.search else 0

        status = cli.run(parser.prog, body, EXPECTED)
        if _stopped_by(status):
            return status  # stopped: no report now (`--report-only` writes it)
    path = report.write(
        SUITES[args.suite],
        args.runs_dir,
        args.report_dir or os.path.join(args.runs_dir, "report"),
        targets=TARGETS if args.suite == "paper" else (),
        seed_targets=SEED_TARGETS if args.suite == "paper" else (),
        searches={
            each: os.path.join(args.runs_dir, "search", each.name, "trials.csv")
            for each in SEARCHES
        },
        data_dir=args.data_dir,
    )
    print(f"report -> {path}")
    return status


if __name__ == "__main__":
    cli.execute(main)
