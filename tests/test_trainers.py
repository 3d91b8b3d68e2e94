"""Training on every backend: JAX and PyTorch trainers, no-TensorFlow runs, data parallelism,
learning curves, divergence, and export of a JAX-trained model."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow_datasets as tfds

from tests.limits import limit
from tests.recording import RecordingWriter
from training import data, errors
from training.config import RunConfig
from training.run import loop
from training.run.callbacks import Checkpoints, LearningCurve

ROOT = Path(__file__).resolve().parents[1]


def _env(backend, **extra):
    return {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "CUDA_VISIBLE_DEVICES": "",
        "KERAS_BACKEND": backend,
        **extra,
    }


TRAIN_LIMIT = limit(300)


def _train(backend, args, timeout=TRAIN_LIMIT, **env):
    return subprocess.run(
        [sys.executable, "-m", "training.train", *args],
        cwd=ROOT,
        env=_env(backend, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _blocked_path(tmp_path):
    """A PYTHONPATH entry under which `import tensorflow` (and TFDS) fails."""
    for name in ("tensorflow", "tensorflow_datasets"):
        package = tmp_path / "blocked" / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f"raise ImportError('{name} is blocked')\n")
    return str(tmp_path / "blocked")


def _weights(path):
    return keras.saving.load_model(path).get_weights()


# JAX compiles every task's step (half a minute on two cores): CI's slow pass runs it.
@pytest.mark.parametrize("backend", [pytest.param("jax", marks=pytest.mark.slow), "torch"])
def test_every_mnist_family_and_synthetic_task_trains_without_tensorflow(tmp_path, backend):
    with tfds.testing.mock_data(num_examples=32):
        for dataset in ("mnist", "fashion_mnist"):
            data.export(dataset, None, str(tmp_path / "data"))
    runs = [
        ("pixel_mnist", "mnist", None),
        ("permuted_mnist", "fashion_mnist", None),
        ("noise_padded_mnist", "fashion_mnist", 40),
        ("adding", None, 12),
        ("copy", None, 24),
        ("digits", None, None),
    ]
    script = textwrap.dedent(
        f"""
        import json, sys
        from training import train
        assert "tensorflow" not in sys.modules
        for task, dataset, timesteps in {runs!r}:
            argv = ["--task", task, "--units", "8", "--batch-size", "8", "--steps", "2",
                    "--eval-batch-size", "64", "--output-dir", f"{tmp_path}/" + task,
                    "--data-dir", "{tmp_path}/data"]
            argv += ["--dataset", dataset] if dataset else []
            argv += ["--timesteps", str(timesteps)] if timesteps else []
            assert train.main(argv) == 0, task
        try:
            import tensorflow  # noqa: F401
        except ImportError:
            print("tensorflow-free")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=_env(backend, PYTHONPATH=_blocked_path(tmp_path)),
        capture_output=True,
        text=True,
        timeout=limit(400),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tensorflow-free" in done.stdout
    for task, _, _ in runs:
        metrics = json.loads((tmp_path / task / "metrics.json").read_text())
        assert metrics["steps"] == 2 and metrics["backend"] == backend
        assert metrics["device"] == f"{backend} on cpu"  # the machine, alike for every backend
        assert 0.0 <= metrics["test_accuracy"] <= 1.0
        assert (tmp_path / task / "model.keras").is_file()
        assert list((tmp_path / task / "logs").iterdir()), "no TensorBoard event file"


@pytest.mark.slow
def test_jax_data_parallel_over_two_devices_matches_one_device(tmp_path):
    common = ["--task", "digits", "--units", "16", "--batch-size", "32", "--steps", "15",
              "--checkpoint-every", "5"]  # fmt: skip
    single = _train("jax", [*common, "--strategy", "default", "--output-dir", str(tmp_path / "a")])
    assert single.returncode == 0, single.stderr[-2000:]
    parallel = _train(
        "jax", [*common, "--cpu-devices", "2", "--output-dir", str(tmp_path / "b")]
    )  # auto picks DataParallel over the 2 devices
    assert parallel.returncode == 0, parallel.stderr[-2000:]
    config = (tmp_path / "b" / "config.yaml").read_text()
    assert "strategy_class: DataParallel" in config and "replicas: 2" in config
    for a, b in zip(
        _weights(tmp_path / "a" / "model.keras"),
        _weights(tmp_path / "b" / "model.keras"),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, atol=2e-5)
    bad = _train("torch", [*common, "--strategy", "mirrored", "--output-dir", str(tmp_path / "c")])
    assert bad.returncode == 2 and "argument `--strategy`" in bad.stderr


def test_learning_curve_records_the_evaluations_it_logs(tmp_path):
    out = tmp_path / "run"
    done = _train(
        "jax",
        ["--task", "digits", "--units", "16", "--batch-size", "32", "--steps", "30",
         "--eval-every", "10", "--output-dir", str(out)],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    curve = json.loads((out / "curve.json").read_text())
    metrics = json.loads((out / "metrics.json").read_text())
    assert curve["split"] == "test" and [p["step"] for p in curve["points"]] == [10, 20, 30]
    seconds = [p["train_seconds"] for p in curve["points"]]
    assert all(0 < a < b for a, b in zip(seconds, seconds[1:], strict=False))
    # The last point evaluates the final weights on the test split: the final metrics.
    assert curve["points"][-1]["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    assert curve["points"][-1]["test_loss"] == pytest.approx(metrics["test_loss"], rel=1e-5)
    for point in curve["points"]:
        assert f"step {point['step']} test_accuracy {point['test_accuracy']:.4f}" in done.stdout


def test_learning_curve_resume_drops_points_after_the_checkpoint(tmp_path):
    curve = LearningCurve(str(tmp_path / "curve.json"), 5, "test", None, None, 8, 0)
    curve.points = [{"step": s, "train_seconds": s / 10} for s in (5, 10, 15)]
    curve.save()
    resumed = LearningCurve(str(tmp_path / "curve.json"), 5, "test", None, None, 8, 0)
    resumed.resume(10)
    assert [p["step"] for p in resumed.points] == [5, 10]
    assert resumed.seconds_before == pytest.approx(1.0)


def _run_loop(trainer, start=0, writer=None, log=print, clock=None, **settings):
    """`trainer` run as a `Run` of `RunConfig.of(**settings)` with its checkpoints."""
    config = RunConfig.of(**settings)
    run = loop.Run(config, trainer, writer=writer, log=log, start_step=start,
                   callbacks=[Checkpoints(config.loop.checkpoint_every)],
                   **({"clock": clock.perf_counter} if clock else {}))  # fmt: skip
    return run.train()


class _FakeTrainer:
    """Losses on demand; a small healthy model for the checks before each checkpoint."""

    batch_size = 4
    chief = True  # the one process: it writes the outputs

    def __init__(self, losses):
        self.losses, self.saved = list(losses), []
        self.model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        self.optimizer = keras.optimizers.SGD()
        self.optimizer.build(self.model.trainable_variables)
        spec = type("Spec", (), {"head": "classification", "num_outputs": 2})()
        self.task = type("Task", (), {"spec": spec})()

    def batches(self, step):
        return np.ones((4, 3), "float32"), np.zeros(4, "int32")

    def predict(self, x):
        return self.model(x)

    def step(self):
        return self.losses.pop(0), 0.5

    def save(self, step):
        self.saved.append(step)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_loop_stops_at_the_first_non_finite_loss(bad):
    from training.run.summaries import ScalarWriter

    trainer = _FakeTrainer([1.0, 0.9, bad, 0.8])
    with pytest.raises(errors.DivergenceError, match="diverged at step 3"):
        _run_loop(
            trainer,
            steps=4,
            checkpoint_every=2,
            log_every=1,
            writer=ScalarWriter(None),
            log=lambda line: None,
        )
    assert trainer.saved == [2]  # the checkpoint before the divergence, none after


@pytest.mark.parametrize("checkpoint_every, last", [(2, "step 2"), (10, "none yet")])
def test_a_divergence_names_the_checkpoint_to_resume_from(checkpoint_every, last):
    from training.run.summaries import ScalarWriter

    trainer = _FakeTrainer([1.0, 0.9, float("nan"), 0.8])
    with pytest.raises(errors.DivergenceError) as caught:
        _run_loop(
            trainer,
            steps=4,
            checkpoint_every=checkpoint_every,
            log_every=1,
            writer=ScalarWriter(None),
            log=lambda line: None,
        )
    assert str(caught.value) == (
        f"training diverged at step 3: the loss is nan. The last checkpoint ({last}) is from "
        "before it; lower --learning-rate, set --clipnorm, or lower --epsilon (docs: the "
        "stable ranges), or resume from it with another --learning-rate and "
        "--change-on-resume learning_rate."
    )


def test_loop_warns_once_when_the_loss_blows_up_while_finite():
    from training.run.summaries import ScalarWriter

    lines = []
    trainer = _FakeTrainer([2.0, 3.0, 19.0, 21.0, 500.0, 2.0])
    _run_loop(
        trainer,
        steps=6,
        checkpoint_every=6,
        log_every=1,
        writer=ScalarWriter(None),
        log=lines.append,
    )
    warnings = [line for line in lines if line.startswith("warning: the loss grew")]
    # 19 < 10 × 2; 21 > 10 × 2 is the first blow-up; 500 is not warned again.
    assert warnings == [
        "warning: the loss grew from 2 to 21 by step 4: training is unstable; lower "
        "--learning-rate, set --clipnorm, or lower --epsilon (see the README's stable ranges)"
    ]
    assert trainer.saved == [6]


def test_a_resumed_run_that_diverges_names_the_checkpoint_it_resumed_from():
    from training.run.summaries import ScalarWriter

    trainer = _FakeTrainer([1.0, float("nan")])
    with pytest.raises(errors.DivergenceError) as caught:
        _run_loop(
            trainer,
            steps=8,
            checkpoint_every=10,
            log_every=1,
            start=4,
            writer=ScalarWriter(None),
            log=lambda line: None,
        )
    assert "at step 6: the loss is nan. The last checkpoint (step 4) is from" in str(caught.value)
    assert trainer.saved == []


def test_a_checkpoint_refused_by_its_checks_names_the_one_before_it():
    """The step's loss is finite but the weights are not: the checkpoint due at step 4 is
    refused, and the message names step 2's as the one to resume from."""
    from training.run.summaries import ScalarWriter

    class _Overflowing(_FakeTrainer):
        def step(self):
            if len(self.losses) == 1:  # the fourth step: a weight overflows
                kernel = self.model.weights[0]
                kernel.assign(np.full(kernel.shape, np.inf, "float32"))
            return super().step()

    trainer = _Overflowing([1.0, 0.9, 0.8, 0.7])
    with pytest.raises(errors.DivergenceError) as caught:
        _run_loop(
            trainer,
            steps=4,
            checkpoint_every=2,
            log_every=1,
            writer=ScalarWriter(None),
            log=lambda line: None,
        )
    message = str(caught.value)
    assert message.startswith("training diverged at step 4: the weight ")
    assert "The last checkpoint (step 2) is from before it" in message
    assert trainer.saved == [2]


class _Clock:
    """`perf_counter` of training.run.loop, moved on by the trainer's steps and saves."""

    def __init__(self, now):
        self.now = now

    def perf_counter(self):
        return self.now


class _TimedTrainer(_FakeTrainer):
    """A first step of 10 s (it compiles), then 2 s per step; 5 s per checkpoint."""

    def __init__(self, losses, clock, first=10.0, later=2.0):
        super().__init__(losses)
        self.clock, self.steps, self.durations = clock, 0, (first, later)

    def step(self):
        self.steps += 1
        self.clock.now += self.durations[0] if self.steps == 1 else self.durations[1]
        return super().step()

    def save(self, step):
        self.clock.now += 5.0
        super().save(step)


def test_the_loop_logs_each_window_and_times_training_without_compiling_or_checkpoints(
    monkeypatch,
):
    """Five steps of batch 4, a log line every 2 and at the end, a checkpoint with each.
    By hand: windows of 12 s (the 10 s first step and one of 2 s), 4 s and 2 s give
    8/12, 8/4 and 4/2 examples/s; the summary's rate leaves out the first step and the
    checkpoints' 15 s (4 steps x 4 examples in 8 s), its wall time the checkpoints."""
    clock = _Clock(100.0)
    trainer, writer, lines = _TimedTrainer([1.0, 2.0, 3.0, 4.0, 5.0], clock), RecordingWriter(), []
    summary = _run_loop(
        trainer,
        steps=5,
        checkpoint_every=2,
        log_every=2,
        writer=writer,
        log=lines.append,
        clock=clock,
    )
    assert [line for line in lines if line.startswith("step ")] == [
        "step 2/5 loss 1.5000 accuracy 0.5000 1 examples/s",
        "step 4/5 loss 3.5000 accuracy 0.5000 2 examples/s",
        "step 5/5 loss 5.0000 accuracy 0.5000 2 examples/s",
    ]
    assert writer.series("train/examples_per_second") == [
        (2, pytest.approx(8 / 12)), (4, pytest.approx(2.0)), (5, pytest.approx(2.0))
    ]  # fmt: skip
    assert writer.series("train/loss") == [(2, 1.5), (4, 3.5), (5, 5.0)]
    assert writer.series("train/accuracy") == [(2, 0.5), (4, 0.5), (5, 0.5)]
    assert trainer.saved == [2, 4, 5]
    assert summary == {
        "steps": 5,
        "examples_per_second": pytest.approx(2.0),
        "wall_time_seconds": pytest.approx(18.0),
        "final_loss": 5.0,
        "final_accuracy": 0.5,
    }


def test_a_one_step_run_has_no_rate_to_report(monkeypatch):
    """Its only step compiles: no step is timed, so there is no examples/s (None)."""
    clock = _Clock(0.0)
    trainer = _TimedTrainer([1.0], clock)
    summary = _run_loop(
        trainer,
        steps=1,
        checkpoint_every=1,
        log_every=5,
        writer=RecordingWriter(),
        log=lambda line: None,
        clock=clock,
    )
    assert summary["examples_per_second"] is None
    assert summary["steps"] == 1 and summary["wall_time_seconds"] == pytest.approx(10.0)


def test_cli_stops_on_divergence_with_a_clear_message(tmp_path):
    done = _train(
        "tensorflow",
        ["--task", "adding", "--timesteps", "20", "--optimizer", "sgd", "--learning-rate",
         "1000000", "--steps", "50", "--output-dir", str(tmp_path / "run")],
    )  # fmt: skip
    assert done.returncode == 2
    assert "error: training diverged at step" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.slow
def test_jax_trained_model_exports_and_serves_the_same_predictions(tmp_path):
    import tensorflow as tf

    from serving.exports.export import export_model

    out = tmp_path / "run"
    script = textwrap.dedent(
        f"""
        import numpy as np, keras
        from training import train
        from training.tasks import catalog as tasks
        assert train.main(["--task", "digits", "--units", "16", "--batch-size", "32",
                           "--steps", "20", "--output-dir", "{out}"]) == 0
        task = tasks.get_task("digits")
        images, labels = task.examples("test")
        x, _ = task.make_batch(images[:8], labels[:8], (0, 0))
        np.save("{tmp_path}/x.npy", x)
        model = keras.saving.load_model("{out}/model.keras")
        np.save("{tmp_path}/logits.npy", np.asarray(model.predict_on_batch(x)))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=_env("jax"),
        capture_output=True, text=True, timeout=limit(300),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    version = export_model(str(out / "model.keras"), str(tmp_path / "export"), 1)
    served = tf.saved_model.load(version).signatures["serving_default"]
    x = np.load(tmp_path / "x.npy")
    answer = served(sequence=tf.constant(x))
    jax_logits = np.load(tmp_path / "logits.npy")
    np.testing.assert_allclose(answer["logits"].numpy(), jax_logits, rtol=1e-5, atol=1e-5)
    assert answer["class_id"].numpy().tolist() == jax_logits.argmax(-1).tolist()


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_library_runs_without_tensorflow(tmp_path, backend):
    script = textwrap.dedent(
        """
        import numpy as np, keras
        from keras_antisym import AntisymmetricRNN, GatedAntisymmetricRNN
        x = np.ones((2, 5, 3), "float32")
        for layer in (AntisymmetricRNN(4), GatedAntisymmetricRNN(4)):
            assert keras.ops.convert_to_numpy(layer(x)).shape == (2, 4)
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT,
        env=_env(backend, PYTHONPATH=_blocked_path(tmp_path)),
        capture_output=True, text=True, timeout=limit(120),
    )  # fmt: skip
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


def test_tune_runs_its_trials_on_jax(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "training.tune", "--task", "digits", "--model", "antisymmetric",
         "--units", "8", "--batch-size", "32", "--tuner", "grid", "--epsilon-values",
         "0.01,0.1", "--gamma-values", "0.01", "--sigma-w-values", "1", "--optimizer-values",
         "adam", "--learning-rate-values", "0.01", "--max-trials", "2", "--steps-per-trial",
         "5", "--directory", str(tmp_path)],
        cwd=ROOT, env=_env("jax"), capture_output=True, text=True, timeout=limit(300),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    best = json.loads((tmp_path / "digits-antisymmetric" / "best.json").read_text())
    assert best["completed_trials"] == 2
    assert best["hyperparameters"]["epsilon"] in (0.01, 0.1)
    rows = (tmp_path / "digits-antisymmetric" / "trials.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("trial_id,status,score")


def test_a_truncated_checkpoint_falls_back_to_the_one_before(tmp_path):
    out = tmp_path / "run"
    common = ["--task", "digits", "--units", "8", "--batch-size", "32", "--checkpoint-every",
              "5", "--output-dir", str(out)]  # fmt: skip
    assert _train("jax", [*common, "--steps", "15"]).returncode == 0
    index = json.loads((out / "checkpoints" / "checkpoint.json").read_text())
    assert index["all"] == ["ckpt-5.npz", "ckpt-10.npz", "ckpt-15.npz"]
    newest = out / "checkpoints" / "ckpt-15.npz"
    newest.write_bytes(newest.read_bytes()[:100])  # torn by a crash of the disk
    (out / "checkpoints" / "ckpt-20.npz.partial").write_bytes(b"killed mid-save")
    resumed = _train("jax", [*common, "--steps", "20"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "skipping unreadable checkpoint" in resumed.stdout
    assert "at step 10" in resumed.stdout
    assert json.loads((out / "metrics.json").read_text())["steps"] == 20
    assert not list((out / "checkpoints").glob("*.partial"))


_TF_COMMON = ["--task", "digits", "--units", "8", "--batch-size", "32", "--checkpoint-every",
              "5"]  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted_tf_weights(tmp_path_factory):
    """The weights of a TensorFlow run of 20 steps that nothing interrupted."""
    out = tmp_path_factory.mktemp("straight")
    done = _train("tensorflow", [*_TF_COMMON, "--steps", "20", "--output-dir", str(out)])
    assert done.returncode == 0, done.stderr[-2000:]
    return _weights(out / "model.keras")


@pytest.mark.parametrize("torn", ["data", "index"])
def test_a_truncated_tf_checkpoint_falls_back_to_the_one_before(
    tmp_path, torn, uninterrupted_tf_weights
):
    import tensorflow as tf

    out = tmp_path / "run"
    checkpoints = out / "checkpoints"
    common = [*_TF_COMMON, "--output-dir", str(out)]
    first = _train("tensorflow", [*common, "--steps", "15"])
    assert first.returncode == 0, first.stderr[-2000:]
    assert tf.train.latest_checkpoint(str(checkpoints)) == str(checkpoints / "ckpt-15")
    (newest,) = checkpoints.glob(f"ckpt-15.{torn}*")
    newest.write_bytes(newest.read_bytes()[:100])  # torn by a crash of the disk
    # What killed saves leave: TF's sharded-save folder and temporary files.
    (checkpoints / "ckpt-20_temp").mkdir()
    (checkpoints / "ckpt-20_temp" / "part-00000-of-00001.index").write_bytes(b"killed")
    (checkpoints / "tmpk1ll3d.tmp").write_text("killed mid-save")
    (checkpoints / f"checkpoint.tmp{'0f' * 16}").write_text("killed mid-save")
    (checkpoints / "checkpoint.partial").write_text("killed mid-save")
    resumed = _train("tensorflow", [*common, "--steps", "20"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    skipped = [line for line in resumed.stdout.splitlines() if "skipping unreadable" in line]
    assert len(skipped) == 1 and "ckpt-15" in skipped[0], resumed.stdout
    assert "at step 10" in resumed.stdout
    assert json.loads((out / "metrics.json").read_text())["steps"] == 20
    assert sorted(p.name for p in checkpoints.iterdir()) == sorted(
        ["checkpoint"]
        + [f"ckpt-{n}.{kind}" for n in (10, 15, 20) for kind in ("index", "data-00000-of-00001")]
    )  # leftovers gone, the torn checkpoint rewritten, KEEP=3
    assert tf.train.latest_checkpoint(str(checkpoints)) == str(checkpoints / "ckpt-20")
    # Resuming from step 10 retrains steps 11-20 exactly as a run that was never interrupted.
    for a, b in zip(_weights(out / "model.keras"), uninterrupted_tf_weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("seconds", "rate"), [(0.5, 8.0), (0.0, 4e9)])
def test_a_short_window_logs_its_true_rate_and_an_instant_one_no_division_by_zero(
    monkeypatch, seconds, rate
):
    """A window of 0.5 s of one batch of 4 logs 8 examples/s; a window the clock cannot
    measure (0 s) logs the rate of 1 ns rather than failing."""
    clock = _Clock(0.0)
    trainer, writer = _TimedTrainer([1.0], clock, first=seconds), RecordingWriter()
    _run_loop(
        trainer,
        steps=1,
        checkpoint_every=1,
        log_every=1,
        writer=writer,
        log=lambda line: None,
        clock=clock,
    )
    assert writer.series("train/examples_per_second") == [(1, pytest.approx(rate))]


@pytest.mark.parametrize(
    ("losses", "warned_at"),
    [
        ([2.0, 20.0, 20.0], None),  # exactly 10 times the first loss: not yet a blow-up
        ([0.01, 0.05, 0.11], 3),  # 10 times a small first loss is the bar: 0.11 > 0.1
        ([0.0, 0.009, 0.011], 3),  # a first loss of 0 counts as 0.001: 0.011 > 0.01
    ],
)
def test_the_blow_up_bar_is_ten_times_the_first_loss_or_a_thousandth(losses, warned_at):
    from training.run.summaries import ScalarWriter

    lines = []
    _run_loop(_FakeTrainer(losses), steps=len(losses), checkpoint_every=10, log_every=1,
              writer=ScalarWriter(None), log=lines.append)  # fmt: skip
    warned = [line for line in lines if line.startswith("warning: the loss grew")]
    if warned_at is None:
        assert warned == []
    else:
        assert len(warned) == 1 and f"by step {warned_at}:" in warned[0]


def test_the_scalar_writer_writes_tensorboard_events_that_read_back(tmp_path):
    """Each scalar an event of its own: tag, value as a float, step as an int, its time."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    from training.run.summaries import ScalarWriter

    logdir = tmp_path / "logs" / "train"
    before = time.time()
    writer = ScalarWriter(str(logdir))
    writer.scalar("loss", np.float32(1.5), np.int64(3))
    writer.scalar("accuracy", 1, 7.0)
    writer.flush()
    (path,) = logdir.glob("events.out.tfevents.*")
    events = [e for e in LegacyEventFileLoader(str(path)).Load() if e.HasField("summary")]
    assert [(e.summary.value[0].tag, e.summary.value[0].simple_value, e.step) for e in events] == [
        ("loss", 1.5, 3),
        ("accuracy", 1.0, 7),
    ]
    assert all(before <= e.wall_time <= time.time() for e in events)
    writer.scalar("late", 2.0, 9)
    writer.close()  # flushes what is left
    events = [e for e in LegacyEventFileLoader(str(path)).Load() if e.HasField("summary")]
    assert [e.summary.value[0].tag for e in events] == ["loss", "accuracy", "late"]
    resumed = ScalarWriter(str(logdir))  # a resumed run logs into the folder it made
    resumed.close()
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 2


def test_a_scalar_writer_without_a_folder_writes_nothing(tmp_path, monkeypatch):
    from training.run.summaries import ScalarWriter

    monkeypatch.chdir(tmp_path)
    writer = ScalarWriter()
    writer.scalar("loss", 1.0, 1)
    writer.flush()
    writer.close()
    assert list(tmp_path.iterdir()) == []
