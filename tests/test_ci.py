"""`.ci/run`: every stage runs after a failure, and the first failure is the exit status."""

import os
import pathlib
import shutil
import signal
import stat
import subprocess

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


def _script(path, label, stage):
    """An executable that appends `label` and its arguments to `ran`, then exits with the
    status in `codes/<stage>`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/usr/bin/env bash\necho "{label} VENV=${{VENV-}} PYTHON=${{PYTHON-}} $*"'
                    f' >>ran\nexit "$(cat codes/{stage} 2>/dev/null || echo 0)"\n')  # fmt: skip
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def stand_in(tmp_path):
    """A tree with `.ci/run` and stand-ins for its stages, each logging that it ran and
    exiting with the status in `codes/<stage>` (0 without one)."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(REPO_ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "codes").mkdir()
    for stage in ("test", "check_wheel"):
        _script(tmp_path / "scripts" / f"{stage}.sh", stage, stage)
    return tmp_path


def _ci(tree, venv=True):
    if venv:
        _script(tree / ".ci-venv" / "bin" / "python", "slow", "slow")
    # CI starts with Ctrl-C's default action, as from a terminal: a test runner's worker may
    # ignore SIGINT, and a shell cannot trap a signal ignored when it started.
    done = subprocess.run(["bash", ".ci/run"], cwd=tree, capture_output=True, text=True,
                          timeout=60, env=_without(os.environ, "VENV", "PYTHON"),
                          preexec_fn=_default_interrupt)  # fmt: skip
    return done.returncode, [line.split()[0] for line in _ran(tree)], done.stderr


def _default_interrupt():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _without(environment, *names):
    return {key: value for key, value in environment.items() if key not in names}


def _ran(tree):
    return (tree / "ran").read_text().splitlines() if (tree / "ran").exists() else []


def test_every_stage_runs_and_passes(stand_in):
    assert _ci(stand_in)[:2] == (0, ["test", "slow", "check_wheel"])
    # The suite installs into CI's own venv, the later stages run its Python.
    test, slow, wheel = _ran(stand_in)
    assert test.startswith("test VENV=.ci-venv PYTHON= ")
    assert slow.startswith("slow VENV= PYTHON= -m pytest") and slow.endswith("-m slow")
    assert wheel.startswith("check_wheel VENV= PYTHON=.ci-venv/bin/python")


def test_a_failing_suite_still_runs_the_slow_tests_and_the_wheel_check(stand_in):
    (stand_in / "codes" / "test").write_text("3")
    (stand_in / "codes" / "check_wheel").write_text("5")
    code, ran, err = _ci(stand_in)
    assert (code, ran) == (3, ["test", "slow", "check_wheel"])
    assert "CI stage failed (exit 3)" in err and "CI stage failed (exit 5)" in err


def test_a_later_failure_is_the_status_when_the_suite_passes(stand_in):
    (stand_in / "codes" / "slow").write_text("1")
    assert _ci(stand_in)[:2] == (1, ["test", "slow", "check_wheel"])


def test_without_a_venv_only_the_suite_runs(stand_in):
    (stand_in / "codes" / "test").write_text("2")
    assert _ci(stand_in, venv=False)[:2] == (2, ["test"])


def test_an_interrupt_stops_ci_at_once(stand_in):
    """Ctrl-C in a stage whose tool exits normally on it (pytest does) ends the whole run."""
    (stand_in / "scripts" / "test.sh").write_text(
        '#!/usr/bin/env bash\necho "test" >>ran\nkill -INT $PPID\nsleep 0.2\nexit 2\n')
    code, ran, _ = _ci(stand_in)
    assert (code, ran) == (130, ["test"])
