"""Processes of this machine, as the application's commands see them."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether process `pid` of this host runs (a killed child not yet reaped does not).

    Reads `/proc` where it exists (a zombie still has a pid but runs no more),
    else asks the kernel with signal 0; a process of another user counts as
    running.
    """
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
