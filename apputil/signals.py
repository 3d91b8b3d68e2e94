"""Stop signals for commands that must end with one line whenever they are stopped.

`raising` turns SIGTERM and SIGINT into an exception; `recording` (a loop that
finishes its step first) turns them into a number to act on at a safe point.

Python runs a signal's handler between any two bytecodes of the main thread,
also inside a finalizer (a `__del__`, a `gc` callback such as JAX's), where a
raised exception is printed as "Exception ignored" and lost. `raising`
therefore keeps each number it received until its exception has left the
block: a `recording` block inside starts with it, and the block, should it end
normally, raises it at its end. A stop is never lost.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

# The numbers each open `raising` block received (innermost last). Module state, as the
# handlers themselves are: both belong to the process.
_open: list[list[int]] = []


@contextlib.contextmanager
def raising(
    make: Callable[[int], BaseException], numbers: tuple[int, ...] = STOP_SIGNALS
) -> Iterator[None]:
    """Within the block, each signal of `numbers` raises `make(number)` in the main thread.

    If that exception is lost (raised inside a finalizer), the block raises
    `make(number)` at its end instead, and a `recording` block inside starts
    with the number; the lost exception's "Exception ignored" report is not
    printed. Off the main thread (where Python cannot install handlers) it
    does nothing. Code inside may put handlers of its own in place for a
    while; the previous handlers come back when the block ends.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    raised: list[BaseException] = []

    def handler(number: int, frame: object) -> None:
        received.append(number)
        error = make(number)
        raised.append(error)
        raise error

    def unraisable(report: sys.UnraisableHookArgs) -> None:
        if not any(report.exc_value is error for error in raised):
            previous_hook(report)

    previous = {number: signal.signal(number, handler) for number in numbers}
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    _open.append(received)
    try:
        yield
        if received:  # its exception was lost in a finalizer
            raise make(received[0])
    finally:
        _open.remove(received)
        sys.unraisablehook = previous_hook
        for number, old in previous.items():
            signal.signal(number, old)


@contextlib.contextmanager
def recording(numbers: tuple[int, ...] = STOP_SIGNALS) -> Iterator[list[int]]:
    """Yields a list that each signal of `numbers` appends its number to, while inside.

    The list starts with the numbers an enclosing `raising` block received
    whose exception was lost, so a loop that checks the list between steps
    stops for them too. The handlers are installed only in the main thread
    (Python delivers signals there); the previous ones come back afterwards.
    """
    received: list[int] = [number for block in _open for number in block]
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(number: int, frame: object) -> None:
        received.append(number)

    previous = {number: signal.signal(number, handler) for number in numbers}
    try:
        yield received
    finally:
        for number, old in previous.items():
            signal.signal(number, old)
