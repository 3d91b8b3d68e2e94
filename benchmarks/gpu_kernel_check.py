"""A GPU check of the fused recurrence kernels in one command, JAX and PyTorch.

    python -m benchmarks.gpu_kernel_check [--quick] [--output runs/benchmarks] [--timeout S]
    (on a GPU machine with JAX and PyTorch: bash benchmarks/gpu_kernel_check.sh)

One subprocess per backend (`KERAS_BACKEND`), each on the same card in the
same run, each writing `gpu-kernel-<backend>.json` after every section:

1. numerics: the fused layers with `fused_kernel=True` against `False` (in
   full float32) and against the float64 NumPy reference (`benchmarks/reference.py`),
   outputs and weight gradients, for each kernel precision (`float32`,
   `tf32x3`, `tf32`);
2. training step (`train_on_batch`, interleaved, repeated, medians) at B128
   T784 m1 n128: kernel (each precision) and loop of both fused layers,
   SimpleRNN, GRU, LSTM (cuDNN on PyTorch) and the floor; the kernel at T1568;
3. batch-1 inference (`predict_on_batch`) at T784: kernel, loop, LSTM;
4. the kernel alone (no Keras): forward + backward at B128 T784 n128 per
   precision, and batch-1 forward with the small tile and the padded one.

The parent writes `gpu-kernel.txt`: each kernel target (PASS, FAIL or n/a)
with ratios from the same run, then every section's numbers. TensorFlow is not
needed.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import common, reference
from benchmarks.common import (
    environment,
    interleaved,
    read_backend_results,
    run_backends,
    run_sections,
    table,
    write_text,
)
from benchmarks.gradients import outputs_and_grads
from benchmarks.run import floor_time, make_layer, make_model, random_batch

PRECISIONS = ("float32", "tf32x3", "tf32")
FULL = {"shape": (128, 784, 1, 128), "long": 1568, "numerics": (32, 200), "repeats": 10}
QUICK = {"shape": (4, 12, 1, 8), "long": 24, "numerics": (3, 10), "repeats": 2}
LAYERS = ("AntisymmetricRNN", "GatedAntisymmetricRNN")
OTHERS = ("SimpleRNN", "GRU", "LSTM")


def _set_precision(precision):
    """Sets the kernels' matrix-product precision (read by each call, also when traced)."""
    from keras_antisym import kernels  # heavy: imports Keras (see benchmarks/run.py)

    kernels.PRECISION = precision


def _with_precision(precision, call):
    """`call` run with the kernels' precision set."""

    def run():
        _set_precision(precision)
        return call()

    return run


def _relative(a, b):
    a, b = np.asarray(a, "float64"), np.asarray(b, "float64")
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _layer_and_grads(name, units, fused, x, weights):
    """Outputs of a layer and the gradients of their weighted sum (`benchmarks.gradients`)."""
    from keras import ops

    options = {"epsilon": 0.1, "gamma": 0.01, "return_sequences": True, "fused_kernel": fused}
    layer = make_layer(name, units, **options)
    layer.build(x.shape)
    layer.set_weights(weights)
    outputs, grads = outputs_and_grads(layer, x, {})
    return ops.convert_to_numpy(outputs), [ops.convert_to_numpy(g) for g in grads]


def _full_float32():
    import contextlib

    import keras

    if keras.backend.backend() != "jax":
        return contextlib.nullcontext()  # PyTorch's float32 products are float32
    import jax

    return jax.default_matmul_precision("highest")


def bench_numerics(config, results):
    """Max relative errors, kernel (each precision) and loop, against each other and float64."""
    batch, steps = config["numerics"]
    units = 128 if batch > 8 else 8
    x = np.random.RandomState(1).standard_normal((batch, steps, 1)).astype("float32")
    for name in LAYERS:
        layer = make_layer(name, units)
        layer.build(x.shape)
        rng = np.random.RandomState(0)
        weights = [
            (0.3 * rng.standard_normal(w.shape)).astype("float32") for w in layer.get_weights()
        ]
        gated = name == "GatedAntisymmetricRNN"
        exact, _ = reference.run(weights, x, units=units, epsilon=0.1, gamma=0.01, gated=gated)
        with _full_float32():  # the loop in float32 (XLA on a GPU defaults to TF32)
            loop_out, loop_grads = _layer_and_grads(name, units, False, x, weights)
        entry = {"loop vs float64": _relative(loop_out, exact)}
        for precision in PRECISIONS:
            _set_precision(precision)
            out, grads = _layer_and_grads(name, units, True, x, weights)
            entry[f"kernel {precision} vs float64"] = _relative(out, exact)
            entry[f"kernel {precision} vs loop"] = _relative(out, loop_out)
            entry[f"kernel {precision} grads vs loop"] = max(
                _relative(g, w) for g, w in zip(grads, loop_grads, strict=True)
            )
        results[name] = entry
        yield


def _timed(callables, repeats, warmup=2):
    return interleaved(callables, repeats, warmup, sync=True)


def _kernel_call(module, batch, steps, units, gated, precision, backward):
    """A callable running `module`'s kernel alone (forward, or forward + backward)."""
    rng = np.random.RandomState(0)
    k = 2 if gated else 1
    u = (0.3 * rng.standard_normal((batch, steps, k * units))).astype("float32")
    mt = (0.1 * rng.standard_normal((units, units))).astype("float32")
    h0 = np.zeros((batch, units), "float32")
    if module.__name__.endswith("pallas_recurrence"):
        return _jax_kernel_call(module, u, mt, h0, gated, precision, backward)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: TRITON_INTERPRET=1
    u, mt, h0 = (torch.tensor(a, device=device).requires_grad_(backward) for a in (u, mt, h0))

    def run():
        states = module.recurrence(u, mt, h0, 0.1, gated, precision)
        if backward:
            torch.autograd.grad(states.sum(), (u, mt, h0))

    return run


def _jax_kernel_call(module, u, mt, h0, gated, precision, backward):
    import jax

    def forward(u, mt, h0):
        return module.recurrence(u, mt, h0, 0.1, gated, precision)

    step = jax.grad(lambda *a: forward(*a).sum(), argnums=(0, 1, 2)) if backward else forward
    step = jax.jit(step)
    args = [jax.device_put(a) for a in (u, mt, h0)]
    return lambda: jax.block_until_ready(step(*args))


def bench_kernel(config, results):
    """The kernel alone: per precision and warps at the training shape; batch-1 tiles."""
    import keras

    batch, steps, _, units = config["shape"]
    # Only this backend's module: Triton must not share a process with JAX's LLVM.
    kind = "pallas" if keras.backend.backend() == "jax" else "triton"
    module = importlib.import_module(f"keras_antisym.kernels.{kind}_recurrence")
    defaults = {"SMALL_BATCH": module.SMALL_BATCH, "NUM_WARPS": module.NUM_WARPS}

    def build(settings, *args):
        """A kernel call under module settings (read when traced on JAX, called on PyTorch)."""
        settings = {**defaults, **settings}
        call = _with_settings(module, settings, _kernel_call(module, *args))
        call()
        return call

    calls = {}
    for gated, precision in itertools.product((False, True), PRECISIONS):
        name = f"{'gated ' if gated else ''}fwd+bwd B{batch} T{steps} {precision}"
        calls[name] = build({}, batch, steps, units, gated, precision, True)
    for precision, warps in itertools.product(PRECISIONS, (4, 8)):
        name = f"fwd+bwd B{batch} T{steps} {precision} num_warps={warps}"
        calls[name] = build({"NUM_WARPS": warps}, batch, steps, units, False, precision, True)
    results["training"] = _timed(calls, config["repeats"])
    yield
    calls = {}
    for label, small in (("small tile", 2), ("padded 16-row tile", 0)):
        call = build({"SMALL_BATCH": small}, 1, steps, units, False, "float32", False)
        calls[f"fwd B1 T{steps} {label}"] = call
    results["batch1"] = _timed(calls, config["repeats"])
    _with_settings(module, defaults, lambda: None)()
    yield


def _with_settings(module, settings, call):
    def run():
        for name, value in settings.items():
            setattr(module, name, value)
        return call()

    return run


def _model(config, name, steps, fused=None):
    """A compiled model as `benchmarks.run.make_model` builds it (XLA on JAX)."""
    import keras

    _, _, features, units = config["shape"]
    options = {} if fused is None else {"fused_kernel": fused}
    jit = keras.backend.backend() == "jax"
    return make_model(name, steps, features, units, jit, **options)


def _kernel_model_call(config, name, steps, precision, x, y):
    """A kernel model's training step at `precision`, traced (JAX) at that precision."""
    model = _model(config, name, steps, True)
    call = _with_precision(precision, lambda: model.train_on_batch(x, y))
    call()
    return call


def bench_training(config, results):
    """Training steps at the check's shape: kernel per precision, loop, other layers."""
    batch, steps, features, units = config["shape"]
    x, y = random_batch(batch, steps, features)
    calls = {}
    for name in LAYERS:
        for precision in PRECISIONS:
            call = _kernel_model_call(config, name, steps, precision, x, y)
            calls[f"{name} kernel {precision}"] = call
        model = _model(config, name, steps, False)
        calls[f"{name} loop"] = lambda m=model: m.train_on_batch(x, y)
    for name in OTHERS:
        model = _model(config, name, steps)
        calls[name] = lambda m=model: m.train_on_batch(x, y)
    results["T784"] = _timed(calls, config["repeats"])
    results["floor"] = {"floor": floor_time(batch, steps, units, config["repeats"], 2)}
    yield
    long_steps = config["long"]
    x2, y2 = random_batch(batch, long_steps, features)
    calls = {}
    for precision in PRECISIONS:
        call = _kernel_model_call(config, "AntisymmetricRNN", long_steps, precision, x2, y2)
        calls[f"AntisymmetricRNN kernel {precision}"] = call
    lstm = _model(config, "LSTM", long_steps)
    calls["LSTM"] = lambda: lstm.train_on_batch(x2, y2)
    results["T1568"] = _timed(calls, config["repeats"])
    yield


def bench_inference(config, results):
    """`predict_on_batch` at batch 1: kernel (float32), loop, LSTM."""
    _set_precision("float32")
    steps = config["shape"][1]
    x, _ = random_batch(1, steps, config["shape"][2])
    models = {
        "AntisymmetricRNN kernel float32": _model(config, "AntisymmetricRNN", steps, True),
        "AntisymmetricRNN loop": _model(config, "AntisymmetricRNN", steps, False),
        "LSTM": _model(config, "LSTM", steps),
    }
    calls = {k: (lambda m=m: m.predict_on_batch(x)) for k, m in models.items()}
    results["B1"] = _timed(calls, config["repeats"])
    yield


SECTIONS = {
    "numerics": bench_numerics,
    "training": bench_training,
    "inference": bench_inference,
    "kernel": bench_kernel,
}


def run_child_sections(config, output, names=tuple(SECTIONS)):
    """Runs the sections `names` in this process's backend, writing after each.

    The kernel targets come first, so that a backend stopped by its timeout
    keeps them; a section that fails records its error and the next one runs.
    """
    import keras

    path = os.path.join(output, f"gpu-kernel-{keras.backend.backend()}.json")
    sections: list[tuple[str, Callable[[Any], Any], Any]] = [
        (key, functools.partial(bench, config), {})
        for key, bench in SECTIONS.items()
        if key in names
    ]
    results = {"environment": environment(), "config": config}
    return run_sections(path, results, sections, indent=1, keep_going=True)


def _median(results, *keys):
    value = results
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value["median"] if isinstance(value, dict) and "median" in value else value


def _ratio(a, b):
    return None if a is None or b is None else a / b


def targets(results, precision):
    """`[(target, value, limit)]`: the kernel targets from one backend's results."""
    batch, steps, features, units = results["config"]["shape"]
    train = results.get("training", {})
    name = f"AntisymmetricRNN kernel {precision}"
    ungated = _median(train, "T784", name)
    gated = _median(train, "T784", f"GatedAntisymmetricRNN kernel {precision}")
    long = _median(train, "T1568", name)
    b1 = _median(results, "inference", "B1", "AntisymmetricRNN kernel float32")
    shape = f"B{batch} T{steps} n{units} m{features}"
    return [
        (f"training step {shape}, kernel {precision} (ms)", ms(ungated), 3.0),
        (f"gated / ungated, kernel {precision}", _ratio(gated, ungated), 1.3),
        (
            f"T{results['config']['long']} / T{steps}, kernel {precision}",
            _ratio(long, ungated),
            2.1,
        ),
        (f"batch-1 inference T{steps}, kernel float32 (ms)", ms(b1), 1.0),
    ]


def ms(seconds):
    return None if seconds is None else 1000 * seconds


def report(all_results):
    """The kernel targets, every timing and the numerics, as text."""
    lines = []
    for backend, results in all_results.items():
        device = results.get("environment", {}).get("device", "cpu")
        lines += ["", f"=== {backend} on {device} ==="]
        rows = {row[0]: row for p in PRECISIONS for row in targets(results, p)}
        for target, value, limit in rows.values():  # batch-1 inference once
            verdict = "n/a" if value is None else ("PASS" if value <= limit else "FAIL")
            shown = "-" if value is None else f"{value:.3f}"
            lines.append(f"{verdict:4} {target}: {shown} (target <= {limit})")
        for section in ("numerics", "training", "inference", "kernel"):
            lines += _section_lines(section, results.get(section, {}))
    return "\n".join(lines)


def _section_lines(section, part):
    """One section as a table: `group | name | value` (timings in ms, median and min)."""
    rows = []
    for group, entries in part.items():
        if not isinstance(entries, dict):
            rows.append((group, "", entries))
            continue
        for name, value in entries.items():
            if isinstance(value, dict) and "median" in value:
                shown = f"{1000 * value['median']:.3f} ms (min {1000 * value['min']:.3f})"
            else:
                shown = f"{value:.2e}" if isinstance(value, float) else str(value)
            rows.append((group, name, shown))
    return ["", *table([section, "case", "value"], rows)]


def main(argv=None):
    parser = common.parser("python -m benchmarks.gpu_kernel_check", __doc__, backends=170)
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run (default: all of {', '.join(SECTIONS)})",
    )
    args = parser.parse_args(argv)
    names = [name for name in args.sections.split(",") if name]
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown or not names:
        parser.error(
            "Received an invalid value for argument `--sections`, expected comma-separated "
            f"names of {', '.join(SECTIONS)}, got {args.sections!r}"
        )
    config = QUICK if args.quick else FULL
    os.makedirs(args.output, exist_ok=True)
    if args.child:
        run_child_sections(config, args.output, names)
        return 0
    backends = [b for b in args.backends.split(",") if b]
    # A backend that fails still reports: its targets read n/a.
    extra = ["--sections", ",".join(names)]
    run_backends(
        "benchmarks.gpu_kernel_check", backends, args.output, args.quick, args.timeout, extra
    )
    text = report(read_backend_results(args.output, "gpu-kernel-{}.json", backends))
    write_text(os.path.join(args.output, "gpu-kernel.txt"), text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
