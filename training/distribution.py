"""The `--strategy` choices.

TensorFlow: one device, mirrored GPUs/CPUs, multi-worker, TPU (`tf.distribute`).
JAX: one device or `keras.distribution.DataParallel` over every device of
every process (multi-host after `keras.distribution.initialize`). PyTorch: one
device. TensorFlow is imported only on its backend.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import threading
import time
from typing import Any

from apputil.cli import EXIT_FAILURE, EXIT_USAGE
from apputil.errors import invalid
from apputil.net import is_loopback
from apputil.processes import pid_alive
from apputil.quiet import native_stderr_silenced
from training.errors import ProcessLostError, StrategyError

STRATEGIES = ("auto", "default", "mirrored", "multi_worker", "tpu", "data_parallel")
TF_STRATEGIES = ("auto", "default", "mirrored", "multi_worker", "tpu")
KERAS_STRATEGIES = {"jax": ("auto", "default", "data_parallel"), "torch": ("auto", "default")}


def split_cpu(devices: int) -> None:
    """Splits the host CPU into `devices` logical devices (before the backend starts).

    Lets MirroredStrategy, DataParallel on JAX (and tests) run several
    replicas on one CPU. PyTorch has no such devices.
    """
    import keras

    if not devices or devices < 2:
        return
    if keras.backend.backend() == "jax":
        flag = f"--xla_force_host_platform_device_count={devices}"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
        return
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        with native_stderr_silenced():  # listing devices probes CUDA, which prints
            cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * devices
        )


def _tf_config():
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as error:
        raise StrategyError(f"TF_CONFIG is not valid JSON: {error}") from None


def _workers(config):
    cluster = (config or {}).get("cluster", {})
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def _check_strategy(name, allowed, backend):
    if name not in allowed:
        expected = f"one of {', '.join(allowed)} on the {backend} backend"
        raise invalid("--strategy", expected, name, StrategyError)


def make(name: str, tpu: str | None = None) -> Any:
    """What `--strategy name` means on the current backend.

    A `tf.distribute.Strategy` on TensorFlow (made before any other
    TensorFlow op runs: multi-worker collectives must be configured first), a
    `keras.distribution.Distribution` or None on JAX and PyTorch.
    """
    import keras

    if keras.backend.backend() == "tensorflow":
        return make_strategy(name, tpu=tpu)
    return make_keras_distribution(name)


def make_keras_distribution(name: str) -> Any:
    """The `keras.distribution.Distribution` for `name` on JAX or PyTorch (None: one device).

    "auto" picks DataParallel when JAX sees several devices (all processes'
    after `initialize_processes`).
    """
    import keras

    backend = keras.backend.backend()
    _check_strategy(name, KERAS_STRATEGIES[backend], backend)
    if backend != "jax" or name == "default":
        return None
    initialize_processes()  # from the environment, unless the command line did it
    devices = keras.distribution.list_devices()
    if name == "auto" and len(devices) < 2:
        return None
    return keras.distribution.DataParallel(devices=devices)


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
    def resolve(cls, coordinator=None, count=None, index=None) -> Processes:
        environ = os.environ
        addresses = environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES", "")
        coordinator = (
            coordinator or addresses.split(",")[0].strip() or environ.get("JAX_COORDINATOR_ADDRESS")
        )
        count = count if count is not None else _int_variable("KERAS_DISTRIBUTION_NUM_PROCESSES")
        index = index if index is not None else _int_variable("KERAS_DISTRIBUTION_PROCESS_ID")
        return cls(coordinator or None, count, index)


def _int_variable(name):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise invalid(name, "an integer", raw, StrategyError) from None


# Set once the processes have connected: what a lost process's report needs.
_STARTED: dict[str, Any] = {}
_ATTEMPTED = threading.Event()
# Whoever finds a lost process first (a failed collective or the peer watch) reports it.
_LOSS_CLAIM = threading.Lock()
#: Seconds between two looks of the peer watch at this host's other processes.
PEER_POLL_SECONDS = 0.25


#: Seconds JAX's own join timeout runs past `--connect-timeout`: when it runs out, JAX's
#: client aborts the process with a C++ stack, so the one-line give-up must come first.
JAX_TIMEOUT_MARGIN = 30
#: Seconds process 0 waits past the others before giving up: they leave first, each with
#: its one line, before the coordinator it serves goes (which would abort them).
COORDINATOR_EXTRA_SECONDS = 3


def initialize_processes(
    processes: Processes | None = None,
    connect_timeout: int = 120,
    heartbeat_timeout: int = 30,
    prog: str = "python -m training.train",
) -> bool:
    """Connects this JAX process to the others (once, before JAX computes anything).

    Does nothing with one process or off JAX. Returns whether several
    processes train together. CPUs reduce with gloo, so processes of one
    machine (or of hosts without accelerators) train together too. A
    process that has not joined every other one `connect_timeout` seconds
    after this call (its peers never started, or were killed with their
    launcher) prints `PROG: error: ...` and exits with status 2: JAX itself
    would abort it with a stack trace.

    Raises:
        StrategyError: an address that is not this machine's (process 0) or
            does not resolve, a coordinator port in use (process 0), a count
            or id that disagrees with the other processes', or a coordinator
            that does not answer within `connect_timeout` seconds.
    """
    import keras

    processes = processes or Processes.resolve()
    if keras.backend.backend() != "jax" or processes.coordinator is None:
        return False
    import jax

    if jax.distributed.is_initialized():
        return jax.process_count() > 1
    deadline = time.monotonic() + connect_timeout
    auto = processes.coordinator == "auto"
    if not auto:
        _check_processes(processes)
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
    _ATTEMPTED.set()
    give_up = _give_up_at(deadline, prog, _connect_failure(processes, connect_timeout, _NOT_ALL))
    try:
        try:
            jax.distributed.initialize(**kwargs)
        except Exception as error:  # JAX's own classes, without a public base
            raise StrategyError(_connect_failure(processes, connect_timeout, error)) from None
        # The count this process was given, not jax.process_count(): that builds the devices,
        # which wait for as many processes as this one was told of.
        _STARTED.update(processes=processes, count=processes.count or jax.process_count())
        _check_agreement(processes, max(1, int(deadline - time.monotonic())))
    finally:
        give_up.set()
    return jax.process_count() > 1


_NOT_ALL = "not every process joined"


def _give_up_at(deadline: float, prog: str, message: str) -> threading.Event:
    """Ends this process with `PROG: error: MESSAGE` (status 2) at `deadline`, unless set first.

    Returns the event that calls it off. JAX waits for the other processes in
    C++ and cannot be interrupted: a daemon thread is what can end the wait.
    """
    done = threading.Event()

    def watch():
        if done.wait(max(0.0, deadline - time.monotonic())):
            return
        print(f"{prog}: error: {message}", file=sys.stderr)
        _exit(EXIT_USAGE)

    threading.Thread(target=watch, name="join-deadline", daemon=True).start()
    return done


def _check_processes(processes):
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


def _wait_for_coordinator(host, port, processes, timeout):
    """Waits until the coordinator answers as a gRPC server, or raises `StrategyError`.

    JAX's client aborts the whole process (SIGABRT, a C++ stack) when it
    cannot register in time: at an address where nothing listens, and also
    where something accepts TCP connections but never answers. The
    coordinator is a gRPC (HTTP/2) server, which opens every connection with
    a SETTINGS frame; checking for it first turns both into one line.
    """
    deadline = time.monotonic() + timeout
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
            problem = "something answers there, but not a JAX coordinator (no HTTP/2 SETTINGS)"
        except TimeoutError:
            problem = "something accepts connections there but does not answer"
        except OSError as error:
            problem = f"no coordinator answers: {error}"
        if time.monotonic() >= deadline:
            raise StrategyError(_connect_failure(processes, timeout, problem)) from None
        time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))


def _read_exactly(connection, size):
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


def _family(host):
    return socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET


def _connect_failure(processes, timeout, error):
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (
        f"process {processes.index} of {processes.count} could not join the coordinator at "
        f"{processes.coordinator} within {timeout} s ({first[:200]}); check that all "
        f"{processes.count} processes run, with the same --num-processes and --coordinator"
    )


def _check_agreement(processes, timeout):
    """Refuses to train when the processes disagree on their count; keeps who is where.

    A process that names fewer processes than the coordinator expects would
    otherwise wait for ones that never come: each one publishes its count (and
    its host and pid, to tell later which one was lost) and compares it with
    every other's before JAX builds its devices.
    """
    roster = {}
    if processes.coordinator != "auto":
        from jax._src import distributed  # the client JAX connected: its key-value store

        client = distributed.global_state.client
        mine = {"count": processes.count, "host": socket.gethostname(), "pid": os.getpid()}
        client.key_value_set(f"keras_antisym/processes/{processes.index}", json.dumps(mine))
        # One deadline for the whole roster: waiting `timeout` for each process in turn
        # would keep a process whose peers never come for count × timeout seconds.
        deadline = time.monotonic() + timeout
        for index in range(_STARTED["count"]):
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
            try:
                theirs = json.loads(
                    client.blocking_key_value_get(f"keras_antisym/processes/{index}", left_ms)
                )
            except Exception:  # JAX's own classes: the other process left, or never published
                continue
            roster[index] = theirs
            if theirs["count"] != processes.count:
                raise StrategyError(
                    f"process {processes.index} was started with --num-processes "
                    f"{processes.count}, process {index} with {theirs['count']}: give every "
                    f"process the same count"
                )
        if _STARTED["count"] != processes.count:
            raise StrategyError(
                f"--num-processes {processes.count}, but the coordinator at "
                f"{processes.coordinator} counts {_STARTED['count']} processes: give every "
                f"process the same count"
            )
    _STARTED["roster"] = roster


def multi_process() -> bool:
    """Whether this process trains together with others (after `initialize_processes`)."""
    return _STARTED.get("count", 1) > 1


def lost_processes_error(error: BaseException) -> ProcessLostError | None:
    """The `ProcessLostError` behind a failed collective, or None if no process was lost.

    A collective fails at once when a peer's connection closes. A peer on this
    host is looked up by its pid at once; otherwise the coordinator knows once
    the peer's heartbeats stop (the heartbeat timeout).
    """
    if not multi_process():
        return None
    everyone = list(range(_STARTED["count"]))
    host = socket.gethostname()
    lost = [
        index
        for index, entry in _STARTED.get("roster", {}).items()
        if entry["host"] == host and not pid_alive(entry["pid"])
    ]
    if not lost:
        from jax._src import distributed

        try:
            live = set(distributed.global_state.client.get_live_nodes(everyone))
        except Exception:  # JAX's own classes: the coordinator itself is gone
            live = set(everyone) - {0}
        lost = [index for index in everyone if index not in live]
    if not lost:
        return None
    if not _claim_loss(lost):  # the peer watch reports it and ends this process
        threading.Event().wait()
    return ProcessLostError(_lost_message(sorted(lost)))


def _claim_loss(lost):
    """Records `lost`; False when the loss was claimed already (by the other finder)."""
    with _LOSS_CLAIM:
        if "lost" in _STARTED:
            return False
        _STARTED["lost"] = lost
        return True


def watch_peers(prog: str) -> None:
    """Ends this process with the lost-process error once a peer on this host is gone.

    A collective fails at once when a peer's connection closes, but a process
    may be elsewhere when its peer dies (writing a checkpoint, waiting on the
    key-value store): JAX would notice only at the heartbeat timeout, and then
    abort every process with a stack trace. A daemon thread looks at the pids
    of the roster's processes on this host every `PEER_POLL_SECONDS`; peers on
    other hosts are left to the collectives and the heartbeat.
    """
    if not multi_process():
        return
    host, mine = socket.gethostname(), _STARTED["processes"].index
    peers = {
        index: entry["pid"]
        for index, entry in _STARTED.get("roster", {}).items()
        if entry["host"] == host and index != mine
    }
    if not peers:
        return

    def watch():
        while True:
            time.sleep(PEER_POLL_SECONDS)
            lost = sorted(index for index, pid in peers.items() if not pid_alive(pid))
            if not lost:
                continue
            if _claim_loss(lost):
                print(f"{prog}: error: {_lost_message(lost)}", file=sys.stderr)
                _leave_together(EXIT_FAILURE)
                _exit(EXIT_FAILURE)
            return  # a failed collective found it first: that path reports and exits

    threading.Thread(target=watch, name="peer-watch", daemon=True).start()


def _lost_message(lost):
    processes = _STARTED["processes"]
    names = ", ".join(str(index) for index in lost)
    which = f"process {names}" if len(lost) == 1 else f"processes {names}"
    if lost == [0]:
        which += f" (the coordinator at {processes.coordinator})"
    return (
        f"lost {which} of {_STARTED['count']} (killed, crashed or unreachable); the others "
        f"stopped: start all {_STARTED['count']} processes again to resume from the last "
        f"checkpoint"
    )


def finish(status: int) -> int:
    """The exit of a command: a failed multi-process run ends here, at once.

    On exit JAX waits at a barrier for every process, and aborts with a stack
    trace when one is gone; a failed run has nothing left to wait for.
    """
    if status and _ATTEMPTED.is_set():
        _leave_together(status)
        _exit(status)
    return status


LEAVE_GRACE_SECONDS = 1.0


def _leave_together(status, wait_seconds=5):
    """Process 0, which serves the coordinator, leaves after the others have said why.

    When the coordinator goes, JAX's client aborts the processes still running
    with a stack trace: each one first writes that it is leaving, and process 0
    waits (briefly) for those of the others that are not lost.
    """
    processes = _STARTED.get("processes")
    if processes is None or processes.coordinator == "auto":
        return
    from jax._src import distributed

    client = distributed.global_state.client
    try:
        client.key_value_set(f"keras_antisym/leaving/{processes.index}", str(status))
        if processes.index != 0:
            return
        for index in range(1, _STARTED["count"]):
            if index not in _STARTED.get("lost", ()):
                client.blocking_key_value_get(f"keras_antisym/leaving/{index}", wait_seconds * 1000)
        # A process that has said it leaves still has to reach its exit: had the coordinator
        # gone first, JAX would abort it with a stack trace on a loaded machine.
        time.sleep(LEAVE_GRACE_SECONDS)
    except Exception:  # JAX's own classes: a process that is gone cannot answer
        pass


def _exit(status):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def process_rows(distribution: Any, batch_size: int) -> slice | None:
    """The rows of each global batch that this process feeds (None: all of them).

    They are the rows the data-parallel layout puts on this process's devices,
    so that the processes' rows together are the global batch, in order.
    """
    if distribution is None or not multi_process():
        return None
    layout = distribution.get_data_layout((batch_size, 1)).backend_layout
    indices = layout.addressable_devices_indices_map((batch_size, 1)).values()
    starts = sorted({rows.start or 0 for rows, _ in indices})
    stops = sorted({batch_size if rows.stop is None else rows.stop for rows, _ in indices})
    if any(b != a for a, b in zip(stops, starts[1:], strict=False)):
        raise StrategyError("this process's devices hold rows of the batch that are not contiguous")
    return slice(starts[0], stops[-1])


def agree(value: int, what: str, hint: str) -> None:
    """Raises `StrategyError` unless every process holds the same integer `value`."""
    if not multi_process():
        return
    import numpy as np
    from jax.experimental import multihost_utils

    values = np.asarray(multihost_utils.process_allgather(np.asarray(value, "int64"))).ravel()
    if len(set(values.tolist())) > 1:
        shown_values = ", ".join(f"process {i}: {v}" for i, v in enumerate(values.tolist()))
        raise StrategyError(f"the processes disagree on {what} ({shown_values}); {hint}")


def keras_distribution_shape(distribution: Any) -> tuple[str, int]:
    """`(name, replicas)` of a `keras.distribution.Distribution` (None: one device)."""
    if distribution is None:
        return "default", 1
    return type(distribution).__name__, len(distribution.device_mesh.devices.flat)


def make_strategy(name: str, tpu: str | None = None) -> Any:
    """The `tf.distribute.Strategy` called `name` (see `STRATEGIES`).

    "auto" picks a TPU when `tpu` or `TPU_NAME` names one, multi-worker when
    TF_CONFIG describes a cluster of several workers, mirrored over all GPUs
    when there are several (or over the logical CPUs when the CPU was split),
    and the default one-device strategy otherwise.
    """
    import tensorflow as tf

    _check_strategy(name, TF_STRATEGIES, "tensorflow")
    if name == "auto":
        if tpu or os.environ.get("TPU_NAME"):
            name = "tpu"
        elif _workers(_tf_config()) > 1:
            name = "multi_worker"
        elif (
            len(tf.config.list_logical_devices("GPU")) > 1
            or len(tf.config.list_logical_devices("CPU")) > 1
        ):
            name = "mirrored"
        else:
            name = "default"
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        if gpus:
            return tf.distribute.MirroredStrategy()
        cpus = [device.name for device in tf.config.list_logical_devices("CPU")]
        # NCCL needs GPUs; on CPUs reduce through one device.
        return tf.distribute.MirroredStrategy(
            devices=cpus, cross_device_ops=tf.distribute.ReductionToOneDevice()
        )
    if name == "multi_worker":
        config = _tf_config()
        if config is None or not config.get("cluster"):
            raise StrategyError("--strategy multi_worker needs TF_CONFIG with a cluster and task")
        return tf.distribute.MultiWorkerMirroredStrategy()
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as error:
        raise StrategyError(f"no TPU found ({str(error).splitlines()[0]})") from None
    return tf.distribute.TPUStrategy(resolver)


def strategy_name(strategy: Any) -> str:
    """The public `tf.distribute` name of `strategy` (its class may be private)."""
    import tensorflow as tf

    for public, name in (
        (tf.distribute.MultiWorkerMirroredStrategy, "MultiWorkerMirroredStrategy"),
        (tf.distribute.MirroredStrategy, "MirroredStrategy"),
        (tf.distribute.TPUStrategy, "TPUStrategy"),
    ):
        if isinstance(strategy, public):
            return name
    return "default"


def chief_process(strategy: Any) -> bool:
    """Whether this process writes the run's outputs, on any backend."""
    import keras

    if keras.backend.backend() == "tensorflow":
        return is_chief(strategy)
    if keras.backend.backend() == "jax":
        import jax  # present: this is the JAX backend

        return jax.process_index() == 0
    return True


def is_chief(strategy: Any) -> bool:
    """Whether this process writes the run's outputs."""
    import tensorflow as tf

    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    return (
        task_type == "chief"
        or task_type is None
        or (
            task_type == "worker"
            and task_id == 0
            and "chief" not in resolver.cluster_spec().as_dict()
        )
    )


def task_label(strategy: Any) -> str:
    import tensorflow as tf

    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "chief"
    return f"{resolver.task_type}{resolver.task_id}"
