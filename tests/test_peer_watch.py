"""The peer watch of a multi-process run: a peer process of this host that dies ends this
process at once with the one-line lost-process error, whatever this process was doing.

The roster, the exit and JAX's key-value store are stand-ins given to the `Cluster`: what
is checked is the watch's own decision (which pid is gone, who reports it, the message and
the status) and the leave-together handshake.
"""

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from training.backends.cluster import Cluster, Processes, check_processes
from training.errors import ProcessLostError, StrategyError
from training.launch import free_port


class _KeyValueStore:
    """JAX's distributed client as the cluster uses it: keys set, keys awaited."""

    def __init__(self, calls=None):
        self.calls = [] if calls is None else calls

    def key_value_set(self, key, value):
        self.calls.append(("set", key, value))

    def blocking_key_value_get(self, key, timeout_ms):
        self.calls.append(("get", key, timeout_ms))
        return "1"


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
