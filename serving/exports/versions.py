"""The version folders of an export base: the one a version gets, checked before anything
is written, and its atomic write through a staging folder beside it.

A staging folder is named `.tmp-<version>-<pid>@<host>-<random>`, so that an export
can tell a dead exporter's leftovers from a live one's; TensorFlow Serving (and
`serving.local.repository`) load only all-digit names, so it is never served.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable

from apputil.errors import Literal, invalid
from apputil.files import fsync_directory, fsync_tree
from apputil.processes import pid_alive
from serving.names import check_version, parse_version, version_folder

# TensorFlow Serving only loads all-digit names. Older exports wrote `.tmp-<version>-<random>`.
_STAGING = re.compile(r"^\.tmp-\d+-(?:(?P<pid>\d+)@(?P<host>[\w.]+)-)?[^-@]+$")
_UNOWNED_STALE_SECONDS = 3600


class VersionExistsError(FileExistsError):
    """The version folder exists already, or another export wrote it meanwhile (status 2)."""


def _owner_alive(pid: int, host: str) -> bool:
    if host != _host():
        return True  # another machine's exporter: cannot tell, keep it
    return pid_alive(pid)


def _host() -> str:
    return re.sub(r"[^\w.]", "_", socket.gethostname()) or "localhost"


def remove_stale_staging(export_base: str | os.PathLike) -> list[str]:
    """Removes staging folders of exports that died; returns their names.

    A folder is stale when its owner (pid and host in its name) is no longer
    running on this host; one without an owner (older exports) when untouched
    for an hour. A live exporter's folder is never removed.
    """
    removed = []
    for name in sorted(os.listdir(export_base)):
        match = _STAGING.match(name)
        path = os.path.join(export_base, name)
        if not match or not os.path.isdir(path):
            continue
        if match["pid"] is not None:
            stale = not _owner_alive(int(match["pid"]), match["host"])
        else:
            stale = time.time() - os.path.getmtime(path) > _UNOWNED_STALE_SECONDS
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
    return removed


def _exists_error(version: int, target: str, how: str = "exists") -> Exception:
    return invalid("version", "a version not yet exported",
                   Literal(f"{version} (`{target}` {how})"), VersionExistsError)  # fmt: skip


def target(export_base: str | os.PathLike, version: int) -> str:
    """The folder `version` is written to (`serving.names`); a `UsageError` for an invalid
    version or base path, `VersionExistsError` for a version exported already (also
    under another spelling, `007`)."""
    check_version(version)
    if os.path.exists(export_base) and not os.path.isdir(export_base):
        raise invalid("export_base", "a folder, or a path to create one", str(export_base))
    target = os.path.join(export_base, version_folder(version))
    if os.path.exists(target):
        raise _exists_error(version, target)
    try:
        names = os.listdir(export_base)
    except OSError:  # missing or unreadable: the write says why, if it fails
        names = []
    for name in names:  # the server reads `007` as version 7 too
        if parse_version(name) == version:
            raise _exists_error(version, os.path.join(export_base, name))
    return target




def write_version(
    export_base: str | os.PathLike, version: int, target: str, write: Callable[[str], None]
) -> str:
    """`write(staging)` into a staging folder beside `target`, flushed to disk and renamed
    into place (atomic on one filesystem), after removing dead exports' staging folders;
    `target`. Nothing of a failed or interrupted write is left behind.

    Raises:
        VersionExistsError: another export wrote `target` meanwhile.
        OSError: the folder could not be written.
    """
    os.makedirs(export_base, exist_ok=True)
    remove_stale_staging(export_base)
    staging = tempfile.mkdtemp(prefix=f".tmp-{version}-{os.getpid()}@{_host()}-", dir=export_base)
    try:
        write(staging)
        os.chmod(staging, 0o755)  # mkdtemp makes it 0700; the server may run as another user
        fsync_tree(staging)
        try:
            os.rename(staging, target)  # atomic on one filesystem; fails if target appeared
        except OSError:
            if os.path.exists(target):
                raise _exists_error(
                    version, target, "was written by another export meanwhile"
                ) from None
            raise
        fsync_directory(export_base)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
