"""`training.reproduce` and `training.paper.report`: the suite end to end on tiny budgets,
resumption, and the report's numbers against hand-built runs."""

import json
import os
import signal
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from tests.helpers import record_figures
from tests.limits import limit
from training import reproduce
from training.errors import SuiteInterrupted
from training.paper import plots, report, suite
from training.tasks import catalog as tasks

ROOT = Path(__file__).resolve().parents[1]

def test_smoke_suite_runs_end_to_end_and_writes_the_report(tmp_path, capsys):
    runs, docs = tmp_path / "runs", tmp_path / "docs"
    argv = ["--suite", "smoke", "--mock-data", "--runs-dir", str(runs), "--report-dir", str(docs)]
    assert reproduce.main(argv) == 0
    results = json.loads((docs / "reproduction" / "results.json").read_text())
    rows = {row["name"]: row for row in results["runs"]}
    assert set(rows) == {run.name for run in suite.SUITES["smoke"]}
    for run in suite.SUITES["smoke"]:
        row = rows[run.name]
        metrics = json.loads((runs / run.name / "metrics.json").read_text())
        assert row["status"] == "finished" and row["steps"] == run.steps == metrics["steps"]
        assert row["test_accuracy"] == metrics["test_accuracy"]
        assert row["curve"][-1]["step"] == run.steps
        assert row["command"].startswith(
            "python -m training.train --config training/paper/configs/"
        )
    # The Table 1 protocol on mock digits: each seed trained on the training split less
    # its validation digits, chose its weights on them; the row is the seeds' mean.
    seeds = [r for r in results["runs"] if r["row"] == "smoke_permuted_mnist_antisymmetric"]
    assert [r["seed"] for r in seeds] == [0, 1]
    for r in seeds:
        assert (r["train_examples"], r["validation_examples"], r["test_examples"]) == (48, 16, 64)
        assert r["curve_split"] == "validation" and "selected_step" in r
        assert r["permutation_seed"] == tasks.PERMUTATION_SEED
        assert f"--seed {r['seed']} " in r["command"] and "--keep-best" in r["command"]
    (entry,) = results["rows"]
    accuracies = [r["test_accuracy"] for r in seeds]
    assert entry["test_accuracies"] == accuracies
    assert entry["mean"] == pytest.approx(np.mean(accuracies))
    assert entry["sd"] == pytest.approx(np.std(accuracies, ddof=1))
    # The mock CIFAR-10 row ran the noise-padded CIFAR-10 config at its overridden length.
    config = (runs / "smoke_noise_padded_cifar10_gated" / "config.yaml").read_text()
    assert "task: noise_padded_cifar10" in config and "timesteps: 40" in config
    markdown = (docs / "reproduction.md").read_text()
    assert "## smoke (digits)" in markdown and "`smoke_digits_lstm`" in markdown
    pictures = sorted(os.listdir(docs / "reproduction"))
    assert "curves_smoke__digits.png" in pictures
    for name in pictures:
        if name.endswith(".png"):
            image = matplotlib.image.imread(docs / "reproduction" / name)
            assert image.ndim == 3 and image.shape[0] > 100 and image.std() > 0

    # Resumable: finished runs are kept, not redone.
    before = (runs / "smoke_digits_lstm" / "metrics.json").stat().st_mtime_ns
    capsys.readouterr()
    assert reproduce.main(argv) == 0
    assert "smoke_digits_lstm: finished, kept" in capsys.readouterr().out
    assert (runs / "smoke_digits_lstm" / "metrics.json").stat().st_mtime_ns == before


def test_rows_without_data_say_so_with_the_command_to_run(tmp_path):
    docs = tmp_path / "docs"
    argv = ["--report-only", "--runs-dir", str(tmp_path / "none"), "--report-dir", str(docs)]
    assert reproduce.main(argv) == 0
    markdown = (docs / "reproduction.md").read_text()
    assert "| 54.7% | — |" in markdown  # the paper's gated noise-padded CIFAR-10, not ours
    assert "not run (no data)" in markdown
    assert "--config training/paper/configs/noise_padded_cifar10_gated.yaml" in markdown
    assert "noise_padded_cifar10_gated --data-dir DATA_DIR" in markdown


def test_budget_scales_the_steps_of_every_run():
    run = suite.SUITES["paper"][0]
    argv = suite.train_argv(run, 300, "runs", None)
    assert argv[argv.index("--steps") + 1] == "300"
    assert argv[argv.index("--eval-every") + 1] == "15"
    assert ["--dataset", "mnist"] == argv[argv.index("--dataset") : argv.index("--dataset") + 2]


@pytest.mark.parametrize(
    "flag, value, expected, got",
    [
        ("--budget", "0", "a positive float", "0.0"),
        ("--budget", "-1", "a positive float", "-1.0"),
        ("--steps", "0", "a positive integer", "0"),
        ("--parallel", "0", "a positive integer", "0"),
        ("--time-limit", "-5", "a positive number of seconds", "-5.0"),
    ],
)
def test_bad_numbers_are_rejected_with_the_argument_named(capsys, tmp_path, flag, value,
                                                          expected, got):  # fmt: skip
    runs = tmp_path / "runs"
    assert reproduce.main([flag, value, "--runs-dir", str(runs)]) == 2
    assert capsys.readouterr().err == (
        "python -m training.reproduce: error: Received an invalid value for argument "
        f"`{flag}`, expected {expected}, got {got}.\n"
    )
    assert not runs.exists()  # refused before anything ran


def test_reproduce_defaults_and_help(capsys):
    args = reproduce.build_parser().parse_args([])
    assert (args.suite, args.only, args.budget, args.steps, args.parallel) == (
        "paper",
        None,
        1.0,
        None,
        1,
    )
    assert (args.runs_dir, args.time_limit, args.search, args.report_dir) == (
        os.path.join("runs", "reproduce"),
        None,
        False,
        None,
    )
    with pytest.raises(SystemExit):
        reproduce.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert " ".join(reproduce.__doc__.split()[:8]) in text
    for flag, meaning in [
        ("--steps STEPS", "steps of every run"),
        ("--parallel PARALLEL", "runs at once"),
        ("--time-limit TIME_LIMIT", "seconds, then stop"),
        ("--budget BUDGET", "scale of every run's steps"),
    ]:
        assert f"{flag} {meaning}" in text


def _row(name, model, accuracy, seconds, table="t", curve=None, device="gpu"):
    return {
        "name": name, "model": model, "table": table, "test_accuracy": accuracy,
        "device": device, "paper": None,
        "train_seconds": seconds, "status": "finished", "steps": 100,
        "curve": curve or [{"step": 100, "seconds": seconds, "accuracy": accuracy}],
    }  # fmt: skip


def test_accuracy_at_equal_time_reads_the_curve():
    row = _row("a", "gated", 0.9, 30, curve=[
        {"step": 10, "seconds": 10, "accuracy": 0.5},
        {"step": 20, "seconds": 20, "accuracy": 0.7},
        {"step": 30, "seconds": 30, "accuracy": 0.9},
    ])  # fmt: skip
    assert report.accuracy_at(row, 25) == 0.7
    assert report.accuracy_at(row, 20) == 0.7
    assert report.accuracy_at(row, 5) is None


def test_targets_compare_the_best_model_with_the_best_rival():
    rows = [
        _row("g", "gated", 0.84, 100),
        _row("a", "antisymmetric", 0.60, 100),
        _row("l1", "lstm", 0.10, 100),
        _row("l2", "lstm", 0.30, 100),
        _row("x", "gated", 0.99, 100, table="other"),
    ]
    table = report.targets_markdown(rows, [("task", "t", ("antisymmetric", "gated"), 0.80,
                                            "lstm", 0.30)])  # fmt: skip
    line = table.splitlines()[-1]
    assert "84.0% (`g`" in line and "| met |" in line
    assert "+54.0 / +54.0 points (target ≥ +30)" in line  # 0.84 - 0.30, not - 0.10
    missed = report.targets_markdown(rows, [("task", "t", ("antisymmetric",), 0.80, "lstm", 0)])
    assert "missed by 20.0 points" in missed


def test_heatmap_cells_are_the_mean_validation_accuracy(tmp_path):
    trials = [
        {"epsilon": 0.01, "gamma": 0.1, "score": 0.5},
        {"epsilon": 0.01, "gamma": 0.1, "score": 0.7},
        {"epsilon": 0.1, "gamma": 1.0, "score": 0.2},
    ]
    grid = plots.plot_heatmap(trials, "t", str(tmp_path / "h.png"))
    np.testing.assert_allclose(grid, [[0.6, np.nan], [np.nan, 0.2]])
    assert matplotlib.image.imread(tmp_path / "h.png").shape[-1] in (3, 4)


def test_search_csv_keeps_completed_trials(tmp_path):
    path = tmp_path / "trials.csv"
    path.write_text(
        "trial_id,status,score,val_loss,epsilon,gamma,learning_rate\n"
        "1,COMPLETED,0.6,1.0,0.01,1.0,0.002\n"
        "2,RUNNING,,,0.1,1.0,0.002\n"
    )
    assert report.read_search(str(path)) == [
        {"score": 0.6, "epsilon": 0.01, "gamma": 1.0, "learning_rate": 0.002}
    ]


def test_search_csv_keeps_the_optimizer_by_name(tmp_path):
    path = tmp_path / "trials.csv"
    path.write_text(
        "trial_id,status,score,val_loss,epsilon,learning_rate,sigma_w,optimizer\n"
        "1,COMPLETED,0.75,1.0,0.1,0.3,1.0,adagrad\n"
    )
    assert report.read_search(str(path)) == [
        {"score": 0.75, "epsilon": 0.1, "learning_rate": 0.3, "optimizer": "adagrad"}
    ]


def test_length_plot_puts_each_models_accuracy_against_t(tmp_path):
    def row(name, model, timesteps, accuracy):
        return {"name": name, "model": model, "task": "noise_padded_mnist",
                "timesteps": timesteps, "test_accuracy": accuracy}  # fmt: skip

    rows = [
        row("noise_padded_fashion_mnist_gated", "gated", 1000, 0.7),
        row("noise_padded_fashion_mnist_t100_gated", "gated", 100, 0.8),
        row("noise_padded_fashion_mnist_t300_gated", "gated", 300, 0.75),
        row("np_gated_eps0.1_gamma1", "gated", 1000, 0.2),  # a variant, not the main config
        row("noise_padded_fashion_mnist_lstm", "lstm", 1000, 0.1),  # one point: no line
    ]
    lines = plots.plot_length(rows, "noise_padded_mnist", str(tmp_path / "l.png"))
    assert lines == {"gated": [(100, 0.8), (300, 0.75), (1000, 0.7)]}
    assert (tmp_path / "l.png").is_file()


def test_only_takes_exact_names_or_parts_of_names():
    exact = reproduce.select("paper", ["pixel_fashion_mnist_lstm"])
    assert [run.name for run in exact] == ["pixel_fashion_mnist_lstm"]
    part = {run.name for run in reproduce.select("paper", ["pixel_fashion_mnist_lstm_"])}
    assert {"pixel_fashion_mnist_lstm_lr0.002"} == part
    seeds = [run.name for run in reproduce.select("paper", ["pixel_mnist_gated_seed"])]
    assert seeds == [f"pixel_mnist_gated_seed{seed}" for seed in (0, 1, 2)]


def test_equal_time_compares_only_runs_on_the_same_hardware():
    rows = [
        _row("fast", "gated", 0.8, 10, curve=[{"step": 5, "seconds": 5, "accuracy": 0.6},
                                               {"step": 10, "seconds": 10, "accuracy": 0.8}]),
        _row("slow", "lstm", 0.5, 40, curve=[{"step": 5, "seconds": 8, "accuracy": 0.3},
                                              {"step": 10, "seconds": 40, "accuracy": 0.5}]),
        _row("cpu", "antisymmetric", 0.7, 3, device="cpu"),
    ]  # fmt: skip
    assert report.equal_times(rows) == [10, 10, None]
    table = report.table_markdown(rows)
    assert "| 30.0% (10 s) |" in table  # the LSTM at the gated run's 10 s
    assert "`cpu`) | — | 70.0% | — |" in table
    mixed = report.targets_markdown(
        [rows[0], _row("other", "lstm", 0.4, 10, device="cpu")],
        [("task", "t", ("gated",), 0.5, "lstm", 0.0)],
    )
    assert "+40.0 / — (other hardware) points" in mixed


def test_hardware_is_the_machine_whatever_the_backend():
    assert plots.hardware("jax on 1 x NVIDIA H100 (gpu)") == "1 x NVIDIA H100 (gpu)"
    assert plots.hardware("tensorflow on cpu") == "cpu"
    assert plots.hardware(None) is None
    gated = _row("g", "gated", 0.8, 20, device="jax on 1 x H100 (gpu)", curve=[
        {"step": 50, "seconds": 10, "accuracy": 0.6},
        {"step": 100, "seconds": 20, "accuracy": 0.8},
    ])  # fmt: skip
    lstm = _row("l", "lstm", 0.2, 50, device="torch on 1 x H100 (gpu)", curve=[
        {"step": 50, "seconds": 25, "accuracy": 0.1},
        {"step": 100, "seconds": 50, "accuracy": 0.2},
    ])  # fmt: skip
    assert report.equal_times([gated, lstm]) == [20, 20]
    line = report.targets_markdown([gated, lstm], [("task", "t", ("gated",), 0.5, "lstm", 0)])
    assert "+60.0 / +80.0 points" in line  # 0.8 - 0.2 at 100 steps; 0.8 - 0.0 at 20 s


def test_lead_at_equal_steps_reads_the_rival_where_it_stopped():
    gated = _row("g", "gated", 0.81, 100, curve=[
        {"step": 40, "seconds": 40, "accuracy": 0.55},
        {"step": 80, "seconds": 80, "accuracy": 0.70},
        {"step": 100, "seconds": 100, "accuracy": 0.81},
    ])  # fmt: skip
    lstm = dict(_row("l", "lstm", 0.10, 90, curve=[
        {"step": 45, "seconds": 45, "accuracy": 0.12},
        {"step": 90, "seconds": 90, "accuracy": 0.10},
    ]), status="partial", steps=90)  # fmt: skip
    assert report.accuracy_at_step(gated, 100) == 0.81
    assert report.accuracy_at_step(gated, 90) == 0.70
    assert report.accuracy_at_step(lstm, 44) is None
    line = report.targets_markdown([gated, lstm], [("task", "t", ("gated",), 0.5, "lstm", 0)])
    assert "+60.0 (step 90) / " in line  # 0.70 - 0.10 at the LSTM's last step
    # A shorter rival run counts only up to its own steps: at 100 steps only `l` ran them.
    short = dict(_row("s", "lstm", 0.4, 40), steps=40, curve=[
        {"step": 40, "seconds": 40, "accuracy": 0.4},
    ])  # fmt: skip
    longer = dict(lstm, steps=100, test_accuracy=0.2, train_seconds=100, curve=[
        *lstm["curve"], {"step": 100, "seconds": 100, "accuracy": 0.2},
    ])  # fmt: skip
    rule = [("task", "t", ("gated",), 0.5, "lstm", 0)]
    line = report.targets_markdown([gated, short, longer], rule)
    assert "+61.0 / +41.0 points" in line  # 0.81 - 0.20 at 100 steps; at 100 s: 0.81 - 0.40


def test_a_run_on_several_machines_keeps_a_row_per_machine():
    def row(name, device, accuracy, curve=True):
        points = [{"step": 10, "seconds": 1, "accuracy": accuracy}] if curve else []
        return {"name": name, "device": device, "test_accuracy": accuracy, "curve": points}

    previous = [row("a", "jax on 1 x H100 (gpu)", 0.8), row("a", "tensorflow on cpu", 0.5),
                row("b", "tensorflow on cpu", 0.3), row("c", "torch on cpu", 0.2)]  # fmt: skip
    fresh = [row("a", "jax on cpu", 0.6), row("b", None, None, curve=False),
             row("c", "jax on cpu", 0.4), row("d", None, None, curve=False)]  # fmt: skip
    merged = [(r["name"], r["device"], r["test_accuracy"]) for r in report.merge(fresh, previous)]
    assert merged == [
        ("a", "jax on cpu", 0.6),  # replaces the CPU row, keeps the GPU row
        ("a", "jax on 1 x H100 (gpu)", 0.8),
        ("b", "tensorflow on cpu", 0.3),  # not in this runs folder: kept
        ("c", "jax on cpu", 0.4),  # the same machine: replaced
        ("d", None, None),  # never run anywhere: its own row
    ]


def test_a_row_kept_from_an_earlier_report_takes_the_suites_table_row_and_paper_number():
    """A record made before the suite held its run to the paper's number (or moved it to
    another table or seed row) is counted as the suite has it now; what it measured stays."""
    earlier = {"name": "a_seed0", "device": "tensorflow on cpu", "test_accuracy": 0.972,
               "curve": [{"step": 50, "seconds": 7.0, "accuracy": 0.971}],
               "table": "old table", "row": None, "paper": None, "status": "finished"}
    fresh = {"name": "a_seed0", "device": None, "curve": [], "table": "pixel_mnist (mnist)",
             "row": "a", "paper": 98.0, "status": "not run"}  # fmt: skip
    (kept,) = report.merge([fresh], [earlier])
    assert kept == {**earlier, "table": "pixel_mnist (mnist)", "row": "a", "paper": 98.0}
    (entry,) = report.seed_rows([{**kept, "seed": 0, "model": "antisymmetric", "steps": 50,
                                  "train_seconds": 7.0}])  # fmt: skip
    assert (entry["row"], entry["paper"], entry["test_accuracies"]) == ("a", 98.0, [0.972])


def test_each_search_varies_its_own_models_hyperparameters_only():
    from training import tune
    from training.search import space

    by_task = {}
    for each in suite.SEARCHES:
        args = tune.build_parser().parse_args(list(each.argv))
        by_task.setdefault((args.task, args.dataset, args.timesteps), []).append(each.model)
        assert args.model == each.model
        assert args.steps_per_trial == (1500 if args.dataset == "mnist" else 400)
        assert args.validation_fraction == 0.1 and args.tuner == "grid"
        values = tune.make_space(args).values
        varied = {name for name in space.MODEL_HYPERPARAMETERS[each.model]
                  if len(values[name]) > 1}  # fmt: skip
        assert varied <= set(each.grid), each.name  # what it varies, its report shows
        if args.dataset == "fashion_mnist" or "optimizer" not in each.name:
            assert varied == set(each.grid), each.name
        trials = int(np.prod([len(values[name]) for name in each.grid]))
        assert args.max_trials == trials, each.name  # the whole grid, nothing more
    # Each task's configs: one search per model, none shared between models; on the
    # real MNIST also the ungated pixel config's optimizer against the paper's.
    assert by_task == {
        ("noise_padded_mnist", "fashion_mnist", 1000): ["gated", "antisymmetric", "ablation",
                                                        "lstm"],
        ("pixel_mnist", "fashion_mnist", None): ["gated", "antisymmetric", "lstm"],
        ("permuted_mnist", "fashion_mnist", None): ["gated", "antisymmetric", "lstm"],
        ("pixel_mnist", "mnist", None): ["antisymmetric", "antisymmetric", "gated",
                                         "antisymmetric", "lstm"],
        ("permuted_mnist", "mnist", None): ["gated", "antisymmetric", "lstm"],
    }  # fmt: skip


@pytest.mark.parametrize("task", ["pixel_mnist", "permuted_mnist"])
@pytest.mark.parametrize("model", ["antisymmetric", "gated", "lstm"])
def test_the_mnist_searches_train_each_table_1_config_but_for_its_grid(task, model):
    """Each Table 1 config's own grid on MNIST's validation split: the config's settings
    fixed, its searched values among the grid's, so the search can confirm the config or
    show what beats it."""
    import yaml

    from training import tune

    config = yaml.safe_load(open(os.path.join(suite.CONFIGS, f"{task}_{model}.yaml")))
    (each,) = suite.select_searches([f"search_mnist_{task.split('_')[0]}_{model}"])
    args = tune.build_parser().parse_args(list(each.argv))
    values = tune.make_space(args).values
    assert (args.dataset, args.validation_fraction, args.steps_per_trial) == ("mnist", 0.1, 1500)
    for name in ("task", "model", "units", "batch_size", "clipnorm", "lr_schedule",
                 "warmup_steps", "lr_floor"):  # fmt: skip
        assert getattr(args, name) == config[name], name
    assert values["optimizer"] == (config["optimizer"],)
    assert values["sigma_w"] == (config["sigma_w"],)
    grid = {name: values[name] for name in each.grid}
    if model == "lstm":
        assert each.grid == ("learning_rate",) and len(grid["learning_rate"]) == 3
    else:
        assert each.grid == ("epsilon", "gamma")
        assert values["learning_rate"] == (config["learning_rate"],)
        # The choices the suite's rows run with (the config's, or MNIST's own).
        choices = dict(suite.MNIST_CHOICES.get((task, model), ()))
        assert choices.get("gamma", config["gamma"]) in grid["gamma"]
    for name, searched in grid.items():
        assert config[name] in searched, name


def test_the_optimizer_searches_train_the_pixel_config_but_for_its_optimizer():
    import yaml

    from training import tune
    from training.search import space

    config = yaml.safe_load(open(os.path.join(suite.CONFIGS, "pixel_mnist_antisymmetric.yaml")))
    searches = suite.select_searches(["search_mnist_pixel_optimizer"])
    assert len(searches) == 2
    grids = {}
    for each in searches:
        assert each.grid == ("optimizer", "learning_rate")
        args = tune.build_parser().parse_args(list(each.argv))
        values = tune.make_space(args).values
        for name in ("epsilon", "gamma", "sigma_w"):
            assert values[name] == (config[name],), (each.name, name)
        for name in ("task", "model", "units", "batch_size", "clipnorm", "lr_schedule",
                     "warmup_steps", "lr_floor"):  # fmt: skip
            assert getattr(args, name) == config[name], (each.name, name)
        assert args.lr_decay_steps is None  # the cosine decays over each trial
        grids[each.name] = (values["optimizer"], values["learning_rate"])
    # The paper's optimizers over the ends and the middle of its learning rates ...
    paper = grids["search_mnist_pixel_optimizer_antisymmetric"]
    assert set(paper[0]) == set(space.PAPER_GRID["optimizer"])
    assert set(paper[1]) <= set(space.PAPER_GRID["learning_rate"])
    assert min(paper[1]) == 0.1 and max(paper[1]) == 1.0
    # ... and the config's own optimizer as the anchor.
    anchor = grids["search_mnist_pixel_optimizer_antisymmetric_adam"]
    assert anchor == ((config["optimizer"],), (config["learning_rate"],))


def test_a_search_table_has_a_column_per_hyperparameter_it_shows(tmp_path):
    csv = tmp_path / "trials.csv"
    csv.write_text("trial_id,status,score,learning_rate,optimizer\n"
                   "1,COMPLETED,0.5,1.0,sgd\n2,COMPLETED,0.25,0.1,sgd\n"
                   "3,COMPLETED,0.875,0.3,adagrad\n4,RUNNING,,0.1,adagrad\n")  # fmt: skip
    (search,) = suite.select_searches(["search_mnist_pixel_optimizer_antisymmetric"])
    path = report.write([], str(tmp_path / "runs"), str(tmp_path / "docs"),
                        searches={search: str(csv)})  # fmt: skip
    markdown = open(path).read()
    section = markdown[markdown.index("## Search: AntisymmetricRNN (pixel MNIST") :]
    assert (
        "| optimizer | learning rate | validation accuracy |\n| --- | --- | --- |\n"
        "| adagrad | 0.3 | 87.5% |\n| sgd | 0.1 | 25.0% |\n| sgd | 1 | 50.0% |\n"
    ) in section
    assert "after 1500 steps (3 trials," in section
    (anchor,) = suite.select_searches(["search_mnist_pixel_optimizer_antisymmetric_adam"])
    csv.write_text("trial_id,status,score,learning_rate,optimizer\n1,COMPLETED,0.5,0.002,adam\n")
    path = report.write([], str(tmp_path / "runs"), str(tmp_path / "docs"),
                        searches={anchor: str(csv)})  # fmt: skip
    assert "after 1500 steps (1 trial, `python" in open(path).read()


def test_search_runs_the_searches_only_names(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(reproduce.tune, "main", lambda argv: calls.append(argv) or 0)
    argv = ["--only", "search_noise_padded_antisymmetric", "--search", "--runs-dir",
            str(tmp_path), "--report-dir", str(tmp_path / "docs"), "--data-dir", "d"]  # fmt: skip
    assert reproduce.main(argv) == 0
    assert len(calls) == 1 and not (tmp_path / "noise_padded_fashion_mnist_antisymmetric").exists()
    (call,) = calls
    assert call[call.index("--model") + 1] == "antisymmetric"
    assert call[call.index("--project-name") + 1] == "search_noise_padded_antisymmetric"
    assert call[call.index("--directory") + 1] == os.path.join(str(tmp_path), "search")
    assert call[-2:] == ["--data-dir", "d"]
    assert [s.name for s in suite.select_searches(["lstm"])] == [
        "search_noise_padded_lstm", "search_pixel_lstm", "search_permuted_lstm",
        "search_mnist_pixel_lstm", "search_mnist_permuted_lstm"]  # fmt: skip
    assert len(suite.select_searches(None)) == len(suite.SEARCHES)


def test_report_has_a_section_per_search_and_reads_an_older_single_search(tmp_path):
    docs = tmp_path / "docs"
    (docs / "reproduction").mkdir(parents=True)
    old = [{"score": 0.6, "epsilon": 0.01, "gamma": 1.0}]
    (docs / "reproduction" / "results.json").write_text(json.dumps({"runs": [], "search": old}))
    csv = tmp_path / "lstm.csv"
    csv.write_text("trial_id,status,score,learning_rate\n1,COMPLETED,0.25,0.005\n"
                   "2,COMPLETED,0.125,0.0005\n")  # fmt: skip
    searches = {each: str(tmp_path / "missing.csv") for each in suite.SEARCHES}
    searches[suite.select_searches(["search_noise_padded_lstm"])[0]] = str(csv)
    path = report.write([], str(tmp_path / "runs"), str(docs), searches=searches)
    markdown = open(path).read()
    assert "## Search: AntisymmetricRNN w/ gating" in markdown  # kept from the older report
    assert "heatmap_search_noise_padded_gated.png" in markdown
    assert "## Search: AntisymmetricRNN (noise" not in markdown  # no trials: no section
    assert "## Search: LSTM (noise-padded Fashion-MNIST, T=1000)" in markdown
    lstm = markdown[markdown.index("## Search: LSTM") :]
    assert lstm.index("| 0.0005 | 12.5% |") < lstm.index("| 0.005 | 25.0% |")
    search = suite.select_searches(["search_noise_padded_lstm"])[0]
    steps = search.argv[search.argv.index("--steps-per-trial") + 1]
    assert (
        f"{search.title}, LSTM: validation accuracy after {steps} steps (2 trials, "
        "`python -m training.reproduce --search --only search_noise_padded_lstm`)."
    ) in lstm
    assert "| learning rate | validation accuracy |\n| --- | --- |\n| 0.0005 |" in lstm
    results = json.loads((docs / "reproduction" / "results.json").read_text())["search"]
    assert results["search_noise_padded_gated"] == old
    assert results["search_noise_padded_lstm"][0] == {"score": 0.25, "learning_rate": 0.005}
    assert results["search_noise_padded_antisymmetric"] == []


def test_curves_are_labelled_with_the_split_they_were_evaluated_on():
    assert plots.curve_label([{"curve_split": "test"}, {}]) == "test accuracy"
    assert plots.curve_label([{"curve_split": "validation"}]) == "validation accuracy"
    mixed = plots.curve_label([{"curve_split": "validation"}, {"curve_split": "test"}])
    assert mixed == "accuracy (test or validation: see the table)"


def test_the_accuracy_at_a_run_s_last_step_is_its_test_accuracy_not_its_curve():
    row = _row("g", "gated", 0.83, 100, curve=[
        {"step": 50, "seconds": 50, "accuracy": 0.6},
        {"step": 100, "seconds": 100, "accuracy": 0.81},  # validation, not test
    ])  # fmt: skip
    assert report.accuracy_at_step(row, 100) == 0.83
    assert report.accuracy_at_step(row, 99) == 0.6
    assert report.accuracy_at_step(dict(row, test_accuracy=None), 100) == 0.81


def test_a_best_run_without_a_point_by_the_rival_s_time_leads_from_zero():
    best = _row("g", "gated", 0.9, 100, curve=[
        {"step": 100, "seconds": 100, "accuracy": 0.9},
    ])  # fmt: skip
    rival = _row("l", "lstm", 0.2, 30, curve=[{"step": 100, "seconds": 30, "accuracy": 0.2}])
    line = report.targets_markdown([best, rival], [("task", "t", ("gated",), 0.5, "lstm", 0)])
    assert line.splitlines()[-1].endswith("| +70.0 / -20.0 points |")  # at 30 s: 0 - 0.2


def test_heatmap_axes_name_the_parameters_on_a_fixed_scale(tmp_path, monkeypatch):
    made = record_figures(monkeypatch, plots)
    trials = [{"epsilon": 0.01, "gamma": 0.1, "score": 0.25}]
    plots.plot_heatmap(trials, "the title", str(tmp_path / "h.png"))
    axis = made[0].axes[0]  # then the colorbar's
    assert (axis.get_xlabel(), axis.get_ylabel()) == ("γ (diffusion)", "ε (step size)")
    assert axis.get_title() == "the title"
    (image,) = axis.images
    assert image.get_cmap().name == "viridis" and image.get_clim() == (0, 1)
    assert [text.get_text() for text in axis.texts] == ["0.25"]
    assert [t.get_text() for t in axis.get_xticklabels()] == ["0.1"]
    assert [t.get_text() for t in axis.get_yticklabels()] == ["0.01"]


def _smoke_run(model):
    return next(r for r in suite.SUITES["smoke"] if r.name == f"smoke_digits_{model}")


def test_a_run_cut_short_reports_its_curve_s_last_point(tmp_path):
    run = _smoke_run("lstm")
    folder = tmp_path / run.name
    folder.mkdir()
    points = [{"step": 10, "train_seconds": 5.0, "test_accuracy": 0.3},
              {"step": 20, "train_seconds": 9.0, "test_accuracy": 0.4}]  # fmt: skip
    (folder / "curve.json").write_text(json.dumps({"points": points}))
    row = report.collect(run, str(tmp_path), None)
    assert (row["status"], row["test_accuracy"], row["steps"], row["train_seconds"]) == (
        "partial",
        0.4,
        20,
        9.0,
    )
    assert row["curve"] == [{"step": 10, "seconds": 5.0, "accuracy": 0.3},
                            {"step": 20, "seconds": 9.0, "accuracy": 0.4}]  # fmt: skip
    validation = [{**p, "validation_accuracy": p.pop("test_accuracy")} for p in points]
    (folder / "curve.json").write_text(json.dumps({"points": validation, "split": "validation"}))
    row = report.collect(run, str(tmp_path), None)  # validation is no test accuracy
    assert (row["status"], row["test_accuracy"], row["curve_split"]) == (
        "partial",
        None,
        "validation",
    )
    assert [p["accuracy"] for p in row["curve"]] == [0.3, 0.4]


def test_a_digits_run_needs_no_data_and_is_just_not_run(tmp_path):
    row = report.collect(_smoke_run("antisymmetric"), str(tmp_path), str(tmp_path / "no-data"))
    assert row["status"] == "not run"


def test_a_runs_folder_is_named_relatively_or_not_at_all(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert report.portable_dir(str(tmp_path / "runs" / "a")) == os.path.join("runs", "a")
    assert report.portable_dir(str(tmp_path.parent)) == "RUNS_DIR"


def test_curves_plot_accuracy_against_steps_and_against_seconds(tmp_path, monkeypatch):
    made = record_figures(monkeypatch, plots)
    row = _row("a", "gated", 0.5, 30, curve=[
        {"step": 10, "seconds": 3, "accuracy": 0.2}, {"step": 20, "seconds": 7, "accuracy": 0.5},
    ])  # fmt: skip
    assert plots.plot_curves("title", [row], str(tmp_path / "c.png"))
    by_steps, by_seconds = made[0].axes
    np.testing.assert_array_equal(by_steps.lines[0].get_xydata(), [[10, 0.2], [20, 0.5]])
    np.testing.assert_array_equal(by_seconds.lines[0].get_xydata(), [[3, 0.2], [7, 0.5]])
    assert (by_steps.get_xlabel(), by_seconds.get_xlabel()) == (
        "training steps",
        "training seconds",
    )
    assert by_steps.get_ylim() == (0, 1) and by_seconds.get_ylabel() == "test accuracy"


def test_each_table_s_curves_are_titled_with_the_table(tmp_path, monkeypatch):
    titles = []
    monkeypatch.setattr(report, "plot_curves", lambda title, rows, path: titles.append(title))
    runs = suite.SUITES["smoke"]
    report.write(runs, str(tmp_path / "runs"), str(tmp_path / "docs"))
    assert titles == list(dict.fromkeys(run.table for run in runs))


def _scheduled(monkeypatch, seconds):
    """`execute`'s training processes replaced by children that print their argv and sleep."""
    import subprocess
    import sys

    started = []
    real_popen = subprocess.Popen

    def popen(command, **kwargs):
        assert command[:3] == [sys.executable, "-m", "training.train"]
        started.append(command[3:])
        code = f"import sys, time; print('argv', sys.argv[1:], flush=True); time.sleep({seconds})"
        return real_popen([sys.executable, "-c", code, *command[3:]], **kwargs)

    monkeypatch.setattr(reproduce.subprocess, "Popen", popen)
    return started


def _digit_runs(count):
    """`count` digits runs of the smoke suite (named apart): they need no data set."""
    import dataclasses

    (run, *_) = [run for run in suite.SUITES["smoke"] if run.data == "digits"]
    return [dataclasses.replace(run, name=f"{run.name}_{index}") for index in range(count)]


def _args(tmp_path, **overrides):
    argv = ["--suite", "smoke", "--runs-dir", str(tmp_path / "runs"), "--steps", "7"]
    args = reproduce.build_parser().parse_args(argv)
    for name, value in overrides.items():
        setattr(args, name, value)
    return args


def test_runs_go_at_most_parallel_at_once_each_with_its_log(tmp_path, monkeypatch):
    started = _scheduled(monkeypatch, 0.2)
    runs = _digit_runs(3)
    lines = []
    reproduce.execute(runs, _args(tmp_path, parallel=2), log=lines.append)
    commands = [line for line in lines if ": python -m training.train " in line]
    exits = [line for line in lines if line.endswith(": exit 0")]
    assert [line.split(":")[0] for line in commands] == [run.name for run in runs]
    assert sorted(line.split(":")[0] for line in exits) == sorted(run.name for run in runs)
    # Two started at once; the third only after one of them had ended.
    assert lines.index(commands[1]) < lines.index(exits[0]) < lines.index(commands[2])
    for run, argv in zip(runs, started, strict=True):
        assert argv == suite.train_argv(run, 7, str(tmp_path / "runs"), None)
        log = (tmp_path / "runs" / f"{run.name}.log").read_text()
        assert log == f"argv {argv!r}\n"  # the run's output, appended to its own log


def test_one_run_at_a_time_by_default(tmp_path, monkeypatch):
    _scheduled(monkeypatch, 0.0)
    runs = _digit_runs(2)
    args = _args(tmp_path)
    assert args.parallel == 1 and args.time_limit is None and args.steps == 7
    lines = []
    reproduce.execute(runs, args, log=lines.append)
    assert [line.split(": ", 1)[1].split()[0] for line in lines] == [
        "python", "exit", "python", "exit"
    ]  # fmt: skip


def test_the_time_limit_stops_the_runs_in_progress(tmp_path, monkeypatch):
    import time

    _scheduled(monkeypatch, 60)
    runs = _digit_runs(3)
    lines = []
    begun = time.monotonic()
    reproduce.execute(runs, _args(tmp_path, parallel=2, time_limit=0.5), log=lines.append)
    assert time.monotonic() - begun < 10
    stopped = [line for line in lines if line.endswith(": stopped at --time-limit (exit 143)")]
    assert [line.split(":")[0] for line in stopped] == [run.name for run in runs[:2]]
    assert not any(runs[2].name in line for line in lines)  # never started


# A stand-in run that saves its work on SIGTERM and SIGINT as `training.train` does: it
# writes which signal stopped it (and whether it leads a session of its own), then exits
# 128 + the number.
_CHECKPOINTS_ON_STOP = """
import os, signal, sys, time
folder = sys.argv[sys.argv.index("--output-dir") + 1]
os.makedirs(folder, exist_ok=True)
def stop(number, frame):
    with open(os.path.join(folder, "stopped"), "w") as handle:
        handle.write(f"{signal.Signals(number).name} {os.getsid(0) == os.getpid()}")
    sys.exit(128 + number)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
print("up", flush=True)
time.sleep(60)
"""


def _checkpointing(monkeypatch):
    """`execute`'s training processes replaced by `_CHECKPOINTS_ON_STOP` children."""
    import subprocess
    import sys

    real_popen = subprocess.Popen

    def popen(command, **kwargs):
        return real_popen([sys.executable, "-c", _CHECKPOINTS_ON_STOP, *command[3:]], **kwargs)

    monkeypatch.setattr(reproduce.subprocess, "Popen", popen)


def _when_up(tmp_path, runs, then):
    """Calls `then()` in a thread once every run's log says it is up (bounded wait)."""
    import threading
    import time

    def wait():
        deadline = time.monotonic() + limit(30)
        logs = [tmp_path / "runs" / f"{run.name}.log" for run in runs]
        while time.monotonic() < deadline:
            if all(log.exists() and "up" in log.read_text() for log in logs):
                break
            time.sleep(0.05)
        then()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def _stopped(tmp_path, run):
    return (tmp_path / "runs" / run.name / "stopped").read_text()


def test_the_time_limit_lets_each_run_checkpoint_before_it_ends(tmp_path, monkeypatch):
    """SIGTERM, which makes `training.train` save the step in progress, not SIGKILL."""
    _checkpointing(monkeypatch)
    runs = _digit_runs(2)
    lines = []
    reproduce.execute(runs, _args(tmp_path, parallel=2, time_limit=limit(3)), log=lines.append)
    assert [_stopped(tmp_path, run) for run in runs] == ["SIGTERM True"] * 2
    assert sorted(line for line in lines if "stopped" in line) == [
        f"{run.name}: stopped at --time-limit (exit 143)" for run in runs
    ]


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_stops_every_run_with_a_checkpoint_and_the_suite(
    tmp_path, monkeypatch, number
):
    """The runs lead sessions of their own (a terminal's Ctrl-C reaches only the suite),
    and the suite passes the signal on once: each run checkpoints, no next run starts."""
    _checkpointing(monkeypatch)
    runs = _digit_runs(3)
    lines = []
    before = signal.getsignal(number)
    _when_up(tmp_path, runs[:2], lambda: os.kill(os.getpid(), number))
    with pytest.raises(SuiteInterrupted) as raised:
        reproduce.execute(runs, _args(tmp_path, parallel=2), log=lines.append)
    assert raised.value.signal_number == number
    name = signal.Signals(number).name
    assert [_stopped(tmp_path, run) for run in runs[:2]] == [f"{name} True"] * 2
    assert sorted(line for line in lines if "stopped" in line) == [
        f"{run.name}: stopped by {name} (exit {128 + number})" for run in runs[:2]
    ]
    assert not any(runs[2].name in line for line in lines)  # never started
    assert signal.getsignal(number) is before  # the handlers are handed back


def test_the_command_stopped_says_so_in_one_line_and_writes_no_report(
    tmp_path, monkeypatch, capsys
):
    _checkpointing(monkeypatch)
    monkeypatch.setattr(reproduce, "select", lambda suite, only: _digit_runs(1))
    _when_up(tmp_path, _digit_runs(1), lambda: os.kill(os.getpid(), signal.SIGTERM))
    argv = ["--suite", "smoke", "--runs-dir", str(tmp_path / "runs"), "--steps", "7",
            "--report-dir", str(tmp_path / "docs")]  # fmt: skip
    assert reproduce.main(argv) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == (
        "python -m training.reproduce: error: stopped by SIGTERM; the runs in progress "
        "checkpointed their step: run the same command to resume\n"
    )
    assert not (tmp_path / "docs").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_runs_of_a_suite_killed_outright_stop_with_a_checkpoint(tmp_path):
    """SIGKILL to the suite (an out-of-memory kill, a scheduler's kill) SIGTERMs its runs:
    none keeps training, unseen, in a folder the next call of the suite needs."""
    import subprocess
    import time

    driver = f"""
import sys
from tests import test_reproduce as t
from training import reproduce
class Patch:
    def setattr(self, owner, name, value):
        setattr(owner, name, value)
t._checkpointing(Patch())
runs = t._digit_runs(2)
reproduce.execute(runs, t._args(__import__("pathlib").Path({str(tmp_path)!r}), parallel=2))
"""
    suite_process = subprocess.Popen(
        [sys.executable, "-c", driver], cwd=ROOT, start_new_session=True
    )
    try:
        logs = [tmp_path / "runs" / f"{run.name}.log" for run in _digit_runs(2)]
        deadline = time.monotonic() + limit(60)
        while not all(log.exists() and "up" in log.read_text() for log in logs):
            assert time.monotonic() < deadline and suite_process.poll() is None
            time.sleep(0.05)
        suite_process.kill()
        suite_process.wait(timeout=limit(10))
        deadline = time.monotonic() + limit(10)
        marks = [tmp_path / "runs" / run.name / "stopped" for run in _digit_runs(2)]
        while not all(mark.exists() for mark in marks) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [mark.read_text() for mark in marks] == ["SIGTERM True"] * 2
    finally:
        if suite_process.poll() is None:
            os.killpg(suite_process.pid, signal.SIGKILL)
        suite_process.wait(timeout=limit(10))


def test_a_failed_search_does_not_keep_the_next_from_running(tmp_path, monkeypatch, capsys):
    statuses = iter([2, 0])
    calls = []
    monkeypatch.setattr(
        reproduce.tune, "main", lambda argv: calls.append(argv) or next(statuses)
    )
    argv = ["--only", "search_pixel_lstm", "search_permuted_lstm", "--search", "--runs-dir",
            str(tmp_path), "--report-dir", str(tmp_path / "docs")]  # fmt: skip
    assert reproduce.main(argv) == 2  # the first failure's status, after both ran
    assert len(calls) == 2
    assert "search search_pixel_lstm: exit 2\n" in capsys.readouterr().out


def test_a_search_stopped_by_a_signal_stops_the_suite(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(reproduce.tune, "main", lambda argv: calls.append(argv) or 130)
    argv = ["--only", "search_pixel_lstm", "search_permuted_lstm", "--search", "--runs-dir",
            str(tmp_path), "--report-dir", str(tmp_path / "docs")]  # fmt: skip
    assert reproduce.main(argv) == 130
    assert len(calls) == 1  # the second search is not started
    assert "error: stopped by SIGINT;" in capsys.readouterr().err


def test_data_is_available_as_a_tfds_folder_or_an_npz(tmp_path):
    (run,) = [r for r in suite.SUITES["paper"] if r.data == "fashion_mnist"][:1]
    assert not suite.data_available(run, None) and not suite.data_available(run, str(tmp_path))
    (tmp_path / "fashion_mnist.npz").write_bytes(b"")
    assert suite.data_available(run, str(tmp_path))
    other = tmp_path / "other"
    (other / "fashion_mnist").mkdir(parents=True)  # a prepared TFDS data set
    assert suite.data_available(run, str(other))
    (digits,) = [r for r in suite.SUITES["smoke"] if r.data == "digits"][:1]
    assert suite.data_available(digits, None)  # bundled with scikit-learn


def test_the_report_reads_searches_from_the_runs_folder_and_goes_under_it(tmp_path, capsys):
    """`--report-only`: searches read from RUNS/search/NAME/trials.csv; report in RUNS/report."""
    runs = tmp_path / "runs"
    search = suite.select_searches(["search_noise_padded_lstm"])[0]
    trials = runs / "search" / search.name / "trials.csv"
    trials.parent.mkdir(parents=True)
    trials.write_text("trial_id,status,score,learning_rate\n1,COMPLETED,0.25,0.005\n")
    assert reproduce.main(["--report-only", "--runs-dir", str(runs)]) == 0
    path = runs / "report" / "reproduction.md"
    assert capsys.readouterr().out == f"report -> {path}\n"
    assert "| 0.005 | 25.0% |" in path.read_text()


def test_the_paper_rows_carry_table_1_s_accuracies_on_mnist_only():
    """Chang et al., Table 1: pixel-by-pixel and permuted MNIST test accuracy (%). On the
    real MNIST each antisymmetric row is three seeds, the LSTM one; every seed selects its
    weights on a validation split of the training digits and reads the test split once."""
    table_1 = {
        ("pixel_mnist", "antisymmetric"): 98.0, ("pixel_mnist", "gated"): 98.8,
        ("pixel_mnist", "lstm"): 97.3, ("permuted_mnist", "antisymmetric"): 95.8,
        ("permuted_mnist", "gated"): 93.1, ("permuted_mnist", "lstm"): 92.6,
    }  # fmt: skip
    assert {(t, m): a for t, by in suite.TABLE_1.items() for m, a in by.items()} == table_1
    rows = {run.name: run for run in suite.SUITES["paper"]}
    for (task, model), accuracy in table_1.items():
        seeds = (0,) if model == "lstm" else (0, 1, 2)
        members = [run for run in rows.values() if run.row == f"{task}_{model}"]
        assert [run.name for run in members] == [f"{task}_{model}_seed{s}" for s in seeds]
        for seed, mnist in zip(seeds, members, strict=True):
            assert (mnist.paper, mnist.data, mnist.steps) == (accuracy, "mnist", 10000)
            assert mnist.table == f"{task} (mnist)"
            chosen = dict(suite.MNIST_CHOICES.get((task, model), ()))
            assert dict(mnist.overrides) == {"dataset": "mnist", "seed": seed,
                                             "validation_fraction": 0.1, "keep_best": True,
                                             **chosen}  # fmt: skip
            argv = suite.train_argv(mnist, 10000, "runs", "data")
            assert "--keep-best" in argv and argv[argv.index("--seed") + 1] == str(seed)
        fashion = rows[f"{task.replace('mnist', 'fashion_mnist')}_{model}"]
        assert fashion.paper is None and fashion.data == "fashion_mnist" and fashion.row is None
        # Fashion-MNIST's pixel rows were still climbing at 6,000 steps.
        assert fashion.steps == (10000 if task == "pixel_mnist" else 6000)
    # The former 5,000-digit subset's rows are gone with the subset.
    assert not [name for name in rows if name.startswith(("pixel_mnist", "permuted_mnist"))
                and "_seed" not in name]  # fmt: skip
    targets = ("pixel_mnist_antisymmetric", "pixel_mnist_gated",
               "permuted_mnist_antisymmetric", "permuted_mnist_gated")  # fmt: skip
    assert suite.SEED_TARGETS == (*targets, *(f"{t}_steps50000" for t in targets))
    # The paper's budget, 50,000 iterations: every row again, with the same seeds, choices
    # and protocol, held to the paper's number.
    for (task, model), accuracy in table_1.items():
        seeds = (0,) if model == "lstm" else (0, 1, 2)
        short = [rows[f"{task}_{model}_seed{s}"] for s in seeds]
        long = [rows[f"{task}_{model}_steps50000_seed{s}"] for s in seeds]
        assert {(r.steps, r.paper, r.row, r.table) for r in long} == {
            (50000, accuracy, f"{task}_{model}_steps50000", f"{task} (mnist)")}  # fmt: skip
        assert [(r.config, r.overrides) for r in long] == [(r.config, r.overrides) for r in short]
    assert len([name for name in rows if "_steps50000_" in name]) == 14


def _seed(row, seed, accuracy, status="finished", seconds=100.0):
    return {**_row(f"{row}_seed{seed}", "antisymmetric", accuracy, seconds, device="cpu"),
            "row": row, "seed": seed, "status": status, "paper": 98.0}  # fmt: skip


def test_a_row_of_seeds_is_their_mean_and_sample_sd_not_the_best_seed():
    rows = [_seed("r", 0, 0.98, seconds=90.0), _seed("r", 1, 0.97, seconds=110.0),
            _seed("r", 2, 0.99), _row("alone", "lstm", 0.5, 10)]  # fmt: skip
    (entry,) = report.seed_rows(rows)
    # Hand-computed: mean (0.98 + 0.97 + 0.99) / 3 = 0.98; sample sd √((0 + 1e-4 + 1e-4)/2).
    assert entry["row"] == "r" and entry["seeds"] == [0, 1, 2]
    assert entry["mean"] == pytest.approx(0.98) and entry["sd"] == pytest.approx(0.01)
    assert entry["train_seconds_mean"] == pytest.approx(100.0)
    table = report.seed_rows_markdown([entry])
    assert "| 98.0% | 98.00 ± 1.00% | 3 of 3 | 98.00, 97.00, 99.00 | 100 | 100 | cpu |" in table
    assert report.seed_targets_markdown([entry], ("r",)).endswith(
        "| `r` | 98.0% | 98.00 ± 1.00% | 3 of 3 | met |"
    )
    # One seed below: the mean misses, however good the best seed is.
    (low,) = report.seed_rows([_seed("r", 0, 0.99), _seed("r", 1, 0.96), _seed("r", 2, 0.97)])
    assert report.seed_targets_markdown([low], ("r",)).endswith("| missed by 0.67 points |")
    # A seed not finished: reported as still to run, its partial curve left out of the mean.
    (part,) = report.seed_rows([_seed("r", 0, 0.99), _seed("r", 1, 0.5, status="partial")])
    assert (part["seeds"], part["planned_seeds"], part["sd"]) == ([0], [0, 1], None)
    assert report.seed_targets_markdown([part], ("r",)).endswith(
        "| `r` | 98.0% | 99.00% | 1 of 2 | seeds still to run |"
    )


# Chang et al., Table 3: pixel-by-pixel and noise-padded CIFAR-10 test accuracy (%).
TABLE_3 = {
    ("pixel_cifar10", "lstm"): 59.7, ("pixel_cifar10", "ablation"): 54.6,
    ("pixel_cifar10", "antisymmetric"): 58.7, ("pixel_cifar10", "gated"): 62.2,
    ("noise_padded_cifar10", "lstm"): 11.6, ("noise_padded_cifar10", "ablation"): 46.2,
    ("noise_padded_cifar10", "antisymmetric"): 48.3, ("noise_padded_cifar10", "gated"): 54.7,
}  # fmt: skip


def test_every_cifar10_row_carries_table_3_s_accuracy_of_its_task_and_model():
    """The smoke rows too: they stand in for the paper rows of their config."""
    rows = [run for runs in suite.SUITES.values() for run in runs if run.data == "cifar10"]
    assert len(rows) == 10  # the eight of Table 3 and two smoke rows
    for run in rows:
        task, model = run.config.removesuffix(".yaml").rsplit("_", 1)
        assert run.paper == TABLE_3[task, model], run.name


def test_the_length_rows_train_at_t100_and_t300():
    rows = [run for run in suite.SUITES["paper"] if run.table == "length (fashion_mnist)"]
    assert sorted((run.overrides, run.name) for run in rows) == sorted(
        ((("timesteps", t),), f"noise_padded_fashion_mnist_t{t}_{model}")
        for t in (100, 300)
        for model in ("antisymmetric", "gated", "lstm")
    )


def test_every_run_of_the_suites_is_a_valid_training_command_with_its_overrides():
    """Each row, as the suite starts it, parses and validates as `training.train`'s run,
    with the settings it overrides in effect; its folder name is plain."""
    import re

    from training import options, train
    from training.config import RunConfig

    for runs in suite.SUITES.values():
        for run in runs:
            argv = suite.train_argv(run, 100, "runs", None)
            args = options.parse_with_config(train.build_parser(), argv)
            config = RunConfig.from_namespace(args).validate()
            flat = config.to_dict()
            for key, value in run.overrides:
                assert flat[key] == value, (run.name, key)
            assert re.fullmatch(r"[a-z0-9_.]+", run.name), run.name
            # A value in the name ("..._eps0.01_gamma0.1", "..._lr0.002") is the run's.
            for short, value in re.findall(r"_(eps|gamma|lr)([0-9.]+)", run.name):
                field = {"eps": "epsilon", "gamma": "gamma", "lr": "learning_rate"}[short]
                assert flat[field] == float(value), (run.name, field)
            # An optimizer in the name ("..._sgd0.1") is the run's, at that learning rate.
            for name, value in re.findall(r"_(sgd|adagrad|adam)([0-9.]+)", run.name):
                assert (flat["optimizer"], flat["learning_rate"]) == (name, float(value))
            # The data it needs is the data it trains on; its table names task and data.
            first = run.table.split(" ")[0]
            assert first in ("length", "smoke") or config.task.name.startswith(first), run.name
            if "mnist" in config.task.name:
                dataset = config.task.dataset or "mnist"  # the MNIST tasks' default
                assert run.data == dataset, run.name
                assert f"({dataset}" in run.table or first == "smoke", run.name


def _record(folder, options, accuracy):
    """A finished run's record, as `training.train` writes it, with `options` recorded."""
    import yaml

    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(options))
    points = [{"step": options["steps"], "train_seconds": 4.0, "validation_accuracy": accuracy}]
    (folder / "curve.json").write_text(json.dumps({"points": points, "split": "validation"}))
    (folder / "metrics.json").write_text(json.dumps(
        {"test_accuracy": accuracy, "steps": options["steps"], "train_seconds": 4.0}))  # fmt: skip


def test_a_record_made_with_other_settings_is_flagged_and_counts_for_nothing(tmp_path):
    """A seed recorded before the suite chose another value: its row says which option
    differs, its row's mean and the targets leave it out, and the suite does not rerun
    it over the record (it names the folder to move)."""
    seeds = [r for r in suite.SUITES["smoke"] if r.row == "smoke_permuted_mnist_antisymmetric"]
    current, stale = seeds
    _record(tmp_path / current.name, {**current.options(), "steps": 7}, 0.5)
    # Another step size and another folder: only the step size is another setting.
    recorded = {**stale.options(), "epsilon": stale.options()["epsilon"] * 2, "steps": 9,
                "output_dir": "elsewhere"}  # fmt: skip
    _record(tmp_path / stale.name, recorded, 0.9)
    rows = [report.collect(run, str(tmp_path), None) for run in seeds]
    assert rows[0]["status"] == "finished" and "other_settings" not in rows[0]
    epsilon = stale.options()["epsilon"]
    assert rows[1]["status"] == (
        f"finished with other settings: epsilon {epsilon * 2} (the suite's: {epsilon})"
    )
    assert rows[1]["other_settings"] == {"epsilon": [epsilon * 2, epsilon]}
    (entry,) = report.seed_rows(rows)
    assert entry["test_accuracies"] == [0.5] and entry["seeds"] == [current.options()["seed"]]
    target = ("t", rows[0]["table"], ("antisymmetric",), 0.4, "lstm", 0)
    targets = report.targets_markdown(rows, [target])
    assert f"50.0% (`{current.name}`" in targets and "90.0%" not in targets
    lines = []
    reproduce.execute(seeds, _args(tmp_path, runs_dir=str(tmp_path)), log=lines.append)
    assert lines == [
        f"{current.name}: finished, kept",
        f"{stale.name}: recorded with other settings (epsilon {epsilon * 2} (the suite's: "
        f"{epsilon})), kept: move its folder away to run the suite's",
    ]
