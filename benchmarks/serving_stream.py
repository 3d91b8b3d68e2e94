"""Per-update latency through the local server: the whole sequence resent, or one chunk streamed.

    python -m benchmarks.serving_stream [--quick] [--output runs/benchmarks]

A client following a growing sequence can resend the whole window with every
new chunk (`serving_default`, T steps each time) or send only the new chunk
with the recurrent states of the previous answer (`stream`). For each input
width (one feature per step, the 28 of a noise-padded Fashion-MNIST row and
the 96 of a noise-padded CIFAR-10 row, the paper's T = 1,000 task)
this exports a `T = 1,000` AntisymmetricRNN classifier (batch 1), serves it
with `python -m serving.server` in its own process and times, in one run and
interleaved in blocks of updates, both kinds of update from one keep-alive
connection: over REST (JSON encoding of the request, the HTTP round trip, the
prediction and the decoding of the answer) and then over gRPC (`GrpcClient`:
TensorProtos of the arrays' bytes, TensorFlow Serving's protos). The same two
signatures are also timed called in this process on tensors (no HTTP, no JSON):
the part of an update that the graph itself costs, and the ratio a front end
with no cost of its own would show.
Prints p50 and p99 of each and the ratios of the medians; writes
`serving_stream.json` and `serving_stream.md` under `--output` (default
`runs/benchmarks`).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import common
from serving.names import DEFAULT_SIGNATURE, SEQUENCE_INPUT, STREAM_SIGNATURE

FULL = {"steps": 1000, "chunk": 28, "units": 128, "repeats": 300, "warmup": 20,
        "block": 10}  # fmt: skip
QUICK = {"steps": 100, "chunk": 28, "units": 16, "repeats": 20, "warmup": 3,
         "block": 5}  # fmt: skip
# Input widths measured: one feature per step; a Fashion-MNIST row (the input of this
# package's T = 1,000 noise-padded task); and a CIFAR-10 row, 32 pixels of 3 channels (the
# input of the paper's T = 1,000 task, noise-padded CIFAR-10). A whole window is m times
# larger to send than with one feature.
FULL_FEATURES = (1, 28, 96)
QUICK_FEATURES = (1,)
SERVER_START_SECONDS = 120


def _export(shape: dict, folder: str) -> str:
    """Exports a seeded `AntisymmetricRNN` + `Dense(10)` classifier; returns the base path."""
    import keras

    from keras_antisym import AntisymmetricRNN
    from serving.exports.export import export_model

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((shape["steps"], shape["features"])),
            AntisymmetricRNN(shape["units"], epsilon=0.01, gamma=0.01),
            keras.layers.Dense(10, name="classification_head"),
        ]
    )
    base = os.path.join(folder, "model")
    export_model(model, base, 1)
    return base


class _Server:
    """`python -m serving.server` on a free port, in its own process (its own GIL)."""

    def __init__(self, base: str):
        command = [sys.executable, "-m", "serving.server", "--model-base-path", base]
        command += ["--model-name", "bench", "--port", "0", "--grpc-port", "0"]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            command, cwd=common.ROOT, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self.grpc = ""
        found = threading.Event()
        threading.Thread(target=self._read, args=(found,), daemon=True).start()
        if not found.wait(SERVER_START_SECONDS):
            self.stop()
            raise common.ChildError(
                "serving.server did not start:\n" + "".join(self.lines[-20:])
            )
        self.host, self.port = self.address
        self.grpc_target = self.grpc  # printed before the URL: read already

    def _read(self, found: threading.Event) -> None:
        assert self.process.stdout is not None  # started with stdout=PIPE
        for line in self.process.stdout:
            self.lines.append(line)
            grpc = re.match(r"Serving \S+ over gRPC on (\S+)", line)
            if grpc:
                self.grpc = grpc[1]
            match = re.match(r"Serving \S+ on http://([^:]+):(\d+)", line)
            if match and not found.is_set():
                self.address = match[1], int(match[2])
                found.set()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _poster(connection: http.client.HTTPConnection, path: str):
    """One `:predict` on the keep-alive connection: encode, send, read, decode."""

    def post(body: dict) -> dict:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read())
        if response.status != 200:
            raise common.ChildError(f"HTTP {response.status}: {answer}")
        return answer

    return post


def _updates(shape: dict, send_whole: Callable, send_chunk: Callable) -> dict:
    """Raw seconds of each update kind, interleaved: `{"whole": [...], "stream": [...]}`.

    `send_whole(window)` predicts on a `(1, T, m)` window; `send_chunk(chunk)` on
    a `(1, chunk, m)` chunk, carrying the states itself.
    """
    rng = np.random.default_rng(0)
    steps, chunk, features = shape["steps"], shape["chunk"], shape["features"]
    window = rng.random((1, steps, features)).astype("float32")

    def whole():
        # The window slides by one chunk: the client resends all T steps.
        window[:, :-chunk] = window[:, chunk:]
        window[:, -chunk:] = rng.random((1, chunk, features))
        send_whole(window)

    def streamed():
        send_chunk(rng.random((1, chunk, features)).astype("float32"))

    calls = {"whole": whole, "stream": streamed}
    for call in calls.values():
        for _ in range(shape["warmup"]):
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    # Interleaved in blocks, so that drift (clock, other load) affects both alike
    # while an update does not pay for the thread pools still busy after a
    # whole-sequence one (a streaming client sends no such requests); the
    # first update of each block is left out for that reason.
    block = shape["block"]
    for _ in range(shape["repeats"] // block):
        for name, call in calls.items():
            for index in range(block + 1):
                start = time.perf_counter()
                call()
                if index:
                    times[name].append(time.perf_counter() - start)
    return times


def _state_sizes(signature_def: dict) -> dict[str, int]:
    """`{state input: units}` of the `stream` signature, from the metadata's signature_def."""
    inputs = signature_def["signature_def"][STREAM_SIGNATURE]["inputs"]
    return {
        name: int(info["tensor_shape"]["dim"][-1]["size"])
        for name, info in inputs.items()
        if name != SEQUENCE_INPUT
    }


def measure(shape: dict, connection: http.client.HTTPConnection) -> dict:
    """Raw seconds of each update through the server: `{"whole": [...], "stream": [...]}`."""
    post = _poster(connection, "/v1/models/bench:predict")
    connection.request("GET", "/v1/models/bench/metadata")
    metadata = json.loads(connection.getresponse().read())
    sizes = _state_sizes(metadata["metadata"]["signature_def"])
    state = {name: [[0.0] * size] for name, size in sizes.items()}

    def send_chunk(chunk):
        body = {"signature_name": STREAM_SIGNATURE,
                "inputs": {SEQUENCE_INPUT: chunk.tolist(), **state}}
        outputs = post(body)["outputs"]
        state.update((name, outputs[name]) for name in sizes)

    return _updates(shape, lambda window: post({"instances": window.tolist()}), send_chunk)


def measure_grpc(shape: dict, client: Any) -> dict:
    """Raw seconds of each update over gRPC (a `serving.client.GrpcClient`): tensors as
    their bytes, the states carried as the arrays of the answers."""
    version, sizes = client.stream_states()
    signatures = client.metadata(version)["metadata"]["signature_def"]["signature_def"]
    (input_name,) = signatures[DEFAULT_SIGNATURE]["inputs"]
    state = {name: np.zeros((1, size), "float32") for name, size in sizes.items()}

    def send_chunk(chunk):
        inputs = {SEQUENCE_INPUT: chunk, **state}
        outputs = client.predict(inputs, version, STREAM_SIGNATURE)["outputs"]
        state.update((name, outputs[name]) for name in sizes)

    def send_whole(window):
        client.predict({input_name: window}, version)

    return _updates(shape, send_whole, send_chunk)


def measure_in_process(shape: dict, base: str) -> dict:
    """Raw seconds of the two signatures called here on tensors (the graph's own cost)."""
    from apputil.quiet import import_tensorflow

    tf = import_tensorflow()
    loaded = tf.saved_model.load(os.path.join(base, "1"))
    whole_fn, stream_fn = loaded.signatures[DEFAULT_SIGNATURE], loaded.signatures[STREAM_SIGNATURE]
    (input_name,) = whole_fn.structured_input_signature[1]
    state = {
        name: tf.zeros([1, spec.shape[-1]])
        for name, spec in stream_fn.structured_input_signature[1].items()
        if name != SEQUENCE_INPUT
    }

    def send_chunk(chunk):
        outputs = stream_fn(sequence=tf.constant(chunk), **state)
        state.update((name, outputs[name]) for name in state)

    def send_whole(window):
        whole_fn(**{input_name: tf.constant(window)})

    return _updates(shape, send_whole, send_chunk)


def _cpu_name() -> str:
    """The CPU's model name (Linux), else what `platform` knows."""
    import platform

    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _stats(seconds: list[float]) -> dict:
    p50, p99 = np.percentile(seconds, [50, 99])
    return {**common.summary(seconds), "p50": float(p50), "p99": float(p99)}


def _measure_width(shape: dict) -> dict:
    """Both kinds of update for one input width: through the server over REST and over
    gRPC, and in process."""
    from serving.client import GrpcClient

    with tempfile.TemporaryDirectory(prefix="serving-stream-") as folder:
        base = _export(shape, folder)
        server = _Server(base)
        connection = http.client.HTTPConnection(server.host, server.port, timeout=60)
        try:
            rest = measure(shape, connection)
            with GrpcClient(server.grpc_target, "bench", timeout=60, retries=0) as client:
                grpc = measure_grpc(shape, client)
        finally:
            connection.close()
            server.stop()
        graph = measure_in_process(shape, base)
    result = {"shape": shape}
    for where, times in (("rest", rest), ("grpc", grpc), ("in_process", graph)):
        stats = {name: _stats(values) for name, values in times.items()}
        ratio = stats["whole"]["median"] / stats["stream"]["median"]
        result[where] = {"latency": stats, "ratio_of_medians": ratio}
    return result


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = common.parser("python -m benchmarks.serving_stream", __doc__)
    args = parser.parse_args(argv)
    base_shape = QUICK if args.quick else FULL
    widths = QUICK_FEATURES if args.quick else FULL_FEATURES
    os.makedirs(args.output, exist_ok=True)
    measured = [_measure_width(dict(base_shape, features=width)) for width in widths]
    results: dict[str, Any] = {
        "environment": {**common.environment(), "cpu": _cpu_name()},
        "widths": measured,
    }
    rows = []
    for each in measured:
        shape = each["shape"]
        for name, label in (
            ("whole", f"whole sequence resent ({shape['steps']} steps)"),
            ("stream", f"one {shape['chunk']}-step chunk streamed"),
        ):
            r, g, p = (each[where]["latency"][name] for where in ("rest", "grpc", "in_process"))
            values = (r["p50"], r["p99"], g["p50"], g["p99"], p["p50"])
            rows.append((shape["features"], label, *(f"{v * 1e3:.2f} ms" for v in values),
                         r["repeats"]))  # fmt: skip
    lines = common.table(
        ["features", "update (batch 1)", "REST p50", "REST p99", "gRPC p50", "gRPC p99",
         "signature alone, p50", "repeats"],
        rows,
    )  # fmt: skip
    lines.append("")
    for each in measured:
        ratios = {where: each[where]["ratio_of_medians"] for where in each if where != "shape"}
        lines.append(
            f"{each['shape']['features']} feature(s) per step: streaming is "
            f"{ratios['rest']:.1f}x cheaper per update over REST, {ratios['grpc']:.1f}x over "
            f"gRPC ({ratios['in_process']:.1f}x for the signatures alone; ratios of the medians)"
        )
    env = results["environment"]
    lines.append(f"CPU: {env['cpu']}, {env['cpus']} cores")
    common.write_json(os.path.join(args.output, "serving_stream.json"), results)
    common.write_text(os.path.join(args.output, "serving_stream.md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
