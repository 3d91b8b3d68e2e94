"""The benchmark suite on an accelerator, through Keras' JAX and PyTorch backends.

    python -m benchmarks.accelerator [--backends jax,torch] [--quick] [--output runs/benchmarks]

For machines where TensorFlow is not installed (GPU machines often carry JAX
and PyTorch only): one subprocess per backend runs, for every layer of
`benchmarks.tables.LAYERS`, interleaved and repeated,

- the training step (forward + backward + SGD) at the suite's shapes, with
  XLA on JAX (`jit_compile=True`, as Keras always does there) and eagerly on
  PyTorch, where Keras runs `LSTM` and `GRU` through cuDNN;
- the fused layers' training step with the input projection hoisted out of
  the loop and not, for wide inputs (m=96), which the layers decide by device;
- forward inference (`predict_on_batch`) at batch 1 and 64;
- the accelerator's peak memory of a training step at T=1000 (PyTorch:
  `max_memory_allocated`; JAX: `peak_bytes_in_use`, a fresh process per layer);
- the floor, `T` chained `tanh(h @ W)` products (compiled on JAX);
- the fused kernel (`fused_kernel=True`, `keras_antisym.kernels`) beside the
  loop (`fused_kernel=False`) of both fused layers: the training step at
  `KERNEL_SHAPES` and batch-1 inference (on a CPU only interpreted, under
  `KERAS_ANTISYM_KERNEL_INTERPRET=1`: JAX's Pallas interpreter, and on PyTorch
  Triton's with `TRITON_INTERPRET=1`; else the section says skipped).

Each section is written to `accelerator-<backend>.json` as soon as it ends, so a
run cut short keeps what it measured; the parent writes `accelerator.md`. The
output folder defaults to `runs/benchmarks`; `--output benchmarks/results`
replaces the committed results.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from apputil.cli import EXIT_FAILURE
from apputil.errors import invalid
from benchmarks import common
from benchmarks.common import (
    environment,
    interleaved,
    last_json,
    read_backend_results,
    run_backends,
    run_child,
    run_sections,
    sync_device,
    table,
    write_text,
)
from benchmarks.run import FULL, QUICK, make_model, random_batch, training_entry
from benchmarks.run import bench_hoist as run_bench_hoist
from benchmarks.tables import (
    LAYERS,
    hoist_markdown,
    hoist_ratios,
    ratios_markdown,
    training_markdown,
    training_ratios,
)

#: The kernel section's training shapes `(batch, T, m, n)`: the suite's T=784, and twice as long.
KERNEL_SHAPES = {"full": [(128, 784, 1, 128), (128, 1568, 1, 128)], "quick": [(8, 20, 1, 8)]}
KERNEL_LAYERS = ("AntisymmetricRNN", "GatedAntisymmetricRNN")


def jit_compile():
    import keras

    # JAX compiles always; torch.compile of a Python loop over T steps is not
    # what Keras users run recurrent layers with.
    return keras.backend.backend() == "jax"


def bench_training(config, results):
    """Appends one entry per shape to `results` (kept if a later shape is cut short)."""
    for shape in config["train_shapes"]:
        results.append(training_entry(config, shape, jit_compile(), sync=True))
        yield


def bench_hoist(config, results):
    results.update(run_bench_hoist(config, sync=True, jit_compile=jit_compile()))
    yield


def bench_inference(config, results):
    for batch, steps, features, units in config["inference_shapes"]:
        x, _ = random_batch(batch, steps, features)
        models = {n: make_model(n, steps, features, units, jit_compile()) for n in LAYERS}
        times = interleaved(
            {n: functools.partial(m.predict_on_batch, x) for n, m in models.items()},
            config["repeats"],
            config["warmup"],
        )
        results.append(
            {"batch": batch, "steps": steps, "features": features, "units": units, "times": times}
        )
        yield


def kernel_runs_here():
    """Whether `fused_kernel=True` can run: CUDA, or the layers' interpreted kernels.

    Returns the reason when it cannot (the section records it), else None.
    """
    import keras

    from keras_antisym import kernels  # heavy: imports Keras (see run.py)

    if kernels.cuda_available():
        return None
    if not kernels.INTERPRET:
        return "no CUDA device, and KERAS_ANTISYM_KERNEL_INTERPRET is not set"
    if keras.backend.backend() == "torch" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return "no CUDA device, and TRITON_INTERPRET is not set"
    return None


def _kernel_calls(batch, steps, features, units, predict=False):
    x, y = random_batch(batch, steps, features)
    calls = {}
    for name, fused in itertools.product(KERNEL_LAYERS, (True, False)):
        model = make_model(name, steps, features, units, jit_compile(), fused_kernel=fused)
        run = model.predict_on_batch if predict else model.train_on_batch
        calls[f"{name}|fused_kernel={fused}"] = (
            (lambda r=run: r(x)) if predict else (lambda r=run: r(x, y))
        )
    return calls


def bench_kernel(config, results):
    """Training step at `KERNEL_SHAPES` and batch-1 inference, kernel and loop, interleaved."""
    skipped = kernel_runs_here()
    if skipped:
        results["skipped"] = skipped
        return
    results["training"] = []
    quick = config is QUICK
    for shape in KERNEL_SHAPES["quick" if quick else "full"]:
        times = interleaved(_kernel_calls(*shape), config["repeats"], config["warmup"], True)
        results["training"].append({"shape": list(shape), "times": times})
        yield
    batch, steps, features, units = config["inference_shapes"][0]
    calls = _kernel_calls(1, steps, features, units, True)
    times = interleaved(calls, config["repeats"], config["warmup"], True)
    results["inference"] = {"shape": [1, steps, features, units], "times": times}
    yield


def kernel_ratios(kernel):
    """Kernel / loop per layer and shape, gated / ungated kernel, longer / shorter kernel."""
    out = {}
    entries = kernel.get("training", [])
    for entry in entries:
        t = entry["times"]
        key = "B{} T{} m{} n{}".format(*entry["shape"])
        for name in KERNEL_LAYERS:
            loop = t[f"{name}|fused_kernel=False"]["median"]
            out[f"{name} kernel/loop {key}"] = t[f"{name}|fused_kernel=True"]["median"] / loop
        ungated = t["AntisymmetricRNN|fused_kernel=True"]["median"]
        out[f"gated/ungated kernel {key}"] = (
            t["GatedAntisymmetricRNN|fused_kernel=True"]["median"] / ungated
        )
    if len(entries) > 1:
        first, last = (
            e["times"]["AntisymmetricRNN|fused_kernel=True"]["median"]
            for e in (entries[0], entries[-1])
        )
        out[f"kernel T{entries[-1]['shape'][1]}/T{entries[0]['shape'][1]}"] = last / first
    return out


def kernel_markdown(kernel):
    if not kernel or kernel.get("skipped"):
        return ["", f"fused kernel: {kernel.get('skipped', 'not run') if kernel else 'not run'}"]
    names = [f"{n}|fused_kernel={f}" for n in KERNEL_LAYERS for f in (True, False)]
    rows = [("training B{} T{} m{} n{}".format(*e["shape"]), e) for e in kernel["training"]]
    if kernel.get("inference"):
        rows.append(
            ("inference B{} T{}".format(*kernel["inference"]["shape"]), kernel["inference"])
        )
    cells = [[label] + [f"{e['times'][n]['median']:.4f}" for n in names] for label, e in rows]
    return ["", *table(["fused kernel (s, median)", *names], cells)]


def device_memory():
    """`(in use, peak)` bytes of the first accelerator, or None on a CPU."""
    import keras

    if keras.backend.backend() == "torch":
        import torch

        if not torch.cuda.is_available():
            return None
        return torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    import jax

    stats = jax.devices()[0].memory_stats()
    if not stats or "peak_bytes_in_use" not in stats:
        return None
    return stats["bytes_in_use"], stats["peak_bytes_in_use"]


def memory_of(name, batch, steps, features, units):
    """Peak accelerator memory of two training steps beyond the built model."""
    import keras

    x, y = random_batch(batch, steps, features)
    model = make_model(name, steps, features, units, jit_compile())
    if keras.backend.backend() == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
    before = device_memory()
    if before is None:
        return None
    model.train_on_batch(x, y)
    model.train_on_batch(x, y)
    sync_device()
    after = device_memory()
    return {
        "peak_growth_mib": (after[1] - before[0]) / 2**20,
        "in_use_before_mib": before[0] / 2**20,
    }


def bench_memory(config, results):
    """JAX cannot reset its peak, so each layer gets a fresh process there."""
    import keras

    shape = config["memory_shape"]
    results["shape"] = shape
    results["layers"] = {}
    if device_memory() is None:  # a CPU: no accelerator memory to read
        results["layers"] = dict.fromkeys(LAYERS)
        return
    for name in LAYERS:
        if keras.backend.backend() == "torch":
            results["layers"][name] = memory_of(name, *shape)
            yield
            continue
        args = ["-m", "benchmarks.accelerator", "--memory-of", name, "--shape"]
        results["layers"][name] = last_json(run_child(args + [str(v) for v in shape], 600))
        yield


def run_child_sections(config, output):
    """Runs every section in this process's backend, writing after each."""
    import keras

    path = os.path.join(output, f"accelerator-{keras.backend.backend()}.json")
    benches: tuple[tuple[str, Callable[[Any, Any], Any], Any], ...] = (
        ("training", bench_training, []),
        ("hoist", bench_hoist, {}),
        ("inference", bench_inference, []),
        ("memory", bench_memory, {}),
        ("kernel", bench_kernel, {}),
    )
    sections = [(key, functools.partial(bench, config), part) for key, bench, part in benches]
    return run_sections(path, {"environment": environment(), "config": config}, sections)


def ratios(results):
    out = {}
    for entry in results.get("training", []):
        key = f"B{entry['batch']} T{entry['steps']} m{entry['features']} n{entry['units']}"
        out[key] = training_ratios(entry)
    if results.get("hoist"):
        out.update(hoist_ratios(results["hoist"]))
    out.update(kernel_ratios(results.get("kernel") or {}))
    memory = (results.get("memory") or {}).get("layers", {})
    if memory.get("LSTM") and memory["LSTM"]["peak_growth_mib"] > 0:
        for name in ("AntisymmetricRNN", "GatedAntisymmetricRNN", "RNN(AntisymmetricCell)"):
            if not memory.get(name):
                continue
            out[f"{name} peak memory/LSTM"] = (
                memory[name]["peak_growth_mib"] / memory["LSTM"]["peak_growth_mib"]
            )
    return out


def markdown(all_results):
    lines = []
    for backend, results in all_results.items():
        env = results["environment"]
        lines += [f"### {backend} on {env.get('device', 'cpu')}", "", f"`{json.dumps(env)}`", ""]
        lines += training_markdown(results.get("training", []))
        if results.get("hoist"):
            lines += hoist_markdown(results["hoist"])
        for entry in results.get("inference", []):
            rows = [(n, f"{entry['times'][n]['median']:.4f}") for n in LAYERS]
            header = [f"inference B{entry['batch']} T{entry['steps']} (s)", "median"]
            lines += ["", *table(header, rows)]
        memory = (results.get("memory") or {}).get("layers", {})
        if memory and all(memory.values()):  # None on a CPU
            rows = [(n, f"{v['peak_growth_mib']:.1f}") for n, v in memory.items()]
            header = [f"peak memory {results['memory']['shape']}", "growth (MiB)"]
            lines += ["", *table(header, rows)]
        lines += kernel_markdown(results.get("kernel"))
        lines += ["", *ratios_markdown(ratios(results)), ""]
    return "\n".join(lines)


def main(argv=None):
    parser = common.parser("python -m benchmarks.accelerator", __doc__, backends=3600)
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)
    parser.add_argument("--shape", type=int, nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    config = QUICK if args.quick else FULL
    if args.memory_of:
        print(json.dumps(memory_of(args.memory_of, *args.shape)))
        return 0
    backends = [b for b in args.backends.split(",") if b]
    if set(backends) - {"jax", "torch"}:
        parser.error(str(invalid("--backends", "a comma list of jax and torch", args.backends)))
    os.makedirs(args.output, exist_ok=True)
    if args.child:
        run_child_sections(config, args.output)
        return 0
    failed = run_backends("benchmarks.accelerator", backends, args.output, args.quick, args.timeout)
    text = markdown(read_backend_results(args.output, "accelerator-{}.json", backends))
    write_text(os.path.join(args.output, "accelerator.md"), text)
    print(text)
    return EXIT_FAILURE if failed else 0


if __name__ == "__main__":
    sys.exit(main())
