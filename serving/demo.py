"""The main job end to end, offline: train, export, serve, predict over REST, stop.

    python -m serving.demo [--output-dir runs/demo] [--export-base models/antisym]
    python -m serving.demo --stream [--timesteps 256] [--chunk 8] [--litert [--litert-base B]]

1. `python -m training.train` on the embedded `digits` task (resumes if run before),
2. `python -m serving.export` to the next free version under `--export-base`,
3. `python -m serving.server` on a free 127.0.0.1 port,
4. a REST prediction of test digits through `serving.client`, printed,
5. the server stopped (also on errors).

`--stream` trains on digits padded with Gaussian noise to `--timesteps` steps
(its own folders: runs/demo-stream, models/antisym-stream) and, in step 4,
sends one test digit's noise-padded sequence to the `stream` signature
`--chunk` steps at a time (8: one image row), printing the prediction after
each chunk: the model's answer for the steps received so far. Training scores
only the answer after all T steps, so the answer wanders while the digit's
rows and the noise arrive and settles as the sequence nears T; each update
costs one chunk, not the whole sequence again. `--stream --litert` also exports
`model.tflite` (`--format litert`) to the next free version of its own base path,
`--litert-base` (default: `--export-base` with `-litert`, so that a server of the
SavedModel base path never meets a LiteRT version), and streams the digit through
LiteRT's interpreter in this process, as an on-device loop would, with no server.

A failed step prints one line and exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from apputil.cli import EXIT_FAILURE, OneLineParser, execute, run
from apputil.errors import check
from apputil.net import free_port
from serving.client import ServingClient, ServingError
from training.run.rundir import RunDir
from training.tasks.catalog import get_task

MODEL_NAME = "antisym"


class DemoError(RuntimeError):
    """A step of the demo failed (the server did not start, a command failed)."""


def _next_version(export_base: str) -> int:
    if not os.path.isdir(export_base):
        return 1
    # ASCII digits only, as the server reads versions ("²".isdigit() is True).
    versions = [int(name) for name in os.listdir(export_base) if re.fullmatch(r"[0-9]+", name)]
    return max(versions, default=0) + 1


def _run(args: list[str], step: str) -> None:
    print(f"[{step}] {' '.join(args)}", flush=True)
    status = subprocess.run([sys.executable, *args]).returncode
    if status != 0:
        raise DemoError(f"step {step!r} failed with exit status {status}")


def _wait_until_serving(
    client: ServingClient, process: subprocess.Popen, deadline_seconds: float
) -> dict:
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DemoError(f"the server exited with status {process.returncode}")
        try:
            return client.status()
        except ServingError:
            time.sleep(0.25)
    raise DemoError(f"the server did not answer within {deadline_seconds} s")


def _test_digits(count: int, timesteps: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The first `count` test digits, as the `digits` task feeds them (noise-padded to T)."""
    task = get_task("digits", timesteps=timesteps)
    images, labels = task.examples("test")
    x, y = task.make_batch(images[:count], labels[:count], np.zeros(2, "int32"))
    return np.asarray(x), np.asarray(y)


def _train_and_export(args: argparse.Namespace) -> int:
    """Train (or resume) on `digits`, export the next free version; returns the version."""
    train = ["-m", "training.train", "--task", "digits", "--steps", str(args.steps)]
    if args.stream:
        train += ["--timesteps", str(args.timesteps)]
    _run([*train, "--output-dir", args.output_dir], "train")
    version = _next_version(args.export_base)
    model = RunDir(args.output_dir).model
    export = ["-m", "serving.export", "--model", model, "--export-base", args.export_base]
    _run([*export, "--version", str(version)], "export")
    return version


def _predict_and_print(client: ServingClient, count: int, version: int) -> None:
    x, labels = _test_digits(count)
    print(f"[predict] POST /v1/models/{MODEL_NAME}:predict with {len(x)} test digits")
    predictions = client.predict(instances=x.tolist())["predictions"]
    correct = 0
    for prediction, label in zip(predictions, labels, strict=True):
        confidence = max(prediction["probabilities"])
        correct += prediction["class_id"] == int(label)
        print(f"  true {int(label)}  predicted {prediction['class_id']}  p={confidence:.3f}")
    print(f"[predict] {correct}/{len(labels)} correct (model version {version})")


def _litert_answers(args: argparse.Namespace) -> tuple[Callable[[Iterable], Iterator], int]:
    """`(stream(chunks), version)`: `model.tflite` of the run, exported to the next free
    version of `--litert-base`, and its stream through LiteRT's interpreter."""
    from serving.exports.runtimes import LiteRTModel

    version = _next_version(args.litert_base)
    folder = os.path.join(args.litert_base, str(version))
    model = RunDir(args.output_dir).model
    export = ["-m", "serving.export", "--model", model, "--export-base", args.litert_base]
    _run([*export, "--version", str(version), "--format", "litert"], "export")
    runtime = LiteRTModel(os.path.join(folder, "model.tflite"))
    print(f"[litert] {os.path.join(folder, 'model.tflite')}: builtin ops only, in this process")

    def stream(chunks: Iterable) -> Iterator[dict]:
        states = runtime.start(1)
        for chunk in chunks:
            answer = runtime.run("stream", sequence=np.asarray(chunk)[None], **states)
            states = {name: answer[name] for name in states}
            yield {key: value[0].tolist() for key, value in answer.items()}

    return stream, version


def _stream_and_print(
    stream: Callable[[Iterable], Iterator], version: int, args: argparse.Namespace
) -> None:
    """Streams one noise-padded test digit chunk by chunk; prints how the prediction settles."""
    x, labels = _test_digits(args.examples, args.timesteps)
    sequence, label = x[-1], int(labels[-1])
    steps = len(sequence)
    print(f"[stream] a test digit ({label}): 64 informative steps (8 rows of 8 pixels), "
          f"then {steps - 64} steps of noise, {args.chunk} steps per request")  # fmt: skip
    chunks = (sequence[start : start + args.chunk] for start in range(0, steps, args.chunk))
    history = []
    for index, answer in enumerate(stream(chunks)):
        seen = min((index + 1) * args.chunk, steps)
        confidence = max(answer["probabilities"])
        history.append((seen, answer["class_id"]))
        part = "digit" if seen <= 64 else "noise"
        bar = "#" * round(20 * confidence)
        print(f"  steps {seen:4d}/{steps} ({part})  predicted {answer['class_id']}  "
              f"p={confidence:.3f}  {bar}")  # fmt: skip
    final = history[-1][1]
    settled = next(seen for i, (seen, _) in enumerate(history)
                   if all(c == final for _, c in history[i:]))  # fmt: skip
    print(f"[stream] true {label}  predicted {final}, unchanged from step {settled} on "
          f"(model version {version})")  # fmt: skip


def _stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    print("[stop] server stopped")


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = OneLineParser(prog="python -m serving.demo", description=__doc__)
    parser.add_argument("--output-dir", help="default runs/demo (runs/demo-stream)")
    parser.add_argument("--export-base", help="default models/antisym (models/antisym-stream)")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--examples", type=int, default=8, help="test digits to predict")
    parser.add_argument("--stream", action="store_true", help="stream a noise-padded digit")
    parser.add_argument("--timesteps", type=int, default=256, help="--stream: padded length")
    parser.add_argument("--chunk", type=int, default=8, help="--stream: steps per request")
    parser.add_argument(
        "--litert",
        action="store_true",
        help="--stream: export model.tflite and stream through LiteRT's interpreter in this "
        "process, as an on-device loop would (no server)",
    )
    parser.add_argument("--litert-base", help="--litert: default <--export-base>-litert")
    args = parser.parse_args(argv)
    suffix = "-stream" if args.stream else ""
    args.output_dir = args.output_dir or f"runs/demo{suffix}"
    args.export_base = args.export_base or os.path.join("models", MODEL_NAME + suffix)
    args.litert_base = args.litert_base or args.export_base.rstrip(os.sep) + "-litert"
    return run(
        parser.prog, lambda: _demo(args), {DemoError: EXIT_FAILURE, ServingError: EXIT_FAILURE}
    )


def _demo(args: argparse.Namespace) -> None:
    """Trains, exports, serves, predicts, and stops the server whatever happens."""
    if args.stream:
        check(args.chunk >= 1, "--chunk", "a positive number of steps", args.chunk)
        check(args.timesteps >= 64, "--timesteps", "at least 64 (a digit's own steps)",
              args.timesteps)  # fmt: skip
    check(not args.litert or args.stream, "--litert", "with --stream", args.litert)
    check(os.path.abspath(args.litert_base) != os.path.abspath(args.export_base),
          "--litert-base", "a folder other than --export-base", args.litert_base)  # fmt: skip
    version = _train_and_export(args)
    if args.litert:
        _stream_and_print(*_litert_answers(args), args)
        return
    port = free_port()
    command = ["-m", "serving.server", "--model-base-path", args.export_base]
    command += ["--model-name", MODEL_NAME, "--port", str(port), "--grpc-port", "0"]
    print(f"[serve] {' '.join(command)}", flush=True)
    server = subprocess.Popen([sys.executable, *command])
    try:
        client = ServingClient(f"http://127.0.0.1:{port}", MODEL_NAME, timeout=30)
        status = _wait_until_serving(client, server, deadline_seconds=120)
        print(f"[serve] {json.dumps(status)}")
        if args.stream:
            _stream_and_print(client.stream, version, args)
        else:
            _predict_and_print(client, args.examples, version)
    finally:
        _stop(server)


if __name__ == "__main__":
    execute(main)
