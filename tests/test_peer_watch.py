"""The peer watch of a multi-process run: a peer process of this host that dies ends this
process at once with the one-line lost-process error, whatever this process was doing.

The roster, the exit and JAX's key-value store are stand-ins given to the `Cluster`: what
is checked is the watch's own decision (which pid is gone, who reports it, the message and
the status) and the leave-together handshake.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from apputil.net import free_port
from training.backends.cluster import Cluster, Processes, check_processes
from training.errors import ProcessLostError, StrategyError


class _KeyValueStore:
    """JAX's distributed client as the cluster uses it: keys set, keys awaited."""

    def __init__(self, calls=None):
        self.calls = [] if calls is None else calls

    def key_value_set(self, key, value):
        self.calls.append(("set", key, value))

    def blocking_key_value_get(self, key, timeout_ms):
        self.calls.append(("get", key, timeout_ms))
        return "1"

    def get_live_nodes(self, nodes):  # the coordinator's view: every process heartbeats
        return list(nodes)


def _cluster(calls, done=None, prog="prog"):
    def fake_exit(status):
        calls.append(("exit", status))
        if done is not None:
            done.set()

    store = _KeyValueStore(calls)
    return Cluster(prog, exit=fake_exit, client=lambda: store, poll_seconds=0.05,
                   leave_grace_seconds=0.0)  # fmt: skip


# What process 0 of two says when it leaves with status 1 (its peer is lost: not awaited).
LEAVES = ("set", "keras_antisym/leaving/0", "1")


@pytest.fixture
def exits():
    """A two-process roster (this process is 0) and the watch's exits, recorded."""
    calls = []
    done = threading.Event()
    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    host = socket.gethostname()
    cluster = _cluster(calls, done, prog="python -m training.train")
    cluster.record(
        Processes("127.0.0.1:1", 2, 0),
        2,
        {0: {"host": host, "pid": os.getpid()}, 1: {"host": host, "pid": peer.pid}},
    )
    yield cluster, peer, calls, done
    peer.kill()
    peer.wait()


def test_a_dead_peer_ends_this_process_with_the_lost_process_error(exits, capsys):
    cluster, peer, calls, done = exits
    cluster.watch_peers()
    assert not done.wait(0.5)  # the peer runs: nothing happens
    peer.kill()
    peer.wait()  # reaped: its pid is gone
    assert done.wait(5)
    assert calls == [LEAVES, ("exit", 1)]
    assert capsys.readouterr().err == (
        "python -m training.train: error: lost process 1 of 2 (killed, crashed or "
        "unreachable); the others stopped: start all 2 processes again to resume from the "
        "last checkpoint\n"
    )
    assert cluster.lost == [1]


def test_a_killed_peer_not_yet_reaped_counts_as_dead(exits):
    cluster, peer, calls, done = exits
    cluster.watch_peers()
    peer.kill()  # a zombie until reaped: it runs no more
    assert done.wait(5)
    assert calls[-1] == ("exit", 1)


def test_a_loss_found_by_a_failed_collective_is_reported_once(exits, capsys):
    cluster, peer, calls, done = exits
    assert cluster.claim_loss([1])  # the training thread found it first
    cluster.watch_peers()
    peer.kill()
    peer.wait()
    assert not done.wait(0.5)
    assert calls == [] and capsys.readouterr().err == ""
    assert not cluster.claim_loss([1])


def test_a_peer_that_leaves_after_the_run_ended_is_not_a_loss(exits, capsys):
    """Once the run's status is known (`finish`), the peers exit at their own pace: one
    that is gone before this process is no lost process, and the status stays 0."""
    cluster, peer, calls, done = exits
    cluster.watch_peers()
    assert cluster.finish(0) == 0
    peer.kill()
    peer.wait()
    assert not done.wait(0.5)
    assert calls == [] and capsys.readouterr().err == ""
    assert cluster.lost is None and not cluster.claim_loss([1])


def test_one_process_or_peers_on_other_hosts_start_no_watch(exits):
    cluster, peer, calls, done = exits
    cluster.roster[1]["host"] = "another-host"
    before = threading.active_count()
    cluster.watch_peers()
    assert threading.active_count() == before
    cluster.count = 1
    cluster.watch_peers()
    assert threading.active_count() == before
    peer.kill()
    peer.wait()
    time.sleep(0.2)
    assert calls == []


def test_a_failed_collective_names_the_dead_peer_of_this_host(exits):
    cluster, peer, calls, done = exits
    peer.kill()
    peer.wait()
    error = cluster.lost_processes_error(RuntimeError("collective failed"))
    assert isinstance(error, ProcessLostError)
    assert str(error) == (
        "lost process 1 of 2 (killed, crashed or unreachable); the others stopped: start "
        "all 2 processes again to resume from the last checkpoint"
    )
    assert cluster.lost == [1]


def test_any_failure_while_a_peer_is_lost_is_the_lost_process_error(exits):
    """Not only a step's collective: whatever this process calls next fails (a metric's
    reset, a checkpoint's agreement) and is the one lost-process line, not its trace."""
    cluster, peer, calls, done = exits
    with pytest.raises(ValueError, match="not a loss"):  # every process lives
        with cluster.losses():
            raise ValueError("not a loss")
    peer.kill()
    peer.wait()
    with pytest.raises(StrategyError, match="expected"):  # the command's own line passes
        with cluster.losses((StrategyError,)):
            raise StrategyError("expected")
    assert cluster.lost is None
    with pytest.raises(ProcessLostError) as raised:
        with cluster.losses((StrategyError,)):
            raise ValueError("UNKNOWN: Gloo AllGather failed: Connection reset by peer")
    assert str(raised.value).startswith("lost process 1 of 2 (killed, crashed or unreachable)")
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    assert cluster.lost == [1] and calls == []


def test_one_process_has_no_lost_peer():
    assert Cluster().lost_processes_error(RuntimeError("x")) is None


def test_a_failed_multi_process_run_leaves_together_and_exits_at_once():
    calls = []
    cluster = _cluster(calls)
    assert cluster.finish(1) == 1 and calls == []  # never joined: an ordinary exit
    assert cluster.finish(0) == 0


@pytest.mark.parametrize("index", [0, 1])
def test_processes_say_they_leave_and_process_0_waits_for_the_live_ones(index):
    calls = []
    cluster = _cluster(calls)
    cluster.record(Processes("127.0.0.1:1", 4, index), 4)
    cluster.lost = [2]
    cluster.leave_together(3, wait_seconds=2)
    said = [("set", f"keras_antisym/leaving/{index}", "3")]
    if index == 0:  # process 3 and 1 answer; 2 is lost and is not waited for
        said += [("get", f"keras_antisym/leaving/{i}", 2000) for i in (1, 3)]
    assert calls == said


def test_one_process_or_an_automatic_coordinator_has_nobody_to_leave_with():
    calls = []
    cluster = _cluster(calls)
    cluster.leave_together(1)  # no processes recorded: one process
    cluster.record(Processes("auto", 2, 0), 2)
    cluster.leave_together(1)
    assert calls == []


@pytest.mark.parametrize("index", [0, 1])
def test_coordinator_address_count_and_index_that_fit_are_accepted(index):
    processes = Processes(f"127.0.0.1:{free_port()}", 2, index)
    assert check_processes(processes) is None


@pytest.mark.parametrize(
    "coordinator, count, index, message",
    [
        ("127.0.0.1:http", 2, 0,
         "Received an invalid value for argument `--coordinator`, expected HOST:PORT, "
         "got '127.0.0.1:http'"),
        ("127.0.0.1:", 2, 0, "expected HOST:PORT, got '127.0.0.1:'"),
        ("1234", 2, 0, "expected HOST:PORT, got '1234'"),
        ("127.0.0.1:1234", None, 0,
         "a coordinator (127.0.0.1:1234) needs --num-processes and --process-id"),
        ("127.0.0.1:1234", 2, None, "needs --num-processes and --process-id"),
        ("127.0.0.1:1234", 2, 2,
         "Received an invalid value for argument `--process-id`, expected an integer in "
         "[0, 2), got 2"),
        ("127.0.0.1:1234", 3, -1, "expected an integer in [0, 3), got -1"),
        # TEST-NET-1 (RFC 5737): never an address of this machine.
        ("192.0.2.1:1234", 2, 0,
         "the coordinator address 192.0.2.1:1234 is not an address of this machine"),
    ],
)  # fmt: skip
def test_coordinator_address_count_and_index_that_do_not_fit_are_refused(
    coordinator, count, index, message
):
    with pytest.raises(StrategyError) as refused:
        check_processes(Processes(coordinator, count, index))
    assert message in str(refused.value)


@pytest.mark.parametrize(
    "lost, which",
    [
        ([1], "process 1"),
        ([1, 2], "processes 1, 2"),
        ([0], "process 0 (the coordinator at 127.0.0.1:1)"),
        ([0, 2], "processes 0, 2"),
    ],
)
def test_the_lost_message_names_the_processes_and_the_coordinator(lost, which):
    cluster = Cluster()
    cluster.record(Processes("127.0.0.1:1", 3, 1), 3)
    assert cluster.lost_message(lost) == (
        f"lost {which} of 3 (killed, crashed or unreachable); the others stopped: start all "
        "3 processes again to resume from the last checkpoint"
    )


def test_the_peer_watch_is_one_named_daemon_thread(exits):
    """It must never keep a finished process alive, and it is findable by name."""
    cluster, peer, calls, done = exits
    cluster.watch_peers()
    (watch,) = [t for t in threading.enumerate() if t.name == "peer-watch"]
    assert watch.daemon
    peer.kill()
    peer.wait()
    assert done.wait(5)


def test_processes_that_agree_pass_and_one_process_needs_no_gather(monkeypatch):
    import numpy as np
    from jax.experimental import multihost_utils

    gathered = []

    def allgather(value):
        gathered.append(int(value))
        return np.asarray([5, 5])

    monkeypatch.setattr(multihost_utils, "process_allgather", allgather)
    cluster = Cluster()
    cluster.agree(5, "the restored step", "hint")  # one process: nothing gathered
    assert gathered == []
    cluster.record(Processes("127.0.0.1:1", 2, 0), 2)
    cluster.agree(5, "the restored step", "hint")  # both hold 5
    assert gathered == [5]


def _listener(answer):
    """A TCP listener on 127.0.0.1 that accepts and sends `answer` (None: nothing; a tuple:
    its pieces, 0.1 s apart), keeping each connection open; returns (port, stop)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop, held = threading.Event(), []

    def serve():
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                continue
            held.append(connection)
            for piece in answer if isinstance(answer, tuple) else (answer,):
                if piece is not None:
                    connection.sendall(piece)
                    time.sleep(0.1)
        for connection in held:
            connection.close()
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1], stop


@pytest.mark.parametrize(
    "answer, problem",
    [
        (None, "something accepts connections there but does not answer"),
        # An HTTP/2 frame header of type DATA (0), not SETTINGS (4): not a JAX coordinator.
        (bytes([0, 0, 0, 0, 0, 0, 0, 0, 0]), "something answers there, but not a JAX "
         "coordinator (no HTTP/2 SETTINGS)"),
        # Eight bytes and then silence: a frame header is nine.
        (bytes(8), "something accepts connections there but does not answer"),
        # The same DATA header in two pieces: read whole, then judged.
        ((bytes(4), bytes(5)), "something answers there, but not a JAX coordinator (no "
         "HTTP/2 SETTINGS)"),
        ("refused", "no coordinator answers: "),
    ],
)  # fmt: skip
def test_process_1_refuses_what_answers_at_the_coordinator_address_unless_it_is_one(
    monkeypatch, answer, problem
):
    """Before JAX connects (and would abort the process), the coordinator must open with
    an HTTP/2 SETTINGS frame, as gRPC servers do; anything else is one line within the
    connect timeout."""
    import time

    import jax

    monkeypatch.setattr(jax.config, "update", lambda *args: None)  # no gloo in this process
    if answer == "refused":
        port, stop = free_port(), threading.Event()
    else:
        port, stop = _listener(answer)
    started = time.monotonic()
    # 3 s: the stand-in's thread must get to answer within it on a busy machine too.
    try:
        with pytest.raises(StrategyError) as refused:
            Cluster().join(Processes(f"127.0.0.1:{port}", 2, 1), connect_timeout=3)
    finally:
        stop.set()
    assert time.monotonic() - started < 15
    assert str(refused.value).startswith(
        f"process 1 of 2 could not join the coordinator at 127.0.0.1:{port} within 3 s ({problem}"
    )


def test_an_ipv6_coordinator_port_is_checked_as_ipv6():
    from training.backends.cluster import check_port_free

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            port = probe.getsockname()[1]
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    assert check_port_free("::1", port) is None
    assert check_port_free("[::1]", port) is None
    with socket.socket(socket.AF_INET6) as taken:
        taken.bind(("::1", port))
        taken.listen(1)
        with pytest.raises(StrategyError, match=f"port {port} on ::1 is in use"):
            check_port_free("::1", port)


class _Roster(_KeyValueStore):
    """JAX's coordination client as a join uses it: each process's entry, by index."""

    def __init__(self, entries, calls=None):
        super().__init__(calls)
        self.entries = entries

    def blocking_key_value_get(self, key, timeout_ms):
        super().blocking_key_value_get(key, timeout_ms)
        index = int(key.rsplit("/", 1)[1])
        if index not in self.entries:
            raise RuntimeError("DEADLINE_EXCEEDED")  # JAX's own error: never published
        return json.dumps(self.entries[index])


@pytest.fixture
def joined_jax(monkeypatch):
    """JAX's `distributed.initialize` and process count as stand-ins: a join runs every
    step of its own (address checks, watchdog, roster) and connects nothing."""
    import jax

    initialized = []
    monkeypatch.setattr(jax.config, "update", lambda *args: None)
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: initialized.append(kw))
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    return initialized


def _cluster_with(store, calls):
    def fake_exit(status):
        calls.append(("exit", status))

    return Cluster("prog", exit=fake_exit, client=lambda: store, leave_grace_seconds=0.0)


def test_a_join_checks_the_roster_keeps_it_and_a_failed_run_then_leaves_at_once(joined_jax):
    host = socket.gethostname()
    calls = []
    store = _Roster({0: {"count": 2, "host": host, "pid": os.getpid()},
                     1: {"count": 2, "host": host, "pid": 1}}, calls)  # fmt: skip
    cluster = _cluster_with(store, calls)
    port = free_port()
    assert cluster.join(Processes(f"127.0.0.1:{port}", 2, 0), connect_timeout=5) is True
    (kwargs,) = joined_jax
    assert (kwargs["coordinator_address"], kwargs["num_processes"], kwargs["process_id"]) == (
        f"127.0.0.1:{port}", 2, 0
    )  # fmt: skip
    assert kwargs["coordinator_bind_address"] == f"127.0.0.1:{port}"  # loopback: bound there
    assert kwargs["initialization_timeout"] > 5  # JAX's own timeout never comes first
    assert cluster.count == 2 and cluster.multi_process
    assert cluster.roster == {0: store.entries[0], 1: store.entries[1]}
    published = json.loads(calls[0][2])
    assert calls[0][:2] == ("set", "keras_antisym/processes/0")
    assert published == {"count": 2, "host": host, "pid": os.getpid()}
    calls.clear()
    assert cluster.finish(0) == 0 and calls == []  # a run that ended well exits normally
    assert cluster.finish(1) == 1
    assert calls[0] == ("set", "keras_antisym/leaving/0", "1") and calls[-1] == ("exit", 1)


def test_a_join_refuses_processes_that_disagree_on_their_count(joined_jax):
    calls = []
    store = _Roster({0: {"count": 2, "host": "h", "pid": 1},
                     1: {"count": 3, "host": "h", "pid": 2}})  # fmt: skip
    cluster = _cluster_with(store, calls)
    with pytest.raises(StrategyError) as refused:
        cluster.join(Processes(f"127.0.0.1:{free_port()}", 2, 0), connect_timeout=5)
    assert str(refused.value) == (
        "process 0 was started with --num-processes 2, process 1 with 3: give every process "
        "the same count"
    )


def test_one_process_joins_nothing_and_counts_one(joined_jax, monkeypatch):
    import jax

    monkeypatch.setattr(jax, "process_count", lambda: 1)
    cluster = Cluster()
    assert cluster.join(Processes(None, None, None)) is False and joined_jax == []
    store = _Roster({0: {"count": 1, "host": "h", "pid": 1}})
    cluster = _cluster_with(store, [])
    assert cluster.join(Processes(f"127.0.0.1:{free_port()}", 1, 0), connect_timeout=5) is False
    assert cluster.count == 1 and not cluster.multi_process


def test_a_join_that_hangs_gives_up_at_the_connect_timeout_in_one_line(monkeypatch, capsys):
    """JAX waits for its peers in C++: the watchdog thread ends the process at the deadline
    (process 0 waits a little longer than the others, who leave first)."""
    import time

    import jax

    from training.backends import cluster as cluster_module

    monkeypatch.setattr(jax.config, "update", lambda *args: None)
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    released = threading.Event()
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: released.wait(10))
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    calls = []
    store = _Roster({i: {"count": 2, "host": "h", "pid": i} for i in (0, 1)})
    cluster = Cluster("prog", exit=lambda status: calls.append(status) or released.set(),
                      client=lambda: store)  # fmt: skip
    started = time.monotonic()
    # The stand-in join returns once the watchdog has fired (a real one ends the process).
    cluster.join(Processes(f"127.0.0.1:{free_port()}", 2, 0), connect_timeout=1)
    waited = time.monotonic() - started
    assert calls == [2]
    extra = cluster_module.COORDINATOR_EXTRA_SECONDS
    assert 1 + extra - 0.5 <= waited < 1 + extra + 5
    assert capsys.readouterr().err.startswith(
        "prog: error: process 0 of 2 could not join the coordinator at 127.0.0.1:"
    )
