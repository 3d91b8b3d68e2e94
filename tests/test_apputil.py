"""The application's shared helpers: error wording, atomic files, the CLI error boundary,
stop signals."""

import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from apputil import cli, errors, files, net, signals
from tests.helpers import ended_pid
from tests.limits import limit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_invalid_is_keras_wording_with_the_value_quoted():
    error = errors.invalid("--units", "a positive integer", -3)
    assert isinstance(error, errors.UsageError)
    assert str(error) == (
        "Received an invalid value for argument `--units`, expected a positive integer, got -3."
    )
    assert str(errors.invalid("name", "text", "x")).endswith("got 'x'.")
    shown = errors.invalid("version", "a new version", errors.Literal("7 (`m/7` exists)"))
    assert str(shown).endswith("got 7 (`m/7` exists).")
    assert isinstance(errors.invalid("a", "b", 1, FileExistsError), FileExistsError)


def test_shown_values_stay_short_however_large_or_deep():
    # Nine levels of nine-fold aliasing: 9**9 leaves if expanded.
    value = ["lol"] * 9
    for _ in range(8):
        value = [value] * 9
    text = errors.shown(value)
    assert len(text) < 200 and "..." in text
    assert len(errors.shown("x" * 10_000)) < 100


def test_a_shown_value_is_cut_at_120_characters_with_an_ellipsis():
    fits = ["x" * 56, "y" * 56]  # repr: 2 + 58 + 2 + 58 = 120 characters
    assert len(repr(fits)) == 120 and errors.shown(fits) == repr(fits)
    longer = ["x" * 57, "y" * 57]  # 122 characters: the first 117 and "..."
    assert errors.shown(longer) == repr(longer)[:117] + "..."
    assert len(errors.shown(longer)) == 120


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("localhost", True),
        ("127.0.0.1", True),
        ("127.8.9.10", True),  # the whole 127/8 block
        ("::1", True),
        ("[::1]", True),  # IPv6 as written in a URL
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("[::]", False),
        ("example.com", False),
        (" 127.0.0.1", False),  # not an address: only the brackets are taken off
        ("X127.0.0.1", False),
        ("", False),
    ],
)
def test_loopback_hosts_are_localhost_and_the_loopback_addresses_only(host, expected):
    assert net.is_loopback(host) is expected


@pytest.mark.parametrize(
    "host, port, expected",
    [("127.0.0.1", 8500, "127.0.0.1:8500"), ("localhost", 0, "localhost:0"),
     ("::1", 8500, "[::1]:8500"), ("[::1]", 8500, "[::1]:8500"),
     ("::ffff:127.0.0.1", 1, "[::ffff:127.0.0.1]:1")],
)  # fmt: skip
def test_host_port_puts_an_ipv6_address_in_brackets_once(host, port, expected):
    assert net.host_port(host, port) == expected


def test_check_raises_only_when_the_condition_fails():
    errors.check(True, "--x", "anything", 1)
    with pytest.raises(errors.UsageError, match="argument `--x`, expected positive, got 0"):
        errors.check(False, "--x", "positive", 0)


def test_atomic_write_replaces_whole_or_not_at_all(tmp_path):
    path = tmp_path / "metrics.json"
    files.write_atomically(path, "old")
    with pytest.raises(RuntimeError), files.atomic_path(path) as partial:
        with open(partial, "w") as handle:
            handle.write("half")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["metrics.json"]  # the partial file is gone
    files.write_atomically(path, b"new")
    assert path.read_bytes() == b"new"


def test_remove_partials_keeps_finished_files(tmp_path):
    for name in ("a.partial.npz", "b.json.partial", "c.json", "partial.txt"):
        (tmp_path / name).write_text("x")
    files.remove_partials(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["c.json", "partial.txt"]
    files.remove_partials(tmp_path / "missing")  # no folder: nothing to do


def test_fsync_tree_reads_every_file(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_text("x")
    files.fsync_tree(tmp_path)  # must not raise on folders or files
    files.fsync_directory(tmp_path / "no-such-folder")  # best effort: no error


class _Expected(RuntimeError):
    pass


def test_run_maps_expected_errors_to_one_line_and_status(capsys):
    def usage():
        raise errors.invalid("--x", "y", 1)

    assert cli.run("prog", usage) == 2
    assert capsys.readouterr().err == (
        "prog: error: Received an invalid value for argument `--x`, expected y, got 1.\n"
    )

    def expected():
        raise _Expected("disk on fire")

    assert cli.run("prog", expected, {_Expected: 1}) == 1
    assert capsys.readouterr().err == "prog: error: disk on fire\n"
    assert cli.run("prog", lambda: None) == 0
    assert cli.run("prog", lambda: 3) == 3


def test_run_takes_a_status_from_a_function_of_the_error_and_the_first_matching_class(capsys):
    class _Busy(_Expected):
        pass

    def busy():
        raise _Busy("port 8501 in use")

    statuses = {_Busy: lambda error: 75 if "in use" in str(error) else 1, _Expected: 3}
    assert cli.run("prog", busy, statuses) == 75
    assert cli.run("prog", busy, {_Expected: 3, _Busy: 4}) == 3  # the first class that matches
    assert capsys.readouterr().err == "prog: error: port 8501 in use\n" * 2


def test_an_interrupted_command_is_one_line_and_status_130(capsys):
    def interrupted():
        raise KeyboardInterrupt

    assert cli.run("prog", interrupted) == 130  # 128 + SIGINT, as a shell reports it
    assert capsys.readouterr().err == "prog: error: interrupted\n"


def test_run_lets_bugs_keep_their_traceback():
    def bug():
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        cli.run("prog", bug, {_Expected: 1})


_FINISHING = """
import atexit, os, sys, time
from apputil import cli
def slow_exit():  # an exit function that takes its time, as TensorFlow's and JAX's do
    print("exit functions running", flush=True)
    time.sleep(1.5)
    print("exit functions done", flush=True)
atexit.register(slow_exit)
atexit.register(lambda: print("flushed by the exit functions", flush=True))
print("work done", flush=True)
cli.execute(lambda: int(sys.argv[1]))
"""


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_finish_runs_the_exit_functions_and_a_signal_meanwhile_is_one_line(tmp_path, number):
    """A stop signal while the exit functions run: one line, the exit functions go on to
    their end, and the status is the work's own (3), not the signal's."""
    script = tmp_path / "finishing.py"
    script.write_text(_FINISHING)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__)))
    process = subprocess.Popen([sys.executable, str(script), "3"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert process.stdout.readline() == "work done\n"
        assert process.stdout.readline() == "flushed by the exit functions\n"  # last in, first
        assert process.stdout.readline() == "exit functions running\n"
        process.send_signal(number)
        out, err = process.communicate(timeout=limit(30))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 3
    assert out == "exit functions done\n"
    name = signal.Signals(number).name
    assert err == f"finishing.py: {name} while exiting: its work was done (exit status 3)\n"


_HANDING_BACK = """
import os, signal, sys
from apputil import cli, signals
def main():
    with signals.raising(lambda number: SystemExit(128 + number)):
        # A stop at the very moment the block hands its handlers back: it is pending
        # while they are restored, and delivered only after.
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
        os.kill(os.getpid(), signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
    print("after the block", flush=True)
    return int(sys.argv[1])
cli.execute(main)
"""


def test_a_signal_as_a_stop_block_hands_back_is_the_exiting_line(tmp_path):
    """The block's end is the command's end of work: a signal that arrives as it restores
    the handlers finds the command's after-work handler, never the default (-15)."""
    script = tmp_path / "handing_back.py"
    script.write_text(_HANDING_BACK)
    env = dict(os.environ, PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, str(script), "4"], capture_output=True, text=True,
                            env=env, timeout=limit(60))  # fmt: skip
    assert result.returncode == 4, result.stderr
    assert result.stdout == "after the block\n"
    assert result.stderr == (
        "handing_back.py: SIGTERM while exiting: its work was done (exit status 4)\n"
    )


_WRAPPED = """
import atexit, os, signal
from apputil import cli
from wrapping import wrapped
def main():
    # A signal after the work, as the exit functions run: the line names the program.
    atexit.register(os.kill, os.getpid(), signal.SIGTERM)
    return 5
if __name__ == "__main__":
    wrapped(cli.execute)(main)
"""


@pytest.mark.parametrize("as_module", [True, False])
def test_the_exiting_line_names_the_program_run_not_the_caller_of_execute(tmp_path, as_module):
    """`python -m PACKAGE.MODULE` is named so, a script by its file name, also when `execute`
    is reached through a wrapper of another module (a profiler's or a mutation tool's)."""
    package = tmp_path / "tool"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "command.py").write_text(_WRAPPED)
    (tmp_path / "wrapping.py").write_text(
        "def wrapped(function):\n    return lambda *args: function(*args)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, str(tmp_path)]))
    argv = ["-m", "tool.command"] if as_module else [str(package / "command.py")]
    result = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env,
                            timeout=limit(60))  # fmt: skip
    assert result.returncode == 5, result.stderr
    prog = "python -m tool.command" if as_module else "command.py"
    assert result.stderr == f"{prog}: SIGTERM while exiting: its work was done (exit status 5)\n"


def test_outside_a_block_before_the_work_a_signal_does_what_it_did_before():
    """Until a block has ended, the command's handler hands a signal to the handler that
    was there (here a recording one); a block's end turns it into the after-work one."""
    before, after = [], []
    previous = signal.signal(signal.SIGUSR1, lambda number, frame: before.append(number))
    try:
        handler = signals.outside(after.append, (signal.SIGUSR1,))
        assert signal.getsignal(signal.SIGUSR1) is handler
        signal.raise_signal(signal.SIGUSR1)
        assert (before, after) == ([signal.SIGUSR1], [])
        with signals.handling(lambda number, frame: None, (signal.SIGUSR1,)):
            signal.raise_signal(signal.SIGUSR1)
        assert (before, after) == ([signal.SIGUSR1], []) and handler.over
        signal.raise_signal(signal.SIGUSR1)
        assert (before, after) == ([signal.SIGUSR1], [signal.SIGUSR1])
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_an_ignored_signal_stays_ignored_until_the_work_is_over():
    """A background job's ignored SIGINT does nothing before the work; after it, it is
    the exiting line like any other (the stop blocks in between take it too)."""
    after = []
    previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        handler = signals.outside(after.append, (signal.SIGUSR2,))
        assert signal.getsignal(signal.SIGUSR2) is handler
        signal.raise_signal(signal.SIGUSR2)  # ignored: the test process lives on
        assert after == []
        handler.over = True
        signal.raise_signal(signal.SIGUSR2)
        assert after == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_one_line_parser_errors_are_one_line():
    code = (
        "from apputil.cli import OneLineParser\n"
        "p = OneLineParser(prog='prog')\n"
        "p.add_argument('--n', type=int)\n"
        "p.parse_args(['--n', 'x'])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=limit(60)
    )
    assert proc.returncode == 2
    assert proc.stderr == "prog: error: argument --n: invalid int value: 'x'\n"


def test_pid_alive_tells_running_from_ended_and_unreaped():
    from apputil.processes import pid_alive

    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = 0
    while child.poll() is None and deadline < 600:  # ended, not yet reaped: a zombie
        deadline += 1
        subprocess.run(["sleep", "0.05"])
    # poll() reaps it; a fresh child left unreaped shows the zombie case.
    assert not pid_alive(child.pid)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # ended, still unreaped
    assert not pid_alive(zombie.pid)
    zombie.wait()


def test_pid_alive_without_proc_asks_the_kernel(monkeypatch, tmp_path):
    from apputil import processes

    monkeypatch.setattr(processes, "PROC", str(tmp_path / "no-proc"))  # macOS, BSDs
    asked = []
    real_kill = os.kill

    def kill(pid, signum):
        asked.append((pid, signum))
        return real_kill(pid, signum)

    monkeypatch.setattr(processes.os, "kill", kill)
    assert processes.pid_alive(os.getpid())
    ended = ended_pid()
    assert not processes.pid_alive(ended)
    assert asked == [(os.getpid(), 0), (ended, 0)]  # signal 0: nothing is sent

    def not_permitted(pid, signum):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(processes.os, "kill", not_permitted)
    assert processes.pid_alive(1)  # another user's process runs


def test_a_proc_folder_without_self_is_no_process_list(monkeypatch, tmp_path):
    """A `/proc` that is not the kernel's (no `self` in it): the kernel is asked."""
    from apputil import processes

    (tmp_path / "proc").mkdir()
    monkeypatch.setattr(processes, "PROC", str(tmp_path / "proc"))
    assert processes.pid_alive(os.getpid())


def test_pid_alive_with_an_unreadable_proc_entry_asks_the_kernel(monkeypatch, tmp_path):
    from apputil import processes

    (tmp_path / "self").mkdir()
    for pid in (os.getpid(), 12345):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").mkdir()  # reading a folder fails: IsADirectoryError
    monkeypatch.setattr(processes, "PROC", str(tmp_path))
    assert processes.pid_alive(os.getpid())
    ended = ended_pid()
    assert not processes.pid_alive(ended)  # no entry: gone, without asking
    monkeypatch.setattr(processes.os, "kill", lambda pid, signum: None)
    assert processes.pid_alive(12345)
    (tmp_path / "777").mkdir()
    (tmp_path / "777" / "stat").write_text("777 (a) b) S 1 2 3\n")  # ")" in the name
    assert processes.pid_alive(777)
    for state in ("Z", "X"):
        (tmp_path / "777" / "stat").write_text(f"777 (a) b) {state} 1 2 3\n")
        assert not processes.pid_alive(777)


def test_an_atomic_write_flushes_the_file_then_renames_then_flushes_the_folder(
    tmp_path, monkeypatch
):
    events = []
    monkeypatch.setattr(files, "fsync_file", lambda p: events.append(("file", os.fspath(p))))
    monkeypatch.setattr(files, "fsync_directory", lambda p: events.append(("dir", os.fspath(p))))
    real_replace = os.replace
    monkeypatch.setattr(
        files.os, "replace", lambda a, b: events.append(("rename", a, b)) or real_replace(a, b)
    )
    path = tmp_path / "model.keras"
    with files.atomic_path(path) as partial:
        assert partial == str(tmp_path / "model.partial.keras")  # the extension kept
        with open(partial, "w") as handle:
            handle.write("x")
    assert events == [("file", partial), ("rename", partial, str(path)), ("dir", str(tmp_path))]
    assert path.read_text() == "x"


def test_fsync_tree_flushes_every_file_and_every_folder_root_last(tmp_path, monkeypatch):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for name in ("a/f", "a/b/g", "h"):
        (tmp_path / name).write_text("x")
    flushed = []
    monkeypatch.setattr(files, "fsync_file", lambda p: flushed.append(("file", p)))
    monkeypatch.setattr(files, "fsync_directory", lambda p: flushed.append(("dir", p)))
    files.fsync_tree(str(tmp_path))
    assert sorted(flushed) == sorted(
        [("file", str(tmp_path / n)) for n in ("a/f", "a/b/g", "h")]
        + [("dir", str(tmp_path / n)) for n in ("a/b", "a")]
        + [("dir", str(tmp_path))]
    )
    assert flushed[-1] == ("dir", str(tmp_path))
    # Each folder after its own files: a flushed entry names a flushed file.
    assert flushed.index(("dir", str(tmp_path / "a"))) > flushed.index(
        ("file", str(tmp_path / "a/f"))
    )


def test_remove_partials_takes_both_partial_names(tmp_path):
    for name in ("model.partial.keras", "curve.json.partial", "x.partial", "partially.json"):
        (tmp_path / name).write_text("x")
    files.remove_partials(tmp_path)
    assert os.listdir(tmp_path) == ["partially.json"]


def test_a_folder_lock_is_held_by_one_holder_at_a_time(tmp_path):
    first, second = files.FolderLock(tmp_path), files.FolderLock(tmp_path)
    assert second.holder() == "unknown"  # no lock file yet
    assert first.acquire()
    assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"
    assert not second.acquire()  # another open file: flock refuses it, even in one process
    assert second.holder() == str(os.getpid())
    first.release()
    first.release()  # twice: nothing held, nothing to do
    assert second.acquire()
    second.release()
    (tmp_path / ".lock").write_text("")
    assert first.holder() == "unknown"  # an empty record


def test_remove_partials_tolerates_a_file_removed_meanwhile(tmp_path, monkeypatch):
    """Another cleaner (a resumed peer) may delete a partial file between the listing and
    the removal: that is the wanted outcome, not an error."""
    (tmp_path / "ckpt-1.partial.npz").write_bytes(b"x")
    listed = os.listdir

    def listing_a_ghost(path):
        return ["ckpt-0.partial.npz", *listed(path)]  # gone before it is removed

    monkeypatch.setattr(files.os, "listdir", listing_a_ghost)
    files.remove_partials(tmp_path)
    assert listed(tmp_path) == []


def test_a_folder_lock_never_taken_releases_nothing(tmp_path):
    lock = files.FolderLock(tmp_path)
    lock.release()  # nothing held: no descriptor to close
    assert not (tmp_path / ".lock").exists()
    assert lock.acquire()
    lock.release()


def test_without_flock_a_folder_lock_is_a_no_op(tmp_path, monkeypatch):
    """Where `fcntl` does not exist (Windows), every holder gets the lock and no file is made."""
    monkeypatch.setattr(files, "fcntl", None)
    first, second = files.FolderLock(tmp_path), files.FolderLock(tmp_path)
    assert first.acquire() is True and second.acquire() is True
    assert not (tmp_path / ".lock").exists()
    first.release()
    second.release()


def test_a_folder_lock_file_is_readable_by_all_and_written_by_its_owner(tmp_path):
    """Mode 0o644 less the umask, as any file a run writes (others read the holder's pid)."""
    import stat

    umask = os.umask(0)
    os.umask(umask)
    lock = files.FolderLock(tmp_path)
    assert lock.acquire()
    try:
        mode = stat.S_IMODE(os.stat(tmp_path / ".lock").st_mode)
        assert mode == 0o644 & ~umask
    finally:
        lock.release()


def test_fsync_directory_flushes_the_folder_itself(tmp_path, monkeypatch):
    """The folder is opened as a directory, flushed and closed (a rename is durable only
    once its folder's entry is)."""
    opened, flushed, closed = [], [], []
    real_open = os.open

    def spy_open(path, flags, *args):
        handle = real_open(path, flags, *args)
        opened.append((os.fspath(path), flags, handle))
        return handle

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "fsync", flushed.append)
    real_close = os.close
    monkeypatch.setattr(os, "close", lambda handle: (closed.append(handle), real_close(handle)))
    files.fsync_directory(tmp_path)
    ((path, flags, handle),) = opened
    assert path == os.fspath(tmp_path)
    assert flags & os.O_DIRECTORY and flags & os.O_ACCMODE == os.O_RDONLY
    assert flushed == [handle] and closed == [handle]


class _StandInTensorFlow:
    """What `import_tensorflow` touches of TensorFlow, noisy on native stderr as TF is."""

    def __init__(self, calls):
        self.calls = calls
        self.config = self

    def list_physical_devices(self, kind):
        os.write(2, b"E0000 cuInit failed\n")
        self.calls.append(("list", kind))
        return []


@pytest.fixture
def stand_in_imports(monkeypatch):
    """`importlib.import_module` recording its names, TensorFlow not imported yet."""
    from apputil import quiet

    calls, levels = [], []
    tensorflow = _StandInTensorFlow(calls)

    def import_module(name):
        os.write(2, f"I0000 loading {name}\n".encode())
        calls.append(("import", name))
        levels.append(os.environ.get("TF_CPP_MIN_LOG_LEVEL"))
        if name == "tensorflow" and calls[0] == ("fail", "tensorflow"):
            raise ImportError("No module named 'tensorflow'")
        return tensorflow if name == "tensorflow" else f"module {name}"

    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    monkeypatch.setattr(quiet.importlib, "import_module", import_module)
    monkeypatch.setattr(quiet, "_DEVICES_LISTED", [])
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    return quiet, calls, tensorflow, levels


def test_tensorflow_is_imported_and_lists_its_gpus_once_with_native_stderr_closed(
    stand_in_imports, capfd, monkeypatch
):
    quiet, calls, tensorflow, levels = stand_in_imports
    print("before", file=sys.stderr)
    assert quiet.import_tensorflow() is tensorflow
    print("after", file=sys.stderr)
    assert calls == [("import", "tensorflow"), ("list", "GPU")]
    assert levels == ["2"]
    assert capfd.readouterr().err == "before\nafter\n"  # the native lines are gone
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"
    # Imported already (by Keras): the devices are listed once, then nothing is done.
    monkeypatch.setitem(sys.modules, "tensorflow", tensorflow)
    assert quiet.import_tensorflow() is tensorflow
    assert calls == [("import", "tensorflow"), ("list", "GPU")]
    monkeypatch.setattr(quiet, "_DEVICES_LISTED", [])
    assert quiet.import_tensorflow() is tensorflow
    assert calls == [("import", "tensorflow"), ("list", "GPU"), ("list", "GPU")]
    assert capfd.readouterr().err == ""


def test_a_log_level_already_set_is_kept(stand_in_imports, monkeypatch):
    quiet, _, _, levels = stand_in_imports
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    quiet.import_tensorflow()
    quiet.import_keras()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"
    assert set(levels) == {"0"}


def test_keras_is_imported_before_tensorflow_and_quietly(stand_in_imports, capfd):
    quiet, calls, _, levels = stand_in_imports
    assert quiet.import_keras() == "module keras"
    assert calls == [("import", "keras"), ("import", "tensorflow"), ("list", "GPU")]
    assert levels == ["2", "2"]  # set before Keras imports TensorFlow on its backend
    assert capfd.readouterr().err == ""
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"


def test_keras_is_imported_where_tensorflow_is_not_installed(stand_in_imports, capfd):
    quiet, calls, _, _ = stand_in_imports
    calls.append(("fail", "tensorflow"))  # the stand-in fails TensorFlow's import
    assert quiet.import_keras() == "module keras"
    assert calls[1:] == [("import", "keras"), ("import", "tensorflow")]
    assert quiet._DEVICES_LISTED == []
    assert capfd.readouterr().err == ""


def test_python_errors_in_a_silenced_block_still_surface_and_stderr_comes_back(capfd):
    from apputil.quiet import native_stderr_silenced

    with pytest.raises(RuntimeError, match="shown"):
        with native_stderr_silenced():
            os.write(2, b"hidden\n")
            raise RuntimeError("shown")
    os.write(2, b"visible\n")
    assert capfd.readouterr().err == "visible\n"


class _Stop(BaseException):  # noqa: N818  (a request to stop, as KeyboardInterrupt)
    def __init__(self, number):
        super().__init__(number)
        self.number = number


class _SignalledWhenCollected:
    """Sends SIGINT from its finalizer: the handler runs inside `__del__`, where Python
    prints an exception it raises as "ignored" and goes on (as in JAX's `gc` callback)."""

    def __del__(self):
        signal.raise_signal(signal.SIGINT)


def _handlers():
    return {number: signal.getsignal(number) for number in signals.STOP_SIGNALS}


def test_a_signal_in_a_raising_block_raises_make_of_its_number_and_the_handlers_come_back():
    before, hook = _handlers(), sys.unraisablehook
    reached = []
    with pytest.raises(_Stop) as stopped:
        with signals.raising(_Stop):
            signal.raise_signal(signal.SIGTERM)
            reached.append("after the signal")
    assert stopped.value.number == signal.SIGTERM and reached == []
    assert _handlers() == before and sys.unraisablehook is hook


def test_a_stop_lost_in_a_finalizer_is_raised_at_the_block_s_end_without_a_report(capfd):
    reached = []
    with pytest.raises(_Stop) as stopped:
        with signals.raising(_Stop):
            _SignalledWhenCollected()  # collected at once
            reached.append("the block goes on")
    assert stopped.value.number == signal.SIGINT and reached == ["the block goes on"]
    assert "Exception ignored" not in capfd.readouterr().err


def test_other_errors_in_finalizers_still_reach_the_previous_hook(monkeypatch):
    reports = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: reports.append(report.exc_value))

    class Failing:
        def __del__(self):
            raise ValueError("in a finalizer")

    with signals.raising(_Stop):
        Failing()
    assert [type(error) for error in reports] == [ValueError]


def test_a_recording_block_starts_with_a_lost_stop_and_records_the_next_ones():
    before = _handlers()
    with pytest.raises(_Stop):
        with signals.raising(_Stop):
            _SignalledWhenCollected()
            with signals.recording() as received:
                assert received == [signal.SIGINT]
                signal.raise_signal(signal.SIGTERM)  # recorded, not raised
                assert received == [signal.SIGINT, signal.SIGTERM]
    with signals.recording() as received:  # no block lost anything
        assert received == []
        signal.raise_signal(signal.SIGINT)
    assert received == [signal.SIGINT] and _handlers() == before


def test_a_stop_after_a_loop_s_last_check_goes_to_the_enclosing_block():
    """A loop that ended normally leaves the stops it did not act on to `check()`."""
    with pytest.raises(_Stop) as stopped:
        with signals.raising(_Stop):
            with signals.recording() as received:
                signal.raise_signal(signal.SIGTERM)
            assert received == [signal.SIGTERM]  # the recording block ended normally
            with signals.recording() as next_loop:
                assert next_loop == [signal.SIGTERM]
            signals.check()
            pytest.fail("check() did not raise")
    assert stopped.value.number == signal.SIGTERM


def test_check_raises_only_for_a_stop_the_innermost_block_kept():
    signals.check()  # no block
    with signals.raising(_Stop):
        signals.check()  # nothing received
    with pytest.raises(_Stop):
        with signals.raising(_Stop):
            with signals.raising(lambda number: RuntimeError(number)):
                with signals.recording():
                    signal.raise_signal(signal.SIGINT)
                with pytest.raises(RuntimeError):
                    signals.check()  # the innermost block's `make`
                raise _Stop(0)


def test_nested_blocks_each_keep_their_own_stops():
    before, hook = _handlers(), sys.unraisablehook
    with pytest.raises(_Stop) as stopped:
        with signals.raising(_Stop):
            with signals.raising(_Stop):
                pass  # an inner block ends with nothing received
            _SignalledWhenCollected()  # the outer block loses a stop
            with signals.recording() as received:
                assert received == [signal.SIGINT]
    assert stopped.value.number == signal.SIGINT
    assert _handlers() == before and sys.unraisablehook is hook


def test_off_the_main_thread_the_blocks_install_nothing():
    before, outcome = _handlers(), []

    def body():
        with signals.raising(_Stop):
            with signals.recording() as received:
                outcome.append((_handlers(), received))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert outcome == [(before, [])]


def test_port_in_use_tells_a_listening_port_from_a_free_one_and_leaves_other_failures():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        assert net.port_in_use("127.0.0.1", port)
    assert not net.port_in_use("127.0.0.1", port)  # closed: free again
    free = net.free_port()
    assert not net.port_in_use("127.0.0.1", free)
    assert not net.port_in_use("192.0.2.1", free)  # not this machine's: the server's bind says


_SLOW_TEST = """
import time
import pytest

@pytest.mark.timeout(1)
def test_slow(request):
    assert request.node.get_closest_marker("timeout").args[0] == 3.0
    time.sleep(1.5)  # past its own 1 s, within the scaled 3 s
"""


def test_the_time_factor_scales_the_tests_limits(tmp_path):
    """`KERAS_ANTISYM_TEST_TIME_FACTOR=3`: a test marked with 1 s runs under 3 s."""
    (tmp_path / "test_slow.py").write_text(_SLOW_TEST)
    root = os.path.dirname(os.path.dirname(__file__))
    env = dict(os.environ, KERAS_ANTISYM_TEST_TIME_FACTOR="3", PYTHONPATH=root)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:randomly",
         "-p", "no:cacheprovider", str(tmp_path / "test_slow.py")],
        cwd=root, env=env, capture_output=True, text=True, timeout=limit(120),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
