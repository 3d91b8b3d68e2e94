"""Smoke test of the benchmark suite on tiny shapes: it runs and writes its results."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.run import QUICK, hoist_models, random_batch
from benchmarks.tables import FUSED_LAYERS, LAYERS
from tests.limits import limit

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_benchmark_runs_on_tiny_shapes(tmp_path):
    env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "CUDA_VISIBLE_DEVICES": "",
        "KERAS_BACKEND": "tensorflow",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--output", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=limit(600),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    layers = set(LAYERS)
    for entry in results["training"]:
        assert set(entry["times"]) == layers
        for timing in entry["times"].values():
            assert 0 < timing["min"] <= timing["median"] <= timing["max"]
            assert timing["repeats"] >= 2
        assert entry["floor"]["median"] > 0
    assert {f"{name}|saved_model" for name in layers} <= set(results["inference"][0]["times"])
    assert {f"{name}|keras_loop" for name in FUSED_LAYERS} <= set(results["inference"][0]["times"])
    assert "AntisymmetricRNN inference B1 T20: own loop/Keras' loop" in results["ratios"]
    assert set(results["memory"]["layers"]) == layers
    assert set(results["backends"]["jax"]["training"][0]["times"]) == layers
    assert results["end_to_end"]["train_examples_per_second"] > 0
    assert "AntisymmetricRNN jit=True/jit=False" in results["ratios"]
    assert set(results["hoist"]["times"]) == {
        "SimpleRNN",
        "AntisymmetricRNN|hoist=False",
        "AntisymmetricRNN|hoist=True",
        "GatedAntisymmetricRNN|hoist=False",
        "GatedAntisymmetricRNN|hoist=True",
    }
    assert results["hoist"]["features"] >= 8  # wide enough for the layers to hoist
    assert "| training step (s) |" in (tmp_path / "results.md").read_text()


def test_hoist_section_switches_the_path_it_measures(monkeypatch):
    """Each `hoist=True` model projects its inputs before the loop; each `hoist=False` one not."""
    from keras_antisym import AntisymmetricCell

    hoisted = set()
    original = AntisymmetricCell.project_inputs

    def spy(cell, sequences):
        hoisted.add(id(cell))
        return original(cell, sequences)

    monkeypatch.setattr(AntisymmetricCell, "project_inputs", spy)
    batch, steps, features, _ = QUICK["hoist_shape"]
    x, y = random_batch(batch, steps, features)
    models = hoist_models(QUICK)
    for model in models.values():
        model.train_on_batch(x, y)  # traces the step, where the path is chosen
    paths = {
        name: id(model.layers[0].cell) in hoisted for name, model in models.items() if "|" in name
    }
    assert paths == {
        "AntisymmetricRNN|hoist=False": False,
        "AntisymmetricRNN|hoist=True": True,
        "GatedAntisymmetricRNN|hoist=False": False,
        "GatedAntisymmetricRNN|hoist=True": True,
    }


def _run_quick(module, output):
    """`python -m module --quick --output output` on TensorFlow, which must succeed."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow"}
    proc = subprocess.run(
        [sys.executable, "-m", module, "--quick", "--output", str(output)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit(600),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_serving_stream_benchmark_times_both_updates_over_rest_and_grpc_and_alone(tmp_path):
    _run_quick("benchmarks.serving_stream", tmp_path)
    results = json.loads((tmp_path / "serving_stream.json").read_text())
    (width,) = results["widths"]
    assert width["shape"]["features"] == 1 and width["shape"]["steps"] == 100
    for where in ("rest", "grpc", "in_process"):
        latency = width[where]["latency"]
        for kind in ("whole", "stream"):
            stats = latency[kind]
            assert 0 < stats["min"] <= stats["p50"] <= stats["p99"] <= stats["max"]
            assert stats["repeats"] == 20  # the first update of each block is left out
        ratio = latency["whole"]["median"] / latency["stream"]["median"]
        assert width[where]["ratio_of_medians"] == pytest.approx(ratio)
    assert "streaming is" in (tmp_path / "serving_stream.md").read_text()


def test_per_step_heads_benchmark_times_both_heads_in_both_runtimes(tmp_path):
    _run_quick("benchmarks.per_step_heads", tmp_path)
    results = json.loads((tmp_path / "per_step_heads.json").read_text())["results"]
    assert [result["steps"] for result in results] == [20, 80]
    for result in results:
        times = result["times"]
        for runtime in ("litert", "onnx"):
            every, last = times[f"{runtime}, every step"], times[f"{runtime}, last step"]
            assert every["repeats"] == last["repeats"] == 3
            assert result["ratios"][runtime] == pytest.approx(every["median"] / last["median"])
    lines = (tmp_path / "per_step_heads.md").read_text().splitlines()
    assert lines[0].startswith("| T | runtime |") and len(lines) == 2 + 2 * 2
