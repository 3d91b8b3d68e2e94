"""JAX training on two processes of this machine (gloo on the CPU), with faults.

Every process is a subprocess on 127.0.0.1 ports, bounded by a timeout, and
killed at the end of its test whatever happened. The two-process runs go
through `training.launch` or start the processes themselves with the flags.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.limits import limit

ROOT = Path(__file__).resolve().parents[1]
STEPS = 20
COMMON = [
    "--task", "digits", "--units", "8", "--batch-size", "32", "--steps", str(STEPS),
    "--log-every", "5", "--checkpoint-every", "5", "--learning-rate", "0.02",
]  # fmt: skip
# The heartbeat timeout is longer than STOP_BOUND: a lost peer on this host is found by its
# pid when the collective fails, and JAX's own heartbeat check (which aborts every process
# with a stack trace) must not overtake that on a loaded machine.
FAULTS = ["--heartbeat-timeout", "20", "--connect-timeout", "20"]
TIMEOUT = 150
# A lost worker is named within this many seconds (a peer on this host is found by its pid).
STOP_BOUND = 10.0

pytestmark = pytest.mark.skipif(
    __import__("importlib").util.find_spec("jax") is None, reason="needs JAX"
)


def _env(**extra):
    env = {**os.environ, "KERAS_BACKEND": "jax", "CUDA_VISIBLE_DEVICES": ""}
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", **extra})
    for name in ("JOB_ADDRESSES", "NUM_PROCESSES", "PROCESS_ID"):
        env.pop(f"KERAS_DISTRIBUTION_{name}", None)
    env.pop("JAX_COORDINATOR_ADDRESS", None)
    env.pop("XLA_FLAGS", None)
    return env


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Processes:
    """Started subprocesses whose output goes to files; all killed on exit."""

    def __init__(self, folder):
        self.folder, self.started = Path(folder), []

    def start(self, name, argv, **env):
        log = self.folder / f"{name}.log"
        with open(log, "w") as handle:  # the child keeps its own descriptor
            process = subprocess.Popen(
                [sys.executable, *argv], cwd=ROOT, env=_env(**env), stdout=handle,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        process.log = log
        self.started.append(process)
        return process

    def train(self, name, output, index, count, port, *extra):
        argv = ["-m", "training.train", *COMMON, "--output-dir", str(output), *FAULTS]
        argv += ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(count)]
        return self.start(name, [*argv, "--process-id", str(index), *extra])

    def wait_all(self, processes, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        for process in processes:
            process.wait(timeout=max(1, deadline - time.monotonic()))
        return [process.log.read_text() for process in processes]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for process in self.started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)  # the process and anything it started
            process.wait(timeout=limit(30))


def _weights(output, step=STEPS):
    with np.load(Path(output) / "checkpoints" / f"ckpt-{step}.npz") as arrays:
        return {key: arrays[key] for key in arrays.files}


def _losses(text):
    return [float(m) for m in re.findall(r"step \d+/\d+ loss ([0-9.]+)", text)]


def _errors(text):
    return [line for line in text.splitlines() if ": error: " in line]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    output = tmp_path_factory.mktemp("one")
    with Processes(output.parent) as started:
        argv = ["-m", "training.train", *COMMON, "--output-dir", str(output)]
        process = started.start("one", [*argv, "--strategy", "default"])
        (text,) = started.wait_all([process])
    assert process.returncode == 0, text[-3000:]
    return output, _losses(text), json.loads((output / "metrics.json").read_text())


def _assert_same_as_one_process(output, text, one_process):
    one_dir, one_losses, one_metrics = one_process
    metrics = json.loads((Path(output) / "metrics.json").read_text())
    assert metrics["replicas"] == 2 and metrics["steps"] == STEPS
    assert metrics["test_accuracy"] == one_metrics["test_accuracy"]
    losses = _losses(text)  # a resumed run logs only its last windows
    np.testing.assert_allclose(losses, one_losses[len(one_losses) - len(losses) :], rtol=1e-5)
    two, one = _weights(output), _weights(one_dir)
    assert sorted(two) == sorted(one)
    for key in one:  # float32 sums in another order: a few ulps
        np.testing.assert_allclose(two[key], one[key], rtol=0, atol=1e-6, err_msg=key)


@pytest.mark.slow
def test_launcher_runs_two_processes_that_train_as_one(tmp_path, one_process):
    output = tmp_path / "run"
    with Processes(tmp_path) as started:
        argv = ["-m", "training.launch", "--processes", "2", "--", *COMMON, *FAULTS]
        launcher = started.start("launch", [*argv, "--output-dir", str(output)])
        (text,) = started.wait_all([launcher])
    assert launcher.returncode == 0, text[-3000:]
    fingerprints = re.findall(r"^\[(\d)\] \[(\w+)\] weights_sha256 (\w+)$", text, re.M)
    assert sorted(f[:2] for f in fingerprints) == [("0", "chief"), ("1", "worker1")]
    assert len({f[2] for f in fingerprints}) == 1, "the processes hold different weights"
    config = (output / "config.yaml").read_text()
    assert "strategy_class: DataParallel" in config and "process_id: 0" in config
    chief = "\n".join(line[4:] for line in text.splitlines() if line.startswith("[0] "))
    _assert_same_as_one_process(output, chief, one_process)


@pytest.mark.slow
def test_killed_worker_stops_the_chief_and_a_restart_resumes(tmp_path, one_process):
    output, port = tmp_path / "run", _free_port()
    with Processes(tmp_path) as started:
        chief = started.train("chief", output, 0, 2, port)
        worker = started.train("worker", output, 1, 2, port)
        deadline = time.monotonic() + TIMEOUT
        while "step 10/" not in worker.log.read_text() and time.monotonic() < deadline:
            assert worker.poll() is None and chief.poll() is None, chief.log.read_text()[-3000:]
            time.sleep(0.05)
        worker.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        chief.wait(timeout=limit(30))
        latency = time.monotonic() - killed
        text = chief.log.read_text()
        assert chief.returncode == 1, text[-3000:]
        assert latency < STOP_BOUND, latency
        assert "Traceback" not in text, text[-3000:]  # one line, whatever it was doing
        assert _errors(text) == [
            "python -m training.train: error: lost process 1 of 2 (killed, crashed or "
            "unreachable); the others stopped: start all 2 processes again to resume from the "
            "last checkpoint"
        ]
        index = json.loads((output / "checkpoints" / "checkpoint.json").read_text())
        saved = int(re.search(r"\d+", index["latest"]).group())
        assert 5 <= saved < STEPS

        # Both again, on a new port: they resume from the same checkpoint and end as one
        # uninterrupted process does.
        port = _free_port()
        again = [started.train(f"again{i}", output, i, 2, port) for i in range(2)]
        texts = started.wait_all(again)
    for process, text in zip(again, texts, strict=True):
        assert process.returncode == 0, text[-3000:]
        assert f"at step {saved}" in text
    _assert_same_as_one_process(output, texts[0], one_process)


def test_processes_that_disagree_on_their_count_fail_fast(tmp_path):
    port = _free_port()
    with Processes(tmp_path) as started:
        processes = [
            started.train(f"p{i}", tmp_path / "run", i, count, port)
            for i, count in enumerate((2, 3))
        ]
        begun = time.monotonic()
        texts = started.wait_all(processes, timeout=limit(60))
        seconds = time.monotonic() - begun
    assert [p.returncode for p in processes] == [2, 2], texts
    for text, (mine, theirs) in zip(texts, ((0, 1), (1, 0)), strict=True):
        count, other = (2, 3) if mine == 0 else (3, 2)
        assert _errors(text) == [
            f"python -m training.train: error: process {mine} was started with "
            f"--num-processes {count}, process {theirs} with {other}: give every process the "
            f"same count"
        ]
    assert seconds < 45


def test_a_wrong_coordinator_address_fails_fast(tmp_path):
    with Processes(tmp_path) as started:
        # Process 0 serves the coordinator: an address of another machine fails at once.
        chief = started.train("chief", tmp_path / "a", 0, 2, _free_port(), "--coordinator",
                              "192.0.2.1:8476")  # fmt: skip
        # Process 1 finds no coordinator there: it gives up after --connect-timeout.
        worker = started.train("worker", tmp_path / "b", 1, 2, _free_port(), "--connect-timeout",
                               "3")  # fmt: skip
        begun = time.monotonic()
        chief_text, worker_text = started.wait_all([chief, worker], timeout=limit(60))
        seconds = time.monotonic() - begun
    assert chief.returncode == 2 and worker.returncode == 2, (chief_text, worker_text)
    assert _errors(chief_text) == [
        "python -m training.train: error: the coordinator address 192.0.2.1:8476 is not an "
        "address of this machine (process 0 serves the coordinator there)"
    ]
    (line,) = _errors(worker_text)
    assert "process 1 of 2 could not join the coordinator at 127.0.0.1:" in line
    assert "within 3 s" in line
    assert seconds < 45


@pytest.mark.slow
def test_tuner_chief_and_two_jax_workers_run_every_trial_once(tmp_path):
    directory, trials = tmp_path / "search", 3
    argv = ["-m", "training.tune", "--task", "digits", "--units", "8", "--batch-size", "32"]
    argv += ["--model", "antisymmetric", "--tuner", "random", "--max-trials", str(trials)]
    argv += ["--steps-per-trial", "5", "--directory", str(directory), "--project-name", "p"]
    oracle = {"KERASTUNER_ORACLE_IP": "127.0.0.1", "KERASTUNER_ORACLE_PORT": str(_free_port())}
    names = ("chief", "tuner0", "tuner1")
    with Processes(tmp_path) as started:
        processes = [
            started.start(name, argv, KERASTUNER_TUNER_ID=name, **oracle) for name in names
        ]
        texts = dict(zip(names, started.wait_all(processes), strict=True))
    for process, name in zip(processes, names, strict=True):
        assert process.returncode == 0, texts[name][-3000:]
    done = [
        line.split()[2]
        for name in ("tuner0", "tuner1")
        for line in texts[name].splitlines()
        if line.startswith(f"[{name}] trial ") and " done " in line
    ]
    assert sorted(done) == [str(i) for i in range(trials)]  # each trial once, on one worker
    assert "] trial " not in texts["chief"]
    assert "trials run on default (1 replicas)" in texts["tuner0"]
    best = json.loads((directory / "p" / "best.json").read_text())
    assert best["completed_trials"] == trials


def _children(pid):
    """The pids whose parent is `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _launch_until_training(started, tmp_path):
    argv = ["-m", "training.launch", "--processes", "2", "--", *COMMON, *FAULTS]
    argv += ["--output-dir", str(tmp_path / "run"), "--steps", "100000"]
    launcher = started.start("launch", argv)
    deadline = time.monotonic() + TIMEOUT
    while "[1] step 5/" not in launcher.log.read_text() and time.monotonic() < deadline:
        assert launcher.poll() is None, launcher.log.read_text()[-3000:]
        time.sleep(0.05)
    return launcher


def _assert_nothing_left(launcher):
    with pytest.raises(ProcessLookupError):  # no process of the launcher's group remains
        os.killpg(launcher.pid, 0)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds children in /proc")
def test_launcher_stops_the_others_when_one_process_dies(tmp_path):
    with Processes(tmp_path) as started:
        launcher = _launch_until_training(started, tmp_path)
        children = sorted(_children(launcher.pid))
        assert len(children) == 2
        os.kill(children[1], signal.SIGKILL)  # process 1: started second
        launcher.wait(timeout=limit(60))
        text = launcher.log.read_text()
        assert launcher.returncode == 128 + signal.SIGKILL, text[-3000:]
        assert "python -m training.launch: process 1 exited with status -9 (SIGKILL)" in text
        _assert_nothing_left(launcher)


def test_launcher_stops_every_process_on_sigterm(tmp_path):
    with Processes(tmp_path) as started:
        launcher = _launch_until_training(started, tmp_path)
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=limit(60))
        text = launcher.log.read_text()
        assert launcher.returncode == 128 + signal.SIGTERM, text[-3000:]
        assert "python -m training.launch: stopping the processes (SIGTERM)" in text
        _assert_nothing_left(launcher)


def test_a_coordinator_that_accepts_but_never_answers_is_one_line_within_the_timeout(tmp_path):
    """JAX's client would abort (SIGABRT, a C++ stack) after its own timeout."""
    with socket.socket() as silent, Processes(tmp_path) as started:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes connections; nobody reads or writes
        port = silent.getsockname()[1]
        worker = started.train("worker", tmp_path / "w", 1, 2, port, "--connect-timeout", "4")
        (text,) = started.wait_all([worker], timeout=limit(60))
    assert worker.returncode == 2, text[-3000:]
    assert _errors(text) == [
        f"python -m training.train: error: process 1 of 2 could not join the coordinator at "
        f"127.0.0.1:{port} within 4 s (something accepts connections there but does not "
        f"answer); check that all 2 processes run, with the same --num-processes and "
        f"--coordinator"
    ]


def test_a_coordinator_port_in_use_is_one_line(tmp_path):
    """JAX's coordinator would crash process 0 (SIGSEGV, "Failed to add port")."""
    with socket.socket() as taken, Processes(tmp_path) as started:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        chief = started.train("chief", tmp_path / "c", 0, 2, port)
        (text,) = started.wait_all([chief], timeout=limit(60))
    assert chief.returncode == 2, text[-3000:]
    (line,) = _errors(text)
    assert line.startswith(f"python -m training.train: error: port {port} on 127.0.0.1 is in use")
    assert line.endswith("give --coordinator a free port")


def test_a_process_whose_peers_never_come_gives_up_within_the_connect_timeout(tmp_path):
    """Process 0 alone (its launcher killed before the others started): one line, status 2."""
    with Processes(tmp_path) as started:
        chief = started.train("chief", tmp_path / "c", 0, 2, _free_port(), "--connect-timeout", "3")
        begun = time.monotonic()
        (text,) = started.wait_all([chief], timeout=limit(60))
        seconds = time.monotonic() - begun
    assert chief.returncode == 2, text[-3000:]
    (line,) = _errors(text)
    assert "process 0 of 2 could not join the coordinator" in line
    assert "within 3 s (not every process joined)" in line
    assert "Check failure" not in text and "SIGABRT" not in text
    # Start-up, then 3 s and process 0's few extra seconds; JAX's own limit is 30 s later.
    assert seconds < 30
