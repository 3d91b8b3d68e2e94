"""`training.launch` in this process, its training processes replaced by small scripts.

What is checked is the launcher's own work: each process's command line and environment,
the `[I]` prefixes, the first failure stopping the rest, signals, and the flags it refuses.
The launcher training for real is `tests/test_multiprocess.py`'s (slow) check.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from apputil.net import free_port
from tests.limits import limit
from training import launch

# Each stand-in prints its argv and environment, then does what its process id asks.
SCRIPT = """
import json, os, signal, sys, time
index = int(sys.argv[sys.argv.index("--process-id") + 1])
print(json.dumps({"argv": sys.argv[1:], "backend": os.environ.get("KERAS_BACKEND"),
                  "unbuffered": os.environ.get("PYTHONUNBUFFERED")}))
print("second line")
plan = json.loads(os.environ["LAUNCH_TEST_PLAN"]).get(str(index), "exit 0")
action, _, value = plan.partition(" ")
if action == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ignoring", flush=True)
    time.sleep(60)
elif action == "sleep":
    time.sleep(float(value))
elif action == "kill":
    os.kill(os.getpid(), int(value))
elif action == "bytes":
    sys.stdout.buffer.write(b"not utf-8: \\xff\\xfe\\n")
elif action == "orphan":  # a child of its own keeps the output pipe open
    import subprocess
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
sys.exit(int(value) if action == "exit" else 0)
"""


@pytest.fixture
def stand_ins(monkeypatch):
    """Launches the stand-in script instead of `training.train`; returns the plan to set."""
    commands = []
    real_popen = subprocess.Popen

    def popen(argv, **kwargs):
        assert argv[:3] == [sys.executable, "-m", "training.train"]
        commands.append(argv[3:])
        return real_popen([sys.executable, "-c", SCRIPT, *argv[3:]], **kwargs)

    monkeypatch.setattr(launch.subprocess, "Popen", popen)
    monkeypatch.delenv("KERAS_BACKEND", raising=False)

    def plan(**actions):
        monkeypatch.setenv("LAUNCH_TEST_PLAN", json.dumps(actions))

    plan()
    return commands, plan


def _reports(out):
    """`{index: the JSON line its process printed}` from the launcher's prefixed output."""
    found = {}
    for line in out.splitlines():
        prefix, _, rest = line.partition("] ")
        if rest.startswith("{"):
            found[int(prefix.lstrip("["))] = json.loads(rest)
    return found


def test_every_process_gets_the_coordinator_and_its_id(stand_ins, capsys):
    commands, _ = stand_ins
    assert (
        launch.main(
            [
                "--processes",
                "3",
                "--max-processes",
                "3",
                "--port",
                "12345",
                "--",
                "--task",
                "digits",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert err == ""  # nothing failed, nothing stopped
    reports = _reports(out)
    assert sorted(reports) == [0, 1, 2]
    for index in range(3):
        expected = ["--task", "digits", "--coordinator", "127.0.0.1:12345",
                    "--num-processes", "3", "--process-id", str(index)]  # fmt: skip
        assert commands[index] == expected
        assert reports[index] == {"argv": expected, "backend": "jax", "unbuffered": "1"}
    # Every line of every process, whole and prefixed with its id.
    assert sorted(line for line in out.splitlines() if "second line" in line) == [
        f"[{index}] second line" for index in range(3)
    ]


def test_the_backend_set_by_the_user_is_kept_and_a_free_port_is_taken(
    stand_ins, capsys, monkeypatch
):
    commands, _ = stand_ins
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    monkeypatch.setattr(launch, "free_port", lambda host="127.0.0.1": 23456)
    assert launch.main(["--processes", "1", "--", "--steps", "3"]) == 0
    assert _reports(capsys.readouterr().out)[0]["backend"] == "torch"
    assert commands == [["--steps", "3", "--coordinator", "127.0.0.1:23456",
                         "--num-processes", "1", "--process-id", "0"]]  # fmt: skip


def test_free_port_is_one_nothing_listens_on():
    import socket

    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # free: it binds


@pytest.mark.parametrize("status", [1, 3])
def test_the_first_failure_stops_the_others_and_gives_its_status(stand_ins, capsys, status):
    _, plan = stand_ins
    plan(**{"0": "sleep 60", "1": f"exit {status}"})
    assert launch.main(["--processes", "2", "--", "--steps", "1"]) == status
    err = capsys.readouterr().err
    assert err == (
        f"python -m training.launch: process 1 exited with status {status}; stopping the rest\n"
    )


def test_a_process_killed_by_a_signal_exits_as_a_shell_reports_it(stand_ins, capsys):
    _, plan = stand_ins
    plan(**{"0": f"kill {int(signal.SIGKILL)}", "1": "sleep 60"})
    assert launch.main(["--processes", "2", "--", "--steps", "1"]) == 128 + signal.SIGKILL
    assert capsys.readouterr().err == (
        "python -m training.launch: process 0 exited with status -9 (SIGKILL); stopping the rest\n"
    )


def test_stop_kills_a_process_that_ignores_sigterm_after_the_grace(stand_ins, capsys):
    _, plan = stand_ins
    plan(**{"0": "ignore-term"})
    running = launch.Launch(1, free_port(), ["--steps", "1"])
    running.start()
    (child,) = running.children
    while "ignoring" not in capsys.readouterr().out:
        assert child.poll() is None
    running.stop(grace=0.5)
    assert child.returncode == -signal.SIGKILL


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_stops_every_process(stand_ins, capsys, signum):
    _, plan = stand_ins
    plan(**{"0": "sleep 60", "1": "sleep 60"})
    before = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM)}
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signum))
    timer.start()
    try:
        status = launch.main(["--processes", "2", "--", "--steps", "1"])
    finally:
        timer.cancel()
    assert status == 128 + signum
    name = signal.Signals(signum).name
    err = capsys.readouterr().err
    assert err == f"python -m training.launch: stopping the processes ({name})\n"
    assert {n: signal.getsignal(n) for n in before} == before  # the handlers are given back


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--processes", "0", "--"], "argument `--processes`, expected a positive integer, got 0"),
        (["--processes", "2", "--port", "65536", "--"],
         "argument `--port`, expected a port in 0..65535, got 65536"),
        (["--processes", "2", "--port", "-1", "--"], "expected a port in 0..65535, got -1"),
        (["--processes", "2", "--", "--coordinator", "h:1"],
         "argument `--coordinator`, expected no value: the launcher sets it"),
        (["--processes", "2", "--", "--num-processes", "2"], "argument `--num-processes`"),
        (["--processes", "2", "--", "--process-id", "0"], "argument `--process-id`"),
    ],
)  # fmt: skip
def test_flags_the_launcher_refuses(stand_ins, capsys, argv, message):
    commands, _ = stand_ins
    assert launch.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m training.launch: error: ") and message in err
    assert commands == []  # nothing started


def test_train_arguments_go_after_a_double_dash(capsys):
    with pytest.raises(SystemExit) as stopped:
        launch.main(["--processes", "2", "--task", "digits"])
    assert stopped.value.code == 2
    assert "give the training.train arguments after --" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        launch.main(["--", "--task", "digits"])  # --processes is required
    assert "the following arguments are required: --processes" in capsys.readouterr().err
    parser = launch.build_parser()
    text = " ".join(parser.format_help().split())
    first, second = (" ".join(p.split()) for p in launch.__doc__.split("\n\n")[:2])
    assert first in text and second not in text  # the description: the first paragraph
    assert text.startswith("usage: python -m training.launch --processes N [--port PORT] -- ")
    assert "--processes PROCESSES how many processes" in text
    assert "--port PORT the coordinator's port on 127.0.0.1 (default: free)" in text


def test_output_that_is_not_utf8_is_forwarded_with_replacement_characters(stand_ins, capsys):
    _, plan = stand_ins
    plan(**{"0": "bytes"})
    assert launch.main(["--processes", "1", "--", "--steps", "1"]) == 0
    assert "[0] not utf-8: \ufffd\ufffd\n" in capsys.readouterr().out


def test_a_leftover_grandchild_holding_the_output_does_not_hold_the_launcher(stand_ins, capsys):
    import time

    _, plan = stand_ins
    plan(**{"0": "orphan"})
    begun = time.monotonic()
    assert launch.main(["--processes", "1", "--", "--steps", "1"]) == 0
    assert time.monotonic() - begun < 20  # the forwarders are given 5 s, not the 30 s


def test_a_launch_the_machine_cannot_start_is_one_line_and_leaves_nothing_running(
    stand_ins, monkeypatch, capsys
):
    commands, plan = stand_ins
    plan(**{"0": "sleep 60"})
    started = []
    popen = launch.subprocess.Popen

    def second_fails(argv, **kwargs):
        if started:
            raise OSError(11, "Resource temporarily unavailable")
        started.append(popen(argv, **kwargs))
        return started[-1]

    monkeypatch.setattr(launch.subprocess, "Popen", second_fails)
    assert launch.main(["--processes", "2", "--", "--steps", "1"]) == 2
    assert capsys.readouterr().err == (
        "python -m training.launch: error: could not start process 1 of 2 ([Errno 11] Resource "
        "temporarily unavailable); this machine cannot run that many: start fewer processes\n"
    )
    (first,) = started
    assert first.returncode == -signal.SIGTERM  # stopped and reaped on the way out


def test_more_processes_than_cpus_are_refused_unless_allowed(stand_ins, capsys):
    cpus = launch.usable_cpus()
    assert launch.main(["--processes", str(cpus + 1), "--", "--steps", "1"]) == 2
    assert capsys.readouterr().err == (
        f"python -m training.launch: error: Received an invalid value for argument "
        f"`--processes`, expected at most {cpus} (one per CPU this launcher may use; "
        f"--max-processes {cpus + 1} starts more), got {cpus + 1}.\n"
    )
    commands, _ = stand_ins
    assert commands == []  # nothing was started
    assert launch.main(["--processes", "3", "--max-processes", "2", "--", "--steps", "1"]) == 2
    assert "expected at most 2 (the --max-processes given), got 3." in capsys.readouterr().err
    assert launch.main(["--processes", "1", "--max-processes", "0", "--", "--steps", "1"]) == 2
    assert "`--max-processes`, expected a positive integer, got 0" in capsys.readouterr().err


def test_a_port_in_use_is_refused_before_any_process_starts(stand_ins, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert launch.main(["--processes", "1", "--port", str(port), "--", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m training.launch: error: port {port} on 127.0.0.1 is in use")
    assert err.endswith("give --port a free port\n") and err.count("\n") == 1
    assert stand_ins[0] == []


def _cgroup_tree(tmp_path, self_cgroup, limits):
    """A /proc/self/cgroup and cgroup folders with `{folder: (pids.max, pids.current)}`."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(self_cgroup)
    root = tmp_path / "cgroup"
    for folder, (most, current) in limits.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "pids.max").write_text(f"{most}\n")
        (root / folder / "pids.current").write_text(f"{current}\n")
    return str(proc), str(root)


def test_the_room_left_is_the_tightest_pids_cgroup_above_this_process(tmp_path):
    # cgroup v1: the pids hierarchy; the parent's limit is the tighter one.
    proc, root = _cgroup_tree(
        tmp_path,
        "9:name=systemd:/\n8:pids:/jobs/mine\n4:memory:/x\n0::/\n",
        {"pids": ("max", 500), "pids/jobs": (100, 60), "pids/jobs/mine": (1000, 10)},
    )
    room = launch.ProcessRoom.read(proc, root)
    assert room.free == 40 and room.where == f"the pids cgroup {root}/pids/jobs"
    room.check(1)  # 24 threads fit into 40
    with pytest.raises(launch.LaunchError) as refused:
        room.check(2)
    assert str(refused.value) == (
        f"2 processes need about 48 threads (24 each), but the pids cgroup {root}/pids/jobs "
        f"leaves room for 40: start fewer processes"
    )


def test_the_room_left_under_cgroup_v2_and_without_limits(tmp_path):
    proc, root = _cgroup_tree(tmp_path, "0::/user.slice/job\n", {"user.slice/job": (30, 29)})
    assert launch.ProcessRoom.read(proc, root) == launch.ProcessRoom(
        1, f"the pids cgroup {root}/user.slice/job"
    )
    proc, root = _cgroup_tree(tmp_path / "none", "0::/a\n", {"a": ("max", 3)})
    room = launch.ProcessRoom.read(proc, root)
    if os.getuid() == 0:  # root is not held to RLIMIT_NPROC: no limit at all
        assert room == launch.ProcessRoom(None)
        room.check(10_000)
    else:
        assert room.free is None or room.where.startswith("the user's process limit (ulimit -u")


PIDS_V1 = "/sys/fs/cgroup/pids"


def _can_make_pids_cgroup():
    if not os.access(PIDS_V1, os.W_OK):
        return False
    probe = os.path.join(PIDS_V1, f"keras-antisym-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
        os.rmdir(probe)
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _can_make_pids_cgroup(), reason="needs a writable pids cgroup (v1)")
def test_a_launch_inside_a_small_pids_cgroup_is_refused_with_one_line(tmp_path):
    """The real kernel limit: the launcher runs in a pids cgroup of 40 tasks."""
    folder = os.path.join(PIDS_V1, f"keras-antisym-test-{os.getpid()}")
    os.mkdir(folder)
    try:
        with open(os.path.join(folder, "pids.max"), "w") as handle:
            handle.write("40")

        def enter():
            with open(os.path.join(folder, "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))

        done = subprocess.run(
            [sys.executable, "-m", "training.launch", "--processes", "2", "--max-processes", "2",
             "--", "--steps", "1"],
            preexec_fn=enter, capture_output=True, text=True, timeout=limit(60),
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert done.stdout == ""
        (line,) = done.stderr.splitlines()
        assert line.startswith(
            "python -m training.launch: error: 2 processes need about 48 threads (24 each), "
            f"but the pids cgroup {folder} leaves room for "
        )
        with open(os.path.join(folder, "cgroup.procs")) as procs:
            assert procs.read().split() == []  # nothing left running in it
    finally:
        os.rmdir(folder)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_processes_die_with_a_launcher_killed_outright(tmp_path):
    """SIGKILL to the launcher (as an out-of-memory kill or a CI timeout would) ends them."""
    from apputil.processes import pid_alive

    driver = """
import sys
from apputil.net import free_port
from training import launch
running = launch.Launch(2, free_port(), [], command=(sys.executable, "-c",
    "import sys, time; print('up', flush=True); time.sleep(120)"))
running.start()
print(" ".join(str(child.pid) for child in running.children), flush=True)
running.wait()
"""
    launcher = subprocess.Popen(
        [sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        lines = [launcher.stdout.readline() for _ in range(3)]
        ups = sorted(line for line in lines if line.startswith("["))
        assert ups == ["[0] up\n", "[1] up\n"]  # both children run their command
        (pid_line,) = (line for line in lines if not line.startswith("["))
        pids = [int(pid) for pid in pid_line.split()]
        assert len(pids) == 2 and all(pid_alive(pid) for pid in pids)
        launcher.kill()
        launcher.wait(timeout=limit(10))
        deadline = time.monotonic() + limit(10)
        while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(pid_alive(pid) for pid in pids)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=limit(10))
