"""`Cluster`: the processes of one JAX run, from joining them to leaving together.

A run on several processes (or hosts) joins them through JAX's coordination
service before JAX computes anything, keeps who is where, notices a peer that
is gone, and ends every process with one line instead of JAX's stack traces.
JAX waits in C++ and aborts the whole process when a peer or the coordinator
is gone, so a failed multi-process run ends with `os._exit`, and the join
has a watchdog thread. The JAX internals this needs (the coordination
client's key-value store and live-node query) are read here only. On other
backends, and with one process, a `Cluster` does nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from apputil.cli import EXIT_FAILURE, EXIT_USAGE
from apputil.errors import invalid
from apputil.net import is_loopback
from apputil.processes import pid_alive
from training.errors import ProcessLostError, StrategyError

#: Seconds between two looks of the peer watch at this host's other processes.
PEER_POLL_SECONDS = 0.25
#: Seconds JAX's own join timeout runs past `--connect-timeout`: when it runs out, JAX's
#: client aborts the process with a C++ stack, so the one-line give-up must come first.
JAX_TIMEOUT_MARGIN = 30
#: Seconds process 0 waits past the others before giving up: they leave first, each with
#: its one line, before the coordinator it serves goes (which would abort them).
COORDINATOR_EXTRA_SECONDS = 3
#: Seconds process 0 waits, after the others said they leave, before it goes.
LEAVE_GRACE_SECONDS = 1.0

_NOT_ALL = "not every process joined"


@dataclasses.dataclass(frozen=True)
class Processes:
    """The processes of a JAX run: `coordinator` (`HOST:PORT` or "auto"), `count`, `index`.

    From the flags (`--coordinator`, `--num-processes`, `--process-id`), else
    Keras' variables (`KERAS_DISTRIBUTION_JOB_ADDRESSES`, whose first address
    is the coordinator, `KERAS_DISTRIBUTION_NUM_PROCESSES`,
    `KERAS_DISTRIBUTION_PROCESS_ID`), else JAX's `JAX_COORDINATOR_ADDRESS`.
    No coordinator: one process.
    """

    coordinator: str | None = None
    count: int | None = None
    index: int | None = None

    @classmethod
    def resolve(
        cls, coordinator: str | None = None, count: int | None = None, index: int | None = None
    ) -> Processes:
        environ = os.environ
        addresses = environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES", "")
        coordinator = (
            coordinator or addresses.split(",")[0].strip() or environ.get("JAX_COORDINATOR_ADDRESS")
        )
        count = count if count is not None else _int_variable("KERAS_DISTRIBUTION_NUM_PROCESSES")
        index = index if index is not None else _int_variable("KERAS_DISTRIBUTION_PROCESS_ID")
        return cls(coordinator or None, count, index)


def _int_variable(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise invalid(name, "an integer", raw, StrategyError) from None


def _exit(status: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _jax_client() -> Any:
    """The coordination client JAX connected (its key-value store and live-node query)."""
    from jax._src import distributed

    return distributed.global_state.client


class Cluster:
    """The processes this one trains with, once joined (one process until then).

    Args:
        prog: The command's name, in the one-line errors it ends a process with.
        exit: Ends the process with a status (default: at once, without the
            interpreter's exit, at which JAX would wait for the lost peer).
        client: Returns JAX's coordination client (default: the one JAX connected).
        poll_seconds: The peer watch's period.
        leave_grace_seconds: How long process 0 waits after the others left.

    `processes`, `count` and `roster` (index -> host and pid) describe the
    processes once joined; `lost` the indices of those found gone.
    """

    def __init__(
        self,
        prog: str = "python -m training.train",
        *,
        exit: Callable[[int], object] = _exit,
        client: Callable[[], Any] = _jax_client,
        poll_seconds: float = PEER_POLL_SECONDS,
        leave_grace_seconds: float = LEAVE_GRACE_SECONDS,
    ):
        self.prog, self._exit, self._client = prog, exit, client
        self.poll_seconds, self.leave_grace_seconds = poll_seconds, leave_grace_seconds
        self.processes: Processes | None = None
        self.count = 1
        self.roster: dict[int, dict[str, Any]] = {}
        self.lost: list[int] | None = None
        self._attempted = False
        self._ended = False
        # Whoever finds a lost process first (a failed collective or the peer watch) reports it.
        self._loss_claim = threading.Lock()

    def record(
        self, processes: Processes, count: int, roster: dict[int, dict[str, Any]] | None = None
    ) -> None:
        """Keeps who joined: `processes` as given, `count` of them, `roster` index -> host, pid."""
        self.processes, self.count, self.roster = processes, count, dict(roster or {})

    @property
    def multi_process(self) -> bool:
        """Whether this process trains together with others (after `join`)."""
        return self.count > 1

    def join(
        self, processes: Processes, connect_timeout: int = 120, heartbeat_timeout: int = 30
    ) -> bool:
        """Connects this JAX process to the others (once, before JAX computes anything).

        Does nothing without a coordinator. Returns whether several processes
        train together. CPUs reduce with gloo, so processes of one machine (or
        of hosts without accelerators) train together too. A process that has
        not joined every other one `connect_timeout` seconds after this call
        (its peers never started, or were killed with their launcher) prints
        `PROG: error: ...` and exits with status 2: JAX itself would abort it
        with a stack trace.

        Raises:
            StrategyError: an address that is not this machine's (process 0) or
                does not resolve, a coordinator port in use (process 0), a count
                or id that disagrees with the other processes', or a coordinator
                that does not answer within `connect_timeout` seconds.
        """
        if processes.coordinator is None:
            return False
        import jax

        if jax.distributed.is_initialized():
            return jax.process_count() > 1
        deadline = time.monotonic() + connect_timeout
        auto = processes.coordinator == "auto"
        if not auto:
            check_processes(processes)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        kwargs: dict[str, Any] = dict(
            heartbeat_timeout_seconds=heartbeat_timeout,
            shutdown_timeout_seconds=connect_timeout,
        )
        if not auto:
            host, port = processes.coordinator.rsplit(":", 1)
            kwargs.update(
                coordinator_address=processes.coordinator,
                num_processes=processes.count,
                process_id=processes.index,
            )
            if is_loopback(host):  # one machine: nothing outside it can reach the coordinator
                kwargs["coordinator_bind_address"] = f"{host}:{port}"
            if processes.index:
                _wait_for_coordinator(host, int(port), processes, connect_timeout)
            else:
                check_port_free(host, int(port))
                deadline += COORDINATOR_EXTRA_SECONDS
        left = max(1, int(deadline - time.monotonic()))
        kwargs["initialization_timeout"] = left + JAX_TIMEOUT_MARGIN
        self._attempted = True
        give_up = self._give_up_at(deadline, _connect_failure(processes, connect_timeout, _NOT_ALL))
        try:
            try:
                jax.distributed.initialize(**kwargs)
            except Exception as error:  # JAX's own classes, without a public base
                raise StrategyError(_connect_failure(processes, connect_timeout, error)) from None
            # The count this process was given, not jax.process_count(): that builds the
            # devices, which wait for as many processes as this one was told of.
            self.record(processes, processes.count or jax.process_count())
            self._check_agreement(processes, max(1, int(deadline - time.monotonic())))
        finally:
            give_up.set()
        return jax.process_count() > 1

    def _give_up_at(self, deadline: float, message: str) -> threading.Event:
        """Ends this process with `PROG: error: MESSAGE` (status 2) at `deadline`, unless set
        first. Returns the event that calls it off. JAX waits for the other processes in C++
        and cannot be interrupted: a daemon thread is what can end the wait."""
        done = threading.Event()

        def watch() -> None:
            if done.wait(max(0.0, deadline - time.monotonic())):
                return
            print(f"{self.prog}: error: {message}", file=sys.stderr)
            self._exit(EXIT_USAGE)

        threading.Thread(target=watch, name="join-deadline", daemon=True).start()
        return done

    def _check_agreement(self, processes: Processes, timeout: int) -> None:
        """Refuses to train when the processes disagree on their count; keeps who is where.

        A process that names fewer processes than the coordinator expects would
        otherwise wait for ones that never come: each one publishes its count (and
        its host and pid, to tell later which one was lost) and compares it with
        every other's before JAX builds its devices.
        """
        if processes.coordinator == "auto":
            return
        client = self._client()
        mine = {"count": processes.count, "host": socket.gethostname(), "pid": os.getpid()}
        client.key_value_set(f"keras_antisym/processes/{processes.index}", json.dumps(mine))
        # One deadline for the whole roster: waiting `timeout` for each process in turn
        # would keep a process whose peers never come for count × timeout seconds.
        deadline = time.monotonic() + timeout
        for index in range(self.count):
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
            try:
                theirs = json.loads(
                    client.blocking_key_value_get(f"keras_antisym/processes/{index}", left_ms)
                )
            except Exception:  # JAX's own classes: the other process left, or never published
                continue
            self.roster[index] = theirs
            if theirs["count"] != processes.count:
                raise StrategyError(
                    f"process {processes.index} was started with --num-processes "
                    f"{processes.count}, process {index} with {theirs['count']}: give every "
                    f"process the same count"
                )
        if self.count != processes.count:
            raise StrategyError(
                f"--num-processes {processes.count}, but the coordinator at "
                f"{processes.coordinator} counts {self.count} processes: give every "
                f"process the same count"
            )

    def lost_processes_error(self, error: BaseException) -> ProcessLostError | None:
        """The `ProcessLostError` behind a failed collective, or None if no process was lost.

        A collective fails at once when a peer's connection closes. A peer on this
        host is looked up by its pid at once; otherwise the coordinator knows once
        the peer's heartbeats stop (the heartbeat timeout).
        """
        if not self.multi_process:
            return None
        everyone = list(range(self.count))
        host = socket.gethostname()
        lost = [
            index
            for index, entry in self.roster.items()
            if entry["host"] == host and not pid_alive(entry["pid"])
        ]
        if not lost:
            try:
                live = set(self._client().get_live_nodes(everyone))
            except Exception:  # JAX's own classes: the coordinator itself is gone
                live = set(everyone) - {0}
            lost = [index for index in everyone if index not in live]
        if not lost:
            return None
        if not self.claim_loss(lost):  # the peer watch reports it and ends this process
            threading.Event().wait()
        return ProcessLostError(self.lost_message(sorted(lost)))

    @contextlib.contextmanager
    def losses(self, expected: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
        """Turns an exception raised inside while a process is lost into its `ProcessLostError`.

        A lost peer fails whatever this process does next that needs it: a training
        step's collective, and as well a metric's reset, a checkpoint's agreement or
        an evaluation, each a JAX error with a stack trace of its own. Inside this
        block any of them ends the run with the one lost-process line. Exceptions of
        the `expected` classes (the command's own one-line errors), and any raised
        while every process lives, pass unchanged.
        """
        try:
            yield
        except Exception as error:  # JAX's runtime errors have no public base class
            if isinstance(error, expected):
                raise
            lost = self.lost_processes_error(error)
            if lost is None:
                raise
            raise lost from None

    def claim_loss(self, lost: list[int]) -> bool:
        """Records `lost`; False when a loss was claimed already (by the other finder), or
        when the run has ended (`finish`): a peer that leaves then is leaving normally."""
        with self._loss_claim:
            if self.lost is not None or self._ended:
                return False
            self.lost = lost
            return True

    def watch_peers(self) -> None:
        """Ends this process with the lost-process error once a peer on this host is gone.

        A collective fails at once when a peer's connection closes, but a process
        may be elsewhere when its peer dies (writing a checkpoint, waiting on the
        key-value store): JAX would notice only at the heartbeat timeout, and then
        abort every process with a stack trace. A daemon thread looks at the pids
        of the roster's processes on this host every `poll_seconds`; peers on
        other hosts are left to the collectives and the heartbeat.
        """
        if not self.multi_process or self.processes is None:
            return
        host, mine = socket.gethostname(), self.processes.index
        peers = {
            index: entry["pid"]
            for index, entry in self.roster.items()
            if entry["host"] == host and index != mine
        }
        if not peers:
            return

        def watch() -> None:
            while True:
                time.sleep(self.poll_seconds)
                lost = sorted(index for index, pid in peers.items() if not pid_alive(pid))
                if not lost:
                    continue
                if self.claim_loss(lost):
                    print(f"{self.prog}: error: {self.lost_message(lost)}", file=sys.stderr)
                    self.leave_together(EXIT_FAILURE)
                    self._exit(EXIT_FAILURE)
                # A failed collective found it first (that path reports and exits), or the
                # run has ended and the peer left at its own exit.
                return

        threading.Thread(target=watch, name="peer-watch", daemon=True).start()

    def lost_message(self, lost: list[int]) -> str:
        """The one line that says which processes were lost and what to do."""
        processes = self.processes
        names = ", ".join(str(index) for index in lost)
        which = f"process {names}" if len(lost) == 1 else f"processes {names}"
        if lost == [0] and processes is not None:
            which += f" (the coordinator at {processes.coordinator})"
        return (
            f"lost {which} of {self.count} (killed, crashed or unreachable); the others "
            f"stopped: start all {self.count} processes again to resume from the last "
            f"checkpoint"
        )

    def finish(self, status: int) -> int:
        """The exit of a command: a failed multi-process run ends here, at once.

        On exit JAX waits at a barrier for every process, and aborts with a stack
        trace when one is gone; a failed run has nothing left to wait for. From
        here on a peer that is gone is not a loss: the others leave at their own
        pace once the run is over (the peer watch stops).
        """
        with self._loss_claim:
            self._ended = True
        if status and self._attempted:
            self.leave_together(status)
            self._exit(status)
        return status

    def leave_together(self, status: int, wait_seconds: float = 5) -> None:
        """Process 0, which serves the coordinator, leaves after the others have said why.

        When the coordinator goes, JAX's client aborts the processes still running
        with a stack trace: each one first writes that it is leaving, and process 0
        waits (briefly) for those of the others that are not lost.
        """
        processes = self.processes
        if processes is None or processes.coordinator == "auto":
            return
        try:
            client = self._client()
            client.key_value_set(f"keras_antisym/leaving/{processes.index}", str(status))
            if processes.index != 0:
                return
            for index in range(1, self.count):
                if index not in (self.lost or ()):
                    client.blocking_key_value_get(
                        f"keras_antisym/leaving/{index}", int(wait_seconds * 1000)
                    )
            # A process that has said it leaves still has to reach its exit: had the
            # coordinator gone first, JAX would abort it with a stack trace on a loaded machine.
            time.sleep(self.leave_grace_seconds)
        except Exception:  # JAX's own classes: a process that is gone cannot answer
            pass

    def agree(self, value: int, what: str, hint: str) -> None:
        """Raises `StrategyError` unless every process holds the same integer `value`."""
        if not self.multi_process:
            return
        import numpy as np
        from jax.experimental import multihost_utils

        values = np.asarray(multihost_utils.process_allgather(np.asarray(value, "int64"))).ravel()
        if len(set(values.tolist())) > 1:
            shown_values = ", ".join(f"process {i}: {v}" for i, v in enumerate(values.tolist()))
            raise StrategyError(f"the processes disagree on {what} ({shown_values}); {hint}")


def check_processes(processes: Processes) -> None:
    """Raises `StrategyError` unless the coordinator, count and index fit together and the
    coordinator's address resolves (and, for process 0, is this machine's)."""
    assert processes.coordinator is not None
    host, _, port = processes.coordinator.rpartition(":")
    if not host or not port.isdigit():
        raise invalid("--coordinator", "HOST:PORT", processes.coordinator, StrategyError)
    if processes.count is None or processes.index is None:
        raise StrategyError(
            f"a coordinator ({processes.coordinator}) needs --num-processes and --process-id "
            f"(or KERAS_DISTRIBUTION_NUM_PROCESSES and KERAS_DISTRIBUTION_PROCESS_ID)"
        )
    if not 0 <= processes.index < processes.count:
        raise invalid(
            "--process-id", f"an integer in [0, {processes.count})", processes.index, StrategyError
        )
    try:
        socket.getaddrinfo(host.strip("[]"), int(port))
    except OSError as error:
        raise StrategyError(
            f"the coordinator address {processes.coordinator} does not resolve ({error})"
        ) from None
    if processes.index == 0:  # process 0 serves the coordinator: the address must be its own
        try:
            with socket.socket(_family(host), socket.SOCK_STREAM) as probe:
                probe.bind((host.strip("[]"), 0))
        except OSError:
            raise StrategyError(
                f"the coordinator address {processes.coordinator} is not an address of this "
                f"machine (process 0 serves the coordinator there)"
            ) from None


# The client's connection preface and an empty SETTINGS frame (RFC 9113, sections 3.4 and 6.5).
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_HTTP2_SETTINGS = 4


def _wait_for_coordinator(host: str, port: int, processes: Processes, timeout: float) -> None:
    """Waits until the coordinator answers as a gRPC server, or raises `StrategyError`.

    JAX's client aborts the whole process (SIGABRT, a C++ stack) when it
    cannot register in time: at an address where nothing listens, and also
    where something accepts TCP connections but never answers. The
    coordinator is a gRPC (HTTP/2) server, which opens every connection with
    a SETTINGS frame; checking for it first turns both into one line.
    """
    deadline = time.monotonic() + timeout
    wrong = None  # an answer that was not a coordinator's: kept over a later attempt's silence
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection(
                (host.strip("[]"), port), timeout=max(0.1, min(2.0, left))
            ) as connection:
                connection.sendall(_HTTP2_PREFACE)
                header = _read_exactly(connection, 9)
            if header[3] == _HTTP2_SETTINGS:
                return
            problem = wrong = (
                "something answers there, but not a JAX coordinator (no HTTP/2 SETTINGS)"
            )
        except TimeoutError:  # the last attempt may have had too little time to read
            problem = wrong or "something accepts connections there but does not answer"
        except OSError as error:
            problem = f"no coordinator answers: {error}"
        if time.monotonic() >= deadline:
            raise StrategyError(_connect_failure(processes, timeout, problem)) from None
        time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))


def _read_exactly(connection: socket.socket, size: int) -> bytes:
    """`size` bytes from `connection`; ConnectionError when it closes first."""
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the connection closed without an answer")
        data += chunk
    return data


def check_port_free(host: str, port: int, flag: str = "--coordinator") -> None:
    """Raises `StrategyError` when `port` of `host` is taken by a listening socket.

    JAX's coordinator crashes its process (SIGSEGV, "Failed to add port")
    when its port is in use. SO_REUSEADDR, as gRPC sets it, lets the check
    ignore connections of an earlier run that are still in TIME_WAIT.
    """
    with socket.socket(_family(host), socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as error:
            raise StrategyError(
                f"port {port} on {host} is in use ({error.strerror or error}); give {flag} "
                f"a free port"
            ) from None


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET


def _connect_failure(processes: Processes, timeout: float, error: object) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (
        f"process {processes.index} of {processes.count} could not join the coordinator at "
        f"{processes.coordinator} within {timeout} s ({first[:200]}); check that all "
        f"{processes.count} processes run, with the same --num-processes and --coordinator"
    )
