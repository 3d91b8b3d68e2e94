"""LiteRT and ONNX exports measured: accuracy after quantization, latency, file sizes.

    python -m benchmarks.portable_exports --model runs/digits-gated/model.keras \
        --task digits [--dataset fashion_mnist --timesteps 1000 --data-dir DIR] \
        [--examples 2000] [--repeats 200] [--output runs/benchmarks]

For a trained `.keras` model of a task this exports, in one run, a LiteRT file
(float32, `float16`, `dynamic-int8`), the ONNX graphs (tf2onnx) and a
SavedModel, then:

* accuracy: each LiteRT variant's and ONNX's test accuracy on the task's test
  split (the first `--examples`), against the Keras model's on the same
  examples, and the change in points;
* latency (batch 1, CPU, one thread per runtime): one `stream` update of
  28 steps and one whole sequence (`serving_default`, the task's T), in
  LiteRT, ONNX Runtime and the SavedModel's signature called in this
  process, interleaved in blocks and repeated; p50 and p99;
* file sizes.

Writes `portable_exports.json` and `.md` under `--output`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from serving.names import DEFAULT_SIGNATURE, SEQUENCE_INPUT, STREAM_SIGNATURE

CHUNK = 28
BLOCK = 10


def _sizes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def _accuracy(predict: Callable[[np.ndarray], np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    hits = sum(
        int((predict(x[i : i + 100]) == y[i : i + 100]).sum()) for i in range(0, len(x), 100)
    )
    return hits / len(x)


def _classes(runtime: Any) -> Callable[[np.ndarray], np.ndarray]:
    return lambda batch: runtime.run(DEFAULT_SIGNATURE, **{SEQUENCE_INPUT: batch})["class_id"]


def _call(runtime: Any, signature: str, inputs: dict[str, np.ndarray]) -> Callable[[], Any]:
    return lambda: runtime.run(signature, **inputs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.portable_exports")
    parser.add_argument("--model", required=True)
    parser.add_argument("--task", default="digits")
    parser.add_argument("--dataset", default=None)
    parser.add_argument("--timesteps", type=int, default=None)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--output", default="runs/benchmarks")
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    # One thread for each runtime, TensorFlow's too (read when it starts).
    os.environ["TF_NUM_INTRAOP_THREADS"] = os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    from serving.exports.export import export_model, load_keras_model
    from serving.exports.runtimes import LiteRTModel, OnnxModel
    from training.tasks.catalog import get_task

    model = load_keras_model(args.model)
    task = get_task(args.task, args.timesteps, args.dataset)
    images, labels = task.examples("test", args.data_dir)
    x, y = task.make_batch(images[: args.examples], labels[: args.examples], seed=0)
    x = np.asarray(x, np.float32)
    base = tempfile.mkdtemp(prefix="portable-")
    folders = {
        "savedmodel": export_model(model, base, 1, padded=False),
        "litert": export_model(model, base, 2, format="litert"),
        "litert float16": export_model(model, base, 3, format="litert", quantize="float16"),
        "litert dynamic-int8": export_model(
            model, base, 4, format="litert", quantize="dynamic-int8"
        ),
        "onnx": export_model(model, base, 5, format="onnx"),
    }
    runtimes: dict[str, Any] = {
        name: LiteRTModel(os.path.join(folder, "model.tflite"), threads=1)
        for name, folder in folders.items()
        if name.startswith("litert")
    }
    runtimes["onnx"] = OnnxModel(folders["onnx"], threads=1)
    import tensorflow as tf

    saved = tf.saved_model.load(folders["savedmodel"]).signatures

    keras_accuracy = _accuracy(lambda b: np.argmax(model.predict(b, verbose=0), -1), x, y)
    results: dict[str, Any] = {
        "task": args.task, "dataset": args.dataset, "steps": x.shape[1],
        "examples": len(x), "keras_accuracy": keras_accuracy, "rows": {},
    }  # fmt: skip
    for name, runtime in runtimes.items():
        accuracy = _accuracy(_classes(runtime), x, y)
        change = 100 * (accuracy - keras_accuracy)
        results["rows"][name] = {
            "accuracy": accuracy, "change_points": change, "bytes": _sizes(folders[name]),
        }  # fmt: skip
    results["rows"]["savedmodel"] = {"bytes": _sizes(folders["savedmodel"])}

    one = x[:1]
    chunk = one[:, :CHUNK]
    calls: dict[str, dict[str, Callable[[], Any]]] = {}
    for name, runtime in runtimes.items():
        states = runtime.start(1)
        calls[name] = {
            "chunk": _call(runtime, STREAM_SIGNATURE, {SEQUENCE_INPUT: chunk, **states}),
            "whole": _call(runtime, DEFAULT_SIGNATURE, {SEQUENCE_INPUT: one}),
        }
    stream_fn, whole_fn = saved[STREAM_SIGNATURE], saved[DEFAULT_SIGNATURE]
    zero_states = {
        key: tf.zeros([1, spec.shape[1]])
        for key, spec in stream_fn.structured_input_signature[1].items()
        if key != SEQUENCE_INPUT
    }
    chunk_t, one_t = tf.constant(chunk), tf.constant(one)
    calls["savedmodel"] = {
        "chunk": lambda: stream_fn(sequence=chunk_t, **zero_states),
        "whole": lambda: whole_fn(sequence=one_t),
    }
    times: dict[str, dict[str, list[float]]] = {n: {"chunk": [], "whole": []} for n in calls}
    for fns in calls.values():  # warm-up
        for fn in fns.values():
            fn()
    for _ in range(max(1, args.repeats // BLOCK)):
        for name, fns in calls.items():
            for kind, fn in fns.items():
                for _ in range(BLOCK):
                    start = time.perf_counter()
                    fn()
                    times[name][kind].append(time.perf_counter() - start)
    for name in calls:
        row = results["rows"].setdefault(name, {})
        for kind in ("chunk", "whole"):
            ms = 1000 * np.asarray(times[name][kind])
            row[f"{kind}_p50_ms"] = float(np.median(ms))
            row[f"{kind}_p99_ms"] = float(np.percentile(ms, 99))
    os.makedirs(args.output, exist_ok=True)
    stem = os.path.join(args.output, f"portable_exports-{args.dataset or args.task}")
    with open(stem + ".json", "w") as file:
        json.dump(results, file, indent=2)
    table = _table(results)
    with open(stem + ".md", "w") as file:
        file.write(table)
    print(table)
    return 0


def _table(results: dict[str, Any]) -> str:
    head = (
        f"{results['task']} ({results['dataset'] or 'default data'}), T={results['steps']}, "
        f"{results['examples']} test examples; "
        f"Keras accuracy {100 * results['keras_accuracy']:.2f}%\n\n"
        "| export | accuracy | change (points) | size (bytes) | 28-step chunk p50 / p99 (ms) "
        "| whole sequence p50 / p99 (ms) |\n|---|---|---|---|---|---|\n"
    )
    lines = []
    for name, row in results["rows"].items():
        accuracy = f"{100 * row['accuracy']:.2f}%" if "accuracy" in row else "-"
        change = f"{row['change_points']:+.2f}" if "change_points" in row else "-"
        lines.append(
            f"| {name} | {accuracy} | {change} | {row['bytes']:,} | "
            f"{row['chunk_p50_ms']:.3f} / {row['chunk_p99_ms']:.3f} | "
            f"{row['whole_p50_ms']:.2f} / {row['whole_p99_ms']:.2f} |"
        )
    return head + "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
