"""The peer watch of a multi-process run: a peer process of this host that dies ends this
process at once with the one-line lost-process error, whatever this process was doing.

The roster, the exit and the leave-together handshake are stand-ins: what is checked is
the watch's own decision (which pid is gone, who reports it, the message and the status).
"""

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from training import distribution


@pytest.fixture
def exits(monkeypatch):
    """A two-process roster (this process is 0) and the watch's exits, recorded."""
    calls = []
    done = threading.Event()

    def fake_exit(status):
        calls.append(("exit", status))
        done.set()

    monkeypatch.setattr(distribution, "_exit", fake_exit)
    monkeypatch.setattr(
        distribution, "_leave_together", lambda status: calls.append(("leave", status))
    )
    monkeypatch.setattr(distribution, "PEER_POLL_SECONDS", 0.05)
    monkeypatch.setattr(distribution, "_STARTED", {})
    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    host = socket.gethostname()
    distribution._STARTED.update(
        processes=distribution.Processes("127.0.0.1:1", 2, 0),
        count=2,
        roster={0: {"host": host, "pid": os.getpid()}, 1: {"host": host, "pid": peer.pid}},
    )
    yield peer, calls, done
    peer.kill()
    peer.wait()


def test_a_dead_peer_ends_this_process_with_the_lost_process_error(exits, capsys):
    peer, calls, done = exits
    distribution.watch_peers("python -m training.train")
    assert not done.wait(0.5)  # the peer runs: nothing happens
    peer.kill()
    peer.wait()  # reaped: its pid is gone
    assert done.wait(5)
    assert calls == [("leave", 1), ("exit", 1)]
    assert capsys.readouterr().err == (
        "python -m training.train: error: lost process 1 of 2 (killed, crashed or "
        "unreachable); the others stopped: start all 2 processes again to resume from the "
        "last checkpoint\n"
    )
    assert distribution._STARTED["lost"] == [1]


def test_a_killed_peer_not_yet_reaped_counts_as_dead(exits):
    peer, calls, done = exits
    distribution.watch_peers("prog")
    peer.kill()  # a zombie until reaped: it runs no more
    assert done.wait(5)
    assert calls[-1] == ("exit", 1)


def test_a_loss_found_by_a_failed_collective_is_reported_once(exits, capsys):
    peer, calls, done = exits
    assert distribution._claim_loss([1])  # the training thread found it first
    distribution.watch_peers("prog")
    peer.kill()
    peer.wait()
    assert not done.wait(0.5)
    assert calls == [] and capsys.readouterr().err == ""
    assert not distribution._claim_loss([1])


def test_one_process_or_peers_on_other_hosts_start_no_watch(exits):
    peer, calls, done = exits
    distribution._STARTED["roster"][1]["host"] = "another-host"
    before = threading.active_count()
    distribution.watch_peers("prog")
    assert threading.active_count() == before
    distribution._STARTED.update(count=1)
    distribution.watch_peers("prog")
    assert threading.active_count() == before
    peer.kill()
    peer.wait()
    time.sleep(0.2)
    assert calls == []
