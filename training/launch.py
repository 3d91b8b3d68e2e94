"""Start a JAX training run as several processes on this machine.

    python -m training.launch --processes 2 -- --task digits --steps 200 --output-dir runs/mp

starts `python -m training.train ARGS --coordinator 127.0.0.1:PORT
--num-processes N --process-id I` for I in 0..N-1 (on a free port unless
`--port`), with `KERAS_BACKEND=jax` unless set, and prints each one's output
prefixed with `[I]`. When one process fails, the others are stopped and the
launcher exits with the failed one's status; SIGINT or SIGTERM stops them all
(exit 128 + the signal's number). On Linux the processes die with the launcher
even when it is killed outright (SIGKILL, an out-of-memory kill). At most one
process per CPU this launcher may use is started unless `--max-processes` says
otherwise, and never more than the machine's process limits leave room for
(about `TASKS_PER_PROCESS` threads each). On several hosts, run
`training.train` on each with the same flags instead (docs/training.md).
"""

from __future__ import annotations

import dataclasses
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from apputil import cli, signals
from apputil.errors import UsageError, check, invalid
from apputil.net import free_port
from apputil.processes import exit_status, parent_death_hook, stop_all
from training.backends.cluster import check_port_free
from training.errors import StrategyError

# Seconds the others get to stop after SIGTERM before they are killed.
GRACE_SECONDS = 10
#: Threads (kernel tasks) one JAX training process runs on the CPU: about 25 were counted
#: at their peak on a 2-core machine. The launcher refuses a launch the machine's process
#: limits have no room for.
TASKS_PER_PROCESS = 24
#: What the processes run: `training.train` with the launch's arguments.
TRAIN_COMMAND = (sys.executable, "-m", "training.train")


class LaunchError(UsageError):
    """A launch this machine cannot start: too many processes, a port in use, no room."""


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
    parser.add_argument(
        "--max-processes",
        type=int,
        default=None,
        help="the most processes to start (default: the CPUs this launcher may run on)",
    )
    return parser


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the system tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class ProcessRoom:
    """How many more kernel tasks (processes and threads) this machine lets us start.

    `free` is None where no limit is known. It is the smallest room left
    under the pids cgroups this process is in (v1 or v2, every ancestor) and,
    for a user other than root, under RLIMIT_NPROC.
    """

    free: int | None
    where: str = ""

    @classmethod
    def read(cls, proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> ProcessRoom:
        rooms = [*_cgroup_rooms(proc, cgroup_root), *_nproc_room(proc)]
        if not rooms:
            return cls(None)
        free, where = min(rooms)
        return cls(max(0, free), where)

    def check(self, processes: int) -> None:
        needed = processes * TASKS_PER_PROCESS
        if self.free is not None and self.free < needed:
            raise LaunchError(
                f"{processes} processes need about {needed} threads ({TASKS_PER_PROCESS} each), "
                f"but {self.where} leaves room for {self.free}: start fewer processes"
            )


def _cgroup_rooms(proc, root):
    """`(free tasks, where)` for each pids cgroup limit above this process."""
    try:
        lines = Path(proc, "self", "cgroup").read_text().splitlines()
    except OSError:
        return []
    folders = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            folders.append((Path(root, "pids"), path))
        elif controllers == "":  # cgroup v2: mounted at the root or at unified/
            folders += [(Path(root), path), (Path(root, "unified"), path)]
    rooms = []
    for mount, path in folders:
        parts = [part for part in path.split("/") if part]
        for depth in range(len(parts), -1, -1):
            folder = mount.joinpath(*parts[:depth])
            try:
                limit = (folder / "pids.max").read_text().strip()
                current = int((folder / "pids.current").read_text())
            except (OSError, ValueError):
                continue
            if limit != "max":
                rooms.append((int(limit) - current, f"the pids cgroup {folder}"))
    return rooms


def _nproc_room(proc):
    """`[(free tasks, where)]` under RLIMIT_NPROC for a user other than root, or []."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    uid = os.getuid()
    if soft == resource.RLIM_INFINITY or uid == 0 or not os.path.isdir(proc):
        return []
    tasks = 0
    for entry in os.scandir(proc):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    tasks += len(os.listdir(os.path.join(entry.path, "task")))
            except OSError:
                continue
    return [(soft - tasks, f"the user's process limit (ulimit -u {soft})")]


class Launch:
    """The processes of one launch, their output forwarding and their stopping.

    `command` is what each process runs before the launch's arguments
    (`TRAIN_COMMAND`: `python -m training.train`).
    """

    def __init__(
        self,
        processes: int,
        port: int,
        train_args: list[str],
        command: tuple[str, ...] = TRAIN_COMMAND,
    ):
        self.address = f"127.0.0.1:{port}"
        self.count, self.train_args, self.command = processes, train_args, command
        self.children: list[subprocess.Popen] = []
        self.forwarders: list[threading.Thread] = []
        self.output_lock = threading.Lock()

    def start(self) -> None:
        """Starts every process, then one thread that forwards all their output.

        The processes are started before any thread of the launcher runs, so
        that what runs between fork and exec (`die_with_parent`) is safe.
        Raises `LaunchError` (after stopping the ones started) when the
        machine cannot start them all.
        """
        env = {**os.environ}
        env.setdefault("KERAS_BACKEND", "jax")
        env["PYTHONUNBUFFERED"] = "1"  # lines arrive as they are printed
        die_with_parent = parent_death_hook()
        try:
            for index in range(self.count):
                argv = [
                    *self.command, *self.train_args,
                    "--coordinator", self.address, "--num-processes", str(self.count),
                    "--process-id", str(index),
                ]  # fmt: skip
                self.children.append(
                    subprocess.Popen(
                        argv,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        preexec_fn=die_with_parent,
                    )
                )
            thread = threading.Thread(target=self._forward, name="forward", daemon=True)
            thread.start()
            self.forwarders.append(thread)
        except (OSError, RuntimeError) as error:  # fork's EAGAIN, "can't start new thread"
            started = len(self.children)
            self.stop(grace=1)
            raise LaunchError(
                f"could not start process {started} of {self.count} ({error}); this machine "
                f"cannot run that many: start fewer processes"
            ) from None

    def _forward(self) -> None:
        """Copies each process's lines to stdout, prefixed with `[I] `, until all close."""
        selector = selectors.DefaultSelector()
        pending: dict[int, bytes] = {}
        for index, child in enumerate(self.children):
            assert child.stdout is not None
            selector.register(child.stdout, selectors.EVENT_READ, index)
            pending[index] = b""
        while selector.get_map():
            for key, _ in selector.select():
                index = key.data
                chunk = os.read(key.fd, 65536)
                if not chunk:  # closed: the process and whatever it started have exited
                    selector.unregister(key.fileobj)
                    lines, pending[index] = [pending[index]] if pending[index] else [], b""
                else:
                    *lines, pending[index] = (pending[index] + chunk).split(b"\n")
                    lines = [line + b"\n" for line in lines]
                if lines:
                    text = "".join(f"[{index}] {line.decode(errors='replace')}" for line in lines)
                    with self.output_lock:
                        sys.stdout.write(text if text.endswith("\n") else text + "\n")
                        sys.stdout.flush()
        selector.close()

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
                return exit_status(status)
            if all(status == 0 for status in statuses):
                self._drain()
                return 0
            time.sleep(0.1)

    def stop(self, grace: float = GRACE_SECONDS) -> None:
        """SIGTERM to the processes still running, SIGKILL to those left after `grace` s."""
        stop_all(self.children, signal.SIGTERM, grace)
        self._drain()

    def _drain(self) -> None:
        for thread in self.forwarders:
            thread.join(timeout=5)

    def note(self, text: str) -> None:
        with self.output_lock:
            print(f"python -m training.launch: {text}", file=sys.stderr, flush=True)


def _shown(status: int) -> str:
    return f"{status} ({signal.Signals(-status).name})" if status < 0 else str(status)


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
        most = usable_cpus() if args.max_processes is None else args.max_processes
        check(most > 0, "--max-processes", "a positive integer", most)
        if args.processes > most:
            where = (
                "the --max-processes given"
                if args.max_processes is not None
                else f"one per CPU this launcher may use; --max-processes {args.processes} "
                f"starts more"
            )
            raise invalid("--processes", f"at most {most} ({where})", args.processes, LaunchError)
        if args.port:
            try:
                check_port_free("127.0.0.1", args.port, "--port")
            except StrategyError as error:
                raise LaunchError(str(error)) from None
        ProcessRoom.read().check(args.processes)

        def stopped(number, frame):
            raise _Stopped(number)

        with signals.handling(stopped):
            launch = Launch(args.processes, args.port or free_port(), train_args)
            try:
                launch.start()
                return launch.wait()
            except _Stopped as stop:
                launch.note(f"stopping the processes ({signal.Signals(stop.number).name})")
                launch.stop()
                return 128 + stop.number

    try:
        return cli.run(parser.prog, body)
    finally:
        if launch is not None:  # whatever happened, no process outlives the launcher
            for child in launch.children:
                if child.poll() is None:
                    child.kill()
                    child.wait()


if __name__ == "__main__":
    cli.execute(main)
