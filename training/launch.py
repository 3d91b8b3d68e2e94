"""Start a JAX training run as several processes on this machine.

    python -m training.launch --processes 2 -- --task digits --steps 200 --output-dir runs/mp

starts `python -m training.train ARGS --coordinator 127.0.0.1:PORT
--num-processes N --process-id I` for I in 0..N-1 (on a free port unless
`--port`), with `KERAS_BACKEND=jax` unless set, and prints each one's output
prefixed with `[I]`. When one process fails, the others are stopped and the
launcher exits with the failed one's status; SIGINT or SIGTERM stops them all
(exit 128 + the signal's number). On several hosts, run `training.train` on
each with the same flags instead (docs/training.md).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from apputil import cli
from apputil.errors import check

# Seconds the others get to stop after SIGTERM before they are killed.
GRACE_SECONDS = 10


def build_parser() -> cli.OneLineParser:
    parser = cli.OneLineParser(
        prog="python -m training.launch",
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s --processes N [--port PORT] -- TRAIN_ARGS...",
    )
    parser.add_argument("--processes", type=int, required=True, help="how many processes")
    parser.add_argument(
        "--port", type=int, default=0, help="the coordinator's port on 127.0.0.1 (default: free)"
    )
    return parser


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the coordinator binds it moments later)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class Launch:
    """The processes of one launch, their output forwarding and their stopping."""

    def __init__(self, processes: int, port: int, train_args: list[str]):
        self.address = f"127.0.0.1:{port}"
        self.count, self.train_args = processes, train_args
        self.children: list[subprocess.Popen] = []
        self.forwarders: list[threading.Thread] = []
        self.output_lock = threading.Lock()

    def start(self) -> None:
        env = {**os.environ}
        env.setdefault("KERAS_BACKEND", "jax")
        env["PYTHONUNBUFFERED"] = "1"  # lines arrive as they are printed
        for index in range(self.count):
            argv = [
                sys.executable, "-m", "training.train", *self.train_args,
                "--coordinator", self.address, "--num-processes", str(self.count),
                "--process-id", str(index),
            ]  # fmt: skip
            child = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
            self.children.append(child)
            thread = threading.Thread(target=self._forward, args=(index, child), daemon=True)
            thread.start()
            self.forwarders.append(thread)

    def _forward(self, index: int, child: subprocess.Popen) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            with self.output_lock:
                sys.stdout.write(f"[{index}] {line}")
                sys.stdout.flush()

    def wait(self) -> int:
        """Waits for every process; the first failure stops the rest. Returns the exit status."""
        while True:
            statuses = [child.poll() for child in self.children]
            failed = [
                (index, status) for index, status in enumerate(statuses) if status not in (None, 0)
            ]
            if failed:
                index, status = failed[0]
                self.note(f"process {index} exited with status {_shown(status)}; stopping the rest")
                self.stop()
                return _exit_status(status)
            if all(status == 0 for status in statuses):
                self._drain()
                return 0
            time.sleep(0.1)

    def stop(self, grace: float = GRACE_SECONDS) -> None:
        """SIGTERM to the processes still running, SIGKILL to those left after `grace` s."""
        for child in self.children:
            if child.poll() is None:
                child.terminate()
        deadline = time.monotonic() + grace
        for child in self.children:
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self._drain()

    def _drain(self) -> None:
        for thread in self.forwarders:
            thread.join(timeout=5)

    def note(self, text: str) -> None:
        with self.output_lock:
            print(f"python -m training.launch: {text}", file=sys.stderr, flush=True)


def _shown(status: int) -> str:
    return f"{status} ({signal.Signals(-status).name})" if status < 0 else str(status)


def _exit_status(status: int) -> int:
    """A child's status as a shell reports it: killed by signal N is 128 + N."""
    return 128 - status if status < 0 else status


class _Stopped(Exception):
    def __init__(self, number: int):
        self.number = number


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if "--" not in argv:
        parser.error("give the training.train arguments after --")
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    train_args = argv[split + 1 :]
    launch: Launch | None = None

    def body():
        nonlocal launch
        check(args.processes > 0, "--processes", "a positive integer", args.processes)
        check(0 <= args.port < 65536, "--port", "a port in 0..65535", args.port)
        for name in ("--coordinator", "--num-processes", "--process-id"):
            check(name not in train_args, name, "no value: the launcher sets it", name)

        def stopped(number, frame):
            raise _Stopped(number)

        previous = {n: signal.signal(n, stopped) for n in (signal.SIGINT, signal.SIGTERM)}
        launch = Launch(args.processes, args.port or free_port(), train_args)
        try:
            launch.start()
            return launch.wait()
        except _Stopped as stop:
            launch.note(f"stopping the processes ({signal.Signals(stop.number).name})")
            launch.stop()
            return 128 + stop.number
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    try:
        return cli.run(parser.prog, body)
    finally:
        if launch is not None:  # whatever happened, no process outlives the launcher
            for child in launch.children:
                if child.poll() is None:
                    child.kill()
                    child.wait()


if __name__ == "__main__":
    sys.exit(main())
