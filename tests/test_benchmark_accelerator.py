"""Smoke test of the accelerator benchmark (JAX and PyTorch backends) on tiny shapes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import accelerator
from benchmarks.accelerator import KERNEL_LAYERS
from benchmarks.tables import LAYERS
from tests.limits import limit

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_accelerator_benchmark_runs_on_tiny_shapes(tmp_path):
    env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "CUDA_VISIBLE_DEVICES": "",
        "KERAS_ANTISYM_KERNEL_INTERPRET": "1",  # the kernel section, interpreted on this CPU
    }
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.accelerator", "--quick", "--output", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=limit(600),
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
        kernel = results["kernel"]
        if backend == "torch" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            assert kernel == {"skipped": "no CUDA device, and TRITON_INTERPRET is not set"}
            continue
        names = {f"{n}|fused_kernel={f}" for n in KERNEL_LAYERS for f in (True, False)}
        for entry in kernel["training"] + [kernel["inference"]]:
            assert set(entry["times"]) == names
    ratios = accelerator.ratios(json.loads((tmp_path / "accelerator-jax.json").read_text()))
    assert 0 < ratios["AntisymmetricRNN kernel/loop B8 T20 m1 n8"]
    assert 0 < ratios["gated/ungated kernel B8 T20 m1 n8"]
    text = (tmp_path / "accelerator.md").read_text()
    assert "### jax on cpu" in text and "### torch on cpu" in text


@pytest.mark.slow
def test_gpu_kernel_check_runs_on_tiny_shapes(tmp_path):
    """The prepared GPU check (benchmarks/gpu_kernel_check.sh), interpreted on this CPU."""
    env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "CUDA_VISIBLE_DEVICES": "",
        "TRITON_INTERPRET": "1",  # PyTorch's kernel on CPU tensors
        "KERAS_ANTISYM_KERNEL_INTERPRET": "1",  # fused_kernel=True without a CUDA GPU
    }
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_kernel_check", "--quick", "--output", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=limit(600),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for backend in ("jax", "torch"):
        results = json.loads((tmp_path / f"gpu-kernel-{backend}.json").read_text())
        for section in ("numerics", "kernel", "training", "inference"):
            assert results[section] and "error" not in results[section], (backend, section)
        for errors in results["numerics"].values():
            assert max(errors.values()) < 1e-5, (backend, errors)
    text = (tmp_path / "gpu-kernel.txt").read_text()
    assert text.count("training step B4 T12 n8 m1, kernel") == 6  # 3 precisions × 2 backends
    assert "=== jax on cpu ===" in text and "=== torch on cpu ===" in text


@pytest.mark.parametrize(
    "module, flag, value, choices",
    [
        ("benchmarks.accelerator", "--backends", "jax,mxnet", "jax and torch"),
        ("benchmarks.gpu_kernel_check", "--sections", "kernel,speed",
         "numerics, training, inference, kernel"),
    ],
)  # fmt: skip
def test_entry_points_reject_unknown_names_in_a_list(module, flag, value, choices):
    """A usage error (status 2) naming the flag, the value given and the choices."""
    proc = subprocess.run(
        [sys.executable, "-m", module, flag, value],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=limit(120),
    )
    assert proc.returncode == 2
    assert f"`{flag}`" in proc.stderr and repr(value) in proc.stderr
    assert choices in proc.stderr
