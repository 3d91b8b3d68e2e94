"""Model selection on the validation split (`--keep-best`), and the report's last evaluations."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from training import train
from training.config import RunConfig
from training.paper import report, suite
from training.run import experiment, loop
from training.run.callbacks import BestWeights, LearningCurve
from training.tasks import catalog as tasks
from training.tasks.models import build_model

TINY = ["--task", "digits", "--units", "8", "--batch-size", "32", "--strategy", "default"]


class _Recorder:
    """Instruments a run: which splits its task reads and when, the weights at each
    evaluation, and a scripted validation accuracy per step in place of the measured one."""

    def __init__(self, monkeypatch, scripted):
        self.events, self.weights, self.scripted = [], {}, scripted
        get_task, on_step_end, run_train = tasks.get_task, LearningCurve.on_step_end, loop.Run.train

        def traced_task(*args, **kwargs):
            task = get_task(*args, **kwargs)
            examples = task.examples

            def traced(split, *rest, **more):
                self.events.append(("read", split))
                return examples(split, *rest, **more)

            task.examples = traced
            return task

        def scripted_step_end(curve, step, logs):
            on_step_end(curve, step, logs)  # the real evaluation runs, when due
            key = f"{curve.split}_accuracy"
            if key not in logs:
                return
            self.events.append(("evaluated", step))
            self.weights[step] = curve.run.trainer.model.get_weights()
            curve.points[-1][key] = logs[key] = self.scripted[step]

        def traced_train(run):
            history = run_train(run)
            self.events.append(("trained", None))
            return history

        monkeypatch.setattr(tasks, "get_task", traced_task)
        monkeypatch.setattr(LearningCurve, "on_step_end", scripted_step_end)
        monkeypatch.setattr(loop.Run, "train", traced_train)


def _test_metrics(weights):
    """Test loss and accuracy of the digits model with `weights`, evaluated afresh."""
    config = RunConfig.of(units=8)
    task = tasks.get_task("digits")
    model = build_model(task.spec, "antisymmetric", units=8, epsilon=config.model.epsilon,
                        gamma=config.model.gamma)  # fmt: skip
    model.set_weights(weights)
    predict = tf.function(lambda x: model(x, training=False))  # as the trainer predicts
    inputs, targets = task.examples("test")
    return loop.evaluate(
        lambda x: predict(tf.constant(x)), task, inputs, targets, config.loop.eval_batch_size,
        config.task.seed,
    )  # fmt: skip


def test_keep_best_tests_the_best_validation_step_and_reads_the_test_split_last(
    tmp_path, monkeypatch
):
    # Validation accuracy peaks at step 10, then falls; the weights go on changing.
    recorder = _Recorder(monkeypatch, {5: 0.30, 10: 0.90, 15: 0.50, 20: 0.40, 25: 0.2, 30: 0.9})
    out = tmp_path / "run"
    argv = [*TINY, "--optimizer", "sgd", "--learning-rate", "0.3", "--validation-fraction",
            "0.2", "--eval-every", "5", "--checkpoint-every", "10", "--log-every", "10",
            "--keep-best", "--diagnostics", "10", "--output-dir", str(out)]  # fmt: skip
    assert train.main([*argv, "--steps", "20"]) == 0

    # The test split is read once, after the last step: never by the curve or diagnostics.
    reads = [split for kind, split in recorder.events if kind == "read"]
    assert reads.count("test") == 1 and "validation" in reads
    assert recorder.events.index(("read", "test")) > recorder.events.index(("trained", None))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["selected_step"] == 10 and metrics["selected_on"] == "validation"
    assert metrics["steps"] == 20
    best = recorder.weights[10]
    assert any(not np.array_equal(a, b) for a, b in zip(best, recorder.weights[20], strict=True))
    test_loss, test_accuracy = _test_metrics(best)
    assert metrics["test_accuracy"] == test_accuracy and metrics["test_loss"] == test_loss
    assert (metrics["test_accuracy"], metrics["test_loss"]) != _test_metrics(recorder.weights[20])
    for saved, expected in zip(_model_weights(out), best, strict=True):  # the exported model
        np.testing.assert_array_equal(saved, expected)
    curve = json.loads((out / "curve.json").read_text())
    assert curve["split"] == "validation" and len(curve["points"]) == 4
    assert "test_examples: 359" in (out / "config.yaml").read_text()  # recorded at the end

    # Resumed with more steps in a new call: the best of step 10, kept on disk, still wins
    # over the new evaluations (25: lower; 30: equal, and the earliest of equals is kept).
    with np.load(out / "best.npz") as kept:
        assert int(kept["step"]) == 10 and float(kept["accuracy"]) == 0.9
    assert train.main([*argv, "--steps", "30"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["selected_step"] == 10 and metrics["resumed_from_step"] == 20
    assert metrics["test_accuracy"] == test_accuracy and metrics["test_loss"] == test_loss
    assert [p["step"] for p in json.loads((out / "curve.json").read_text())["points"]] == [
        5, 10, 15, 20, 25, 30
    ]  # fmt: skip


def _model_weights(out):
    return keras.saving.load_model(out / "model.keras").get_weights()


def test_without_keep_best_the_last_step_is_tested_and_named(tmp_path):
    config = RunConfig.of(units=8, batch_size=32, steps=3).validate()
    metrics = experiment.train_and_evaluate(config, str(tmp_path), log=lambda line: None)
    assert metrics["selected_step"] == 3 and metrics["selected_on"] == "last"
    assert not (tmp_path / "best.npz").exists()


def test_best_weights_newer_than_the_restored_checkpoint_are_dropped(tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    best = BestWeights(str(tmp_path / "best.npz"))
    best.offer(model, 30, 0.7, 1.0)
    best.offer(model, 40, 0.6, 1.2)  # worse: not kept
    assert best.step == 30
    best.save()
    logs = []
    again = BestWeights(str(tmp_path / "best.npz"))
    again.resume(40, logs.append)
    assert again.step == 30 and again.accuracy == 0.7 and again.loss == 1.0
    for saved, weight in zip(again.weights, model.get_weights(), strict=True):
        np.testing.assert_array_equal(saved, weight)
    older = BestWeights(str(tmp_path / "best.npz"))
    older.resume(20, logs.append)  # an older checkpoint was restored
    assert older.step is None and older.weights is None
    assert logs == ["ignoring the best weights of step 30: the run resumes from step 20"]
    same = BestWeights(str(tmp_path / "best.npz"))
    same.resume(30, logs.append)  # the checkpoint of the best step itself: kept
    assert same.step == 30 and len(logs) == 1


def test_nothing_is_written_before_an_evaluation_and_a_torn_file_is_ignored(tmp_path):
    path = tmp_path / "best.npz"
    best = BestWeights(str(path))
    best.save()
    assert not path.exists()
    best.offer(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]), 5, 0.5, 0.9)
    best.save()
    path.unlink()
    best.save()  # nothing new since the last save: not written again
    assert not path.exists()
    path.write_bytes(b"PK\x03\x04 torn")
    logs = []
    torn = BestWeights(str(path))
    torn.resume(10, logs.append)
    assert torn.step is None and torn.weights is None
    assert len(logs) == 1 and logs[0].startswith(f"ignoring unreadable best weights {path}: ")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--keep-best", "--eval-every", "5"],
         "argument `--keep-best`, expected a validation split to select on: "
         "--validation-fraction above 0 (the test split is read only at the end), got "
         "--keep-best with --validation-fraction 0.0."),
        (["--keep-best", "--validation-fraction", "0.1"],
         "argument `--eval-every`, expected a positive integer with --keep-best"),
    ],
)  # fmt: skip
def test_keep_best_without_a_validation_split_is_a_usage_error(tmp_path, capsys, args, message):
    assert train.main([*args, "--steps", "1", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and message in err[0], err


# --- The report: the spread of the last evaluations, the selected step ------------------------


def _curve(*accuracies):
    return [{"step": 10 * (i + 1), "seconds": i + 1, "accuracy": a}
            for i, a in enumerate(accuracies)]  # fmt: skip


def test_the_spread_of_the_last_five_evaluations():
    # The first points are outside the last five: 0.05 and 0.99 do not count.
    spread = report.last_spread(_curve(0.05, 0.99, 0.62, 0.71, 0.58, 0.66, 0.64))
    assert spread == {"min": 0.58, "max": 0.71, "evaluations": 5}
    assert report.last_spread(_curve(0.3, 0.4)) == {"min": 0.3, "max": 0.4, "evaluations": 2}
    assert report.last_spread([]) is None
    rows = [
        {"name": "a", "model": "gated", "table": "t", "test_accuracy": 0.7, "device": "cpu",
         "paper": None, "train_seconds": 7, "status": "finished", "steps": 70,
         "curve": _curve(0.05, 0.99, 0.62, 0.71, 0.58, 0.66, 0.64), "curve_split": "validation",
         "selected_step": 40},
        {"name": "b", "model": "lstm", "table": "t", "test_accuracy": 0.3, "device": "gpu",
         "paper": None, "train_seconds": 2, "status": "finished", "steps": 20,
         "curve": _curve(0.25, 0.35)},
        {"name": "c", "model": "lstm", "table": "t", "device": "cpu", "paper": None,
         "status": "not run", "curve": []},
    ]  # fmt: skip
    table = report.table_markdown(rows).splitlines()
    assert "| last 5 evaluations |" in table[0]
    assert "| 70.0% | — | 58.0–71.0%, validation | 70 (best: 40) | 7 |" in table[2], table[2]
    assert "| 30.0% | — | 25.0–35.0% (last 2) | 20 | 2 |" in table[3], table[3]
    assert "| — | — | — | — | — |" in table[4], table[4]


def test_the_report_writes_the_spread_and_the_selected_step_of_each_run(tmp_path):
    runs_dir, report_dir = tmp_path / "runs", tmp_path / "docs"
    chosen = [r for r in suite.SUITES["smoke"] if r.table == "smoke (digits)"]
    kept, selected = chosen
    points = [{"step": s, "train_seconds": s / 10, "validation_accuracy": a}
              for s, a in ((10, 0.2), (20, 0.6), (30, 0.5), (40, 0.55))]  # fmt: skip
    folder = runs_dir / selected.name
    folder.mkdir(parents=True)
    (folder / "curve.json").write_text(json.dumps({"split": "validation", "points": points}))
    (folder / "metrics.json").write_text(json.dumps(
        {"test_accuracy": 0.58, "steps": 40, "train_seconds": 4.0, "selected_step": 20,
         "selected_on": "validation"}))  # fmt: skip
    # A row of an earlier report (a run made elsewhere) is kept, with its spread.
    assets = report_dir / "reproduction"
    assets.mkdir(parents=True)
    accuracies = (0.1, 0.9, 0.8, 0.7, 0.75, 0.85)
    old_curve = [{"step": s, "seconds": s, "accuracy": a} for s, a in enumerate(accuracies, 1)]
    old = {"name": kept.name, "table": kept.table, "model": "antisymmetric", "paper": None,
           "device": "gpu", "status": "finished", "test_accuracy": 0.8, "steps": 6,
           "curve": old_curve}  # fmt: skip
    (assets / "results.json").write_text(json.dumps({"runs": [old], "search": []}))
    path = report.write(chosen, str(runs_dir), str(report_dir))
    rows = {row["name"]: row for row in json.loads((assets / "results.json").read_text())["runs"]}
    assert rows[selected.name]["last_spread"] == {"min": 0.2, "max": 0.6, "evaluations": 4}
    assert rows[selected.name]["selected_step"] == 20
    assert rows[kept.name]["last_spread"] == {"min": 0.7, "max": 0.9, "evaluations": 5}
    assert rows[kept.name]["test_accuracy"] == 0.8 and "selected_step" not in rows[kept.name]
    markdown = open(path).read()
    assert "| 58.0% | — | 20.0–60.0% (last 4), validation | 40 (best: 20) |" in markdown
    assert "| 80.0% | — | 70.0–90.0% | 6 |" in markdown
