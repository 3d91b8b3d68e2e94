"""Benchmarks the AntisymmetricRNN layers against Keras' own recurrent layers.

    python -m benchmarks.run [--quick] [--output runs/benchmarks]

Everything is measured in one process per backend, interleaved (one repeat of
every layer, then the next repeat) and repeated, reporting the median, min and
max; results are stated as ratios to Keras' layers measured in the same run
and as multiples of the floor, the compiled time of `T` chained
`tanh(h @ W)` products. Sections: training steps at several shapes;
`jit_compile` True against False; the fused layers with the input projection
hoisted out of the loop or not (wide inputs); inference in process and through
the SavedModel (the fused layers also on Keras' own loop, the anchor of their
inference loop); peak memory, in a fresh subprocess per layer (peak RSS
growth over one training step); `training.train` end to end; the training
step under each dtype policy (`mixed_bfloat16`, `mixed_float16`) beside
float32; the JAX backend in a subprocess. Writes `results.json` and `results.md` in `--output`
(default `runs/benchmarks`; `--output benchmarks/results` replaces the
committed results).

Keras is imported by the functions that build models, not with this module:
it fixes its backend when imported, and `benchmarks.accelerator` imports this
module in a parent process that runs each backend in its own child.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import sys
import tempfile
import time

import numpy as np

from benchmarks import common
from benchmarks.common import (
    ChildError,
    environment,
    interleaved,
    last_json,
    run_child,
    write_json,
    write_text,
)
from benchmarks.tables import (
    FUSED_LAYERS,
    LAYERS,
    POLICIES,
    PRECISION_LAYERS,
    markdown,
    ratios,
)
from training.run.rundir import RunDir

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
    "precision_shape": (128, 784, 1, 128),
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
    "precision_shape": (8, 20, 1, 8),
    "repeats": 2,
    "warmup": 1,
}


def make_layer(name, units, **fused_options):
    """A layer by name; `fused_options` (e.g. `hoist_inputs`) go to the fused layers."""
    import keras

    import keras_antisym  # heavy: imports Keras, which fixes the backend (see the module doc)

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


def random_batch(batch, steps, features):
    """Uniform float32 inputs `(batch, steps, features)` and int32 labels in [0, 10), seeded."""
    rng = np.random.RandomState(0)
    return (
        rng.rand(batch, steps, features).astype("float32"),
        rng.randint(0, 10, batch).astype("int32"),
    )


def floor_time(batch, steps, units, repeats, warmup):
    """Compiled forward time of `steps` chained `tanh(h @ W)` products."""
    import keras
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


def training_entry(config, shape, jit_compile=False, layers=LAYERS, sync=False):
    """One shape's training-step timings of every layer, and the floor.

    `sync`: wait for the accelerator after each timed call.
    """
    batch, steps, features, units = shape
    x, y = random_batch(batch, steps, features)
    models = {name: make_model(name, steps, features, units, jit_compile) for name in layers}
    timings = interleaved(
        {n: functools.partial(m.train_on_batch, x, y) for n, m in models.items()},
        config["repeats"],
        config["warmup"],
        sync,
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
    return _train_step_variants(
        config, config["jit_shape"], layers, (False, True), lambda jit: f"jit={jit}",
        lambda name, jit, steps, features, units: make_model(name, steps, features, units, jit),
    )  # fmt: skip


def _train_step_variants(config, shape, layers, variants, label, build):
    """Training steps of each layer in each variant at `shape`, interleaved in one run.

    `build(name, variant, steps, features, units)` makes the compiled model;
    the times are keyed `"<layer>|<label(variant)>"`.
    """
    batch, steps, features, units = shape
    x, y = random_batch(batch, steps, features)
    calls = {}
    for name in layers:
        for variant in variants:
            model = build(name, variant, steps, features, units)
            calls[f"{name}|{label(variant)}"] = lambda m=model: m.train_on_batch(x, y)
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


def bench_hoist(config, sync=False, jit_compile=False):
    """Fused training step with the input projection hoisted or not, wide inputs.

    The fused layers choose by device with `hoist_inputs="auto"`; this
    measures both choices (`hoist_inputs=False` and `True`) on this machine,
    interleaved.
    """
    batch, steps, features, units = config["hoist_shape"]
    x, y = random_batch(batch, steps, features)
    calls = {
        name: (lambda m=model: m.train_on_batch(x, y))
        for name, model in hoist_models(config, jit_compile).items()
    }
    times = interleaved(calls, config["repeats"], config["warmup"], sync)
    return {"batch": batch, "steps": steps, "features": features, "units": units, "times": times}


def bench_inference(config, layers=LAYERS):
    import keras
    import tensorflow as tf

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for batch, steps, features, units in config["inference_shapes"]:
            x, _ = random_batch(batch, steps, features)
            calls = {}
            for name in layers:
                model = make_model(name, steps, features, units)
                forward = tf.function(lambda v, m=model: m(v, training=False))
                calls[name] = lambda f=forward, x=x: f(x).numpy()
                if name in FUSED_LAYERS:
                    # Keras' own loop (the training path; no dropout here): the anchor of
                    # the inference loop that LiteRT converts to builtin ops.
                    anchor = tf.function(lambda v, m=model: m(v, training=True))
                    calls[f"{name}|keras_loop"] = lambda f=anchor, x=x: f(x).numpy()
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


def precision_model(name, policy, steps, features, units):
    """`make_model`'s model with the recurrent layer under `policy` and a float32 head."""
    import keras

    import keras_antisym

    if name == "RNN(AntisymmetricCell)":
        layer = keras.layers.RNN(keras_antisym.AntisymmetricCell(units, dtype=policy), dtype=policy)
    else:
        layer = getattr(keras_antisym, name)(units, dtype=policy)
    model = keras.Sequential(
        [keras.Input((steps, features)), layer, keras.layers.Dense(10, dtype="float32")]
    )
    optimizer = keras.optimizers.SGD(0.01)
    if policy == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def bench_precision(config, layers=PRECISION_LAYERS):
    """Training step under each dtype policy beside float32: same run, interleaved.

    The mixed policies keep the state and the Euler update in float32 and run
    the products in the compute dtype; on a CPU without native bfloat16 or
    float16 arithmetic they are expected to be slower, not faster.
    """
    return _train_step_variants(
        config, config["precision_shape"], layers, POLICIES, str,
        lambda name, policy, steps, features, units: precision_model(
            name, policy, steps, features, units
        ),
    )  # fmt: skip


def _proc_status_mib(field):
    """A `/proc/self/status` field (`VmRSS:`, `VmHWM:`) in MiB."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field):
                return int(line.split()[1]) / 1024  # kB -> MiB
    raise KeyError(field)


def rss_growth(name, batch, steps, features, units):
    """Peak RSS growth (MiB) over two training steps of a built model, in this process.

    Once the model is built, the kernel's peak-RSS mark is reset
    (`/proc/self/clear_refs`); the growth of the peak over two training steps
    (the first one traces the graph, the same work for every layer) is what
    training needs beyond the built model.
    """
    x, y = random_batch(batch, steps, features)
    model = make_model(name, steps, features, units)
    before = _proc_status_mib("VmRSS:")
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # reset the peak (VmHWM) to the current RSS
    model.train_on_batch(x, y)
    model.train_on_batch(x, y)
    peak = _proc_status_mib("VmHWM:")
    return {"peak_growth_mib": peak - before, "peak_rss_mib": peak}


def bench_memory(config, layers=LAYERS):
    """`rss_growth` of each layer, each in a fresh process (a peak cannot be shared)."""
    results = {}
    for name in layers:
        args = ["-m", "benchmarks.run", "--memory-of", name, "--shape"]
        stdout = run_child(args + [str(v) for v in config["memory_shape"]], timeout=1200)
        results[name] = last_json(stdout)
    return {"shape": config["memory_shape"], "layers": results}


def bench_end_to_end(config):
    """`training.train` (pipeline included) against its bare training step.

    The bare step is `train_on_batch` of the same model, optimizer and batch
    shape on a fixed in-memory batch; the run is `python -m training.train` on
    `digits` noise-padded to the same length (a real tf.data pipeline).
    """
    import keras

    batch, steps, features, units = config["e2e_shape"]
    x, y = random_batch(batch, steps, features)
    model = keras.Sequential(
        [
            keras.Input((steps, features)),
            make_layer("AntisymmetricRNN", units),
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
    with tempfile.TemporaryDirectory() as tmp:
        train = ["-m", "training.train", "--task", "digits", "--timesteps", str(steps)]
        train += ["--units", str(units), "--batch-size", str(batch)]
        train += ["--steps", str(config["e2e_steps"]), "--optimizer", "sgd"]
        train += ["--learning-rate", "0.01", "--strategy", "default", "--log-every", "1000"]
        train += ["--checkpoint-every", "100000", "--output-dir", tmp]
        run_child(train, timeout=3600)
        metrics = RunDir(tmp).read_metrics()
        if metrics is None:
            raise ChildError(f"training.train wrote no readable metrics in {tmp}")
    bare_rate = batch / bare["median"]
    return {
        "shape": [batch, steps, features, units],
        "bare_step": bare,
        "bare_examples_per_second": bare_rate,
        "train_examples_per_second": metrics["examples_per_second"],
        "train_over_bare": metrics["examples_per_second"] / bare_rate,
    }


def run_backend(backend, quick, output):
    """Runs the JAX (or other) backend's training benchmark in a child process."""
    args = ["-m", "benchmarks.run", "--training-only", "--output", output]
    run_child(args + (["--quick"] if quick else []), 3600, {"KERAS_BACKEND": backend})
    with open(os.path.join(output, "training.json")) as handle:
        return json.load(handle)


def main(argv=None):
    parser = common.parser("python -m benchmarks.run", __doc__)
    parser.add_argument("--training-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)
    parser.add_argument("--shape", type=int, nargs=4, help=argparse.SUPPRESS)
    parser.add_argument(
        "--only",
        choices=["e2e", "jit", "hoist", "inference", "memory", "precision"],
        help="rerun one section into the existing results in --output",
    )
    parser.add_argument(
        "--skip", default="", help="comma list: jit,hoist,inference,memory,e2e,precision,jax"
    )
    args = parser.parse_args(argv)
    if args.memory_of:  # the child of `bench_memory`: one layer in a fresh process
        print(json.dumps(rss_growth(args.memory_of, *args.shape)))
        return 0
    os.makedirs(args.output, exist_ok=True)
    config = QUICK if args.quick else FULL
    skip = set(filter(None, args.skip.split(",")))

    import keras

    if args.training_only:  # the child process of another backend: JAX always jits
        results = {
            "environment": environment(),
            "training": bench_training(config, jit_compile=True),
        }
        write_json(os.path.join(args.output, "training.json"), results)
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
            "precision": ("precision", bench_precision),
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
    if "precision" not in skip:
        results["precision"] = bench_precision(config)
    if "jax" not in skip:
        with tempfile.TemporaryDirectory() as tmp:
            results["backends"] = {"jax": run_backend("jax", args.quick, tmp)}
    results["wall_seconds"] = time.time() - started
    results["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return _write(results, args.output)


def _write(results, output):
    results["ratios"] = ratios(results)
    text = markdown(results)
    write_json(os.path.join(output, "results.json"), results)
    write_text(os.path.join(output, "results.md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
