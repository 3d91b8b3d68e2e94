"""Real tf.distribute strategies: 2 logical CPUs, and 2 worker processes on 127.0.0.1.

Each run is a subprocess (the CPU split and TF_CONFIG must be set before
TensorFlow starts), bounded by a timeout, compared with a single-device run
on the same data.
"""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMON = [
    "--task",
    "digits",
    "--units",
    "16",
    "--batch-size",
    "32",
    "--steps",
    "25",
    "--log-every",
    "5",
    "--checkpoint-every",
    "25",
    "--learning-rate",
    "0.02",
]
TIMEOUT = 240


def _env(**extra):
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", **extra}


def _train(output_dir, *extra, env=None):
    proc = subprocess.run(
        [sys.executable, "-m", "training.train", *COMMON, "--output-dir", str(output_dir), *extra],
        cwd=ROOT,
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def _losses(stdout):
    return [float(m) for m in re.findall(r"^step \d+/\d+ loss ([0-9.]+)", stdout, re.M)]


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    output = tmp_path_factory.mktemp("single")
    stdout = _train(output, "--strategy", "default")
    return output, _losses(stdout), json.loads((output / "metrics.json").read_text())


def _assert_same_training(output, losses, single_device):
    single_dir, single_losses, single_metrics = single_device
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["replicas"] == 2 and metrics["steps"] == 25
    np.testing.assert_allclose(losses, single_losses, rtol=1e-4)
    assert abs(metrics["test_loss"] - single_metrics["test_loss"]) < 1e-4
    single = keras.saving.load_model(single_dir / "model.keras").get_weights()
    distributed = keras.saving.load_model(output / "model.keras").get_weights()
    for a, b in zip(distributed, single, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_mirrored_strategy_on_two_logical_cpus(tmp_path, single_device):
    stdout = _train(tmp_path, "--strategy", "mirrored", "--cpu-devices", "2")
    config = (tmp_path / "config.yaml").read_text()
    assert "strategy_class: MirroredStrategy" in config and "replicas: 2" in config
    _assert_same_training(tmp_path, _losses(stdout), single_device)


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def test_multi_worker_mirrored_strategy_with_two_processes(tmp_path, single_device):
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    procs = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "training.train",
                    *COMMON,
                    "--output-dir",
                    str(tmp_path),
                    "--strategy",
                    "multi_worker",
                ],
                cwd=ROOT,
                env=_env(TF_CONFIG=tf_config),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=TIMEOUT)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-3000:]
    fingerprints = [
        re.search(r"\[worker(\d)\] weights_sha256 (\w+)", out).groups() for out in outputs
    ]
    assert {f[0] for f in fingerprints} == {"0", "1"}
    assert fingerprints[0][1] == fingerprints[1][1], "workers hold different weights"
    config = (tmp_path / "config.yaml").read_text()
    assert "strategy_class: MultiWorkerMirroredStrategy" in config
    _assert_same_training(tmp_path, _losses(outputs[0]), single_device)
