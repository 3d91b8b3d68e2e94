"""Signals as exceptions, for commands that must end with one line whenever they are stopped."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def raising(
    make: Callable[[int], BaseException], numbers: tuple[int, ...] = STOP_SIGNALS
) -> Iterator[None]:
    """Within the block, each signal of `numbers` raises `make(number)` in the main thread.

    Off the main thread (where Python cannot install handlers) it does
    nothing. Code inside may put handlers of its own in place for a while (a
    training loop that finishes its step first); the previous handlers come
    back when the block ends.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(number: int, frame: object) -> None:
        raise make(number)

    previous = {number: signal.signal(number, handler) for number in numbers}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)
