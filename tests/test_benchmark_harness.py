"""The benchmarks' sections time what their configuration names, in process.

Stand-in models record what each section builds (layer, shape, options) and the batches it
runs them on; stand-in timings give each callable a known median. So these tests check the
sections' wiring (shapes, variants, keys, files) against the configuration, quickly; the
slow smoke tests run the real sections in child processes.
"""

import json

import numpy as np
import pytest

from apputil.cli import EXIT_FAILURE
from benchmarks import accelerator, run
from benchmarks.run import QUICK
from benchmarks.tables import LAYERS

TINY = {
    "train_shapes": [(3, 5, 2, 4), (3, 7, 1, 4)],
    "inference_shapes": [(2, 6, 1, 4)],
    "memory_shape": (3, 9, 1, 4),
    "jit_shape": (4, 6, 1, 5),
    "hoist_shape": (2, 5, 9, 3),
    "e2e_shape": (4, 6, 1, 5),
    "e2e_steps": 3,
    "precision_shape": (2, 5, 1, 3),
    "repeats": 3,
    "warmup": 2,
}


class StandInModel:
    """Records its build arguments and the shapes of the batches it is called on."""

    def __init__(self, name, steps, features, units, jit_compile=False, **options):
        self.spec = {"name": name, "steps": steps, "features": features, "units": units}
        self.jit_compile = jit_compile
        self.options = options
        self.calls = []

    def train_on_batch(self, x, y):
        self.calls.append(("train", np.shape(x), np.shape(y)))

    def predict_on_batch(self, x):
        self.calls.append(("predict", np.shape(x)))


class Recorder:
    """Stand-ins for `make_model`, `interleaved` and `floor_time`, patched into a module."""

    def __init__(self):
        self.models = []
        self.timed = []  # (names, repeats, warmup, sync) per interleaved call
        self.floors = []

    def make_model(self, *args, **kwargs):
        model = StandInModel(*args, **kwargs)
        self.models.append(model)
        return model

    def interleaved(self, calls, repeats, warmup, sync=False):
        self.timed.append((list(calls), repeats, warmup, sync))
        for call in calls.values():
            call()
        return {
            name: {
                "median": index + 1.0,
                "min": index + 0.5,
                "max": index + 2.0,
                "repeats": repeats,
            }
            for index, name in enumerate(calls)
        }

    def floor_time(self, batch, steps, units, repeats, warmup):
        self.floors.append((batch, steps, units, repeats, warmup))
        return {"median": 0.25, "min": 0.2, "max": 0.3, "repeats": repeats}


@pytest.fixture
def recorder(monkeypatch):
    made = Recorder()
    for module in (run, accelerator):
        monkeypatch.setattr(module, "make_model", made.make_model)
        monkeypatch.setattr(module, "interleaved", made.interleaved)
    monkeypatch.setattr(run, "floor_time", made.floor_time)
    return made


def _specs(models):
    return [(m.spec["name"], m.spec["steps"], m.spec["features"], m.spec["units"]) for m in models]


# --- benchmarks.run -----------------------------------------------------------------------------


def test_a_training_entry_times_every_layer_and_the_floor_at_its_shape(recorder):
    entry = run.training_entry(TINY, (3, 5, 2, 4), jit_compile=True)
    assert _specs(recorder.models) == [(name, 5, 2, 4) for name in LAYERS]
    assert all(m.jit_compile is True for m in recorder.models)
    assert all(m.calls == [("train", (3, 5, 2), (3,))] for m in recorder.models)
    assert recorder.timed == [(list(LAYERS), 3, 2, False)]
    assert recorder.floors == [(3, 5, 4, 3, 2)]
    assert {k: entry[k] for k in ("batch", "steps", "features", "units", "jit_compile")} == {
        "batch": 3, "steps": 5, "features": 2, "units": 4, "jit_compile": True,
    }  # fmt: skip
    assert entry["floor"]["median"] == 0.25
    assert [entry["times"][name]["median"] for name in LAYERS] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_training_runs_one_entry_per_configured_shape(recorder):
    entries = run.bench_training(TINY, layers=("GRU",))
    assert [(e["batch"], e["steps"], e["features"], e["units"]) for e in entries] == [
        (3, 5, 2, 4), (3, 7, 1, 4),
    ]  # fmt: skip
    assert _specs(recorder.models) == [("GRU", 5, 2, 4), ("GRU", 7, 1, 4)]


def test_the_jit_section_builds_each_layer_both_ways_at_its_shape(recorder):
    result = run.bench_jit(TINY, layers=("SimpleRNN", "GRU"))
    assert [(m.spec["name"], m.jit_compile) for m in recorder.models] == [
        ("SimpleRNN", False), ("SimpleRNN", True), ("GRU", False), ("GRU", True),
    ]  # fmt: skip
    assert {m.spec["steps"] for m in recorder.models} == {6}
    assert all(m.calls == [("train", (4, 6, 1), (4,))] for m in recorder.models)
    assert list(result["times"]) == [
        "SimpleRNN|jit=False", "SimpleRNN|jit=True", "GRU|jit=False", "GRU|jit=True",
    ]  # fmt: skip
    assert (result["batch"], result["steps"], result["features"], result["units"]) == (4, 6, 1, 5)


def test_the_hoist_section_names_its_shape_and_both_choices(recorder):
    result = run.bench_hoist(TINY)
    assert {k: result[k] for k in ("batch", "steps", "features", "units")} == {
        "batch": 2, "steps": 5, "features": 9, "units": 3,
    }  # fmt: skip
    assert [(m.spec["name"], m.options) for m in recorder.models] == [
        ("SimpleRNN", {}),
        ("AntisymmetricRNN", {"hoist_inputs": False}),
        ("AntisymmetricRNN", {"hoist_inputs": True}),
        ("GatedAntisymmetricRNN", {"hoist_inputs": False}),
        ("GatedAntisymmetricRNN", {"hoist_inputs": True}),
    ]
    assert all(m.calls == [("train", (2, 5, 9), (2,))] for m in recorder.models)


def test_inference_times_the_model_and_its_saved_model_in_a_temporary_folder(monkeypatch, tmp_path):
    """Real models (a SavedModel export cannot be stood in for); the export stays out of cwd."""
    timed = []

    def once(calls, repeats, warmup, sync=False):
        outputs = {name: call() for name, call in calls.items()}
        timed.append(outputs)
        return {name: {"median": 1.0} for name in calls}

    monkeypatch.setattr(run, "interleaved", once)
    monkeypatch.chdir(tmp_path)
    config = {**TINY, "inference_shapes": [(2, 4, 1, 3)]}
    results = run.bench_inference(config, layers=("RNN(AntisymmetricCell)",))
    assert list(tmp_path.iterdir()) == []
    assert [(e["batch"], e["steps"], e["features"], e["units"]) for e in results] == [(2, 4, 1, 3)]
    (outputs,) = timed
    direct = outputs["RNN(AntisymmetricCell)"]
    served = outputs["RNN(AntisymmetricCell)|saved_model"]
    assert direct.shape == (2, 10)
    np.testing.assert_allclose(served, direct, rtol=1e-5, atol=1e-6)


def test_end_to_end_runs_the_training_command_on_its_shape(monkeypatch, tmp_path):
    """The bare step is timed on a real model; the training run is stood in for."""
    from training.train import build_parser

    commands = []

    def child(args, timeout, env=None, capture=True):
        commands.append(list(args))
        output = args[args.index("--output-dir") + 1]
        with open(f"{output}/metrics.json", "w") as handle:
            json.dump({"examples_per_second": 30.0}, handle)
        return ""

    monkeypatch.setattr(run, "run_child", child)
    monkeypatch.setattr(
        run, "interleaved", lambda calls, repeats, warmup: {"bare": {"median": 0.5}}
    )
    monkeypatch.chdir(tmp_path)
    result = run.bench_end_to_end(TINY)
    (command,) = commands
    assert command[:2] == ["-m", "training.train"]
    args = build_parser().parse_args(command[2:])  # the training command accepts it as given
    assert (args.task, args.timesteps, args.units, args.batch_size, args.steps) == (
        "digits", 6, 5, 4, 3,
    )  # fmt: skip
    assert (args.optimizer, args.learning_rate, args.strategy) == ("sgd", 0.01, "default")
    assert result["shape"] == [4, 6, 1, 5]
    assert result["bare_examples_per_second"] == 4 / 0.5
    assert result["train_examples_per_second"] == 30.0
    assert result["train_over_bare"] == 30.0 / 8.0


def _stand_in_sections(monkeypatch):
    """`benchmarks.run`'s sections replaced by ones that return their names."""
    called = []

    def section(key):
        def bench(config):
            called.append((key, config))
            return {"section": key}

        return bench

    for name in ("training", "jit", "hoist", "inference", "memory", "end_to_end", "precision"):
        monkeypatch.setattr(run, f"bench_{name}", section(name))
    monkeypatch.setattr(run, "run_backend", lambda backend, quick, output: {"backend": backend})
    monkeypatch.setattr(run, "environment", lambda: {"backend": "tensorflow"})
    monkeypatch.setattr(run, "ratios", lambda results: {})
    monkeypatch.setattr(run, "markdown", lambda results: "the tables\n")
    return called


def test_the_run_writes_every_section_under_its_key(monkeypatch, tmp_path, capsys):
    called = _stand_in_sections(monkeypatch)
    assert run.main(["--quick", "--output", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    for key in ("training", "jit", "hoist", "inference", "memory", "end_to_end", "precision"):
        assert results[key] == {"section": key}
    assert results["backends"] == {"jax": {"backend": "jax"}}
    assert all(config is QUICK for _, config in called)
    assert results["config"] == json.loads(json.dumps(QUICK))
    assert (tmp_path / "results.md").read_text() == "the tables\n"
    assert "the tables" in capsys.readouterr().out


def test_the_run_leaves_out_skipped_sections(monkeypatch, tmp_path):
    called = _stand_in_sections(monkeypatch)
    skip = "jit,hoist,inference,memory,e2e,precision,jax"
    assert run.main(["--quick", "--skip", skip, "--output", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [key for key, _ in called] == ["training"]
    for key in ("jit", "hoist", "inference", "memory", "end_to_end", "precision", "backends"):
        assert key not in results


@pytest.mark.parametrize(
    "only, key",
    [("e2e", "end_to_end"), ("jit", "jit"), ("hoist", "hoist"), ("inference", "inference"),
     ("memory", "memory"), ("precision", "precision")],
)  # fmt: skip
def test_only_reruns_one_section_into_the_existing_results(monkeypatch, tmp_path, only, key):
    called = _stand_in_sections(monkeypatch)
    (tmp_path / "results.json").write_text(json.dumps({"training": "kept", key: "old"}))
    assert run.main(["--quick", "--only", only, "--output", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["training"] == "kept"
    assert results[key] == {"section": key}
    assert called == [(key, QUICK)]


def test_the_run_help_lists_the_sections_it_can_skip(capsys):
    with pytest.raises(SystemExit) as exit_:
        run.main(["--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith("usage: python -m benchmarks.run")
    assert "comma list: jit,hoist,inference,memory,e2e,precision,jax" in text


# --- benchmarks.accelerator ---------------------------------------------------------------------


def test_every_accelerator_section_times_the_configured_shapes(monkeypatch, recorder, tmp_path):
    monkeypatch.setattr(accelerator, "kernel_runs_here", lambda: None)
    monkeypatch.setattr(accelerator, "device_memory", lambda: None)  # a CPU
    monkeypatch.setattr(accelerator, "environment", lambda: {"device": "cpu"})
    results = accelerator.run_child_sections(QUICK, str(tmp_path))
    written = json.loads((tmp_path / "accelerator-tensorflow.json").read_text())
    assert written["training"] == json.loads(json.dumps(results["training"]))
    assert [(e["batch"], e["steps"], e["features"], e["units"]) for e in written["training"]] == [
        tuple(shape) for shape in QUICK["train_shapes"]
    ]
    hoist = written["hoist"]
    assert [hoist[k] for k in ("batch", "steps", "features", "units")] == list(QUICK["hoist_shape"])
    (inference,) = written["inference"]
    assert list(inference["times"]) == list(LAYERS)
    assert written["memory"] == {
        "shape": list(QUICK["memory_shape"]),
        "layers": dict.fromkeys(LAYERS),
    }
    kernel = written["kernel"]
    names = [
        f"{name}|fused_kernel={fused}"
        for name in accelerator.KERNEL_LAYERS
        for fused in (True, False)
    ]
    ((shape, times),) = [(e["shape"], e["times"]) for e in kernel["training"]]
    assert shape == list(accelerator.KERNEL_SHAPES["quick"][0])
    assert list(times) == names
    batch, steps, features, units = QUICK["inference_shapes"][0]
    assert kernel["inference"]["shape"] == [1, steps, features, units]
    assert list(kernel["inference"]["times"]) == names
    # Every model this process built: jit as the backend wants (TensorFlow: off), the
    # kernel models with `fused_kernel`, each run on a batch of its own shape.
    assert all(m.jit_compile is False for m in recorder.models)
    fused = [m for m in recorder.models if "fused_kernel" in m.options]
    assert [(m.spec["name"], m.options["fused_kernel"]) for m in fused] == [
        (name, flag)
        for _ in range(2)
        for name in accelerator.KERNEL_LAYERS
        for flag in (True, False)
    ]
    kb, kt, km, kn = accelerator.KERNEL_SHAPES["quick"][0]
    assert [m.calls for m in fused[:4]] == [[("train", (kb, kt, km), (kb,))]] * 4
    assert [m.calls for m in fused[4:]] == [[("predict", (1, steps, features))]] * 4
    assert all(
        m.spec == {"name": m.spec["name"], "steps": steps, "features": features, "units": units}
        for m in fused[4:]
    )
    predicted = [m for m in recorder.models if m.calls and m.calls[0][0] == "predict"]
    assert [m.calls for m in predicted[: len(LAYERS)]] == [
        [("predict", (batch, steps, features))]
    ] * len(LAYERS)


def test_the_kernel_section_records_why_it_was_skipped(monkeypatch):
    from keras_antisym import kernels

    monkeypatch.setattr(kernels, "cuda_available", lambda: False)
    monkeypatch.setattr(kernels, "INTERPRET", False)
    reason = "no CUDA device, and KERAS_ANTISYM_KERNEL_INTERPRET is not set"
    assert accelerator.kernel_runs_here() == reason
    part = {}
    assert list(accelerator.bench_kernel(QUICK, part)) == []
    assert part == {"skipped": reason}
    monkeypatch.setattr(kernels, "INTERPRET", True)
    assert accelerator.kernel_runs_here() is None  # this backend (TensorFlow) needs no Triton
    monkeypatch.setattr(kernels, "INTERPRET", False)
    monkeypatch.setattr(kernels, "cuda_available", lambda: True)
    assert accelerator.kernel_runs_here() is None


def test_device_memory_reads_the_bytes_in_use_and_the_peak(monkeypatch):
    import jax

    class Device:
        def __init__(self, stats):
            self.stats = stats

        def memory_stats(self):
            return self.stats

    stats = {"bytes_in_use": 5, "peak_bytes_in_use": 9, "largest_alloc_size": 7}
    monkeypatch.setattr(jax, "devices", lambda: [Device(stats)])
    assert accelerator.device_memory() == (5, 9)
    monkeypatch.setattr(jax, "devices", lambda: [Device({"bytes_in_use": 5})])
    assert accelerator.device_memory() is None
    monkeypatch.setattr(jax, "devices", lambda: [Device(None)])  # a CPU
    assert accelerator.device_memory() is None


def test_memory_of_is_the_peak_over_two_steps_beyond_the_built_model(monkeypatch, recorder):
    readings = iter([(100 * 2**20, 120 * 2**20), (110 * 2**20, 356 * 2**20)])
    monkeypatch.setattr(accelerator, "device_memory", lambda: next(readings))
    monkeypatch.setattr(accelerator, "sync_device", lambda: None)
    result = accelerator.memory_of("GRU", 3, 7, 2, 5)
    assert result == {"peak_growth_mib": 256.0, "in_use_before_mib": 100.0}
    (model,) = recorder.models
    assert model.spec == {"name": "GRU", "steps": 7, "features": 2, "units": 5}
    assert model.calls == [("train", (3, 7, 2), (3,))] * 2


def test_the_accelerator_memory_child_prints_its_measurement(monkeypatch, capsys):
    seen = []

    def measure(name, *shape):
        seen.append((name, shape))
        return {"peak_growth_mib": 1.5}

    monkeypatch.setattr(accelerator, "memory_of", measure)
    argv = ["--memory-of", "LSTM", "--shape", "2", "3", "1", "4"]
    assert accelerator.main(argv) == 0
    assert seen == [("LSTM", (2, 3, 1, 4))]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {"peak_growth_mib": 1.5}


@pytest.mark.parametrize("failed, status", [([], 0), (["torch"], EXIT_FAILURE)])
def test_the_accelerator_parent_writes_the_tables_of_the_backends_that_ran(
    monkeypatch, tmp_path, capsys, failed, status
):
    runs = []

    def run_backends(module, backends, output, quick, timeout):
        runs.append((module, list(backends), output, quick, timeout))
        for backend in backends:
            (tmp_path / f"accelerator-{backend}.json").write_text(json.dumps({"ran": backend}))
        return failed

    monkeypatch.setattr(accelerator, "run_backends", run_backends)
    monkeypatch.setattr(accelerator, "markdown", lambda found: json.dumps(found, sort_keys=True))
    argv = ["--backends", "jax,torch", "--timeout", "9", "--output", str(tmp_path)]
    assert accelerator.main(argv) == status
    assert runs == [("benchmarks.accelerator", ["jax", "torch"], str(tmp_path), False, 9.0)]
    expected = json.dumps({"jax": {"ran": "jax"}, "torch": {"ran": "torch"}}, sort_keys=True)
    assert (tmp_path / "accelerator.md").read_text() == expected
    assert expected in capsys.readouterr().out


def test_the_accelerator_refuses_an_unknown_backend_and_names_itself(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        accelerator.main(["--backends", "jax,tensorflow", "--output", str(tmp_path)])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("python -m benchmarks.accelerator: error: ")
    assert "--backends" in error and "'jax,tensorflow'" in error
