"""Smoke test of the accelerator benchmark (JAX and PyTorch backends) on tiny shapes."""

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.run import LAYERS

ROOT = Path(__file__).resolve().parents[1]


def test_accelerator_benchmark_runs_on_tiny_shapes(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.accelerator", "--quick", "--output", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for backend in ("jax", "torch"):
        results = json.loads((tmp_path / f"accelerator-{backend}.json").read_text())
        assert results["environment"]["backend"] == backend
        assert len(results["training"]) == 2
        for entry in results["training"] + results["inference"]:
            assert set(entry["times"]) == set(LAYERS)
            for timing in entry["times"].values():
                assert 0 < timing["min"] <= timing["median"] <= timing["max"]
        assert "GatedAntisymmetricRNN|hoist=True" in results["hoist"]["times"]
        # No accelerator here: memory is recorded as unknown, not as a number.
        assert results["memory"]["layers"] == dict.fromkeys(LAYERS)
    text = (tmp_path / "accelerator.md").read_text()
    assert "### jax on cpu" in text and "### torch on cpu" in text


def test_accelerator_benchmark_rejects_unknown_backend(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.accelerator", "--backends", "jax,mxnet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "`--backends`" in proc.stderr and "'jax,mxnet'" in proc.stderr
