"""The tuning CLI: a small search, distributed chief/workers, resume, bad flags."""

import csv
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from apputil.errors import UsageError
from tests.limits import limit
from training import tune
from training.errors import SearchError
from training.search.space import MODEL_HYPERPARAMETERS, PAPER_GRID, SearchSpace, flag_name

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--task", "digits", "--units", "8", "--batch-size", "32", "--seed", "0"]


def _env(**extra):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    for name in ("KERASTUNER_TUNER_ID", "KERASTUNER_ORACLE_IP", "KERASTUNER_ORACLE_PORT"):
        env.pop(name, None)
    env.update(extra)
    return env


def _start(args, log_path, **env):
    with open(log_path, "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "training.tune", *args],
            cwd=ROOT,
            env=_env(**env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _stop(processes):
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=limit(30))


def _wait_for_text(search, log, text, seconds):
    """Waits until the search's log holds `text`; the deadline it set."""
    deadline = time.monotonic() + limit(seconds)
    while text not in log.read_text():
        assert search.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.01)
    return deadline


def _trials(project_dir):
    """trial_id -> trial.json of every trial of a project."""
    trials = {}
    for path in Path(project_dir).glob("trial_*/trial.json"):
        try:
            trial = json.loads(path.read_text())
        except json.JSONDecodeError:  # being written
            continue
        trials[trial["trial_id"]] = trial
    return trials


def _read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_space_contains_its_grid_values_or_with_log_scale_its_ranges():
    grid = SearchSpace({"epsilon": [0.01, 1.0]})
    assert grid.contains("epsilon", 0.01) and grid.contains("epsilon", 1.0)
    assert not grid.contains("epsilon", 0.1)  # between the values, but no value
    ranges = SearchSpace({"epsilon": [0.01, 1.0], "gamma": [0.1]}, log_scale=True)
    assert ranges.contains("epsilon", 0.01) and ranges.contains("epsilon", 0.1)
    assert ranges.contains("epsilon", 1.0)
    assert not ranges.contains("epsilon", 0.009) and not ranges.contains("epsilon", 1.01)
    assert ranges.contains("gamma", 0.1) and not ranges.contains("gamma", 0.2)  # one value
    assert ranges.contains("optimizer", "sgd") and not ranges.contains("optimizer", "adam")


def _search(**fields):
    from training.config import RunConfig

    run = RunConfig.of(task="digits", model="antisymmetric", validation_fraction=0.2)
    return tune.SearchConfig(run=run, space=SearchSpace(), **fields)


def test_search_budgets_take_their_smallest_values():
    config = _search(max_trials=1, steps_per_trial=1, hyperband_max_epochs=1, retrain_steps=0)
    assert config.validate() is config


@pytest.mark.parametrize(
    ("field", "value", "flag", "expected"),
    [
        ("max_trials", 0, "--max-trials", "a positive integer"),
        ("steps_per_trial", 0, "--steps-per-trial", "a positive integer"),
        ("hyperband_max_epochs", -2, "--hyperband-max-epochs", "a positive integer"),
        ("retrain_steps", -1, "--retrain-steps", "a non-negative integer"),
    ],
)
def test_search_budgets_out_of_range_are_refused_by_flag(field, value, flag, expected):
    from apputil.errors import UsageError

    with pytest.raises(UsageError) as refused:
        _search(**{field: value}).validate()
    assert str(refused.value) == (
        f"Received an invalid value for argument `{flag}`, expected {expected}, got {value}."
    )


# 1.0 is refused by the run's own check first; a search also refuses 0 (no validation split).
@pytest.mark.parametrize(("fraction", "expected"), [(0.0, "(0, 1)"), (1.0, "[0, 1)")])
def test_a_search_needs_a_validation_split(fraction, expected):
    from apputil.errors import UsageError
    from training.config import RunConfig

    run = RunConfig.of(task="digits", model="antisymmetric", validation_fraction=fraction)
    with pytest.raises(UsageError) as refused:
        tune.SearchConfig(run=run, space=SearchSpace()).validate()
    assert str(refused.value) == (
        "Received an invalid value for argument `--validation-fraction`, "
        f"expected a float in {expected}, got {fraction}."
    )


def test_a_grid_search_needs_discrete_values():
    from apputil.errors import UsageError
    from training.config import RunConfig

    run = RunConfig.of(task="digits", model="antisymmetric", validation_fraction=0.2)
    space = SearchSpace(log_scale=True)
    with pytest.raises(UsageError) as refused:
        tune.SearchConfig(run=run, space=space, tuner="grid").validate()
    assert str(refused.value) == (
        "Received an invalid value for argument `--tuner`, expected random, bayesian or "
        "hyperband with --log-scale (grid needs discrete values), got 'grid'."
    )
    assert tune.SearchConfig(run=run, space=space, tuner="bayesian").validate()


def test_a_space_as_recorded_in_search_json():
    """Every hyperparameter's values, sorted and without repeats, and the log-scale switch."""
    space = SearchSpace({"epsilon": [1.0, 0.01, 1.0], "optimizer": "adagrad"}, log_scale=True)
    assert space.to_dict() == {
        "log_scale": True,
        "epsilon": [0.01, 1.0],
        "gamma": [0.001, 0.01, 0.1, 1.0],  # the paper's grids
        "learning_rate": [0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0],
        "sigma_w": [0.0, 1.0, 2.0, 4.0, 8.0, 16.0],
        "optimizer": ["adagrad"],
    }


def test_small_random_search_stays_in_the_space_and_names_the_best_trial(tmp_path, capsys):
    directory = tmp_path / "search"
    argv = [*TINY, "--model", "antisymmetric", "--tuner", "random", "--max-trials", "3"]
    argv += ["--steps-per-trial", "10", "--directory", str(directory), "--project-name", "p"]
    assert tune.main(argv) == 0

    trials = _trials(directory / "p")
    assert len(trials) == 3
    space = SearchSpace()
    for trial in trials.values():
        assert trial["status"] == "COMPLETED"
        values = trial["hyperparameters"]["values"]
        assert set(values) == set(MODEL_HYPERPARAMETERS["antisymmetric"])
        for name, value in values.items():
            assert value in PAPER_GRID[name] and space.contains(name, value), (name, value)

    with open(directory / "p" / "trials.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["trial_id"] for row in rows] != [] and len(rows) == 3
    scores = [float(row["score"]) for row in rows]
    assert scores == sorted(scores, reverse=True)
    text = (directory / "p" / "best.json").read_text()
    best = json.loads(text)
    assert text == json.dumps(best, indent=2) + "\n"  # for people to read
    assert best["objective"] == "val_accuracy"
    assert best["best_trial_id"] == rows[0]["trial_id"]
    assert best["score"] == pytest.approx(max(t["score"] for t in trials.values()))
    assert best["hyperparameters"] == trials[best["best_trial_id"]]["hyperparameters"]["values"]
    assert best["completed_trials"] == 3
    out = capsys.readouterr().out
    assert "trial_id" in out and f"best trial {best['best_trial_id']}" in out


def test_custom_log_scale_space_samples_inside_its_ranges(tmp_path):
    space_file = tmp_path / "space.yaml"
    space_file.write_text("epsilon: [0.05, 0.5]\noptimizer: [adagrad]\n")
    directory = tmp_path / "search"
    argv = [*TINY, "--model", "gated", "--tuner", "bayesian", "--max-trials", "2"]
    argv += ["--steps-per-trial", "5", "--space", str(space_file), "--log-scale"]
    argv += ["--learning-rate-values", "0.1,0.3", "--directory", str(directory)]
    assert tune.main(argv) == 0
    trials = _trials(directory / "digits-gated")
    assert len(trials) == 2
    for trial in trials.values():
        values = trial["hyperparameters"]["values"]
        assert 0.05 <= values["epsilon"] <= 0.5
        assert 0.1 <= values["learning_rate"] <= 0.3
        assert 0.001 <= values["gamma"] <= 1 and 0 <= values["sigma_w"] <= 16
        assert values["optimizer"] == "adagrad"


@pytest.mark.parametrize("tuner, model", [("grid", "lstm"), ("hyperband", "gated")])
def test_grid_and_hyperband_search_then_retrain_the_best(tmp_path, tuner, model):
    directory = tmp_path / "search"
    argv = [*TINY, "--model", model, "--tuner", tuner, "--max-trials", "4"]
    argv += ["--steps-per-trial", "6", "--directory", str(directory), "--retrain-steps", "8"]
    argv += ["--sigma-w-values", "1,2", "--learning-rate-values", "0.1"]
    assert tune.main(argv) == 0
    trials = _trials(directory / f"digits-{model}")
    assert len(trials) == 4
    for trial in trials.values():
        values = trial["hyperparameters"]["values"]
        assert values["sigma_w"] in (1, 2) and values["learning_rate"] == 0.1
        assert ("epsilon" in values) == (model != "lstm")
    best = json.loads((directory / f"digits-{model}" / "best.json").read_text())
    assert best["score"] == pytest.approx(
        max(t["score"] for t in trials.values() if t["status"] == "COMPLETED")
    )
    assert best["retrained"]["steps"] == 8
    assert best["retrained"]["model"] == model and "val_accuracy" in best["retrained"]
    config = (directory / f"digits-{model}" / "best" / "config.yaml").read_text()
    assert f"sigma_w: {float(best['hyperparameters']['sigma_w'])}" in config
    assert (directory / f"digits-{model}" / "best" / "model.keras").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--epsilon-values", "0,0.1"],
            "Received an invalid value for argument `--epsilon-values`, expected positive floats",
        ),
        (
            ["--gamma-values", "-0.1"],
            "Received an invalid value for argument `--gamma-values`, expected non-negative",
        ),
        (
            ["--learning-rate-values", "0.1,x"],
            "Received an invalid value for argument `--learning-rate-values`, expected positive",
        ),
        # Not numbers: the message names what each flag takes.
        (
            ["--gamma-values", "0.1,x"],
            "argument `--gamma-values`, expected non-negative floats, got '0.1,x'.",
        ),
        (
            ["--sigma-w-values", "one"],
            "argument `--sigma-w-values`, expected non-negative floats, got 'one'.",
        ),
        (
            ["--epsilon-values", "0.1;0.2"],
            "argument `--epsilon-values`, expected positive floats, got '0.1;0.2'.",
        ),
        (["--optimizer-values", "rmsprop"], "argument `--optimizer-values`"),
        (["--tuner", "grid", "--log-scale"], "argument `--tuner`"),
        (["--validation-fraction", "0"], "argument `--validation-fraction`"),
        (["--max-trials", "0"], "argument `--max-trials`"),
    ],
)
def test_invalid_values_fail_with_one_line(tmp_path, capsys, extra, message):
    assert tune.main([*TINY, "--directory", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not list(tmp_path.rglob("best.json"))


def test_invalid_space_file_value_fails_with_one_line(tmp_path, capsys):
    space_file = tmp_path / "space.yaml"
    space_file.write_text("epsilon: [-1, 0.1]\n")
    assert tune.main([*TINY, "--space", str(space_file), "--directory", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "argument `--space (epsilon)`, expected positive floats" in err
    assert err.count("\n") == 1


def test_unknown_tuner_is_a_one_line_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        tune.main([*TINY, "--tuner", "annealing"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --tuner: invalid choice: 'annealing'" in err
    assert err.count("\n") == 1


def test_trials_run_under_mirrored_strategy_on_two_logical_cpus(tmp_path):
    directory = tmp_path / "search"
    argv = [*TINY, "--max-trials", "2", "--steps-per-trial", "5", "--directory", str(directory)]
    argv += ["--strategy", "mirrored", "--cpu-devices", "2"]
    result = subprocess.run(
        [sys.executable, "-m", "training.tune", *argv],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=limit(120),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trials run on MirroredStrategy (2 replicas)" in result.stdout
    trials = _trials(directory / "digits-antisymmetric")
    assert len(trials) == 2 and all(t["status"] == "COMPLETED" for t in trials.values())


@pytest.mark.slow
def test_chief_and_two_workers_run_every_trial_once(tmp_path):
    directory = tmp_path / "search"
    trials = 4
    argv = [*TINY, "--model", "antisymmetric", "--tuner", "random"]
    argv += ["--max-trials", str(trials), "--steps-per-trial", "10"]
    argv += ["--directory", str(directory), "--project-name", "p"]
    oracle = {"KERASTUNER_ORACLE_IP": "127.0.0.1", "KERASTUNER_ORACLE_PORT": str(_free_port())}
    names = ("chief", "tuner0", "tuner1")
    processes = []
    try:
        for name in names:
            processes.append(
                _start(argv, tmp_path / f"{name}.log", KERASTUNER_TUNER_ID=name, **oracle)
            )
        deadline = time.monotonic() + limit(150)
        for process in processes:
            process.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        _stop(processes)
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in names}
    for process, name in zip(processes, names, strict=True):
        assert process.returncode == 0, logs[name][-3000:]

    found = _trials(directory / "p")
    assert sorted(found) == [str(i) for i in range(trials)]
    assert all(trial["status"] == "COMPLETED" for trial in found.values())
    # Each trial ran on exactly one worker, exactly once; the chief ran none.
    runs = [
        line.split()[2]
        for name in ("tuner0", "tuner1")
        for line in logs[name].splitlines()
        if line.startswith(f"[{name}] trial ") and " done " in line
    ]
    assert sorted(runs) == sorted(found)
    assert "] trial " not in logs["chief"]
    best = json.loads((directory / "p" / "best.json").read_text())
    assert best["completed_trials"] == trials
    assert best["score"] == pytest.approx(max(t["score"] for t in found.values()))


@pytest.mark.parametrize(
    "number, wait_for, seconds",
    [(signal.SIGTERM, "[tuner0] trial 0 ", 4.0), (signal.SIGINT, "trials run on ", 0.0)],
)
def test_a_signal_stops_the_search_with_one_line_and_the_shell_s_status(
    tmp_path, number, wait_for, seconds
):
    """In a trial (its loop finishes the step in progress) or anywhere else in the search."""
    directory = tmp_path / "search"
    argv = [*TINY, "--model", "antisymmetric", "--tuner", "random", "--max-trials", "2"]
    argv += ["--steps-per-trial", "1000000", "--directory", str(directory), "--project-name", "p"]
    log = tmp_path / "tune.log"
    search = _start(argv, log)
    try:
        _wait_for_text(search, log, wait_for, 90)
        time.sleep(seconds)
        search.send_signal(number)
        search.wait(timeout=limit(60))
    finally:
        _stop([search])
    text = log.read_text()
    assert search.returncode == 128 + number, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    (line,) = [line for line in text.splitlines() if ": error: " in line]
    name = signal.Signals(number).name
    assert re.fullmatch(
        rf"python -m training\.tune: error: stopped by {name} (in trial 0 at step \d+|outside "
        rf"a trial); run the same command to continue the search \(its finished trials are "
        rf"kept\)",
        line,
    ), line
    if number == signal.SIGTERM:  # 4 s into a trial of a million steps: inside its loop
        assert " in trial 0 at step " in line, line


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_after_the_best_trial_is_printed_is_one_line_and_keeps_the_status(
    tmp_path, number
):
    """The process took seconds to exit after its last line, killed by a signal then:
    stop signals sent every 50 ms from the best trial's line on leave best.json whole and
    each one that lands is one line with the documented status."""
    directory = tmp_path / "search"
    argv = [*TINY, "--model", "antisymmetric", "--tuner", "random", "--max-trials", "1"]
    argv += ["--steps-per-trial", "5", "--directory", str(directory), "--project-name", "p"]
    log = tmp_path / "tune.log"
    search = _start(argv, log)
    try:
        deadline = _wait_for_text(search, log, "best trial 0 ", 120)
        sent = 0
        while search.poll() is None and time.monotonic() < deadline:
            search.send_signal(number)
            sent += 1
            time.sleep(0.05)
        search.wait(timeout=limit(60))
    finally:
        _stop([search])
    text = log.read_text()
    name = signal.Signals(number).name
    told = [line for line in text.splitlines() if f"{name} while exiting" in line]
    stopped = [line for line in text.splitlines() if ": error: " in line]
    assert "Traceback" not in text, text[-3000:]
    assert sent >= 1 and len(told) + len(stopped) <= sent, (sent, text[-3000:])
    assert set(told) <= {
        f"python -m training.tune: {name} while exiting: its work was done (exit status "
        f"{search.returncode})"
    }
    # The best trial's line is printed inside the search: a first signal between it and
    # the search's end stops the search as any signal outside a trial does, in one line
    # with the signal's status; every later one finds the search over. Never death by it.
    if stopped:
        assert search.returncode == 128 + number, text[-3000:]
        assert stopped == [
            f"python -m training.tune: error: stopped by {name} outside a trial; run the same "
            "command to continue the search (its finished trials are kept)"
        ], text[-3000:]
    else:
        assert search.returncode == 0, text[-3000:]
    assert json.loads((directory / "p" / "best.json").read_text())["completed_trials"] == 1


def test_killed_search_resumes_without_redoing_finished_trials(tmp_path):
    directory = tmp_path / "search"
    argv = [*TINY, "--model", "antisymmetric", "--tuner", "random", "--max-trials", "3"]
    argv += ["--steps-per-trial", "40", "--directory", str(directory), "--project-name", "p"]
    project = directory / "p"
    first = _start(argv, tmp_path / "first.log")
    try:
        deadline = time.monotonic() + limit(90)
        while time.monotonic() < deadline and first.poll() is None:
            trial = _trials(project).get("0")
            oracle = _read_json(project / "oracle.json")
            # The oracle saves trial 0 as finished (no longer ongoing) after its trial.json.
            if (
                trial
                and trial["status"] == "COMPLETED"
                and oracle
                and "0" not in oracle["ongoing_trials"].values()
            ):
                break
            time.sleep(0.05)
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=limit(30))
    finally:
        _stop([first])
    before = _trials(project)
    assert before["0"]["status"] == "COMPLETED"
    assert not (directory / "p" / "best.json").exists()

    second = _start(argv, tmp_path / "second.log")
    try:
        second.wait(timeout=limit(90))
    finally:
        _stop([second])
    log = (tmp_path / "second.log").read_text()
    assert second.returncode == 0, log[-3000:]
    after = _trials(project)
    assert sorted(after) == ["0", "1", "2"]
    assert all(trial["status"] == "COMPLETED" for trial in after.values())
    assert after["0"]["score"] == before["0"]["score"]
    assert after["0"]["hyperparameters"] == before["0"]["hyperparameters"]
    assert "[tuner0] trial 0 " not in log  # not redone
    best = json.loads((directory / "p" / "best.json").read_text())
    assert best["completed_trials"] == 3


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (SearchError("no trial of p completed; see its trial.json files"), 2),
        (OSError("disk full"), 1),
    ],
)
def test_main_starts_the_backend_then_searches_and_reports_a_failure_in_one_line(
    monkeypatch, tmp_path, capsys, error, status
):
    """In process, with the backend's start and the search replaced: what `main` hands on,
    and its exit status."""
    from training.backends import select
    from training.search import tuner as search

    calls = []

    def start(launch):
        calls.append(("start", launch.cpu_devices, launch.strategy))
        return "backend"

    def failing(config, backend):
        calls.append(("search", config.max_trials, config.run.model.units, backend))
        raise error

    monkeypatch.setattr(select, "start", start)
    monkeypatch.setattr(search, "run", failing)
    argv = [*TINY, "--directory", str(tmp_path), "--cpu-devices", "2", "--max-trials", "3"]
    assert tune.main(argv) == status
    assert calls == [("start", 2, "auto"), ("search", 3, 8, "backend")]
    assert capsys.readouterr().err == f"python -m training.tune: error: {error}\n"


def test_a_space_file_takes_dashed_names_and_flags_override_it(tmp_path):
    space_file = tmp_path / "space.yaml"
    space_file.write_text("learning-rate: [0.3, 0.1]\nsigma-w: 2\ngamma: [0.5]\n")
    args = tune.build_parser().parse_args(
        [*TINY, "--space", str(space_file), "--gamma-values", "0.25,0"]
    )
    space = tune.make_space(args)
    assert space.values["learning_rate"] == (0.1, 0.3)
    assert space.values["sigma_w"] == (2.0,)
    assert space.values["gamma"] == (0.0, 0.25)  # the flag wins over the file
    assert space.values["epsilon"] == PAPER_GRID["epsilon"]


def test_a_space_file_that_is_not_a_mapping_is_named(tmp_path, capsys):
    space_file = tmp_path / "space.yaml"
    space_file.write_text("- 1\n- 2\n")
    assert tune.main([*TINY, "--space", str(space_file), "--directory", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"python -m training.tune: error: argument --space: {space_file} is not a mapping "
        "of options\n"
    )


def test_help_names_the_command_and_what_it_does(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exited:
        tune.main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m training.tune ")
    description = out.split("\n\n")[1]
    assert description == "Search ε, γ, learning rate, σ_w and the optimizer with keras-tuner."
    assert "--cpu-devices" in out and "--max-trials" in out
    assert (
        "\nsearch space (default: the paper's grids; overrides --epsilon, --gamma, --sigma-w, "
        "--optimizer, --learning-rate):\n  --epsilon-values V1,V2,...\n"
    ) in out


def test_help_gives_each_grid_s_paper_values_and_what_a_space_file_is():
    text = " ".join(tune.build_parser().format_help().split())
    for name, grid in PAPER_GRID.items():
        values = ",".join(str(v) for v in grid)
        assert f"{flag_name(name)} V1,V2,... default: {values} " in text, name
    assert "--space SPACE YAML mapping of hyperparameter name to a list of values " in text


def test_the_search_flags_in_the_help_are_the_copy_in_the_docs(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        tune.main(["--help"])
    out = capsys.readouterr().out
    docs = (ROOT / "docs" / "tuning.md").read_text()
    section = docs[docs.index("## Flags of the search") :]
    start = section.index("```text\n") + len("```text\n")
    documented = section[start : section.index("\n```", start)]
    assert out[out.index("search space (") :].rstrip("\n") == documented


def test_the_search_flags_defaults():
    args = tune.build_parser().parse_args([])
    assert (args.tuner, args.max_trials, args.steps_per_trial, args.hyperband_max_epochs) == (
        "random", 20, 500, 3,
    )  # fmt: skip
    assert args.directory == os.path.join("runs", "tuning")
    assert (args.project_name, args.retrain_steps, args.retrain_dir, args.space) == (
        None, 0, None, None,
    )  # fmt: skip


@pytest.mark.parametrize(
    "environment, expected",
    [
        ({}, False),  # no oracle: a search of its own
        ({"KERASTUNER_TUNER_ID": "tuner0"}, False),
        ({"KERASTUNER_ORACLE_IP": "127.0.0.1"}, True),
        ({"KERASTUNER_ORACLE_IP": "127.0.0.1", "KERASTUNER_TUNER_ID": "tuner1"}, True),
        ({"KERASTUNER_ORACLE_IP": "127.0.0.1", "KERASTUNER_TUNER_ID": "chief"}, False),
    ],
)
def test_a_worker_is_a_process_with_an_oracle_address_that_is_not_the_chief(
    monkeypatch, environment, expected
):
    from training.search import tuner as search

    for name in ("KERASTUNER_TUNER_ID", "KERASTUNER_ORACLE_IP"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert search.is_worker() is expected


class _Metrics:
    def __init__(self, values):
        self.values = values

    def exists(self, name):
        return name in self.values

    def get_last_value(self, name):
        return self.values[name]


def _trial(trial_id, status, score, metrics=None, **values):
    from types import SimpleNamespace

    return SimpleNamespace(
        trial_id=trial_id,
        status=status,
        score=score,
        metrics=_Metrics(metrics or {}),
        hyperparameters=SimpleNamespace(values=values),
    )


def test_trial_rows_put_completed_trials_best_first_then_the_rest_by_id():
    from types import SimpleNamespace

    from training.search import tuner as search

    trials = [
        _trial("04", "RUNNING", None, learning_rate=0.1),
        _trial("01", "COMPLETED", 0.5, {"val_loss": 1.5}, learning_rate=0.2, sigma_w=1.0),
        _trial("03", "FAILED", None, learning_rate=0.3),
        _trial("00", "COMPLETED", 0.9, {"val_loss": 0.25}, learning_rate=0.4),
        _trial("02", "INVALID", None, **{"learning_rate": 0.5, "tuner/epochs": 2}),
    ]
    oracle = SimpleNamespace(trials={t.trial_id: t for t in trials})
    rows = search.trial_rows(oracle, "lstm")
    assert [row["trial_id"] for row in rows] == ["00", "01", "02", "03", "04"]
    assert [row["val_loss"] for row in rows] == [0.25, 1.5, None, None, None]
    assert rows[2]["rounds"] == 2 and "rounds" not in rows[0]
    assert [row["learning_rate"] for row in rows] == [0.4, 0.2, 0.5, 0.3, 0.1]
    assert rows[1]["sigma_w"] == 1.0 and rows[0]["sigma_w"] is None


def test_a_trial_table_leaves_missing_values_blank_and_rounds_floats_to_four_digits():
    from training.search import tuner as search

    rows = [
        {"trial_id": "00", "score": 0.123456, "val_loss": None},
        {"trial_id": "1", "score": None, "val_loss": 12.0},
    ]
    assert search.format_table(rows) == (
        "trial_id  score   val_loss\n"
        "--------  ------  --------\n"
        "00        0.1235\n"
        "1                 12"
    )
    assert search.format_table([]) == "(no trials)"


@pytest.mark.parametrize("tuner", ["random", "hyperband"])
def test_a_tuner_s_hypermodel_trains_on_the_backend_it_is_given(tmp_path, tuner):
    from training.config import RunConfig
    from training.search import tuner as search

    config = tune.SearchConfig(
        run=RunConfig.of(task="digits", units=8, batch_size=32, seed=0, validation_fraction=0.1),
        space=SearchSpace(),
        tuner=tuner,
        max_trials=5,
        hyperband_max_epochs=4,
        directory=str(tmp_path),
        project_name="p",
    )
    from training.backends.strategies import TensorFlowBackend

    backend = TensorFlowBackend()
    made = search.make_tuner(config, backend, log=lambda line: None)
    assert made.hypermodel.backend is backend
    assert made.distribution_strategy is backend.strategy
    assert made.oracle.max_trials == 5
    if tuner == "hyperband":
        assert (made.oracle.max_epochs, made.oracle.factor) == (4, 3)
        assert made.hypermodel.rounds == 4
    else:  # one round: a trial is steps_per_trial steps
        assert made.hypermodel.rounds == 1


def _search_config(tmp_path, **run):
    from training.config import RunConfig

    settings = dict(task="digits", units=8, batch_size=32, seed=0, validation_fraction=0.1)
    return tune.SearchConfig(
        run=RunConfig.of(**{**settings, **run}),
        space=SearchSpace(),
        directory=str(tmp_path),
        project_name="p",
    )


def test_a_search_record_without_a_newer_run_setting_reads_as_its_default(tmp_path):
    """A record written before a run setting existed: the setting ran at its default."""
    from training.config import RunConfig
    from training.search import tuner as search

    config = _search_config(tmp_path)
    search.check_same_search(config)
    path = tmp_path / "p" / "search.json"
    record = json.loads(path.read_text())
    assert record == json.loads(json.dumps(config.identity()))
    assert path.read_text() == json.dumps(record, indent=2, sort_keys=True) + "\n"
    assert record["run"].pop("momentum") == RunConfig().optimizer.momentum  # an older record
    path.write_text(json.dumps(record))
    search.check_same_search(config)  # continues: it ran at the default

    with pytest.raises(UsageError) as refused:
        search.check_same_search(_search_config(tmp_path, momentum=0.5))
    assert str(refused.value) == (
        "Received an invalid value for argument `--momentum`, expected "
        f"{RunConfig().optimizer.momentum} "
        f"as in {path} (a rerun continues the search of its project; start another with "
        "another --project-name or --directory), got 0.5."
    )


def test_a_search_starts_in_a_project_folder_that_exists_without_a_record(tmp_path):
    """An empty folder made beforehand (a mounted volume) is a new search, not an error."""
    from training.search import tuner as search

    config = _search_config(tmp_path)
    os.makedirs(config.project_dir)
    search.check_same_search(config)
    record = json.loads((tmp_path / "p" / "search.json").read_text())
    assert record == json.loads(json.dumps(config.identity()))


def test_a_signal_between_trials_ends_the_search_in_one_line_in_process(
    tmp_path, capsys, monkeypatch
):
    """SIGINT as the search reports its backend (outside any trial): `main` answers with
    the signal's line and the shell's status."""

    class Interrupting:
        """stdout that sends SIGINT to this process when the search reports its backend."""

        def __init__(self, stream):
            self.stream = stream

        def write(self, text):
            if text.startswith("trials run on "):
                os.kill(os.getpid(), signal.SIGINT)
            return self.stream.write(text)

        def flush(self):
            self.stream.flush()

    monkeypatch.setattr(sys, "stdout", Interrupting(sys.stdout))
    argv = [*TINY, "--model", "antisymmetric", "--max-trials", "1", "--steps-per-trial", "2"]
    previous = signal.getsignal(signal.SIGINT)
    status = tune.main([*argv, "--directory", str(tmp_path), "--project-name", "p"])
    assert signal.getsignal(signal.SIGINT) is previous  # the handler is put back
    assert status == 128 + signal.SIGINT
    assert capsys.readouterr().err == (
        "python -m training.tune: error: stopped by SIGINT outside a trial; run the same "
        "command to continue the search (its finished trials are kept)\n"
    )
    assert not (tmp_path / "p" / "search.json").exists()  # stopped before it was recorded


def test_a_search_refuses_a_multi_worker_cluster_and_a_batch_the_replicas_cannot_split(
    tmp_path,
):
    """Before any trial: keras-tuner runs each trial on one worker, and a trial's batch must
    split over the backend's replicas."""
    from training.backends.launch_config import LaunchConfig
    from training.backends.strategies import TensorFlowBackend
    from training.search import tuner as search

    cluster = TensorFlowBackend(launch=LaunchConfig(strategy="multi_worker"))
    cluster.distributed = True
    with pytest.raises(UsageError, match="`--strategy`, expected a single-worker strategy"):
        search.run(_search_config(tmp_path), cluster)
    three = TensorFlowBackend()
    three.replicas = 3
    with pytest.raises(UsageError, match="`--batch-size`, expected a multiple of the 3 replicas"):
        search.run(_search_config(tmp_path), three)
    assert not (tmp_path / "p").exists()  # refused before the search was recorded


def test_the_best_summary_names_the_best_completed_trial_and_the_search(tmp_path):
    from types import SimpleNamespace

    from training.search import tuner as search

    config = dataclasses.replace(_search_config(tmp_path), tuner="hyperband", steps_per_trial=7)
    best = _trial("03", "COMPLETED", 0.75, {"val_loss": 0.5},
                  **{"learning_rate": 0.1, "tuner/epochs": 2, "tuner/round": 0})  # fmt: skip
    other = _trial("01", "COMPLETED", 0.5, {"val_loss": 0.9}, learning_rate=0.2)
    failed = _trial("02", "FAILED", None, learning_rate=0.3)
    # Stopped before its end, with a score better than any: not a completed trial.
    stopped = _trial("04", "STOPPED", 0.9, learning_rate=0.4)
    oracle = SimpleNamespace(trials={t.trial_id: t for t in (best, other, failed, stopped)})
    tuner = SimpleNamespace(oracle=oracle, project_dir=config.project_dir)
    rows = search.trial_rows(oracle, "antisymmetric")
    assert search.best_summary(config, tuner, rows) == {
        "objective": "val_accuracy",
        "best_trial_id": "03",
        "score": 0.75,
        "val_loss": 0.5,
        "hyperparameters": {"learning_rate": 0.1},  # keras-tuner's own keys left out
        "task": "digits",
        "model": config.run.model.name,
        "units": 8,
        "tuner": "hyperband",
        "steps_per_trial": 7,
        "validation_fraction": 0.1,
        "trials": 4,
        "completed_trials": 2,
        "space": config.space.to_dict(),
        "project_dir": config.project_dir,
    }
    with pytest.raises(SearchError, match=f"no trial of {config.project_dir} completed"):
        search.best_summary(config, tuner, [r for r in rows if r["trial_id"] in ("02", "04")])


@pytest.mark.parametrize(
    "values, sources, message",
    [
        ({"alpha": [1], "beta": [2]}, {},
         "`--space`, expected keys among epsilon, gamma, learning_rate, sigma_w, optimizer, "
         "got 'alpha'"),
        ({"learning_rate": []}, {},
         "`--learning-rate-values`, expected at least one value, got []"),
        ({"sigma_w": ()}, {"sigma_w": "sigma-w in space.yaml"},
         "`sigma-w in space.yaml`, expected at least one value, got []"),
        ({"optimizer": ["sgd", "rmsprop"]}, {},
         "`--optimizer-values`, expected names among sgd, adagrad, adam, got ['sgd', 'rmsprop']"),
        ({"epsilon": ["0.1", "small"]}, {},
         "`--epsilon-values`, expected positive floats, got ['0.1', 'small']"),
        ({"gamma": [0.1, -0.5]}, {"gamma": "gamma in s.yaml"},
         "`gamma in s.yaml`, expected non-negative floats, got [0.1, -0.5]"),
        ({"learning_rate": [None]}, {},
         "`--learning-rate-values`, expected positive floats, got [None]"),
    ],
)  # fmt: skip
def test_a_space_refuses_bad_values_naming_where_they_came_from(values, sources, message):
    with pytest.raises(UsageError) as refused:
        SearchSpace(values, sources=sources)
    assert str(refused.value) == f"Received an invalid value for argument {message}."


def test_each_hyperparameter_s_flag_is_its_name_dashed():
    assert [flag_name(name) for name in PAPER_GRID] == [
        "--epsilon-values", "--gamma-values", "--learning-rate-values", "--sigma-w-values",
        "--optimizer-values",
    ]  # fmt: skip


def test_a_log_scale_space_declares_ranges_over_its_values_log_uniform_above_zero():
    import keras_tuner

    space = SearchSpace(
        {"epsilon": [1.0, 0.01, 0.1], "gamma": [0.0, 2.0], "learning_rate": [0.5, 0.25, 2.0],
         "sigma_w": [4.0], "optimizer": ["adam", "sgd"]},
        log_scale=True,
    )  # fmt: skip
    hp = keras_tuner.HyperParameters()
    space.declare(hp, "antisymmetric")
    declared = {p.name: p.get_config() for p in hp.space}
    ranges = {
        name: (config["min_value"], config["max_value"], config["sampling"])
        for name, config in declared.items()
        if "min_value" in config
    }
    assert ranges == {
        "epsilon": (0.01, 1.0, "log"),
        "gamma": (0.0, 2.0, "linear"),  # 0 has no logarithm
        "learning_rate": (0.25, 2.0, "log"),
    }
    assert declared["sigma_w"]["value"] == 4.0  # a single value is fixed
    assert declared["optimizer"]["values"] == ["adam", "sgd"]  # names stay a choice
