"""The run's small parts in process: its folder (`RunDir`), the identity check both a
resumed run and a continued search use, and the backend choice keeping the JAX cluster."""

import json

import keras
import pytest

from apputil.errors import UsageError
from training.backends import select
from training.backends.cluster import Cluster
from training.backends.launch_config import LaunchConfig
from training.run.identity import MISSING, check_unchanged
from training.run.rundir import RunDir
from training.sections import flag


def test_a_run_folder_names_every_file_of_a_run(tmp_path):
    run = RunDir(str(tmp_path))
    names = (run.config, run.metrics, run.checkpoints, run.logs, run.curve,
             run.best_weights, run.model)  # fmt: skip
    assert [path.removeprefix(str(tmp_path) + "/") for path in names] == [
        "config.yaml", "metrics.json", "checkpoints", "logs", "curve.json", "best.npz",
        "model.keras",
    ]  # fmt: skip
    assert RunDir.default("digits", "gated") == RunDir("runs/digits-gated")


def test_a_run_folder_reads_what_a_run_left_and_nothing_else(tmp_path):
    run = RunDir(str(tmp_path))
    assert (run.read_config(), run.read_metrics(), run.read_curve()) == ({}, None,
                                                                       {"points": []})  # fmt: skip
    assert not run.has_checkpoints() and not run.finished(0)
    (tmp_path / "checkpoints").mkdir()
    assert not run.has_checkpoints()  # an empty folder holds nothing to resume
    (tmp_path / "checkpoints" / "ckpt-1.npz").write_bytes(b"x")
    assert run.has_checkpoints()
    (tmp_path / "metrics.json").write_text('{"steps": 5}')
    assert run.finished(5) and run.finished(4) and not run.finished(6)
    (tmp_path / "metrics.json").write_text("{}")  # no steps recorded: none trained
    assert run.finished(0) and not run.finished(1)
    (tmp_path / "metrics.json").write_text("{torn")
    assert run.read_metrics() is None and not run.finished(0)
    (tmp_path / "config.yaml").write_text("units: 8\n")
    (tmp_path / "curve.json").write_text(json.dumps({"split": "test", "points": [{"step": 1}]}))
    assert run.read_config() == {"units": 8} and run.read_curve()["points"] == [{"step": 1}]


def test_the_identity_check_reports_every_allowed_change_and_refuses_the_first_other():
    before = {"a": 1, "b": 2, "c": 3}
    changed = check_unchanged(before, {"a": 9, "b": 8, "c": 3}, path="p", flag=flag,
                              hint=lambda key, value: "h", allowed=("a", "b"))  # fmt: skip
    assert changed == {"a": (1, 9), "b": (2, 8)}
    with pytest.raises(UsageError) as refused:
        check_unchanged(before, {"a": 9, "c": 4}, path="p", flag=flag,
                        hint=lambda key, value: f"hint for {key} {value}")  # fmt: skip
    assert str(refused.value) == (
        "Received an invalid value for argument `--a`, expected 1 as in p (hint for a 1), got 9."
    )
    # A key the record lacks is compared with its default, or not at all.
    assert check_unchanged(before, {"new": 5}, path="p", flag=flag, hint=lambda k, v: "") == {}
    assert MISSING is not None
    with pytest.raises(UsageError, match="argument `--new`, expected 4 as in p"):
        check_unchanged(before, {"new": 5}, path="p", flag=flag, hint=lambda k, v: "",
                        default=lambda key: 4)  # fmt: skip


def test_the_jax_backend_joins_the_cluster_it_is_given(monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    cluster = Cluster("python -m training.train")
    made = select.start(LaunchConfig(strategy="default"), cluster)
    assert made.cluster is cluster
    assert select.start(LaunchConfig(strategy="default")).cluster is not cluster


def test_best_weights_say_through_the_run_s_log_why_they_are_not_resumed(tmp_path):
    from training.config import RunConfig
    from training.run.callbacks import BestWeights
    from training.run.loop import Run

    (tmp_path / "best.npz").write_bytes(b"torn")
    lines = []
    best = BestWeights(str(tmp_path / "best.npz"))
    Run(RunConfig(), trainer=None, log=lines.append, callbacks=[best], start_step=10)
    best.on_train_begin()
    assert len(lines) == 1 and lines[0].startswith(f"ignoring unreadable best weights {best.path}")


def test_a_run_in_process_writes_its_record_and_metrics_where_it_says(tmp_path, monkeypatch):
    """A tiny run, in this process: the default folder, the record's keys (sorted, as
    written), and the metrics that name where it ran and its training time."""
    import yaml

    from training.config import RunConfig
    from training.run import experiment

    monkeypatch.chdir(tmp_path)
    config = RunConfig.of(task="adding", timesteps=5, units=4, batch_size=8, steps=2,
                          eval_every=1, log_every=1, checkpoint_every=2).validate()  # fmt: skip
    metrics = experiment.train_and_evaluate(config, log=lambda line: None)
    run = RunDir.default("adding", "antisymmetric")
    assert run.read_metrics() == json.loads(json.dumps(metrics))
    text = open(run.config).read()
    keys = [line.split(":")[0] for line in text.splitlines() if not line.startswith(" ")]
    keys = [key for key in keys if key and not key.startswith("-")]
    assert keys == sorted(keys)
    record = yaml.safe_load(text)
    assert record["replicas"] == 1 and record["device"] == metrics["device"]
    assert metrics["device"].startswith("tensorflow on ")
    assert metrics["train_seconds"] == run.read_curve()["points"][-1]["train_seconds"]
