"""Stop signals for commands that must end with one line whenever they are stopped.

`raising` turns SIGTERM and SIGINT into an exception; `recording` (a loop that
finishes its step first) turns them into a number to act on at a safe point;
`check()` is such a point; `handling` puts any handler in place for a while.
`outside` is a command's handler around those blocks (`apputil.cli.execute`):
the default action until a block ends, then the command's own.

Python runs a signal's handler between any two bytecodes of the main thread,
also inside a finalizer (a `__del__`, a `gc` callback such as JAX's), where a
raised exception is printed as "Exception ignored" and lost. A `raising` block
therefore keeps each number it received until it ends: a `recording` block
inside starts with it, and `check()` and the block's end raise it. A number a
`recording` block received after its loop's last check goes to the enclosing
`raising` block the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _Block:
    """An open `raising` block: its `make`, and the numbers it received."""

    def __init__(self, make: Callable[[int], BaseException]):
        self.make = make
        self.numbers: list[int] = []


# The open `raising` blocks, innermost last. Module state, as the handlers themselves are:
# both belong to the process.
_open: list[_Block] = []


@contextlib.contextmanager
def raising(
    make: Callable[[int], BaseException], numbers: tuple[int, ...] = STOP_SIGNALS
) -> Iterator[None]:
    """Within the block, each signal of `numbers` raises `make(number)` in the main thread.

    The number is kept until the block ends. If its exception never ends the
    block (lost in a finalizer, whose "Exception ignored" report is then not
    printed, or caught by the code inside), `check()` and the end of the block
    raise `make(number)`, and a `recording` block inside starts with the
    number. Off the main thread (where Python cannot install handlers) it does
    nothing. Code inside may put handlers of its own in place for a while; the
    previous handlers come back when the block ends.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    block = _Block(make)
    raised: list[BaseException] = []

    def handler(number: int, frame: object) -> None:
        block.numbers.append(number)
        error = make(number)
        raised.append(error)
        raise error

    def unraisable(report: sys.UnraisableHookArgs) -> None:
        for index, error in enumerate(raised):
            if report.exc_value is error:
                del raised[index]  # the block keeps its number, not its traceback
                return
        previous_hook(report)

    previous_hook = sys.unraisablehook
    try:
        sys.unraisablehook = unraisable
        _open.append(block)
        with handling(handler, numbers):
            yield
            check()
    finally:
        _open.remove(block)
        sys.unraisablehook = previous_hook


def check() -> None:
    """Raises the innermost `raising` block's exception for a signal it received and is
    still open after; a safe point for code that cannot rely on the handler's raise."""
    if _open and _open[-1].numbers:
        raise _open[-1].make(_open[-1].numbers[0])


@contextlib.contextmanager
def recording(numbers: tuple[int, ...] = STOP_SIGNALS) -> Iterator[list[int]]:
    """Yields a list that each signal of `numbers` appends its number to, while inside.

    For a loop that checks the list between steps. In the main thread the list
    starts with the numbers the enclosing `raising` blocks received and are
    still open after, and, when the block ends without an exception (the loop
    ended before it checked again), the numbers it received go to the
    innermost `raising` block, so `check()` and that block's end still act on
    them. The handlers are installed only in the main thread (Python delivers
    signals there); the previous ones come back afterwards.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(number: int, frame: object) -> None:
        received.append(number)

    with handling(handler, numbers):
        # Read after the handlers are in place: a stop before them is in a block's numbers.
        kept = [number for block in _open for number in block.numbers]
        received[:0] = kept
        yield received
        if _open:
            _open[-1].numbers.extend(received[len(kept) :])


@contextlib.contextmanager
def handling(handler: Callable[[int, Any], None], numbers: tuple[int, ...] = STOP_SIGNALS
             ) -> Iterator[None]:  # fmt: skip
    """`handler` for each signal of `numbers` within the block; the previous ones after.

    A previous handler that is an `Outside` learns that the command's work is over
    before it is back in place, so a signal at any moment of the hand-back finds
    either this block's handler or the command's own after-work one.
    """
    previous = {}
    try:
        for number in numbers:
            previous[number] = signal.signal(number, handler)
        yield
    finally:
        for number, old in previous.items():
            if isinstance(old, Outside):
                old.over = True
            signal.signal(number, old)


class Outside:
    """A command's stop-signal handler outside its blocks (`raising`, `recording`, `handling`).

    Until the work is `over`, a signal gets what the process had before
    (`previous`: Python's KeyboardInterrupt for SIGINT, the default end for
    SIGTERM, nothing for an ignored one); once it is, `after(number)`, as the
    stop blocks take ignored signals too. A block that hands back to it sets
    `over` first; a command without blocks sets it when its work returns.
    """

    def __init__(self, after: Callable[[int], None], previous: dict[int, Any]):
        self.after, self.previous, self.over = after, previous, False

    def __call__(self, number: int, frame: Any) -> None:
        if self.over:
            self.after(number)
            return
        previous = self.previous[number]
        if previous is signal.SIG_IGN:  # a background job's SIGINT, say
            return
        if callable(previous):
            previous(number, frame)
            return
        signal.signal(number, signal.SIG_DFL)  # the default action: end the process
        os.kill(os.getpid(), number)


def outside(after: Callable[[int], None], numbers: tuple[int, ...] = STOP_SIGNALS) -> Outside:
    """Puts an `Outside` in place for each signal of `numbers`, in the main thread; returns
    it."""
    handler = Outside(after, {})
    if threading.current_thread() is threading.main_thread():
        for number in numbers:
            handler.previous[number] = signal.signal(number, handler)
    return handler
