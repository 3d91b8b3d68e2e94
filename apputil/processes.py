"""Processes of this machine, as the application's commands see them."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable

#: Where the kernel lists processes (Linux); elsewhere the kernel is asked with signal 0.
PROC = "/proc"


def pid_alive(pid: int) -> bool:
    """Whether process `pid` of this host runs (a killed child not yet reaped does not).

    Reads `/proc` where it exists (a zombie still has a pid but runs no more),
    else asks the kernel with signal 0 (macOS and other systems without
    `/proc`); a process of another user counts as running.
    """
    if os.path.isdir(os.path.join(PROC, "self")):
        try:
            with open(os.path.join(PROC, str(pid), "stat")) as handle:
                return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except FileNotFoundError:
            return False
        except OSError:  # unreadable (a hardened /proc): ask the kernel
            pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


PR_SET_PDEATHSIG = 1  # prctl(2)


def parent_death_hook(number: int = signal.SIGKILL) -> Callable[[], None] | None:
    """What a child runs before exec so that the kernel signals it when its parent dies.

    Linux's PR_SET_PDEATHSIG: signal `number` reaches the child as soon as the
    thread that started it ends, however the parent died (SIGKILL, an
    out-of-memory kill): SIGKILL for a child that must not outlive it, SIGTERM
    for one that saves its work on SIGTERM. A child whose parent is gone
    already (between fork and prctl) exits at once. None elsewhere.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(PR_SET_PDEATHSIG, int(number), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return die_with_parent


def stop_all(
    children: Iterable[subprocess.Popen], number: int = signal.SIGTERM, grace: float = 10.0
) -> None:
    """Signal `number` to the children still running, SIGKILL to those left after `grace` s.

    Each child gets the same deadline (not `grace` each, one after the other),
    and is waited for: none is left a zombie.
    """
    children = list(children)
    for child in children:
        if child.poll() is None:
            child.send_signal(number)
    deadline = time.monotonic() + grace
    for child in children:
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def exit_status(returncode: int) -> int:
    """A child's `returncode` as a shell reports it: killed by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode
