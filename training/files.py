"""Atomic file writes: a reader sees the old file or the new one, never a part.

Every file `training/` leaves for a later run to read (configs, metrics,
checkpoints, curves, data exports) is written through `atomic_path`: to a
`NAME.partial.EXT` sibling (the extension kept, as `model.save` wants),
flushed to disk, renamed into place, and the rename itself flushed, so a
`kill -9` or a power loss leaves no torn file.
"""

import contextlib
import os

PARTIAL = ".partial"


def _fsync_directory(directory):
    if not hasattr(os, "O_DIRECTORY"):  # Windows cannot open a folder
        return
    handle = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


@contextlib.contextmanager
def atomic_path(path):
    """Yields a temporary path to write; on success it replaces `path` durably.

    The writer may create the temporary file any way it likes (a file handle,
    `np.savez`, `model.save`); on an exception it is removed and `path` is
    left as it was.
    """
    root, extension = os.path.splitext(path)
    partial = root + PARTIAL + extension
    try:
        yield partial
        with open(partial, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
        raise
    _fsync_directory(os.path.dirname(os.path.abspath(path)))


def write_atomically(path, data):
    """Writes `data` (text or bytes) to `path` atomically and durably."""
    mode = "wb" if isinstance(data, bytes) else "w"
    with atomic_path(path) as partial, open(partial, mode) as handle:
        handle.write(data)


def remove_partials(directory):
    """Deletes the `NAME.partial.EXT` files a killed writer left in `directory`."""
    if not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        if PARTIAL + "." in name or name.endswith(PARTIAL):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(directory, name))
