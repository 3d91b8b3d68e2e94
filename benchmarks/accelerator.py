"""The benchmark suite on an accelerator, through Keras' JAX and PyTorch backends.

    python -m benchmarks.accelerator [--backends jax,torch] [--quick] [--output DIR]

For machines where TensorFlow is not installed (the GPU machines lent here
carry JAX and PyTorch only): one subprocess per backend runs, for every layer
of `benchmarks.run.LAYERS`, interleaved and repeated,

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
  `KERNEL_SHAPES` and batch-1 inference (on a CPU: JAX's Pallas interpreter;
  PyTorch only under `TRITON_INTERPRET=1`, else the section says skipped).

Each section is written to `accelerator-<backend>.json` as soon as it ends, so a
run cut short keeps what it measured; the parent writes `accelerator.md`.
"""

import argparse
import itertools
import json
import os
import subprocess
import sys
import time

from benchmarks.run import (
    FULL,
    LAYERS,
    QUICK,
    _data,
    hoist_markdown,
    hoist_ratios,
    interleaved,
    make_model,
    training_entry,
    training_ratios,
)
from benchmarks.run import bench_hoist as run_bench_hoist
from benchmarks.run import environment as run_environment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The kernel section's training shapes `(batch, T, m, n)`: the issue's, and twice as long.
KERNEL_SHAPES = {"full": [(128, 784, 1, 128), (128, 1568, 1, 128)], "quick": [(8, 20, 1, 8)]}
KERNEL_LAYERS = ("AntisymmetricRNN", "GatedAntisymmetricRNN")


def _sync():
    """Waits for the accelerator, so that a timer stops after the work."""
    import keras

    if keras.backend.backend() == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()


def _synced(call):
    def run():
        call()
        _sync()

    return run


def jit_compile():
    import keras

    # JAX compiles always; torch.compile of a Python loop over T steps is not
    # what Keras users run recurrent layers with.
    return keras.backend.backend() == "jax"


def bench_training(config, results):
    """Appends one entry per shape to `results` (kept if a later shape is cut short)."""
    for shape in config["train_shapes"]:
        results.append(training_entry(config, shape, jit_compile(), synced=_synced))
        yield


def bench_hoist(config, results):
    results.update(run_bench_hoist(config, synced=_synced, jit_compile=jit_compile()))
    yield


def bench_inference(config, results):
    for batch, steps, features, units in config["inference_shapes"]:
        x, _ = _data(batch, steps, features)
        models = {n: make_model(n, steps, features, units, jit_compile()) for n in LAYERS}
        times = interleaved(
            {n: (lambda m=m, x=x: m.predict_on_batch(x)) for n, m in models.items()},
            config["repeats"],
            config["warmup"],
        )
        results.append(
            {"batch": batch, "steps": steps, "features": features, "units": units, "times": times}
        )
        yield


def kernel_runs_here():
    """Whether `fused_kernel=True` can run: CUDA, or an interpreter (Pallas; Triton's)."""
    import keras

    from keras_antisym.kernels import cuda_available

    if keras.backend.backend() == "jax" or cuda_available():
        return True
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _kernel_calls(batch, steps, features, units, predict=False):
    x, y = _data(batch, steps, features)
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
    if not kernel_runs_here():
        results["skipped"] = "no CUDA device, and TRITON_INTERPRET is not set"
        return
    results["training"] = []
    quick = config is QUICK
    for shape in KERNEL_SHAPES["quick" if quick else "full"]:
        calls = {k: _synced(v) for k, v in _kernel_calls(*shape).items()}
        times = interleaved(calls, config["repeats"], config["warmup"])
        results["training"].append({"shape": list(shape), "times": times})
        yield
    batch, steps, features, units = config["inference_shapes"][0]
    calls = {k: _synced(v) for k, v in _kernel_calls(1, steps, features, units, True).items()}
    times = interleaved(calls, config["repeats"], config["warmup"])
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
    lines = ["", "| fused kernel (s, median) | " + " | ".join(names) + " |"]
    lines += ["|---|" + "---|" * len(names)]
    rows = [("training B{} T{} m{} n{}".format(*e["shape"]), e) for e in kernel["training"]]
    if kernel.get("inference"):
        rows.append(
            ("inference B{} T{}".format(*kernel["inference"]["shape"]), kernel["inference"])
        )
    for label, entry in rows:
        cells = [f"{entry['times'][n]['median']:.4f}" for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


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

    x, y = _data(batch, steps, features)
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
    _sync()
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
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.accelerator", "--memory-of", name, "--shape"]
            + [str(v) for v in shape],
            cwd=ROOT,
            env=os.environ,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        results["layers"][name] = json.loads(proc.stdout.strip().splitlines()[-1])
        yield


def environment():
    import keras

    info = run_environment()
    if keras.backend.backend() == "torch":
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["device"] = torch.cuda.get_device_name(0)
            info["cudnn"] = torch.backends.cudnn.version()
    else:
        import jax

        info["jax"] = jax.__version__
        info["device"] = str(jax.devices()[0].device_kind)
    return info


def run_child(config, output):
    """Runs every section in this process's backend, writing after each."""
    import keras

    path = os.path.join(output, f"accelerator-{keras.backend.backend()}.json")
    results = {"environment": environment(), "config": config}
    sections = (
        ("training", bench_training, []),
        ("hoist", bench_hoist, {}),
        ("inference", bench_inference, []),
        ("memory", bench_memory, {}),
        ("kernel", bench_kernel, {}),
    )
    for key, bench, part in sections:
        started = time.time()
        results[key] = part
        for _ in itertools.chain(bench(config, part), [None]):  # keep each result
            results[f"{key}_seconds"] = time.time() - started
            with open(path, "w") as handle:
                json.dump(results, handle, indent=2)
        print(f"{keras.backend.backend()}: {key} done in {time.time() - started:.0f} s", flush=True)
    return results


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
        lines += ["| training step (s) | " + " | ".join(LAYERS) + " | floor |"]
        lines += ["|---|" + "---|" * (len(LAYERS) + 1)]
        for entry in results.get("training", []):
            cells = [
                f"{entry['times'][n]['median']:.4f} ({entry['times'][n]['min']:.4f}-"
                f"{entry['times'][n]['max']:.4f})"
                for n in LAYERS
            ]
            lines.append(
                f"| B{entry['batch']} T{entry['steps']} m{entry['features']} n{entry['units']} | "
                + " | ".join(cells)
                + f" | {entry['floor']['median']:.4f} |"
            )
        if results.get("hoist"):
            lines += hoist_markdown(results["hoist"])
        for entry in results.get("inference", []):
            lines += ["", f"| inference B{entry['batch']} T{entry['steps']} (s) | median |"]
            lines += ["|---|---|"] + [
                f"| {n} | {entry['times'][n]['median']:.4f} |" for n in LAYERS
            ]
        memory = (results.get("memory") or {}).get("layers", {})
        if memory and all(memory.values()):  # None on a CPU
            shape = results["memory"]["shape"]
            lines += ["", f"| peak memory {shape} | growth (MiB) |", "|---|---|"]
            lines += [f"| {n} | {v['peak_growth_mib']:.1f} |" for n, v in memory.items()]
        lines += kernel_markdown(results.get("kernel"))
        lines += ["", "| ratio (same run, medians) | value |", "|---|---|"]
        for name, value in ratios(results).items():
            if isinstance(value, dict):
                lines += [f"| {name}: {k} | {v:.3f} |" for k, v in value.items()]
            else:
                lines.append(f"| {name} | {value:.3f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.accelerator", description=__doc__)
    parser.add_argument("--backends", default="jax,torch", help="comma list of Keras backends")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (smoke test)")
    parser.add_argument("--output", default=os.path.join("benchmarks", "results"))
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per backend")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)
    parser.add_argument("--shape", type=int, nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    config = QUICK if args.quick else FULL
    if args.memory_of:
        print(json.dumps(memory_of(args.memory_of, *args.shape)))
        return 0
    os.makedirs(args.output, exist_ok=True)
    if args.child:
        run_child(config, args.output)
        return 0
    backends = [b for b in args.backends.split(",") if b]
    unknown = set(backends) - {"jax", "torch"}
    if unknown:
        parser.error(
            f"Received an invalid value for argument `--backends`, expected a comma list "
            f"of jax and torch, got {args.backends!r}"
        )
    failed = []
    for backend in backends:
        env = {**os.environ, "KERAS_BACKEND": backend, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        command = [sys.executable, "-m", "benchmarks.accelerator", "--child"]
        command += ["--output", args.output] + (["--quick"] if args.quick else [])
        try:
            proc = subprocess.run(command, cwd=ROOT, env=env, timeout=args.timeout)
            if proc.returncode != 0:
                failed.append(backend)
        except subprocess.TimeoutExpired:
            failed.append(backend)
            print(f"{backend}: stopped after {args.timeout:.0f} s", file=sys.stderr)
    all_results = {}
    for backend in backends:
        path = os.path.join(args.output, f"accelerator-{backend}.json")
        if os.path.exists(path):
            with open(path) as handle:
                all_results[backend] = json.load(handle)
    text = markdown(all_results)
    with open(os.path.join(args.output, "accelerator.md"), "w") as handle:
        handle.write(text)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
