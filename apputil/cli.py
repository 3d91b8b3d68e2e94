"""Command-line helpers: one-line argument errors and a command's error boundary.

Every command of `training/`, `serving/` and `benchmarks/` parses its flags in
`main` with `OneLineParser` and runs its body through `run`: the failures a user
can cause and fix (bad options, unreadable inputs, a full disk) print one line
`PROG: error: MESSAGE` and exit with the documented status; anything else is a
bug and keeps its traceback. The commands of `training/` and `serving/` end their
process with `finish`.
"""

from __future__ import annotations

import argparse
import atexit
import inspect
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

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


def finish(status: int) -> NoReturn:
    """Ends a command's process with `status`, the result of its `main`.

    The interpreter's own exit (and TensorFlow's teardown after it) takes seconds
    with the default signal handlers back in place, so a stop signal then would
    kill a process whose work is done, with no line and status -15. Here the
    other threads are joined and the exit functions run (logging's flush, JAX's
    shutdown) while a stop signal is answered with one line that changes
    nothing: the work has finished, the status stays its own. The process then
    ends without the teardown.
    """
    caller = inspect.currentframe()
    spec = caller.f_back.f_globals.get("__spec__") if caller and caller.f_back else None
    prog = f"python -m {spec.name}" if spec is not None else os.path.basename(sys.argv[0])

    def exiting(number: int, frame: object) -> None:
        name = signal.Signals(number).name
        print(f"{prog}: {name} while exiting: its work was done (exit status {status})",
              file=sys.stderr, flush=True)  # fmt: skip

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, exiting)
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
