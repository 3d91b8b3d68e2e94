"""The training CLI: outputs, learning, configs, bad flags, kill-and-resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow_datasets as tfds
import yaml

from benchmarks import reference
from tests.limits import limit
from training import train
from training.backends.launch_config import LaunchConfig
from training.config import RunConfig
from training.run import experiment
from training.tasks.catalog import get_task
from training.tasks.models import build_model

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "training" / "paper" / "configs").glob("*.yaml"))
OUTPUT_FILES = ("config.yaml", "metrics.json", "model.keras", "checkpoints/checkpoint")


def _env(backend="tensorflow"):
    return {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "CUDA_VISIBLE_DEVICES": "",
        "KERAS_BACKEND": backend,
    }


CLI_LIMIT = limit(240)


def _run_cli(args, timeout=CLI_LIMIT, backend="tensorflow"):
    return subprocess.run(
        [sys.executable, "-m", "training.train", *args],
        cwd=ROOT,
        env=_env(backend),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("model", ["antisymmetric", "gated", "ablation", "lstm"])
def test_each_model_learns_on_mock_data_and_writes_every_output(tmp_path, model):
    logs = []
    with tfds.testing.mock_data(num_examples=16):
        metrics = _run_in_process(
            train.build_parser().parse_args(
                [
                    "--task",
                    "noise_padded_mnist",
                    "--timesteps",
                    "28",
                    "--model",
                    model,
                    "--units",
                    "16",
                    "--epsilon",
                    "0.5",
                    "--batch-size",
                    "16",
                    "--steps",
                    "40",
                    "--learning-rate",
                    "0.03",
                    "--log-every",
                    "10",
                    "--checkpoint-every",
                    "20",
                    "--output-dir",
                    str(tmp_path),
                    "--strategy",
                    "default",
                ]
            ),
            log=logs.append,
        )
    losses = [float(line.split()[3]) for line in logs if line.startswith("step ")]
    assert len(losses) == 4 and losses[-1] < 0.7 * losses[0], losses
    for name in OUTPUT_FILES:
        assert (tmp_path / name).is_file(), name
    assert list((tmp_path / "logs").iterdir()), "no TensorBoard events"
    written = json.loads((tmp_path / "metrics.json").read_text())
    for key in ("test_accuracy", "test_loss", "steps", "examples_per_second", "wall_time_seconds"):
        assert key in written
    assert written["steps"] == 40 and written == metrics
    assert (written["task"], written["model"]) == ("noise_padded_mnist", model)
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert config["model"] == model and config["timesteps"] == 28
    assert (config["features"], config["output_dir"]) == (28, str(tmp_path))
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert loaded.count_params() == written["parameters"]


def test_real_mnist_gives_a_clear_learning_signal(tmp_path, shared_tfds):
    """Row-by-row real MNIST (T=28) for 150 steps: far above chance (10%). The run reads
    the first 9,600 training digits and 2,000 test digits of the shared MNIST, written as
    `keras.datasets`' .npz (the same loading code's other source), not all 60,000."""
    arrays = {}
    for split, count in (("train", 9600), ("test", 2000)):
        images, labels = tfds.as_numpy(tfds.load(
            "mnist", split=f"{split}[:{count}]", as_supervised=True, data_dir=shared_tfds,
            download=False, batch_size=-1,
        ))  # fmt: skip
        arrays[f"x_{split}"], arrays[f"y_{split}"] = images[..., 0], labels
    data = tmp_path / "data"
    data.mkdir()
    np.savez(data / "mnist.npz", **arrays)
    metrics = _run_in_process(
        train.build_parser().parse_args(
            [
                "--task",
                "noise_padded_mnist",
                "--timesteps",
                "28",
                "--model",
                "antisymmetric",
                "--units",
                "64",
                "--epsilon",
                "0.1",
                "--gamma",
                "0.01",
                "--batch-size",
                "64",
                "--steps",
                "150",
                "--learning-rate",
                "0.01",
                "--data-dir",
                str(data),
                "--output-dir",
                str(tmp_path / "run"),
                "--strategy",
                "default",
                "--log-every",
                "50",
            ]
        ),
        log=lambda line: None,
    )
    assert metrics["test_accuracy"] > 0.6, metrics


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_paper_configs_resolve_to_the_paper_models(config):
    args = train.build_parser()
    parsed = train.options.parse_with_config(args, ["--config", str(config)])
    RunConfig.from_namespace(parsed).validate()
    expected = {
        ("lstm", "pixel_mnist"): 67_850,
        ("lstm", "permuted_mnist"): 67_850,
        ("antisymmetric", "pixel_mnist"): 9_674,
        ("gated", "pixel_mnist"): 9_930,
        ("antisymmetric", "permuted_mnist"): 9_674,
        ("gated", "permuted_mnist"): 9_930,
        ("lstm", "pixel_cifar10"): 68_874,
        ("ablation", "pixel_cifar10"): 41_954,
        ("antisymmetric", "pixel_cifar10"): 36_234,
        ("gated", "pixel_cifar10"): 37_258,
        # m=1, n=128: 2·128 input + 128² free recurrent + 2·128 bias + 1,290 head.
        ("ablation", "pixel_mnist"): 18_186,
    }
    task = parsed.task.replace("noise_padded_", "pixel_")
    spec = get_task(parsed.task, timesteps=parsed.timesteps).spec
    model = build_model(spec, parsed.model, units=parsed.units)
    blocks = {"lstm": 4, "gated": 2, "ablation": 2, "antisymmetric": 1}[parsed.model]
    if parsed.task == "noise_padded_cifar10":  # m = 96 instead of 3: the input kernel grows
        expected_count = expected[(parsed.model, task)] + 93 * blocks * parsed.units
    elif parsed.task == "noise_padded_mnist":  # m = 28 rows of pixels instead of 1 pixel
        expected_count = expected[(parsed.model, task)] + 27 * blocks * parsed.units
    else:
        expected_count = expected[(parsed.model, task)]
    assert model.count_params() == expected_count
    assert parsed.batch_size == 128
    if "mnist" in parsed.task:  # the measured configs (docs/reproduction.md)
        assert parsed.steps == 6000 and parsed.optimizer == "adam" and parsed.clipnorm == 1.0
    else:  # the paper's CIFAR-10 settings, not run here
        assert parsed.steps == (10_000 if parsed.task.startswith("noise_padded") else 50_000)


def test_command_line_overrides_config(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("units: 32\nlearning-rate: 0.5\n")
    parsed = train.options.parse_with_config(
        train.build_parser(), ["--config", str(config), "--units", "8"]
    )
    assert parsed.units == 8 and parsed.learning_rate == 0.5


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "mnist_pixels"], "argument --task: invalid choice"),
        (["--epsilon", "0"], "argument `--epsilon`, expected a positive float"),
        (["--epsilon", "-1"], "argument `--epsilon`, expected a positive float"),
        (["--gamma", "-0.1"], "argument `--gamma`"),
        (["--data-dir", "/nonexistent/tfds"], "argument `--data-dir`"),
        (["--task", "pixel_cifar10", "--data-dir", "{empty}"], "is not prepared in"),
        (["--config", "/nonexistent.yaml"], "argument --config: no such file"),
        (
            ["--batch-size", "3", "--strategy", "mirrored", "--cpu-devices", "2"],
            "a multiple of the 2 replicas",
        ),
    ],
)
def test_bad_flags_exit_with_one_line(tmp_path, args, message):
    args = [a.replace("{empty}", str(tmp_path)) for a in args]
    argv = [*args, "--output-dir", str(tmp_path / "out"), "--steps", "1"]
    proc = _run_cli(argv, timeout=limit(120))
    assert proc.returncode == 2, proc.stderr[-2000:]
    # One line and nothing else: TensorFlow's native start-up lines are silenced too.
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr[-2000:]
    assert lines[0].startswith("python -m training.train: error: ")


def _run_in_process(args, log=print):
    config = RunConfig.from_namespace(args).validate()
    return experiment.train_and_evaluate(config, args.output_dir, log=log)


def _weights(path):
    return keras.saving.load_model(path).get_weights()


# The checkpoint index each backend's trainer writes last, after a complete save.
CHECKPOINT_INDEX = {
    "tensorflow": "checkpoint",
    "jax": "checkpoint.json",
    "torch": "checkpoint.json",
}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_kill_and_resume_finishes_with_nothing_lost(tmp_path, backend):
    common = [
        "--task",
        "digits",
        "--units",
        "32",
        "--batch-size",
        "32",
        "--steps",
        "300",
        "--checkpoint-every",
        "10",
        "--log-every",
        "10",
        "--strategy",
        "default",
    ]
    killed_dir = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "training.train", *common, "--output-dir", str(killed_dir)],
        cwd=ROOT,
        env=_env(backend),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    index = killed_dir / "checkpoints" / CHECKPOINT_INDEX[backend]
    deadline = time.monotonic() + limit(180)
    while not index.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert index.exists(), "no checkpoint before the deadline"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=limit(30))
    assert not (killed_dir / "metrics.json").exists(), "the run finished before the kill"

    resumed = _run_cli([*common, "--output-dir", str(killed_dir)], backend=backend)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout
    metrics = json.loads((killed_dir / "metrics.json").read_text())
    assert metrics["steps"] == 300 and 10 <= metrics["resumed_from_step"] < 300
    assert metrics["steps_this_run"] == 300 - metrics["resumed_from_step"]

    whole_dir = tmp_path / "whole"
    assert _run_cli([*common, "--output-dir", str(whole_dir)], backend=backend).returncode == 0
    whole = json.loads((whole_dir / "metrics.json").read_text())
    # The same batches from the restored step on: the same model.
    for a, b in zip(
        _weights(killed_dir / "model.keras"), _weights(whole_dir / "model.keras"), strict=True
    ):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert abs(metrics["test_loss"] - whole["test_loss"]) < 1e-4

    again = _run_cli([*common, "--output-dir", str(killed_dir)], backend=backend)  # finished
    assert (
        again.returncode == 0
        and json.loads((killed_dir / "metrics.json").read_text())["steps"] == 300
    )


def test_diagnostics_flag_logs_stability_measures(tmp_path):
    logs = []
    metrics = _run_in_process(
        train.build_parser().parse_args(
            [
                "--units",
                "16",
                "--steps",
                "20",
                "--diagnostics",
                "10",
                "--log-every",
                "10",
                "--gamma",
                "0.05",
                "--output-dir",
                str(tmp_path),
                "--strategy",
                "default",
            ]
        ),
        log=logs.append,
    )
    assert sum(line.startswith("step ") and " diagnostics " in line for line in logs) == 2
    values = metrics["diagnostics"]
    # Real parts of the eigenvalues of W - Wᵀ - γI are -γ (the paper's diffusion).
    assert abs(values["stability/antisymmetric/m_eig_real_max"] + 0.05) < 1e-5
    # The rest, recomputed independently from the final weights (the diagnostics ran at
    # the last step) on the same probe: the first 4 test sequences.
    expected = _reference_diagnostics(tmp_path / "model.keras", epsilon=0.1, gamma=0.05)
    for name, value in expected.items():
        assert values[name] == pytest.approx(value, rel=1e-3), name


def _reference_diagnostics(model_path, epsilon, gamma, probe=4):
    """Euler margin, end-to-end Jacobian and gradient norm from NumPy / a GradientTape."""
    import tensorflow as tf

    from training.tasks import catalog as tasks

    model = keras.saving.load_model(model_path)
    task = tasks.get_task("digits")
    test_x, test_y = task.examples("test", None)
    x, y = (np.asarray(a) for a in task.make_batch(test_x[:probe], test_y[:probe], (0, 0)))
    layer = model.get_layer("antisymmetric")
    kernel, packed, bias = (np.asarray(w, "float64") for w in layer.get_weights())
    units = kernel.shape[1]
    m = reference.transition_matrix(packed, units, gamma)
    outputs, _ = reference.run([kernel, packed, bias], x.astype("float64"), units=units,
                               epsilon=epsilon, gamma=gamma)  # fmt: skip
    margins, eig_abs, sv_max = [], [], []
    for b in range(probe):
        jacobian, h = np.eye(units), np.zeros(units)
        for t in range(x.shape[1]):
            slope = 1 - np.tanh(m @ h + kernel.T @ x[b, t] + bias) ** 2
            step = np.eye(units) + epsilon * slope[:, None] * m
            jacobian, h = step @ jacobian, outputs[b, t]
        eig_abs.append(np.abs(np.linalg.eigvals(jacobian)))
        sv_max.append(np.linalg.svd(jacobian, compute_uv=False).max())
        margins.append(np.abs(np.linalg.eigvals(step - np.eye(units)) + 1).max())
    with tf.GradientTape() as tape:
        logits = model(x, training=False)
        loss = tf.reduce_mean(
            tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
        )
    grads = tape.gradient(loss, layer.trainable_variables)
    return {
        "stability/antisymmetric/euler_margin": max(margins),
        "stability/antisymmetric/e2e_eig_abs_mean": float(np.mean(eig_abs)),
        "stability/antisymmetric/e2e_sv_max": float(np.max(sv_max)),
        "stability/grad_norm/antisymmetric": float(
            np.sqrt(sum(np.sum(np.square(g.numpy())) for g in grads))
        ),
    }


@pytest.mark.slow
def test_resume_refuses_other_settings_and_rewrites_nothing(tmp_path):
    out = tmp_path / "run"
    common = ["--task", "digits", "--units", "8", "--batch-size", "32", "--output-dir", str(out)]
    assert _run_cli([*common, "--steps", "20"]).returncode == 0
    config = (out / "config.yaml").read_text()
    changed = _run_cli([*common, "--steps", "40", "--learning-rate", "0.5"])
    assert changed.returncode == 2 and "Traceback" not in changed.stderr
    assert "argument `--learning-rate`, expected 0.01 as in" in changed.stderr
    # A model of another shape, or another backend's checkpoints: refused before the restore.
    wider = _run_cli([*common, "--steps", "40", "--units", "16"])
    assert wider.returncode == 2 and "Traceback" not in wider.stderr, wider.stderr[-2000:]
    assert "argument `--units`, expected 8 as in" in wider.stderr
    other_backend = _run_cli([*common, "--steps", "40"], backend="jax")
    assert other_backend.returncode == 2, other_backend.stderr[-2000:]
    assert "`KERAS_BACKEND`, expected 'tensorflow' as in" in other_backend.stderr
    fewer = _run_cli([*common, "--steps", "10"])
    assert fewer.returncode == 2 and "expected at least the 20 steps" in fewer.stderr
    assert (out / "config.yaml").read_text() == config
    extended = _run_cli([*common, "--steps", "30", "--log-every", "5"])  # more steps: allowed
    assert extended.returncode == 0, extended.stderr[-2000:]
    native = ("I0000", "W0000", "E0000", "WARNING: All log messages before absl")
    assert not [line for line in extended.stderr.splitlines() if line.startswith(native)]
    assert extended.stdout.splitlines()[0] == "training on tensorflow on cpu"
    extended_metrics = json.loads((out / "metrics.json").read_text())
    assert extended_metrics["steps"] == 30
    again = _run_cli([*common, "--steps", "30"])  # finished: evaluates, trains nothing
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.splitlines()[-1].endswith(f"steps 30 (no new steps) -> {out}")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps_this_run"] == 0 and metrics["examples_per_second"] is None
    assert metrics["final_train_loss"] == extended_metrics["final_train_loss"] is not None


def test_weights_fingerprint_changes_with_any_weight():
    model = build_model(get_task("digits").spec, "antisymmetric", units=4, seed=0)
    same = build_model(get_task("digits").spec, "antisymmetric", units=4, seed=0)
    assert experiment.weights_fingerprint(model) == experiment.weights_fingerprint(same)
    weights = model.get_weights()
    for index in range(len(weights)):
        changed = [w.copy() for w in weights]
        flat = changed[index].reshape(-1)
        flat[-1] = np.nextafter(flat[-1], np.float32(np.inf))  # one ulp in the last entry
        same.set_weights(changed)
        assert experiment.weights_fingerprint(same) != experiment.weights_fingerprint(model), index


@pytest.mark.parametrize(
    "error, status",
    [(None, 0), (OSError("disk full"), 1)],
)
def test_main_hands_the_validated_run_to_the_processes_then_the_experiment(
    monkeypatch, tmp_path, capsys, error, status
):
    """In process, with the backend's start, the experiment and the cluster's exit as
    stand-ins: the launch settings go to the backend, the run's to the experiment."""
    from training.backends import select
    from training.backends.cluster import Cluster

    calls = []

    def start(launch, cluster):
        calls.append(("start", launch, cluster.prog))
        return "backend"

    monkeypatch.setattr(select, "start", start)
    monkeypatch.setattr(Cluster, "finish", lambda _, code: calls.append(("finish", code)) or code)

    def train_and_evaluate(config, output_dir, backend):
        calls.append(("train", config.model.units, config.loop.steps, output_dir, backend))
        if error:
            raise error

    monkeypatch.setattr(experiment, "train_and_evaluate", train_and_evaluate)
    argv = ["--units", "8", "--steps", "3", "--cpu-devices", "2", "--output-dir", str(tmp_path),
            "--coordinator", "127.0.0.1:1234", "--num-processes", "2", "--process-id", "1",
            "--connect-timeout", "7", "--heartbeat-timeout", "9"]  # fmt: skip
    assert train.main(argv) == status
    launch = LaunchConfig(cpu_devices=2, coordinator="127.0.0.1:1234", num_processes=2,
                          process_id=1, connect_timeout=7, heartbeat_timeout=9)  # fmt: skip
    assert calls == [
        ("start", launch, "python -m training.train"),
        ("train", 8, 3, str(tmp_path), "backend"),
        ("finish", status),
    ]
    expected = "" if error is None else "python -m training.train: error: disk full\n"
    assert capsys.readouterr().err == expected


@pytest.mark.parametrize("argv", [["--units", "0"], ["--connect-timeout", "0"]])
def test_an_invalid_run_is_refused_before_anything_starts(monkeypatch, capsys, argv):
    from training.backends import select

    monkeypatch.setattr(select, "start", lambda *args: pytest.fail("started"))
    assert train.main(argv) == 2
    flag, value = argv
    expected = "a positive integer"
    assert capsys.readouterr().err == (
        f"python -m training.train: error: Received an invalid value for argument `{flag}`, "
        f"expected {expected}, got {value}.\n"
    )


def test_the_output_folder_flag_defaults_to_none_and_says_where_runs_go(capsys, monkeypatch):
    parser = train.build_parser()
    assert parser.parse_args([]).output_dir is None
    monkeypatch.setenv("COLUMNS", "200")
    text = " ".join(parser.format_help().split())
    assert "--output-dir OUTPUT_DIR default: runs/<task>-<model>" in text
    assert parser.prog == "python -m training.train"
    assert parser.description == train.__doc__.split("\n\n")[0]


def test_the_machine_is_described_alike_on_every_backend(monkeypatch):
    """With stand-ins for the accelerators this machine lacks."""
    import types

    import tensorflow as tf

    from training.backends.distributions import JaxBackend, TorchBackend
    from training.backends.strategies import TensorFlowBackend

    gpus = ["GPU:0", "GPU:1"]
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind: gpus)
    monkeypatch.setattr(
        tf.config.experimental, "get_device_details", lambda gpu: {"device_name": "NVIDIA H200"}
    )
    tensorflow = TensorFlowBackend(tf.distribute.get_strategy())
    assert tensorflow.describe_device() == "tensorflow on 2 x NVIDIA H200 (gpu)"
    monkeypatch.setattr(tf.config.experimental, "get_device_details", lambda gpu: {})
    assert tensorflow.describe_device() == "tensorflow on 2 x GPU (gpu)"

    cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 3,
                                 get_device_name=lambda i: f"H100 #{i}")  # fmt: skip
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert TorchBackend().describe_device() == "torch on 3 x H100 #0 (gpu)"
    cuda.is_available = lambda: False
    assert TorchBackend().describe_device() == "torch on cpu"

    devices = [types.SimpleNamespace(device_kind="cpu", platform="cpu"),
               types.SimpleNamespace(device_kind="TPU v5 lite", platform="tpu")] * 2  # fmt: skip
    jax = types.SimpleNamespace(devices=lambda: devices, process_index=lambda: 0,
                                process_count=lambda: 1)  # fmt: skip
    monkeypatch.setitem(sys.modules, "jax", jax)
    assert JaxBackend().describe_device() == "jax on 2 x TPU v5 lite (tpu)"


def test_a_run_s_trainer_has_its_seeded_model_and_compiles_when_asked(tmp_path):
    from training.backends.strategies import TensorFlowBackend

    task = get_task("digits")
    settings = dict(units=4, epsilon=0.5, gamma=0.25, sigma_w=2.0)
    config = RunConfig.of(task="digits", model="gated", batch_size=8, seed=5, jit_compile=True,
                          **settings).validate()  # fmt: skip
    x, y = task.examples("train")
    trainer = experiment.build_trainer(config, task, (x[:16], y[:16]), TensorFlowBackend(),
                                       checkpoint_dir=str(tmp_path))  # fmt: skip
    assert trainer.jit_compile is True
    expected = build_model(task.spec, "gated", seed=5, **settings)
    for got, want in zip(trainer.model.get_weights(), expected.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_run_s_splits_are_read_from_its_data_with_its_validation_fraction(tmp_path):
    """The train split leaves out the validation examples; the test split is read last."""
    read = []

    class StandInTask:
        def examples(self, split, data_dir=None, validation_fraction=0.0):
            read.append((split, data_dir, validation_fraction))
            return split, data_dir

    config = RunConfig.of(data_dir=str(tmp_path), validation_fraction=0.2)
    splits = experiment.Splits.load(StandInTask(), config)
    assert read == [("train", str(tmp_path), 0.2), ("validation", str(tmp_path), 0.2)]
    assert splits.test == ("test", str(tmp_path))
    assert read[-1] == ("test", str(tmp_path), 0.0)
    read.clear()
    without = experiment.Splits.load(StandInTask(), RunConfig.of(data_dir=str(tmp_path)))
    assert without.validation is None and read == [("train", str(tmp_path), 0.0)]
