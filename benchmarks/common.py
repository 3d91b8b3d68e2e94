"""What the benchmark entry points share: the environment probe, child processes, timing, output.

`benchmarks.run`, `benchmarks.accelerator` and `benchmarks.gpu_kernel_check`
each run their measurements in child processes (one per Keras backend, or one
per layer where a peak must start fresh), time callables interleaved and
repeated, and write JSON and markdown under `--output` (default
`runs/benchmarks`; the committed results change only with `--output
benchmarks/results`).

Importing this module imports the standard library only: Keras fixes its
backend when it is imported, and the parent processes, which choose a backend
per child, must not import it. The functions that need Keras, PyTorch or JAX
import them when called.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from apputil.cli import OneLineParser
from apputil.files import write_atomically

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUTPUT = os.path.join("runs", "benchmarks")


# --- The command line ---------------------------------------------------------------------------


def parser(prog: str, doc: str, backends: float | None = None) -> OneLineParser:
    """An entry point's parser with `--quick` and `--output` (one-line errors, status 2).

    `backends`: the default seconds per backend; adds `--backends`, `--timeout`
    and the hidden `--child` of the per-backend child processes.
    """
    made = OneLineParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    made.add_argument("--quick", action="store_true", help="tiny shapes (smoke test)")
    made.add_argument(
        "--output", default=DEFAULT_OUTPUT, help=f"results folder (default {DEFAULT_OUTPUT})"
    )
    if backends is not None:
        made.add_argument("--backends", default="jax,torch", help="comma list of Keras backends")
        made.add_argument("--timeout", type=float, default=backends, help="seconds per backend")
        made.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return made


# --- The environment ----------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    """The backend, library versions, machine and accelerator of this process, as JSON."""
    import keras

    backend = keras.backend.backend()
    info: dict[str, Any] = {
        "backend": backend,
        "keras": keras.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "processor": platform.processor(),
    }
    with contextlib.suppress(ImportError):  # JAX and PyTorch machines may lack TensorFlow
        import tensorflow as tf

        info["tensorflow"] = tf.__version__
        info["gpus"] = [d.name for d in tf.config.list_physical_devices("GPU")]
    if backend == "torch":
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["device"] = torch.cuda.get_device_name(0)
            info["cudnn"] = torch.backends.cudnn.version()
    elif backend == "jax":
        import jax

        info["jax"] = jax.__version__
        info["device"] = str(jax.devices()[0].device_kind)
    return info


# --- Child processes ----------------------------------------------------------------------------


class ChildError(RuntimeError):
    """A benchmark's child process failed or ran out of time (the message ends with its stderr)."""


def run_child(
    args: Sequence[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
    capture: bool = True,
) -> str:
    """Runs `python ARGS` in the repository root; returns its standard output.

    Args:
        args: The interpreter's arguments (`["-m", "benchmarks.run", ...]`).
        timeout: Seconds before the child is stopped.
        env: Variables set over this process's environment (`KERAS_BACKEND`, ...).
        capture: Whether to capture the child's output; if not, it goes to this
            process's (a long child shows its progress) and "" is returned.

    Raises:
        ChildError: the child exited with a non-zero status or ran out of time.
    """
    command = " ".join(args)
    environ = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    try:
        done = subprocess.run(
            [sys.executable, *args],
            cwd=ROOT,
            env=environ,
            timeout=timeout,
            capture_output=capture,
            text=True,
        )
    except subprocess.TimeoutExpired:
        raise ChildError(f"{command}: stopped after {timeout:.0f} s") from None
    if done.returncode != 0:
        raise ChildError(f"{command}: exit status {done.returncode}\n{(done.stderr or '')[-3000:]}")
    return done.stdout or ""


def last_json(stdout: str) -> Any:
    """The JSON value on the last line of a child's output."""
    return json.loads(stdout.strip().splitlines()[-1])


def run_backends(
    module: str,
    backends: Iterable[str],
    output: str,
    quick: bool,
    timeout: float,
    extra: Sequence[str] = (),
) -> list[str]:
    """Runs `python -m MODULE --child` once per Keras backend; returns those that failed.

    Each child writes its own results under `output` as it goes, so a child
    that fails or runs out of time keeps what it measured. `extra`: more
    arguments of every child.
    """
    failed = []
    for backend in backends:
        args = ["-m", module, "--child", "--output", output] + (["--quick"] if quick else [])
        args += list(extra)
        env = {"KERAS_BACKEND": backend, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        try:
            run_child(args, timeout, env, capture=False)
        except ChildError as error:
            failed.append(backend)
            print(f"{backend}: {str(error).splitlines()[0]}", file=sys.stderr)
    return failed


def read_backend_results(output: str, pattern: str, backends: Iterable[str]) -> dict[str, Any]:
    """`{backend: results}` of the files `pattern.format(backend)` under `output` that exist."""
    found = {}
    for backend in backends:
        path = os.path.join(output, pattern.format(backend))
        if os.path.exists(path):
            with open(path) as handle:
                found[backend] = json.load(handle)
    return found


def run_sections(
    path: str,
    results: dict[str, Any],
    sections: Iterable[tuple[str, Callable[[Any], Iterator[None]], Any]],
    indent: int = 2,
    keep_going: bool = False,
) -> dict[str, Any]:
    """Runs each `(key, bench, part)`, writing `results` to `path` after every piece.

    `bench(part)` fills `part` (stored as `results[key]`) and yields after each
    piece, so a run cut short keeps what it measured; `results[key_seconds]` is
    the section's time so far. With `keep_going`, a section that raises records
    `part["error"]` and the next one runs.
    """
    import keras

    backend = keras.backend.backend()
    for key, bench, part in sections:
        started = time.time()
        results[key] = part
        try:
            for _ in bench(part):
                results[f"{key}_seconds"] = time.time() - started
                write_json(path, results, indent)
        except Exception as error:
            if not keep_going:
                raise
            part["error"] = f"{type(error).__name__}: {error}"[:2000]
        results[f"{key}_seconds"] = time.time() - started
        write_json(path, results, indent)
        print(f"{backend}: {key} done in {time.time() - started:.0f} s", flush=True)
    return results


# --- Timing -------------------------------------------------------------------------------------


def summary(times: Sequence[float]) -> dict[str, float]:
    """Median, min, max and count of a list of seconds."""
    return {
        "median": statistics.median(times),
        "min": min(times),
        "max": max(times),
        "repeats": len(times),
    }


def sync_device() -> None:
    """Waits for the accelerator (PyTorch on CUDA), so that a timer stops after the work.

    Keras' JAX calls return host arrays, which waits already.
    """
    import keras

    if keras.backend.backend() == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()


def interleaved(
    callables: Mapping[str, Callable[[], object]],
    repeats: int,
    warmup: int,
    sync: bool = False,
) -> dict[str, dict[str, float]]:
    """Times each callable `repeats` times, round-robin, after `warmup` calls each.

    Interleaving spreads a machine's drift (clock, other load) over every
    callable alike. `sync`: wait for the accelerator after each call.
    """
    for call in callables.values():
        for _ in range(warmup):
            call()
    if sync:
        sync_device()
    times: dict[str, list[float]] = {name: [] for name in callables}
    for _ in range(repeats):
        for name, call in callables.items():
            start = time.perf_counter()
            call()
            if sync:
                sync_device()
            times[name].append(time.perf_counter() - start)
    return {name: summary(values) for name, values in times.items()}


# --- Output -------------------------------------------------------------------------------------


def table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> list[str]:
    """A markdown table's lines: the header, the rule, one line per row."""
    return [
        _row(header),
        "|" + "---|" * len(header),
        *(_row(row) for row in rows),
    ]


def _row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def write_json(path: str, data: Any, indent: int = 2) -> None:
    """Writes `data` as JSON to `path`, atomically (a reader never sees half a file)."""
    write_atomically(path, json.dumps(data, indent=indent))


def write_text(path: str, text: str) -> None:
    """Writes `text` to `path`, atomically."""
    write_atomically(path, text)
