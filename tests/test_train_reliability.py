"""Training under hostile or careless use: signals, divergence, shared folders, bad data, reruns."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import yaml

from apputil.files import FolderLock
from tests.limits import limit
from training import train, tune
from training.errors import DivergenceError
from training.run import loop

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--task", "digits", "--units", "8", "--batch-size", "32", "--strategy", "default"]


def _env(backend="jax"):
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "",
            "KERAS_BACKEND": backend}  # fmt: skip


def _endless_run(out, stdout=subprocess.PIPE):
    """A tiny `training.train` process in `out` that trains until it is stopped; its argv."""
    argv = [*TINY, "--steps", "100000", "--checkpoint-every", "100000", "--log-every", "5",
            "--output-dir", str(out)]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "training.train", *argv], cwd=ROOT, env=_env(),
        stdout=stdout, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return proc, argv


@pytest.mark.parametrize("number, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_checkpoints_the_step_in_progress_and_the_rerun_resumes_there(
    tmp_path, number, status
):
    out = tmp_path / "run"
    proc, argv = _endless_run(out)
    try:
        deadline = time.monotonic() + limit(120)
        for line in proc.stdout:  # wait until it trains
            if line.startswith("step 10/") or time.monotonic() > deadline:
                break
        proc.send_signal(number)
        _, err = proc.communicate(timeout=limit(60))
    finally:
        proc.kill()
    assert proc.returncode == status, err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    name = signal.Signals(number).name
    assert f"python -m training.train: error: stopped by {name} at step " in lines[0]
    step = int(lines[0].split(" at step ")[1].split(",")[0])
    index = json.loads((out / "checkpoints" / "checkpoint.json").read_text())
    assert index["latest"] == f"ckpt-{step}.npz"  # the only checkpoint: the interrupted step
    rerun = subprocess.run(
        [sys.executable, "-m", "training.train", *argv[:-4], "--steps", str(step + 2),
         "--output-dir", str(out)], cwd=ROOT, env=_env(), capture_output=True, text=True,
        timeout=limit(180),
    )  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"at step {step}" in rerun.stdout
    assert json.loads((out / "metrics.json").read_text())["steps"] == step + 2


class _Stepping:
    """Five healthy steps; `send` is called with the step in progress at one moment of it."""

    batch_size = 4
    chief = True

    def __init__(self, moment):
        self.model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        self.optimizer = keras.optimizers.SGD()
        self.optimizer.build(self.model.trainable_variables)
        self.task = type("Task", (), {"spec": _Spec()})()
        self.moment, self.steps, self.saved = moment, 0, []

    def send(self, moment):
        if moment == self.moment and self.steps == 3:
            os.kill(os.getpid(), signal.SIGINT)

    def step(self):
        self.steps += 1
        self.send("step")
        return 1.0, 0.5

    def batches(self, step):
        return np.ones((4, 3), "float32"), np.zeros(4, "int32")

    def predict(self, x):
        return self.model(x)

    def save(self, step):
        self.saved.append(step)


@pytest.mark.parametrize("moment", ["step", "after the checkpoint's test"])
def test_a_signal_at_any_moment_stops_at_a_checkpointed_step(moment):
    from training.config import RunConfig
    from training.errors import Interrupted
    from training.run.callbacks import Checkpoints

    trainer = _Stepping(moment)

    class SignalLast(loop.Callback):
        """The last callback of the step: the last moment before the step ends."""

        def on_step_end(self, step, logs):
            trainer.send("after the checkpoint's test")

    config = RunConfig.of(steps=5, checkpoint_every=100, log_every=1)
    before = signal.getsignal(signal.SIGINT)  # ignored, where the suite runs under nohup
    run = loop.Run(config, trainer, log=lambda line: None,
                   callbacks=[Checkpoints(100), SignalLast()])  # fmt: skip
    with pytest.raises(Interrupted) as stopped:
        run.train()
    # Stopped at the step in progress, or at the next one when the signal came too late
    # for this one's checkpoint; either way the step it names is the one checkpointed.
    assert stopped.value.step == (3 if moment == "step" else 4)
    assert trainer.saved == [stopped.value.step]
    assert signal.getsignal(signal.SIGINT) is before  # the handler is given back

    assert str(stopped.value) == (
        f"stopped by {signal.Signals(stopped.value.signal_number).name} at step "
        f"{stopped.value.step}, checkpointed; run the same command to resume"
    )


@pytest.mark.parametrize("signum, name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")])
def test_an_interrupted_run_says_where_it_stopped_and_exits_as_a_shell_reports_the_signal(
    signum, name, capsys
):
    from apputil.cli import run
    from training.errors import EXPECTED, Interrupted

    error = Interrupted(signum, 12)
    assert (error.signal_number, error.step) == (signum, 12)
    message = f"stopped by {name} at step 12, checkpointed; run the same command to resume"
    assert str(error) == message

    def body():
        raise error

    assert run("prog", body, EXPECTED) == 128 + int(signum)  # 143 and 130
    assert capsys.readouterr().err == f"prog: error: {message}\n"


class _Trainer:
    """The pieces of a trainer `save_checked` reads, around a real model."""

    def __init__(self, scale):
        self.model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        self.model.set_weights([w * 0 + scale for w in self.model.get_weights()])
        self.optimizer = keras.optimizers.SGD()
        self.optimizer.build(self.model.trainable_variables)
        self.task = type("Task", (), {"spec": _Spec()})()
        self.saved = []

    def batches(self, step):
        return np.full((4, 3), 1e30, "float32"), np.zeros(4, "int32")

    def predict(self, x):
        return self.model(x)

    def save(self, step):
        self.saved.append(step)


class _Spec:
    head, num_outputs, scored_steps, tolerance = "classification", 2, None, None


@pytest.mark.parametrize(
    "scale, reason",
    [(np.inf, "is not finite or beyond 1.8e"), (np.nan, "is not finite"),
     (1e20, "beyond 1.8e+19"), (1e18, "non-finite loss")],
)  # fmt: skip
def test_nothing_non_finite_or_overflowing_is_checkpointed(scale, reason):
    trainer = _Trainer(scale)
    pattern = f"diverged at step 7: .*{re.escape(reason)}.* \\(step 5\\)"
    with pytest.raises(DivergenceError, match=pattern):
        loop.save_checked(trainer, 7, saved=5)
    assert trainer.saved == []
    healthy = _Trainer(0.5)
    loop.save_checked(healthy, 7, saved=5)
    assert healthy.saved == [7]


class _Counter(keras.layers.Layer):
    """An integer weight (a count), as a model may carry beside its float ones."""

    def build(self, input_shape):
        self.count = self.add_weight(shape=(), dtype="int32", initializer="zeros",
                                     trainable=False, name="count")  # fmt: skip

    def call(self, x):
        return x


class _SmallInputs(_Trainer):
    def batches(self, step):
        return np.ones((4, 3), "float32"), np.zeros(4, "int32")


def test_integer_weights_and_weights_at_the_float32_limit_are_checkpointed():
    """Only float weights have a limit, √max of their dtype, which is itself allowed
    (1.8e19 in float32: its square still fits); an integer weight is never refused."""
    limit = np.sqrt(np.finfo(np.float32).max)
    trainer = _SmallInputs(0.0)
    trainer.model = keras.Sequential([keras.Input((3,)), _Counter(), keras.layers.Dense(2)])
    kernel, bias = trainer.model.layers[-1].weights
    kernel.assign(np.full(kernel.shape, limit, "float32"))
    assert float(np.max(np.abs(kernel.numpy()))) == float(limit)
    assert any(w.dtype == "int32" for w in trainer.model.weights)
    loop.save_checked(trainer, 3, saved=1)
    assert trainer.saved == [3]


def test_a_non_finite_optimizer_variable_is_not_checkpointed():
    trainer = _SmallInputs(0.5)
    trainer.optimizer = keras.optimizers.SGD(momentum=0.9)
    trainer.optimizer.build(trainer.model.trainable_variables)
    (momentum, *_) = [v for v in trainer.optimizer.variables if "momentum" in v.path]
    momentum.assign(np.full(momentum.shape, np.nan, "float32"))
    with pytest.raises(DivergenceError) as caught:
        loop.save_checked(trainer, 7, saved=5)
    assert str(caught.value).startswith(
        f"training diverged at step 7: the optimizer variable {momentum.path} is not finite. "
        "The last checkpoint (step 5) is from before it"
    )
    assert trainer.saved == []


def test_weights_that_overflow_the_next_batchs_loss_are_not_checkpointed():
    trainer = _Trainer(1e18)  # finite weights, but 1e30 inputs make the logits overflow
    with pytest.raises(DivergenceError) as caught:
        loop.save_checked(trainer, 7, saved=5)
    assert str(caught.value).startswith(
        "training diverged at step 7: its weights give a non-finite loss on the next batch. "
        "The last checkpoint (step 5) is from before it"
    )


def test_a_refused_first_checkpoint_says_there_is_none_yet():
    trainer = _Trainer(np.nan)
    with pytest.raises(DivergenceError, match=r"The last checkpoint \(none yet\) is from"):
        loop.save_checked(trainer, 3)
    assert trainer.saved == []


@pytest.mark.slow
def test_a_diverged_run_resumes_from_its_last_good_checkpoint_with_a_new_learning_rate(tmp_path):
    out = tmp_path / "run"
    common = [*TINY, "--optimizer", "sgd", "--checkpoint-every", "1", "--output-dir", str(out)]
    first = subprocess.run(
        [sys.executable, "-m", "training.train", *common, "--steps", "3"], cwd=ROOT, env=_env(),
        capture_output=True, text=True, timeout=limit(180),
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-2000:]
    blown = subprocess.run(
        [sys.executable, "-m", "training.train", *common, "--steps", "40",
         "--learning-rate", "1e38", "--change-on-resume", "learning_rate"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=limit(180),
    )  # fmt: skip
    assert blown.returncode == 2, blown.stderr[-2000:]
    assert "training diverged at step" in blown.stderr and "Traceback" not in blown.stderr
    # Every checkpoint left is finite.
    for path in (out / "checkpoints").glob("ckpt-*.npz"):
        with np.load(path) as arrays:
            assert all(np.isfinite(arrays[k]).all() for k in arrays.files), path
    refused = subprocess.run(
        [sys.executable, "-m", "training.train", *common, "--steps", "6",
         "--learning-rate", "0.05"], cwd=ROOT, env=_env(), capture_output=True, text=True,
        timeout=limit(180),
    )  # fmt: skip
    assert refused.returncode == 2 and "argument `--learning-rate`" in refused.stderr
    resumed = subprocess.run(
        [sys.executable, "-m", "training.train", *common, "--steps", "6",
         "--learning-rate", "0.05", "--change-on-resume", "learning_rate"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=limit(180),
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming with learning_rate 0.05 (was 1e+38)" in resumed.stdout
    record = yaml.safe_load((out / "config.yaml").read_text())
    assert record["learning_rate"] == 0.05
    assert record["resume_changes"][-1]["learning_rate"] == 0.05
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 6 and np.isfinite(metrics["test_loss"])


def test_a_second_run_in_the_same_folder_is_refused_and_a_dead_holder_never_blocks(
    tmp_path, capsys
):
    out = tmp_path / "run"
    out.mkdir()
    lock = FolderLock(out)
    assert lock.acquire()
    try:
        argv = [*TINY, "--steps", "2", "--output-dir", str(out)]
        assert train.main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and f"{out} is in use by process {os.getpid()}" in err[0]
    finally:
        lock.release()
    # A lock file left by a process that died holds no lock.
    (out / ".lock").write_text("999999\n")
    assert train.main([*TINY, "--steps", "2", "--output-dir", str(out)]) == 0


def _npz(path, **arrays):
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)


GOOD = {
    "x_train": np.zeros((4, 28, 28), "uint8"), "y_train": np.zeros(4, "int64"),
    "x_test": np.zeros((2, 28, 28), "uint8"), "y_test": np.zeros(2, "int64"),
}  # fmt: skip


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\x00garbage" * 100, "is not a readable .npz file"),
        ({**GOOD, "x_train": None}, "has no array 'x_train' and 'y_train'"),
        ({**GOOD, "x_train": np.zeros((4, 27, 28), "uint8")}, "have shape (4, 27, 28)"),
        ({**GOOD, "y_train": np.zeros(3, "int64")}, "(3,) train labels for 4 images"),
        ({**GOOD, "y_train": np.full(4, 12)}, "integer labels 0-9"),
        ({**GOOD, "x_train": np.array(["a"] * 4)}, "have shape (4,)"),
    ],
)
def test_garbage_data_files_are_one_line_errors(tmp_path, capsys, content, message):
    path = tmp_path / "mnist.npz"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        _npz(path, **{k: v for k, v in content.items() if v is not None})
    argv = ["--task", "pixel_mnist", "--data-dir", str(tmp_path), "--steps", "1",
            "--output-dir", str(tmp_path / "run")]  # fmt: skip
    assert train.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and message in err[0], err


SEARCH = [*TINY[:-2], "--model", "antisymmetric", "--tuner", "random", "--max-trials", "2",
          "--steps-per-trial", "2", "--validation-fraction", "0.2", "--seed", "0"]  # fmt: skip


def test_a_search_is_continued_only_with_its_own_settings(tmp_path, capsys):
    # One trial a search: the refusals are of the settings, not of what the trials found.
    argv = [*SEARCH, "--max-trials", "1", "--directory", str(tmp_path), "--project-name", "p"]
    assert tune.main(argv) == 0
    record = json.loads((tmp_path / "p" / "search.json").read_text())
    assert record["run"]["units"] == 8 and record["steps_per_trial"] == 2
    capsys.readouterr()
    for change, flag in (
        (["--units", "9"], "--units"),
        (["--steps-per-trial", "3"], "--steps-per-trial"),
        (["--epsilon-values", "0.1"], "--epsilon-values"),
        (["--tuner", "bayesian"], "--tuner"),
        (["--hyperband-max-epochs", "4"], "--hyperband-max-epochs"),
        (["--log-scale"], "--log-scale"),
    ):
        assert tune.main([*argv, *change]) == 2, change
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and f"argument `{flag}`, expected" in err[0], err
        assert "as in" in err[0] and "search.json" in err[0]
    # More trials extend the same search; another project in the same folder is apart.
    assert tune.main([*argv[:-2], "--project-name", "q"]) == 0
    assert (tmp_path / "p" / "trials.csv").exists() and (tmp_path / "q" / "trials.csv").exists()
    assert json.loads((tmp_path / "q" / "best.json").read_text())["project_dir"].endswith("q")


def test_seed_zero_gives_the_same_search_twice(tmp_path):
    values = []
    for name in ("a", "b"):
        assert tune.main([*SEARCH, "--directory", str(tmp_path / name), "--project-name", "p"]) == 0
        trials = sorted((tmp_path / name / "p").glob("trial_*/trial.json"))
        values.append([json.loads(t.read_text())["hyperparameters"]["values"] for t in trials])
    assert values[0] == values[1] and len(values[0]) == 2


def _shared_tfds():
    path = os.environ.get("KERAS_ANTISYM_TFDS_DIR") or ROOT.parent / "shared" / "data" / "tfds"
    return Path(path) if (Path(path) / "mnist").is_dir() else None


@pytest.mark.parametrize("damage", ["metadata", "records"])
def test_a_damaged_tfds_folder_is_a_one_line_error(tmp_path, capsys, damage):
    version = tmp_path / "tfds" / "mnist" / "3.0.1"
    if damage == "metadata":
        version.mkdir(parents=True)
        (version / "dataset_info.json").write_bytes(os.urandom(2000))
    else:
        shared = _shared_tfds()
        if shared is None:
            pytest.skip("needs the prepared MNIST (shared/data/tfds) to damage a copy")
        import shutil

        shutil.copytree(shared / "mnist", tmp_path / "tfds" / "mnist")
        for record in (tmp_path / "tfds" / "mnist").rglob("*.tfrecord*"):
            record.write_bytes(os.urandom(3000))
    argv = ["--task", "pixel_mnist", "--data-dir", str(tmp_path / "tfds"), "--steps", "1",
            "--output-dir", str(tmp_path / "run")]  # fmt: skip
    assert train.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "TFDS data set 'mnist' in" in err[0] and "cannot be read" in err[0]


def _mount_tmpfs(folder, size):
    """A filesystem of `size` at `folder` (root on Linux); False where it cannot be made."""
    folder.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
    )
    return done.returncode == 0


def _fill(folder):
    """Writes one file into `folder` until its filesystem is full."""
    with open(folder / "filler", "wb") as handle:
        with contextlib.suppress(OSError):
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_a_full_disk_at_a_checkpoint_is_one_line_keeps_the_last_and_the_rerun_resumes(
    tmp_path, backend
):
    """A real full filesystem (a small tmpfs), filled after the first checkpoint."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "8m"):
        pytest.skip("cannot mount a tmpfs here (needs root on Linux)")
    try:
        out = disk / "run"
        argv = [*TINY, "--steps", "100000", "--checkpoint-every", "20", "--log-every", "20",
                "--output-dir", str(out)]  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, "-m", "training.train", *argv], cwd=ROOT, env=_env(backend),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            states = [out / "checkpoints" / name for name in ("checkpoint", "checkpoint.json")]
            deadline = time.monotonic() + limit(120)
            while not any(state.exists() for state in states):  # the first one is complete
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.05)
            _fill(disk)
            _, err = proc.communicate(timeout=limit(120))
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == 1, err[-2000:]
        (line,) = err.strip().splitlines()
        assert re.fullmatch(
            rf"python -m training\.train: error: cannot write checkpoint "
            rf"{re.escape(str(out / 'checkpoints'))}/ckpt-\d+(\.npz)? \(No space left on "
            rf"device\); the last complete checkpoint is kept: free space and run the same "
            rf"command to resume",
            line,
        ), line
        failed = int(re.search(r"ckpt-(\d+)", line)[1])
        names = sorted(os.listdir(out / "checkpoints"))
        assert not [name for name in names if "temp" in name or "partial" in name], names
        (disk / "filler").unlink()
        rerun = subprocess.run(
            [sys.executable, "-m", "training.train", *argv[:-6], "--steps", str(failed + 5),
             "--checkpoint-every", "100", "--output-dir", str(out)],
            cwd=ROOT, env=_env(backend), capture_output=True, text=True, timeout=limit(120),
        )  # fmt: skip
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        kept = failed - 20  # the checkpoint before the one the full disk refused
        resumed = rf"^resumed from \S+ckpt-{kept}(\.npz)? at step {kept}$"
        assert re.search(resumed, rerun.stdout, re.M), rerun.stdout[-2000:]
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_stop_lost_in_a_finalizer_at_start_up_still_stops_the_run(tmp_path, capsys, monkeypatch):
    """SIGINT whose handler runs inside a `gc` callback (as JAX's is, while a run starts):
    Python's KeyboardInterrupt would be printed as "Exception ignored" and the run would
    train to its end; the run keeps the stop, stops after its first step, checkpointed."""
    import gc
    import threading

    from training.run import experiment

    setting_up, sent = [], []
    original = experiment.train_and_evaluate

    def train_and_evaluate(*args, **kwargs):
        setting_up.append(True)
        return original(*args, **kwargs)

    def send_once(phase, info):
        # Once the run is being set up (its model built, its data read), before it trains;
        # in the main thread, where the handler then runs inside this callback.
        if setting_up and not sent and threading.current_thread() is threading.main_thread():
            sent.append(phase)
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(experiment, "train_and_evaluate", train_and_evaluate)
    out = tmp_path / "run"
    before = signal.getsignal(signal.SIGINT)
    gc.callbacks.append(send_once)
    try:
        status = train.main([*TINY, "--steps", "50", "--log-every", "10", "--output-dir",
                             str(out)])  # fmt: skip
    finally:
        gc.callbacks.remove(send_once)
    err = capsys.readouterr().err
    assert sent and status == 130, err[-2000:]
    assert "Exception ignored" not in err and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines() == [
        "python -m training.train: error: stopped by SIGINT at step 1, checkpointed; run the "
        "same command to resume"
    ]
    saved = {name.split(".")[0] for name in os.listdir(out / "checkpoints")}
    assert saved - {"checkpoint"} == {"ckpt-1"} and not (out / "metrics.json").exists()
    assert signal.getsignal(signal.SIGINT) is before  # the handlers are given back


def _start_up_stop(tmp_path, number, delay):
    proc, _ = _endless_run(tmp_path / f"run-{number}-{delay}", stdout=subprocess.DEVNULL)
    try:
        time.sleep(delay)
        proc.send_signal(number)
        _, err = proc.communicate(timeout=limit(120))
    finally:
        proc.kill()
    return proc.returncode, err


# Seconds after the start at which a stop arrives: importing Keras, reading the data,
# building and compiling the model, the first steps. (In the interpreter's own start,
# before the command's first line runs, a signal has its default action: SIGTERM kills.)
START_UP_MOMENTS = (1.0, 1.5, 2.0, 3.0, 4.0, 5.5, 7.0, 9.0)


@pytest.mark.slow
@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_at_any_moment_of_the_start_up_ends_the_run_with_one_line(tmp_path, number):
    name = signal.Signals(number).name
    for delay in START_UP_MOMENTS:  # one process at a time
        status, err = _start_up_stop(tmp_path, number, delay)
        lines = err.strip().splitlines()
        assert status == 128 + number and "Traceback" not in err, (delay, err[-2000:])
        assert len(lines) == 1 and lines[0].startswith(
            f"python -m training.train: error: stopped by {name} "
        ), (delay, err[-2000:])
