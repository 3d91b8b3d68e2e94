"""A head on every step in the LiteRT and ONNX exports, against a head on the last step.

    python -m benchmarks.per_step_heads [--timesteps 1000 4000] [--units 128] \
        [--repeats 30] [--quick] [--output runs/benchmarks]

For each T this builds two float32 models on `(batch, T, 28)` sequences,
`AntisymmetricRNN(units)` and a 10-class Dense either on the last step (the
anchor) or on every step (`return_sequences=True`), exports both to LiteRT and
to ONNX (tf2onnx), and times one whole sequence (`serving_default`, batch 1,
one thread per runtime) in each runtime, all interleaved. The ratio of the
medians, per-step over last-step, is what keeping the T outputs costs: it
stays flat in T when the loop writes each step's output once, and grows with
T when it copies the outputs so far at every step. The weights are random:
latency does not depend on them. Writes `per_step_heads.json` and `.md`.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

import numpy as np

from benchmarks import common
from serving.names import DEFAULT_SIGNATURE, SEQUENCE_INPUT
from training.tasks.heads import HEADS

FEATURES, CLASSES = 28, 10
COMPARED = {"last step": "classification", "every step": "per_step_classification"}


def _model(steps: int, units: int, per_step: bool) -> Any:
    import keras

    from keras_antisym import AntisymmetricRNN

    keras.utils.set_random_seed(0)
    inputs = keras.Input((steps, FEATURES))
    hidden = AntisymmetricRNN(units, return_sequences=per_step)(inputs)
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(hidden))


def _runtimes(model: Any, head: str, base: str) -> dict[str, Any]:
    from serving.exports import litert
    from serving.exports.export import export_model
    from serving.exports.runtimes import LiteRTModel, OnnxModel

    lite = export_model(model, base, 1, format="litert", head=head)
    onnx = export_model(model, base, 2, format="onnx", head=head)
    return {
        "litert": LiteRTModel(os.path.join(lite, litert.FILE_NAME), threads=1),
        "onnx": OnnxModel(onnx, threads=1),
    }


def measure(steps: int, units: int, repeats: int) -> dict[str, Any]:
    """Median seconds of a whole sequence per runtime and head, and the ratios."""
    sequence = np.random.default_rng(0).standard_normal((1, steps, FEATURES)).astype("float32")
    calls = {}
    with tempfile.TemporaryDirectory(prefix="per-step-") as base:
        for label, head in COMPARED.items():
            model = _model(steps, units, per_step=HEADS[head].per_step)
            runtimes = _runtimes(model, head, os.path.join(base, head))
            for runtime_name, runtime in runtimes.items():
                calls[f"{runtime_name}, {label}"] = lambda runtime=runtime: runtime.run(
                    DEFAULT_SIGNATURE, **{SEQUENCE_INPUT: sequence}
                )
        times = common.interleaved(calls, repeats=repeats, warmup=2)
    median = {name: stats["median"] for name, stats in times.items()}
    ratios = {
        runtime: median[f"{runtime}, every step"] / median[f"{runtime}, last step"]
        for runtime in ("litert", "onnx")
    }
    return {"steps": steps, "units": units, "times": times, "ratios": ratios}


def _table(results: list[dict[str, Any]]) -> str:
    header = ["T", "runtime", "last step p50 (ms)", "every step p50 (ms)", "every / last"]
    rows = [
        [
            result["steps"],
            runtime,
            f"{1000 * result['times'][f'{runtime}, last step']['median']:.2f}",
            f"{1000 * result['times'][f'{runtime}, every step']['median']:.2f}",
            f"{ratio:.2f}×",
        ]
        for result in results
        for runtime, ratio in result["ratios"].items()
    ]
    return "\n".join(common.table(header, rows)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = common.parser("python -m benchmarks.per_step_heads", __doc__ or "")
    parser.add_argument("--timesteps", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--units", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ["TF_NUM_INTRAOP_THREADS"] = os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    steps_list, units, repeats = args.timesteps, args.units, args.repeats
    if args.quick:
        steps_list, units, repeats = [20, 80], 8, 3
    results = [measure(steps, units, repeats) for steps in steps_list]
    os.makedirs(args.output, exist_ok=True)
    text = _table(results)
    common.write_json(
        os.path.join(args.output, "per_step_heads.json"),
        {"environment": common.environment(), "results": results},
    )
    common.write_text(os.path.join(args.output, "per_step_heads.md"), text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
