"""Benchmarks the AntisymmetricRNN layers against Keras' own recurrent layers.

    python -m benchmarks.run [--quick] [--output benchmarks/results]

Everything is measured in one process per backend, interleaved (one repeat of
every layer, then the next repeat) and repeated, reporting the median, min and
max; results are stated as ratios to Keras' layers measured in the same run
and as multiples of the floor, the compiled time of `T` chained
`tanh(h @ W)` products. Sections: training steps at several shapes;
`jit_compile` True against False; the fused layers with the input projection
hoisted out of the loop or not (wide inputs); inference in process and through
the SavedModel; peak memory, in a fresh subprocess per layer (`ru_maxrss`
growth over one training step); `training.train` end to end; the JAX backend
in a subprocess. Writes `results.json` and `results.md` in `--output`.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

LAYERS = (
    "AntisymmetricRNN",
    "GatedAntisymmetricRNN",
    "RNN(AntisymmetricCell)",
    "SimpleRNN",
    "GRU",
    "LSTM",
)

FULL = {
    "train_shapes": [
        (128, 196, 1, 128),
        (128, 784, 1, 128),
        (128, 1568, 1, 128),
        (128, 1024, 3, 256),
    ],
    "inference_shapes": [(1, 784, 1, 128), (64, 784, 1, 128)],
    "memory_shape": (128, 1000, 1, 128),
    "jit_shape": (128, 784, 1, 128),
    "hoist_shape": (128, 400, 96, 128),
    "e2e_shape": (128, 784, 1, 128),
    "e2e_steps": 40,
    "repeats": 5,
    "warmup": 2,
}
QUICK = {
    "train_shapes": [(8, 20, 1, 8), (8, 40, 1, 8)],
    "inference_shapes": [(1, 20, 1, 8)],
    "memory_shape": (8, 30, 1, 8),
    "jit_shape": (8, 20, 1, 8),
    "hoist_shape": (8, 20, 9, 8),
    "e2e_shape": (8, 70, 1, 8),
    "e2e_steps": 5,
    "repeats": 2,
    "warmup": 1,
}


def make_layer(name, units, **fused_options):
    """A layer by name; `fused_options` (e.g. `hoist_inputs`) go to the fused layers."""
    import keras

    import keras_antisym

    if name == "AntisymmetricRNN":
        return keras_antisym.AntisymmetricRNN(units, **fused_options)
    if name == "GatedAntisymmetricRNN":
        return keras_antisym.GatedAntisymmetricRNN(units, **fused_options)
    if name == "RNN(AntisymmetricCell)":
        return keras.layers.RNN(keras_antisym.AntisymmetricCell(units))
    return getattr(keras.layers, name)(units)


def make_model(name, steps, features, units, jit_compile=False, **fused_options):
    import keras

    model = keras.Sequential(
        [
            keras.Input((steps, features)),
            make_layer(name, units, **fused_options),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        keras.optimizers.SGD(0.01),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
    )
    return model


def _data(batch, steps, features):
    import numpy as np

    rng = np.random.RandomState(0)
    return (
        rng.rand(batch, steps, features).astype("float32"),
        rng.randint(0, 10, batch).astype("int32"),
    )


def _summary(times):
    return {
        "median": statistics.median(times),
        "min": min(times),
        "max": max(times),
        "repeats": len(times),
    }


def interleaved(callables, repeats, warmup):
    """Times each callable `repeats` times, round-robin, after `warmup` calls each."""
    for call in callables.values():
        for _ in range(warmup):
            call()
    times = {name: [] for name in callables}
    for _ in range(repeats):
        for name, call in callables.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: _summary(values) for name, values in times.items()}


def floor_time(batch, steps, units, repeats, warmup):
    """Compiled forward time of `steps` chained `tanh(h @ W)` products."""
    import keras
    import numpy as np
    from keras import ops

    w = np.random.RandomState(0).randn(units, units) / np.sqrt(units)
    w = ops.convert_to_tensor(w.astype("float32"))
    h0 = ops.zeros((batch, units))

    def chain(h):
        return ops.fori_loop(0, steps, lambda i, h: ops.tanh(ops.matmul(h, w)), h)

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        compiled = tf.function(chain, jit_compile=True)
    elif keras.backend.backend() == "jax":
        import jax

        compiled = jax.jit(chain)
    else:
        compiled = chain
    return interleaved({"floor": lambda: ops.convert_to_numpy(compiled(h0))}, repeats, warmup)[
        "floor"
    ]


def training_entry(config, shape, jit_compile=False, layers=LAYERS, synced=lambda call: call):
    """One shape's training-step timings of every layer, and the floor.

    `synced` wraps each timed call (an accelerator backend waits for its device).
    """
    batch, steps, features, units = shape
    x, y = _data(batch, steps, features)
    models = {name: make_model(name, steps, features, units, jit_compile) for name in layers}
    timings = interleaved(
        {n: synced(lambda m=m: m.train_on_batch(x, y)) for n, m in models.items()},
        config["repeats"],
        config["warmup"],
    )
    return {
        "batch": batch,
        "steps": steps,
        "features": features,
        "units": units,
        "jit_compile": jit_compile,
        "times": timings,
        "floor": floor_time(batch, steps, units, config["repeats"], config["warmup"]),
    }


def bench_training(config, jit_compile=False, layers=LAYERS):
    return [training_entry(config, shape, jit_compile, layers) for shape in config["train_shapes"]]


def bench_jit(config, layers=LAYERS):
    """Training step with `jit_compile` False and True, same shape, interleaved."""
    batch, steps, features, units = config["jit_shape"]
    x, y = _data(batch, steps, features)
    calls = {}
    for name in layers:
        for jit in (False, True):
            model = make_model(name, steps, features, units, jit)
            calls[f"{name}|jit={jit}"] = lambda m=model: m.train_on_batch(x, y)
    return {
        "batch": batch,
        "steps": steps,
        "features": features,
        "units": units,
        "times": interleaved(calls, config["repeats"], config["warmup"]),
    }


def hoist_models(config, jit_compile=False):
    """`{name: model}` of the hoist section: the fused layers with `hoist_inputs` False, True."""
    batch, steps, features, units = config["hoist_shape"]
    models = {"SimpleRNN": make_model("SimpleRNN", steps, features, units, jit_compile)}
    for name in ("AntisymmetricRNN", "GatedAntisymmetricRNN"):
        for hoist in (False, True):
            models[f"{name}|hoist={hoist}"] = make_model(
                name, steps, features, units, jit_compile, hoist_inputs=hoist
            )
    return models


def bench_hoist(config, synced=lambda call: call, jit_compile=False):
    """Fused training step with the input projection hoisted or not, wide inputs.

    The fused layers choose by device with `hoist_inputs="auto"`; this
    measures both choices (`hoist_inputs=False` and `True`) on this machine,
    interleaved.
    """
    batch, steps, features, units = config["hoist_shape"]
    x, y = _data(batch, steps, features)
    calls = {
        name: synced(lambda m=model: m.train_on_batch(x, y))
        for name, model in hoist_models(config, jit_compile).items()
    }
    times = interleaved(calls, config["repeats"], config["warmup"])
    return {"batch": batch, "steps": steps, "features": features, "units": units, "times": times}


def bench_inference(config, layers=LAYERS):
    import keras
    import tensorflow as tf

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for batch, steps, features, units in config["inference_shapes"]:
            x, _ = _data(batch, steps, features)
            calls = {}
            for name in layers:
                model = make_model(name, steps, features, units)
                forward = tf.function(lambda v, m=model: m(v, training=False))
                calls[name] = lambda f=forward, x=x: f(x).numpy()
                path = os.path.join(tmp, f"{name}-{batch}".replace("(", "_").replace(")", "_"))
                model.export(path, format="tf_saved_model", verbose=False)
                loaded = tf.saved_model.load(path)
                calls[f"{name}|saved_model"] = lambda s=loaded, x=x: s.serve(x).numpy()
                keras.backend.clear_session(free_memory=False)
            results.append(
                {
                    "batch": batch,
                    "steps": steps,
                    "features": features,
                    "units": units,
                    "times": interleaved(calls, config["repeats"], config["warmup"]),
                }
            )
    return results


MEMORY_SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
from benchmarks.run import make_model, _data

def status(field):
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field):
                return int(line.split()[1]) / 1024  # kB -> MiB

name, batch, steps, features, units = {args!r}
x, y = _data(batch, steps, features)
model = make_model(name, steps, features, units)
before = status("VmRSS:")
with open("/proc/self/clear_refs", "w") as handle:
    handle.write("5")  # reset the peak (VmHWM) to the current RSS
model.train_on_batch(x, y)
model.train_on_batch(x, y)
peak = status("VmHWM:")
print(json.dumps({{"peak_growth_mib": peak - before, "peak_rss_mib": peak}}))
"""


def bench_memory(config, layers=LAYERS):
    """Peak RSS growth over one training step, each layer in a fresh process.

    Once the model is built, the kernel's peak-RSS mark is reset
    (`/proc/self/clear_refs`); the growth of the peak over two training steps
    (the first one traces the graph, the same work for every layer) is what
    training needs beyond the built model.
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = {}
    for name in layers:
        script = MEMORY_SCRIPT.format(root=root, args=(name, *config["memory_shape"]))
        proc = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=1200,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        )
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"shape": config["memory_shape"], "layers": results}


def bench_end_to_end(config):
    """`training.train` (pipeline included) against its bare training step.

    The bare step is `train_on_batch` of the same model, optimizer and batch
    shape on a fixed in-memory batch; the run is `python -m training.train` on
    `digits` noise-padded to the same length (a real tf.data pipeline).
    """
    batch, steps, features, units = config["e2e_shape"]
    x, y = _data(batch, steps, features)
    import keras

    import keras_antisym

    model = keras.Sequential(
        [
            keras.Input((steps, features)),
            keras_antisym.AntisymmetricRNN(units),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        keras.optimizers.SGD(0.01, momentum=0.9),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    bare = interleaved(
        {"bare": lambda: model.train_on_batch(x, y)}, config["repeats"] * 2, config["warmup"]
    )["bare"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "training.train",
                "--task",
                "digits",
                "--timesteps",
                str(steps),
                "--units",
                str(units),
                "--batch-size",
                str(batch),
                "--steps",
                str(config["e2e_steps"]),
                "--optimizer",
                "sgd",
                "--learning-rate",
                "0.01",
                "--strategy",
                "default",
                "--log-every",
                "1000",
                "--checkpoint-every",
                "100000",
                "--output-dir",
                tmp,
            ],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=3600,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        )
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-3000:])
        with open(os.path.join(tmp, "metrics.json")) as handle:
            metrics = json.load(handle)
    bare_rate = batch / bare["median"]
    return {
        "shape": [batch, steps, features, units],
        "bare_step": bare,
        "bare_examples_per_second": bare_rate,
        "train_examples_per_second": metrics["examples_per_second"],
        "train_over_bare": metrics["examples_per_second"] / bare_rate,
    }


def run_backend(backend, quick, output):
    """Runs the JAX (or other) backend's training benchmark in a subprocess."""
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    args = [sys.executable, "-m", "benchmarks.run", "--training-only", "--output", output]
    if quick:
        args.append("--quick")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    with open(os.path.join(output, "training.json")) as handle:
        return json.load(handle)


def environment():
    import keras

    info = {
        "backend": keras.backend.backend(),
        "keras": keras.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "processor": platform.processor(),
    }
    try:
        import tensorflow as tf

        info["tensorflow"] = tf.__version__
        info["gpus"] = [d.name for d in tf.config.list_physical_devices("GPU")]
    except ImportError:
        pass
    return info


def training_ratios(entry):
    """One training entry's ratios to Keras' layers and to the floor (medians)."""
    t = {k: v["median"] for k, v in entry["times"].items()}
    return {
        "AntisymmetricRNN/SimpleRNN": t["AntisymmetricRNN"] / t["SimpleRNN"],
        "GatedAntisymmetricRNN/SimpleRNN": t["GatedAntisymmetricRNN"] / t["SimpleRNN"],
        "RNN(AntisymmetricCell)/SimpleRNN": t["RNN(AntisymmetricCell)"] / t["SimpleRNN"],
        "AntisymmetricRNN/LSTM": t["AntisymmetricRNN"] / t["LSTM"],
        "AntisymmetricRNN/floor": t["AntisymmetricRNN"] / entry["floor"]["median"],
    }


def hoist_ratios(hoist):
    t = {k: v["median"] for k, v in hoist["times"].items()}
    shape = f"m={hoist['features']}, T={hoist['steps']}"
    return {
        f"{name} hoisted/not hoisted ({shape})": t[f"{name}|hoist=True"] / t[f"{name}|hoist=False"]
        for name in ("AntisymmetricRNN", "GatedAntisymmetricRNN")
    }


def ratios(results):
    """The targets of the benchmark issue, as ratios measured in the same run."""
    out = {}
    for entry in results["training"]:
        key = f"train_B{entry['batch']}_T{entry['steps']}_m{entry['features']}_n{entry['units']}"
        out[key] = training_ratios(entry)
    by_steps = {e["steps"]: e for e in results["training"] if e["features"] == 1}
    if len(by_steps) >= 2:
        short, long = sorted(by_steps)[-2:]
        for name in ("AntisymmetricRNN", "GatedAntisymmetricRNN"):
            out[f"{name} T={long}/T={short}"] = (
                by_steps[long]["times"][name]["median"] / by_steps[short]["times"][name]["median"]
            )
    jit = results.get("jit")
    if jit:
        t = {k: v["median"] for k, v in jit["times"].items()}
        for name in LAYERS:
            out[f"{name} jit=True/jit=False"] = t[f"{name}|jit=True"] / t[f"{name}|jit=False"]
    hoist = results.get("hoist")
    if hoist:
        out.update(hoist_ratios(hoist))
    e2e = results.get("end_to_end")
    if e2e:
        out["training.train examples/s / bare step examples/s"] = e2e["train_over_bare"]
    memory = results.get("memory")
    if memory:
        lstm = memory["layers"]["LSTM"]["peak_growth_mib"]
        ours = ("AntisymmetricRNN", "GatedAntisymmetricRNN", "RNN(AntisymmetricCell)")
        for name in ours if lstm > 0 else ():  # tiny (--quick) shapes may not grow the peak
            out[f"{name} peak memory/LSTM"] = memory["layers"][name]["peak_growth_mib"] / lstm
    return out


def hoist_markdown(hoist):
    shape = f"B{hoist['batch']} T{hoist['steps']} m{hoist['features']} n{hoist['units']}"
    lines = ["", f"| input projection, training step {shape} (s) | median |", "|---|---|"]
    rows = [(name.replace("|", ", "), t["median"]) for name, t in hoist["times"].items()]
    return lines + [f"| {name} | {median:.4f} |" for name, median in rows]


def markdown(results):
    lines = [f"Environment: {json.dumps(results['environment'])}", ""]
    lines += [
        "| training step (s) | " + " | ".join(LAYERS) + " | floor |",
        "|---|" + "---|" * (len(LAYERS) + 1),
    ]
    for entry in results["training"]:
        cells = [
            f"{entry['times'][n]['median']:.4f} ({entry['times'][n]['min']:.4f}-"
            f"{entry['times'][n]['max']:.4f})"
            for n in LAYERS
        ]
        lines.append(
            f"| B{entry['batch']} T{entry['steps']} m{entry['features']} "
            f"n{entry['units']} | " + " | ".join(cells) + f" | {entry['floor']['median']:.4f} |"
        )
    if results.get("hoist"):
        lines += hoist_markdown(results["hoist"])
    for entry in results.get("inference", []):
        lines += [
            "",
            f"| inference B{entry['batch']} T{entry['steps']} (s) | in process | SavedModel |",
            "|---|---|---|",
        ]
        for name in LAYERS:
            a, b = entry["times"][name], entry["times"][f"{name}|saved_model"]
            lines.append(f"| {name} | {a['median']:.4f} | {b['median']:.4f} |")
    if results.get("memory"):
        lines += [
            "",
            f"| peak memory, training step {results['memory']['shape']} | growth (MiB) |",
            "|---|---|",
        ]
        for name, value in results["memory"]["layers"].items():
            lines.append(f"| {name} | {value['peak_growth_mib']:.1f} |")
    for backend, other in results.get("backends", {}).items():
        lines += [
            "",
            f"| {backend} training step (s) | " + " | ".join(LAYERS) + " |",
            "|---|" + "---|" * len(LAYERS),
        ]
        for entry in other["training"]:
            lines.append(
                f"| B{entry['batch']} T{entry['steps']} m{entry['features']} | "
                + " | ".join(f"{entry['times'][n]['median']:.4f}" for n in LAYERS)
                + " |"
            )
    lines += ["", "| ratio (same run, medians) | value |", "|---|---|"]
    lines += [
        f"| {name} | {value:.3f} |"
        if not isinstance(value, dict)
        else "\n".join(f"| {name}: {k} | {v:.3f} |" for k, v in value.items())
        for name, value in results["ratios"].items()
    ]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny shapes (smoke test)")
    parser.add_argument("--output", default=os.path.join("benchmarks", "results"))
    parser.add_argument("--training-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--only",
        choices=["e2e", "jit", "hoist", "inference", "memory"],
        help="rerun one section into the existing results in --output",
    )
    parser.add_argument("--skip", default="", help="comma list: jit,hoist,inference,memory,e2e,jax")
    args = parser.parse_args(argv)
    os.makedirs(args.output, exist_ok=True)
    config = QUICK if args.quick else FULL
    skip = set(filter(None, args.skip.split(",")))

    import keras

    if args.training_only:  # the child process of another backend: JAX always jits
        results = {
            "environment": environment(),
            "training": bench_training(config, jit_compile=True),
        }
        with open(os.path.join(args.output, "training.json"), "w") as handle:
            json.dump(results, handle, indent=2)
        return 0
    if keras.backend.backend() != "tensorflow":
        parser.error("run the benchmark with KERAS_BACKEND=tensorflow (it runs JAX itself)")

    started = time.time()
    if args.only:  # rerun one section into existing results
        with open(os.path.join(args.output, "results.json")) as handle:
            results = json.load(handle)
        sections = {
            "e2e": ("end_to_end", bench_end_to_end),
            "jit": ("jit", bench_jit),
            "hoist": ("hoist", bench_hoist),
            "inference": ("inference", bench_inference),
            "memory": ("memory", bench_memory),
        }
        key, bench = sections[args.only]
        results[key] = bench(config)
        return _write(results, args.output)
    results = {"environment": environment(), "config": config}
    results["training"] = bench_training(config)
    if "jit" not in skip:
        results["jit"] = bench_jit(config)
    if "hoist" not in skip:
        results["hoist"] = bench_hoist(config)
    if "inference" not in skip:
        results["inference"] = bench_inference(config)
    if "memory" not in skip:
        results["memory"] = bench_memory(config)
    if "e2e" not in skip:
        results["end_to_end"] = bench_end_to_end(config)
    if "jax" not in skip:
        with tempfile.TemporaryDirectory() as tmp:
            results["backends"] = {"jax": run_backend("jax", args.quick, tmp)}
    results["wall_seconds"] = time.time() - started
    results["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return _write(results, args.output)


def _write(results, output):
    results["ratios"] = ratios(results)
    with open(os.path.join(output, "results.json"), "w") as handle:
        json.dump(results, handle, indent=2)
    with open(os.path.join(output, "results.md"), "w") as handle:
        handle.write(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
