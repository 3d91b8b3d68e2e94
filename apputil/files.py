"""Atomic, durable file writes: a reader sees the old file or the new one, never a part.

Every file that a later run or a server reads (configs, metrics, checkpoints,
curves, data exports, exported models) is written to a temporary sibling,
flushed to disk, renamed into place, and the rename itself flushed, so that a
`kill -9` or a power loss leaves no torn file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

try:
    import fcntl
except ImportError:  # Windows: no flock, and FolderLock is a no-op
    fcntl = None  # type: ignore[assignment]

PARTIAL = ".partial"


def fsync_directory(path: str | os.PathLike) -> None:
    """Flushes a folder's entries (a rename or a new file in it) to disk.

    Silently does nothing where a folder cannot be opened or flushed (Windows,
    some network filesystems): there the rename is as durable as it gets.
    """
    if not hasattr(os, "O_DIRECTORY"):
        return
    with contextlib.suppress(OSError):
        handle = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)


def fsync_file(path: str | os.PathLike) -> None:
    """Flushes one file's contents to disk."""
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_tree(root: str) -> None:
    """Flushes every file and folder under `root`, and `root` itself."""
    for folder, _, names in os.walk(root, topdown=False):
        for name in names:
            fsync_file(os.path.join(folder, name))
        fsync_directory(folder)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """Yields a temporary path to write; on success it replaces `path` durably.

    The temporary file is `NAME.partial.EXT` beside `path` (the extension kept,
    as `model.save` wants). The writer may create it any way it likes (a file
    handle, `np.savez`, `model.save`); on an exception it is removed and `path`
    is left as it was.
    """
    path = os.fspath(path)
    root, extension = os.path.splitext(path)
    partial = root + PARTIAL + extension
    try:
        yield partial
        fsync_file(partial)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
        raise
    fsync_directory(os.path.dirname(os.path.abspath(path)))


def write_atomically(path: str | os.PathLike, data: str | bytes) -> None:
    """Writes `data` (text or bytes) to `path` atomically and durably."""
    mode = "wb" if isinstance(data, bytes) else "w"
    with atomic_path(path) as partial, open(partial, mode) as handle:
        handle.write(data)


def remove_partials(directory: str | os.PathLike) -> None:
    """Deletes the `NAME.partial.EXT` files a killed writer left in `directory`."""
    if not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        if PARTIAL + "." in name or name.endswith(PARTIAL):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(directory, name))


class FolderLock:
    """An exclusive lock on a folder, held by one process at a time.

    Taken with `flock` on `FOLDER/.lock`, so the kernel releases it when the
    holder exits, however it exits: a lock left by a dead process never blocks.
    The file records the holder's pid for the message of whoever is refused.
    Where `flock` does not exist (Windows), the lock is a no-op.
    """

    NAME = ".lock"

    def __init__(self, folder: str | os.PathLike):
        self.path = os.path.join(os.fspath(folder), self.NAME)
        self._handle: int | None = None

    def acquire(self) -> bool:
        """Takes the lock; False (and nothing held) when another process holds it."""
        if fcntl is None:
            return True
        handle = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(handle)
            return False
        os.ftruncate(handle, 0)
        os.write(handle, f"{os.getpid()}\n".encode())
        self._handle = handle
        return True

    def holder(self) -> str:
        """The pid recorded by the holder, or "unknown"."""
        try:
            with open(self.path) as handle:
                return handle.read().strip() or "unknown"
        except OSError:
            return "unknown"

    def release(self) -> None:
        if self._handle is not None:
            os.close(self._handle)  # closing the descriptor releases the flock
            self._handle = None
