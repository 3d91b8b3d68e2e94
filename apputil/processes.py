"""Processes of this machine, as the application's commands see them."""

from __future__ import annotations

import os

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
