"""Command-line helpers: one-line argument errors and a command's error boundary.

Every command of `training/`, `serving/` and `benchmarks/` parses its flags in
`main` with `OneLineParser` and runs its body through `run`: the failures a user
can cause and fix (bad options, unreadable inputs, a full disk) print one line
`PROG: error: MESSAGE` and exit with the documented status; anything else is a
bug and keeps its traceback. The commands of `training/` and `serving/` run their
`main` with `execute`.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from apputil import signals
from apputil.errors import UsageError

#: Exit statuses: 0 success, 1 an environment failure (files, disk, network),
#: 2 a usage error (bad option or input).
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

#: An exit status, or a function of the exception that gives it.
Status = int | Callable[[Any], int]


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (`PROG: error: MESSAGE`, status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def fail(prog: str, error: object, status: int = EXIT_USAGE) -> int:
    """Prints `PROG: error: ERROR` to stderr and returns `status`."""
    print(f"{prog}: error: {error}", file=sys.stderr)
    return status


def run(
    prog: str,
    body: Callable[[], object],
    expected: Mapping[type[BaseException], Status] | None = None,
) -> int:
    """Runs `body()`; an exception of an `expected` class (or `UsageError`) is one line.

    `expected` maps exception classes to exit statuses, or to functions of the
    exception that return one (the first matching class in order wins).
    Returns `body`'s integer result, or 0.
    """
    classes: dict[type[BaseException], Status] = {UsageError: EXIT_USAGE, **(expected or {})}
    try:
        result = body()
    except tuple(classes) as error:
        status = next(s for cls, s in classes.items() if isinstance(error, cls))
        return fail(prog, error, status if isinstance(status, int) else status(error))
    except KeyboardInterrupt:
        return fail(prog, "interrupted", 130)
    return result if isinstance(result, int) else EXIT_OK


def execute(main: Callable[[], int]) -> NoReturn:
    """Runs a command's `main` and ends its process with the status it returns.

    Around `main`, SIGTERM and SIGINT do what they did before until the
    command's work is over: the end of its stop-signal block (`apputil.signals`),
    or `main`'s return for a command without one. From then on a stop signal is
    one line, `PROG: SIGTERM while exiting: its work was done (exit status N)`,
    and changes nothing. So the moment a block hands its handlers back has none
    that kills the process, and neither has the interpreter's own exit, which
    (with TensorFlow's teardown after it) takes seconds: here the other threads
    are joined and the exit functions run (logging's flush, JAX's shutdown),
    then the process ends without the teardown.
    """
    # Named by the program that runs, not by the frame that calls: `execute` is called from
    # a `__main__` block, and wrappers around functions (a profiler's, a mutation tool's
    # trampolines) would otherwise name themselves.
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    prog = f"python -m {spec.name}" if spec is not None else os.path.basename(sys.argv[0])
    exiting = _Exiting(prog)
    handler = signals.outside(exiting)
    status = main()
    handler.over = True
    exiting.ended(status)
    try:
        # The first steps of CPython's own exit (`Py_FinalizeEx`), in its order: the
        # threading module's exit callbacks (thread pools' shutdown), the join of the
        # non-daemon threads, then the atexit functions.
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed or broken pipe: nothing more to say
                pass
        os._exit(status)


class _Exiting:
    """The line for a stop signal after a command's work: said once the status is known."""

    def __init__(self, prog: str):
        self.prog = prog
        self.status: int | None = None
        self.waiting: list[int] = []

    def __call__(self, number: int) -> None:
        if self.status is None:  # the work is over, its status not yet returned
            self.waiting.append(number)
        else:
            self._say(number)

    def ended(self, status: int) -> None:
        """The work's status is `status`: the signals that waited for it are said now."""
        self.status = status
        waiting, self.waiting = self.waiting, []
        for number in waiting:
            self._say(number)

    def _say(self, number: int) -> None:
        name = signal.Signals(number).name
        print(f"{self.prog}: {name} while exiting: its work was done (exit status {self.status})",
              file=sys.stderr, flush=True)  # fmt: skip
